"""Cloudflare Queues in the embedded runtime: each queue's broker, its producer binding, and delivery.

Lives here: ``QueueProducer`` (``env.BINDING``: ``send`` and ``sendBatch``),
``QueueBroker`` (one per queue: the messages waiting, batches formed when
``max_batch_size`` are ready or the oldest has waited ``max_batch_timeout``,
at most ``max_concurrency`` handled at once, and what the handler decided
applied: an ack deletes, a retry comes again after its delay, a message
past ``max_retries`` goes to the dead-letter queue or is dropped) and
``QueueStats`` (what happened, and the operations billed). Under faults a
consumer's invocation may die partway (every message of its batch comes
again: what it acked never reached the broker) and an ack may be lost (the
message comes again although it was handled): delivery is at least once.
Must not know: Durable Objects, or how the handler is invoked; the runtime
hands each broker ``invoke(batch)``, and the messages' checks and shapes are
in ``_queue_values``.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._queue_values import (
    MAX_BATCH_BYTES,
    MAX_BATCH_MESSAGES,
    MAX_CONCURRENCY,
    Message,
    MessageBatch,
    QueueConsumer,
    delay_of,
    encoded,
    operations,
)
from ._values import JsException, rpc_copy

if TYPE_CHECKING:
    from ._clock import RuntimeLoop
    from ._faults import FaultPlanner


@dataclass
class QueueStats:
    """What one queue did, and the operations it is billed for (a write, a
    read per delivery, a delete per ack: three for a message handled once)."""

    sent: int = 0
    deliveries: int = 0  #: messages handed to the consumer, a message delivered again counted again
    batches: int = 0
    acked: int = 0
    retried: int = 0
    dead_lettered: int = 0
    dropped: int = 0  #: past ``max_retries`` with no dead-letter queue
    crashed_invocations: int = 0  #: invocations that died partway (faults)
    acks_lost: int = 0  #: messages that came again after their ack (faults)
    late: int = 0  #: messages held back by a ``late_delivery`` fault
    operations: int = 0


@dataclass
class _Stored:
    id: str
    body: Any
    size: int
    sent_at: float  #: epoch ms
    ready_at: float  #: epoch ms: not delivered before
    attempts: int = 0  #: deliveries so far


class QueueBroker:
    """One queue: what its producers sent, delivered to its consumer in batches."""

    def __init__(self, name: str, loop: RuntimeLoop, faults: FaultPlanner,
                 spawn: Callable[[Awaitable[Any]], Any], log: Callable[[str, str], None]) -> None:
        self.name = name
        self.loop = loop
        self.faults = faults
        self.spawn = spawn
        self.log = log
        self.stats = QueueStats()
        self.consumer: QueueConsumer | None = None
        self.invoke: Callable[[MessageBatch], Awaitable[Any]] | None = None
        self.dead_letters: QueueBroker | None = None
        self._waiting: list[_Stored] = []
        self._handling = 0  #: batches being handled now
        self._kick_at: float | None = None
        self._seq = itertools.count(1)
        self._prefix = f"{zlib.crc32(name.encode()):08x}"  #: ids: 32 hex digits, unique across queues

    def waiting(self) -> int:
        """Messages queued and not being handled now (those delayed included)."""
        return len(self._waiting)

    def handling(self) -> int:
        """Batches being handled now."""
        return self._handling

    def put(self, body: Any, size: int, delay_s: float) -> None:
        now = self.loop.now_ms()
        late_ms = self.faults.delivery_late_ms(self.name)
        if late_ms:
            self.stats.late += 1
            self.log("queue message late", f"{self.name}: {late_ms:.0f} ms")
        self._stored(_Stored(self._new_id(), rpc_copy(body), size, now, now + delay_s * 1000 + late_ms))

    def take(self, message: _Stored) -> None:
        """A message another queue gave up on (this is its dead-letter queue):
        its id and timestamp kept, its attempts counted anew."""
        self._stored(_Stored(message.id, message.body, message.size, message.sent_at, self.loop.now_ms()))

    def _stored(self, stored: _Stored) -> None:
        self.stats.sent += 1
        self.stats.operations += operations(stored.size)
        self._waiting.append(stored)
        self._kick_soon(stored.ready_at)

    # -- batches --------------------------------------------------------------
    def _new_id(self) -> str:
        return f"{self._prefix}{next(self._seq):024x}"

    def _kick_soon(self, at_ms: float) -> None:
        if self.consumer is None or (self._kick_at is not None and self._kick_at <= at_ms):
            return
        self._kick_at = at_ms
        self.loop.call_later_exact(max(0.0, at_ms - self.loop.now_ms()) / 1000, self._kick, at_ms)

    def _kick(self, at_ms: float) -> None:
        if self._kick_at != at_ms:
            return  # a sooner kick took its place
        self._kick_at = None
        consumer = self.consumer
        assert consumer is not None
        now = self.loop.now_ms()
        while self._handling < (consumer.max_concurrency or MAX_CONCURRENCY):
            ready = sorted((m for m in self._waiting if m.ready_at <= now), key=lambda m: (m.ready_at, m.id))
            timed_out = bool(ready) and ready[0].ready_at + consumer.max_batch_timeout * 1000 <= now
            if len(ready) < consumer.max_batch_size and not timed_out:
                break
            batch = ready[:consumer.max_batch_size]
            taken = {id(m) for m in batch}
            self._waiting = [m for m in self._waiting if id(m) not in taken]
            self._handling += 1
            self.spawn(self._deliver(batch))
        self._kick_next(now)

    def _kick_next(self, now: float) -> None:
        """Come back when the next batch may be due: a delayed message ready,
        the oldest ready one timed out (or at once, with a full batch
        waiting for a free slot, when a slot frees)."""
        consumer = self.consumer
        if consumer is None or not self._waiting:
            return
        ready = [m.ready_at for m in self._waiting if m.ready_at <= now]
        later = [m.ready_at for m in self._waiting if m.ready_at > now]
        due = later + ([min(ready) + consumer.max_batch_timeout * 1000] if ready else [])
        self._kick_soon(max(now, min(due)))

    async def _deliver(self, stored: list[_Stored]) -> None:
        for message in stored:
            message.attempts += 1
            self.stats.deliveries += 1
            self.stats.operations += operations(message.size)
        self.stats.batches += 1
        batch = MessageBatch(self.name, [
            Message(m.id, datetime.datetime.fromtimestamp(m.sent_at / 1000, datetime.UTC).replace(tzinfo=None),
                    rpc_copy(m.body), m.attempts) for m in stored])
        self.log("queue batch", f"{self.name}: {len(stored)}")
        failed = await self._handled(batch)
        self._handling -= 1
        for message, seen in zip(stored, batch.messages):
            # An invocation that died said nothing: its words never reached the broker.
            self._settle(message, ("retry", None) if failed is None else batch.outcome(seen, not failed))
        self._kick_soon(self.loop.now_ms())

    async def _handled(self, batch: MessageBatch) -> bool | None:
        """Run the handler on ``batch``: False if it returned, True if it
        raised, None if the invocation died (faults)."""
        assert self.invoke is not None
        task = asyncio.ensure_future(self.invoke(batch))
        crash_after_ms = self.faults.consumer_crash(self.name)
        if crash_after_ms is not None:
            self.loop.call_later_exact(crash_after_ms / 1000, task.cancel)
        try:
            await task
            return False
        except asyncio.CancelledError:
            if crash_after_ms is None:
                raise
            self.stats.crashed_invocations += 1
            self.log("queue consumer died", self.name)
            return None
        except Exception as error:
            self.log("queue consumer failed", repr(error))
            return True

    def _settle(self, message: _Stored, outcome: tuple[str, float | None]) -> None:
        """Apply what became of ``message``: ``("ack", _)`` or ``("retry", delay or None)``."""
        decided, delay = outcome
        if decided == "ack":
            self.stats.acked += 1
            self.stats.operations += operations(message.size)
            if self.faults.ack_lost(self.name):
                self.stats.acks_lost += 1
                self.log("queue ack lost", message.id)
                self._again(message, 0.0)
            return
        self.stats.retried += 1
        assert self.consumer is not None
        if message.attempts > self.consumer.max_retries:
            self._give_up(message)
            return
        self._again(message, self.consumer.retry_delay if delay is None else delay)

    def _again(self, message: _Stored, delay_s: float) -> None:
        message.ready_at = self.loop.now_ms() + delay_s * 1000
        self._waiting.append(message)
        self._kick_soon(message.ready_at)

    def _give_up(self, message: _Stored) -> None:
        if self.dead_letters is None:
            self.stats.dropped += 1
            self.log("queue message dropped", message.id)
            return
        self.stats.dead_lettered += 1
        self.dead_letters.take(message)


class QueueProducer:
    """``env.BINDING`` for a queue: what a Worker or an object sends with. A
    send from an object waits for its output gate: a message never leaves
    before the writes made ahead of it are durable (and never, if they are lost)."""

    def __init__(self, broker: QueueBroker, gate: Callable[[], Awaitable[Any]]) -> None:
        self._broker = broker
        self._gate = gate

    async def send(self, body: Any, options: Any = None, **extra: Any) -> None:
        """Queue one message (``contentType``, ``delaySeconds`` in ``options`` or as keywords)."""
        _, size = encoded(body, options, extra)
        delay = delay_of(options, extra)
        await self._gate()
        self._broker.put(body, size, delay)

    async def sendBatch(self, messages: Any, options: Any = None, **extra: Any) -> None:
        """Queue up to 100 messages (``[{"body": ..., "delaySeconds": ...}]``), all or none."""
        if not isinstance(messages, list) or not messages:
            raise JsException("sendBatch() requires at least one message", name="TypeError")
        if len(messages) > MAX_BATCH_MESSAGES:
            raise JsException(f"Queue sendBatch failed: batch of {len(messages)} messages exceeds limit of "
                              f"{MAX_BATCH_MESSAGES}", name="Error")
        default_delay = delay_of(options, extra)
        checked = []
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or "body" not in message:
                raise JsException(f"messages[{i}] must be an object with a body", name="TypeError")
            _, size = encoded(message["body"], message, {})
            checked.append((message["body"], size, delay_of(message, {}, default_delay)))
        total = sum(size for _, size, _ in checked)
        if total > MAX_BATCH_BYTES:
            raise JsException(f"Queue sendBatch failed: batch of {total} bytes exceeds limit of "
                              f"{MAX_BATCH_BYTES}", name="Error")
        await self._gate()
        for body, size, delay in checked:
            self._broker.put(body, size, delay)


class Queues:
    """Every queue of a runtime, by name, wired to producers and consumers."""

    def __init__(self, loop: RuntimeLoop, faults: FaultPlanner, spawn: Callable[[Awaitable[Any]], Any],
                 log: Callable[[str, str], None], gate: Callable[[], Awaitable[Any]]) -> None:
        self._services = (loop, faults, spawn, log)
        self._gate = gate  #: a sender's output gate
        self.brokers: dict[str, QueueBroker] = {}

    def __getitem__(self, name: str) -> QueueBroker:
        if name not in self.brokers:
            self.brokers[name] = QueueBroker(name, *self._services)
        return self.brokers[name]

    def set_up(self, producers: dict[str, str], consumers: Sequence[QueueConsumer],
               invoke: Callable[[MessageBatch], Awaitable[Any]]) -> dict[str, QueueProducer]:
        """The producer bindings (binding -> queue name), with each consumer
        given its queue (one consumer a queue, as production allows)."""
        for consumer in consumers:
            broker = self[consumer.queue]
            if broker.consumer is not None:
                raise ValueError(f"queue {consumer.queue} has two consumers")
            broker.consumer, broker.invoke = consumer, invoke
            if consumer.dead_letter_queue is not None:
                broker.dead_letters = self[consumer.dead_letter_queue]
        return {binding: QueueProducer(self[name], self._gate) for binding, name in producers.items()}

    def operations(self) -> int:
        return sum(broker.stats.operations for broker in self.brokers.values())


def producers_of(settings: dict[str, Any]) -> dict[str, str]:
    """``[[queues.producers]]`` of a wrangler.toml: binding -> queue name."""
    entries = settings.get("queues", {}).get("producers", [])
    for entry in entries:
        if "binding" not in entry or "queue" not in entry:
            raise ValueError("[[queues.producers]] needs `binding` and `queue`")
        if entry.get("delivery_delay"):
            raise ValueError("[[queues.producers]] delivery_delay is not supported here; send with delaySeconds")
    return {entry["binding"]: entry["queue"] for entry in entries}


def consumers_of(settings: dict[str, Any]) -> list[QueueConsumer]:
    """``[[queues.consumers]]`` of a wrangler.toml."""
    return [QueueConsumer.from_wrangler(entry) for entry in settings.get("queues", {}).get("consumers", [])]
