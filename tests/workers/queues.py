"""A Worker module with a queue producer and consumer, for the embedded runtime's Queues tests.

Each message body says what the consumer does with it: ``ack``, ``retry``
(with ``delay``), ``retry_then_ack``, ``raise`` (the whole handler fails),
``work`` (awaits ``ms`` first), ``ack_all`` or ``retry_all`` (the batch's
word, after every message's own, the latter with a 3 s delay), or nothing
(the handler returns without a word). The consumer records every delivery
in ``DELIVERIES``.
"""

import asyncio
import time

from workers import DurableObject, WorkerEntrypoint

DELIVERIES = []  #: (queue, message id, body, attempts, loop ms)
SEEN = []  #: (queue, message id, body, attempts, the timestamp's type name): what the fidelity scenario compares


class Sender(DurableObject):
    """An object that sends to the queue, as a shard would."""

    async def send(self, body, options=None):
        await self.env.JOBS.send(body, **(options or {}))

    async def record_and_send(self, body):
        """A write, then a send that must not leave before the write is durable."""
        self.ctx.storage.sql.exec("CREATE TABLE IF NOT EXISTS sent (n INTEGER)")
        self.ctx.storage.sql.exec("INSERT INTO sent VALUES (?)", body["n"])
        await self.env.JOBS.send(body)


class Default(WorkerEntrypoint):
    async def send(self, body, options=None):
        await self.env.JOBS.send(body, **(options or {}))

    async def queue(self, batch, env, ctx):  # (workerd passes all three; env and ctx are None)
        failing = False
        words = set()
        for message in batch.messages:
            body = message.body
            DELIVERIES.append((batch.queue, message.id, body, message.attempts, time.time() * 1000))
            SEEN.append((batch.queue, message.id, body, message.attempts, type(message.timestamp).__name__))
            do = body.get("do") if isinstance(body, dict) else None
            if do == "work":
                await asyncio.sleep(body["ms"] / 1000)
                message.ack()
            elif do == "ack":
                message.ack()
            elif do == "retry":
                message.retry(delaySeconds=body.get("delay", 0))
            elif do == "retry_then_ack":
                message.retry({"delaySeconds": 1})
                message.ack()  # the first word counts
            elif do == "raise":
                failing = True
            words.add(do)
        if "ack_all" in words:
            batch.ackAll()
        if "retry_all" in words:
            batch.retryAll(delaySeconds=3)
        if failing:
            raise RuntimeError("the consumer failed")
