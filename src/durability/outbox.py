"""DurabilityOutbox: messages written with the state change that caused them, sent until acknowledged.

Lives here: the outbox table, named channels with their senders, coalescing
by key, publishing on the scheduler with retries, and reading pending
messages so that a caller can piggyback them on another call.
Must not know: what a message means or where a sender delivers it.

A message enqueued inside a transaction commits with that transaction or
not at all; the timer that will publish it is derived from the rows again
when the channel opens in a new instance: nothing accepted is lost on a
crash. Delivery is at least once; a receiver must tolerate
duplicates (cumulative counts make that easy).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ._common.checks import compact_json
from ._common.clock import now_ms
from ._common.schema import migrate, public_migrate
from ._common.sql import GrowingCounter, Sql
from .retry import Backoff
from .scheduler.alarm import DurabilityScheduler, Timer

PARTICIPANT = "durability.outbox"

# One WITHOUT ROWID table keyed by (channel, id): enqueueing, coalescing
# and acknowledging a message each write one row.
_SCHEMA = {
    1: [
        """
        CREATE TABLE IF NOT EXISTS durability_outbox (
          channel TEXT NOT NULL,
          id TEXT NOT NULL,
          seq INTEGER NOT NULL,
          body TEXT NOT NULL,
          created_at REAL NOT NULL,
          version INTEGER NOT NULL DEFAULT 0,
          PRIMARY KEY (channel, id)
        ) WITHOUT ROWID
        """
    ]
}
_TABLES = ["durability_outbox"]


@dataclass(frozen=True)
class OutboxMessage:
    channel: str
    id: str  #: the coalescing key, or a sequence number for unkeyed messages
    body: Any  #: the JSON value that was enqueued
    created_at: float  #: epoch ms of the first enqueue under this id
    version: int  #: changes each time a newer message replaces this one


Sender = Callable[[list[OutboxMessage]], Awaitable[None]]


class OutboxChannel:
    """One named stream of outgoing messages with its sender."""

    def __init__(self, outbox: DurabilityOutbox, name: str, send: Sender,
                 batch_size: int, delay_ms: float) -> None:
        self.outbox = outbox
        self.name = name
        self.send = send
        self.batch_size = batch_size
        self.delay_ms = delay_ms
        self._publishing = asyncio.Lock()

    def enqueue(self, body: Any, *, key: str | None = None) -> str:
        """Add a message; call it inside the transaction of the change it reports.

        With ``key``, a message still unsent under the same key is replaced
        (it keeps its place in line): for cumulative reports, the newest
        says everything the older one said. Returns the message id.
        """
        text = compact_json(body, "outbox message")
        if key is not None and (not isinstance(key, str) or not key or key.startswith("#")):
            raise ValueError(f"outbox key must be a non-empty string not starting with '#', not {key!r}")
        outbox = self.outbox
        # One number from a counter that only grows within this instance
        # serves as the position of a new message and the version of every
        # write: an acknowledgement naming an older version (even of a message
        # deleted and written again since) can never delete the newer one.
        version = outbox._versions.next()
        # Unkeyed ids must never repeat, even once the table emptied and a new
        # instance counts from 1 again: a receiver may deduplicate by id.
        message_id = key if key is not None else f"#{int(now_ms()):013x}{random.getrandbits(48):012x}"
        outbox.sql.exec(
            "INSERT INTO durability_outbox (channel, id, seq, body, created_at, version) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (channel, id) DO UPDATE SET "
            "body = excluded.body, version = excluded.version",
            self.name, message_id, version, text, now_ms(), version,
        )
        outbox.scheduler.schedule_by(PARTICIPANT, self.name, now_ms() + self.delay_ms)
        return message_id

    def pending(self, limit: int | None = None) -> list[OutboxMessage]:
        """Messages not yet acknowledged, oldest first."""
        rows = self.outbox.sql.exec(
            "SELECT id, body, created_at, version FROM durability_outbox "
            "WHERE channel = ? ORDER BY seq LIMIT ?",
            self.name, -1 if limit is None else limit,
        )
        return [
            OutboxMessage(self.name, r["id"], json.loads(r["body"]), r["created_at"], r["version"])
            for r in rows
        ]

    def acknowledge(self, messages: list[OutboxMessage]) -> None:
        """Forget messages that were delivered, unless a newer one replaced them since."""

        def apply() -> None:
            for message in messages:
                self.outbox.sql.exec(
                    "DELETE FROM durability_outbox WHERE channel = ? AND id = ? AND version = ?",
                    self.name, message.id, message.version,
                )

        self.outbox.sql.transaction(apply)

    async def publish(self) -> None:
        """Send what was pending when it started, a batch at a time; raise if a send fails.

        Messages that arrive meanwhile wait for the channel's timer, so one
        alarm never turns into an endless stream of sends while writes keep
        coming, and ``delay_ms`` keeps gathering them.
        """
        async with self._publishing:
            rounds = -(-self.outbox._count(self.name) // self.batch_size)
            for _ in range(rounds):
                batch = self.pending(self.batch_size)
                if not batch:
                    return
                await self.send(batch)
                self.acknowledge(batch)
            if self.pending(1):
                self.outbox.scheduler.schedule_by(PARTICIPANT, self.name, now_ms() + self.delay_ms)

    async def flush(self) -> bool:
        """Publish now instead of waiting for the alarm; on failure the alarm retries.

        Returns whether the channel is empty afterwards.
        """
        try:
            await self.publish()
        except Exception:
            empty = False  # the channel's timer retries
        else:
            empty = not self.pending(1)
        await self.outbox.scheduler.sync()
        return empty


class DurabilityOutbox:
    """Named channels of outgoing messages on one scheduler."""

    def __init__(self, scheduler: DurabilityScheduler, *, backoff: Backoff | None = None) -> None:
        if getattr(scheduler, "outbox", None) is not None:
            raise ValueError("this scheduler already has an outbox: use DurabilityOutbox.of(scheduler)")
        scheduler.outbox = self
        self.scheduler = scheduler
        self.sql: Sql = scheduler.sql
        self._channels: dict[str, OutboxChannel] = {}
        migrate(self.sql, "outbox", _SCHEMA)
        self._versions = GrowingCounter(self.sql, "SELECT max(version) AS n FROM durability_outbox")
        # A channel's timer is due when its oldest message's delay is over:
        # the rows say so, so the timer lives in memory and costs no row
        # (see DurabilityScheduler); channel() derives it when it opens.
        scheduler.register(PARTICIPANT, self._on_timer, backoff=backoff, durable=False)

    @classmethod
    def of(cls, scheduler: DurabilityScheduler) -> DurabilityOutbox:
        """The scheduler's outbox, created on first use: helpers share one per object."""
        existing = getattr(scheduler, "outbox", None)
        return existing if existing is not None else cls(scheduler)

    migrate = public_migrate("outbox", _TABLES, "the outbox's table")

    def channel(self, name: str, send: Sender, *, batch_size: int = 32,
                delay_ms: float = 0) -> OutboxChannel:
        """Open the channel ``name``; ``send(messages)`` delivers a batch or raises.

        ``delay_ms`` lets messages gather before the alarm publishes them.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"channel name must be a non-empty string, not {name!r}")
        if name in self._channels:
            raise ValueError(f"channel {name!r} is already open")
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if delay_ms < 0:
            raise ValueError("delay_ms must not be negative")
        channel = OutboxChannel(self, name, send, batch_size, delay_ms)
        self._channels[name] = channel
        oldest = channel.pending(1)  # first in line, so the first enqueued
        if oldest:
            self.scheduler.schedule_by(PARTICIPANT, name, oldest[0].created_at + delay_ms)
        return channel

    def _count(self, channel: str) -> int:
        row = self.sql.one("SELECT count(*) AS n FROM durability_outbox WHERE channel = ?", channel)
        return int(row["n"]) if row else 0

    async def _on_timer(self, timer: Timer) -> None:
        channel = self._channels.get(timer.key)
        if channel is None:
            raise LookupError(f"outbox channel {timer.key!r} is not open in this object")
        await channel.publish()
