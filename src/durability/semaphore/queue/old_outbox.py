"""The queue's old outbox channels, drained: the reports older versions queued there.

Lives here: ``OldOutboxDrain``: the outbox channels
``durability.semaphore-queue`` (grant reports) and
``durability.semaphore-queue.leases`` (lease reports), opened only to send
what older versions queued on them, one ``sync`` per key, each key's
messages acknowledged once its holder answered. Nothing is queued there
any more: reports are read from the items (see queue/grants and
queue/leases). This module goes in version 1.0; an object upgraded to a
0.x release drains its channels at its first start. Must not know: when
reports are due, or SQL.
"""

from __future__ import annotations

from collections.abc import Callable

from ..._common.clock import now_ms
from ...outbox import DurabilityOutbox, OutboxChannel, OutboxMessage
from ...scheduler.alarm import DurabilityScheduler
from ..messages import MAX_REPORTS, Reply, Sync, queued_grant_report, queued_lease_id
from .grants import QueueGrants
from .leases import QueueLeases
from .memory import QueueContext
from .pure.lease_rules import lease_report

CHANNEL = "durability.semaphore-queue"  #: the outbox channel older versions queued grant reports on
OLD_LEASE_CHANNEL = "durability.semaphore-queue.leases"  #: and lease reports on


class OldOutboxDrain:
    def __init__(self, scheduler: DurabilityScheduler, ctx: QueueContext, grants: QueueGrants,
                 leases: QueueLeases) -> None:
        self.ctx = ctx
        self.grants = grants
        self.leases = leases
        self._channels: dict[str, OutboxChannel] = {}
        if ctx.store.legacy:  # (a queue made since version 9 never had these channels: no outbox table is made)
            outbox = DurabilityOutbox.of(scheduler)
            self._channels = {name: outbox.channel(name, self._send, delay_ms=ctx.options.lease_report_delay_ms,
                                                   batch_size=MAX_REPORTS) for name in (CHANNEL, OLD_LEASE_CHANNEL)}

    def lease_messages(self, lease_ids: set[str]) -> list[OutboxMessage]:
        """Queued lease reports of these leases (a request reporting them acknowledges them)."""
        return [m for channel in self._channels.values() for m in channel.pending()
                if queued_lease_id(m.body) in lease_ids]

    def acknowledge(self, messages: list[OutboxMessage]) -> None:
        for name in sorted({m.channel for m in messages}):
            self._channels[name].acknowledge([m for m in messages if m.channel == name])

    async def _send(self, messages: list[OutboxMessage]) -> None:
        """The channels' sender: lease reports, and grant reports."""
        await self._send_reports([m for m in messages if queued_grant_report(m.body) is not None])
        await self._send_lease_reports([m for m in messages if queued_lease_id(m.body) is not None])

    async def _send_reports(self, messages: list[OutboxMessage]) -> None:
        """Grant reports: a ``sync`` per key with their cumulative counts."""
        if not messages:
            return

        def on_reply(key: str, reply: Reply, batch: list[OutboxMessage]) -> None:
            self.grants.apply_outcomes(reply.reports)
            self.acknowledge(batch)
            if reply.leases:  # leases retired since: stop drawing now
                self.leases.learn(key, reply.leases, now_ms())
            self.leases.after_contended(key, reply)

        def sync(batch: list[OutboxMessage]) -> Sync:
            reports = [queued_grant_report(m.body) for m in batch]
            return Sync(self.ctx.client_id, tuple(report for report in reports if report is not None))

        await self._sync_per_key(messages, sync, on_reply)

    async def _send_lease_reports(self, messages: list[OutboxMessage]) -> None:
        """Lease reports: a ``sync`` per key with each lease's current counts."""
        current = {}
        for message in messages:
            lease_id = queued_lease_id(message.body)
            lease = self.ctx.lease_book.lease(lease_id) if lease_id is not None else None
            if lease is not None and lease.settled_at is None:
                current[(message.channel, message.id)] = lease
        gone = [m for m in messages if (m.channel, m.id) not in current]
        if gone:  # settled since: nothing left to say
            self.acknowledge(gone)

        def sync(batch: list[OutboxMessage]) -> Sync:
            return Sync(self.ctx.client_id, (), tuple(lease_report(current[(m.channel, m.id)]) for m in batch))

        def on_reply(key: str, reply: Reply, batch: list[OutboxMessage]) -> None:
            self.acknowledge(batch)  # first: an outcome may queue a newer report
            self.leases.apply_outcomes(reply.lease_reports, now_ms())
            if reply.leases:
                self.leases.learn(key, reply.leases, now_ms())
            self.leases.after_contended(key, reply)

        await self._sync_per_key([m for m in messages if (m.channel, m.id) in current], sync, on_reply)

    async def _sync_per_key(self, messages: list[OutboxMessage], sync_of: Callable[[list[OutboxMessage]], Sync],
                            on_reply: Callable[[str, Reply, list[OutboxMessage]], None]) -> None:
        """Send one ``sync`` per key, ``sync_of(batch)``, and commit each
        answer's ``on_reply(key, reply, batch)``.

        Each key's reports are acknowledged as soon as its holder answered, so
        one unreachable holder delays only its own account's reports.
        """
        by_key: dict[str, list[OutboxMessage]] = {}
        for message in messages:
            by_key.setdefault(message.body["key"], []).append(message)
        failure: Exception | None = None
        for key, batch in by_key.items():
            try:
                await self.ctx.exchange(key, sync_of(batch), lambda reply: on_reply(key, reply, batch))  # noqa: B023
            except Exception as error:
                failure = failure or error
        if failure is not None:
            raise failure
