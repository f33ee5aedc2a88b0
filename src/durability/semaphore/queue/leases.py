"""The queue's leases: draws, what the holder lists and answers about them, renewals, and their reports.

Lives here: ``QueueLeases``: drawing queued items from this object's
leases, keeping what the holder lists (``learn``) and answers
(``apply_outcomes``, decided by ``queue/pure/lease_rules``), giving idle leases
back when the holder is short, renewing leases at half their lifetime,
and sending the lease reports the holder may not have heard, each in one
``sync`` (the counts read when it is sent). Must not know: grants, the
request a report may ride on (``queue/requests`` marks those reports in
flight), or SQL.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import replace

from ..._common.clock import now_ms
from ..messages import MAX_REPORTS, OK, LeaseEntry, LeaseOutcome, Reply, Sync
from .memory import QueueContext
from .pure.lease_rules import (
    Then,
    after_outcome,
    idle_to_return,
    lease_report,
    may_take_up,
    renewed,
    taken_up,
)
from .pure.states import ADMITTED, LocalLease, TimerKind, Via

log = logging.getLogger("durability.semaphore.queue")


class QueueLeases:
    def __init__(self, ctx: QueueContext) -> None:
        self.ctx = ctx
        self._versions = itertools.count(1)  #: report versions: a reply answers the version it carried

    # -- inside a commit -----------------------------------------------------------
    def draw(self, key: str, now: float, *, admits_after: bool = False) -> None:
        """Admit queued items at once on permits drawn from this object's leases
        (the draw and the admission commit together). ``admits_after``: the
        caller hands what it admits to ``admit()`` once its commit is done
        (``QueueContext.admit_in_this_event``): with strict leases, a holder's
        call that brought a lease set the alarm to now for it 0.74 times a
        job on the demo's workload (a row, an alarm run, a row to set it back)."""
        ctx = self.ctx
        drawn = False
        reserved = ctx.reserved(key)
        for lease in ctx.lease_book.leases(key):
            if lease.undrawn <= 0:
                continue
            items = ctx.store.oldest_queued(key, lease.group, lease.undrawn, reserved.get(lease.group, 0))
            for number, item in enumerate(items, start=lease.drawn + 1):  # numbered in order (see lease_book)
                ctx.move(item, ADMITTED, lease.lease_id, Via.LEASE, number)
            drawn = drawn or bool(items)
        if drawn and admits_after:
            ctx.admit_in_this_event()
        elif drawn:
            ctx.due_by(TimerKind.ADMIT, None, now)

    def put_and_report(self, lease: LocalLease) -> None:
        """Keep a lease and have it reported (its counts are read when the report is sent)."""
        self.ctx.lease_book.keep(lease)
        self.report_due(lease.key, lease.lease_id, now_ms() + self.ctx.options.lease_report_delay_ms)

    def report_due(self, key: str, lease_id: str, at: float) -> None:
        """The holder must hear about the lease again: by ``at``, or with the key's next request."""
        self.ctx.memory.lease_due[lease_id] = (key, next(self._versions))
        self.ctx.due_by(TimerKind.LEASE_REPORT, key, at)

    def reports_heard(self, versions: dict[str, int]) -> None:
        """The holder answered reports of these leases, as they stood at these versions."""
        due = self.ctx.memory.lease_due
        for lease_id, version in versions.items():
            if due.get(lease_id, (None, None))[1] == version:
                del due[lease_id]

    def learn(self, key: str, entries: tuple[LeaseEntry, ...], now: float, listed_all: bool = False) -> None:
        """Leases the holder lists: new ones, ones whose reply was lost, ones to stop drawing from,
        and (``listed_all``) every other one it counts for this object."""
        book = self.ctx.lease_book
        for entry in entries:
            if book.settled(entry.lease_id):
                continue  # a reply sent before it was settled here
            known = book.lease(entry.lease_id)
            if known is not None:
                if entry.retired and not known.stopped and known.settled_at is None:
                    self.put_and_report(replace(known, stopped=True))
                continue
            may_draw = not entry.retired and may_take_up(entry, listed_all, lambda: self.ctx.waiting_groups(key))
            lease = taken_up(key, entry, now, may_draw)
            # No row holds the lease: the key's row makes a new instance ask
            # about it (a write only the first time the key is registered).
            self.ctx.store.register_key(key)
            if lease.stopped:
                self.put_and_report(lease)  # tell the holder nothing was drawn
            else:
                book.keep(lease)
        self.schedule_renewal()

    def apply_outcomes(self, outcomes: tuple[LeaseOutcome, ...], now: float) -> None:
        book = self.ctx.lease_book
        for outcome in outcomes:
            known = book.lease(outcome.lease_id)
            if known is None or known.settled_at is not None:
                continue
            answer = after_outcome(known, outcome, now)
            if answer.then is Then.FORGET:
                book.forget(known.lease_id, now)
                # Its items may go: due now, for any alarm run that comes, but
                # no alarm of its own before a request wait on (set to now,
                # 0.69 times a job with strict leases on the demo's workload:
                # a row, an alarm run and a row to set the alarm back).
                self.ctx.due_by(TimerKind.PURGE, None, now, alarm_by=now + self.ctx.options.request_wait_ms)
            elif answer.then is Then.REPORT:
                self.put_and_report(answer.lease)
            elif answer.then is Then.KEEP:
                book.keep(answer.lease)
        self.schedule_renewal()

    def return_idle(self, key: str) -> bool:
        """The holder is short of permits: give back what leases in groups with
        nothing queued have not drawn. True if any was given back."""
        leases = [lease for lease in self.ctx.lease_book.leases(key) if lease.undrawn > 0]
        if not leases:
            return False  # (no scan of the items for the groups waiting)
        idle = idle_to_return(leases, self.ctx.waiting_groups(key))
        for lease in idle:
            self.put_and_report(lease)
        return bool(idle)

    def after_contended(self, key: str, reply: Reply) -> None:
        """A holder short of permits gets back, at once, what idle leases hold undrawn."""
        self.ctx.memory.heard(key, reply)
        if reply.contended and self.return_idle(key):
            # Report what that stopped now, not after the delay. Only then: a
            # shard that holds no idle lease has nothing to send, and an alarm
            # woken for nothing is still billed as a request.
            self.ctx.due_by(TimerKind.LEASE_REPORT, key, now_ms())

    def schedule_renewal(self) -> None:
        renewal = self.ctx.lease_book.earliest_renewal()
        if renewal is None:
            self.ctx.cancel(TimerKind.RENEW)
        else:
            self.ctx.due_at(TimerKind.RENEW, None, renewal)

    def stops_heard(self, reply: Reply) -> bool:
        """Does the reply retire a lease, or answer a report with anything but ``ok``?"""
        return any(o.status != OK for o in reply.lease_reports) or any(e.retired for e in reply.leases)

    # -- timers and reports ----------------------------------------------------------
    async def renew(self) -> None:
        """At half its lifetime a lease is reported again (``queue/pure/lease_rules.renewed``)."""
        def renew() -> None:
            now = now_ms()
            waiting: dict[str, set[str]] = {}
            for lease in self.ctx.lease_book.leases():
                if lease.renew_at > now:
                    continue
                if lease.key not in waiting:
                    waiting[lease.key] = self.ctx.waiting_groups(lease.key)
                self.put_and_report(renewed(lease, now, waiting[lease.key]))
            self.schedule_renewal()

        await self.ctx.commit(renew)
        await self.report_all()

    async def report(self, key: str) -> None:
        """Send the key's due lease reports (current counts) in one ``sync`` and apply the answer."""
        ctx, memory = self.ctx, self.ctx.memory
        if key in memory.rejoining:  # the key's request, due now, carries them
            # (a backstop, should that request not be sent: reports in flight
            # are not repeated; the pump is due sooner, so the alarm stays)
            await ctx.commit(lambda: ctx.due_by(
                TimerKind.LEASE_REPORT, key, now_ms() + ctx.options.lease_report_delay_ms), move_alarm=False)
            return
        due = {i: v for i, (k, v) in memory.lease_due.items() if k == key and memory.leases_in_flight.get(i) != v}
        leases = {i: ctx.lease_book.lease(i) for i in sorted(due)}
        current = [lease for lease in leases.values() if lease is not None and lease.settled_at is None]
        # Settled or forgotten since: nothing left to say about those.
        self.reports_heard({i: due[i] for i, lease in leases.items() if lease not in current})
        current = current[:MAX_REPORTS]
        if not current:
            return

        def apply(reply: Reply) -> None:
            self.reports_heard({lease.lease_id: due[lease.lease_id] for lease in current})
            self.apply_outcomes(reply.lease_reports, now_ms())
            if reply.leases:
                self.learn(key, reply.leases, now_ms())
            self.after_contended(key, reply)
            if any(k == key for k, _ in ctx.memory.lease_due.values()):
                ctx.due_by(TimerKind.LEASE_REPORT, key, now_ms())  # more than one sync holds

        await ctx.exchange(key, Sync(ctx.client_id, (), tuple(lease_report(lease) for lease in current)), apply)

    async def report_all(self) -> None:
        """Send every due lease report now, of every key: a holder short of
        permits gets back the footprint of permits released here sooner
        (with jobs of 100 ms to 2 s, the limit is busy 2 to 3 points more
        of the time than when only the key at hand reports at once)."""
        for key in sorted({k for k, _ in self.ctx.memory.lease_due.values()}):
            await self.report_safely(key)

    async def report_safely(self, key: str) -> None:
        try:
            await self.report(key)
        except Exception as error:  # the lease report timer retries, with backoff
            log.warning("reporting leases of %s failed: %r; it will be retried", key, error)
            await self.ctx.commit(lambda: self.ctx.due_by(TimerKind.LEASE_REPORT, key, now_ms()))
