"""The queue's grants: claims on them, what the holder lists and answers about them, and their reports.

Lives here: ``QueueGrants``: claiming permits this object holds for its
oldest queued items, keeping what the holder lists of its grants
(``learn``), admitting on the claims the holder confirmed or sending
refused ones back in line (``apply_outcomes``, decided by
``queue/pure/core.settle``), and sending the grant reports the holder may not
have heard in one ``sync``. A grant's report is read from its items: the
claim's or release's own write is its durable copy, so no row is written
for a report; what the holder acknowledged is memory (a new instance
reports every grant with releases once more, and cumulative counts make a
repeat harmless). Must not know: leases beyond handing their part of a
reply on, the request a report may ride on, or SQL.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from ..._common.clock import now_ms
from ..messages import MAX_REPORTS, GrantEntry, Reply, Report, ReportOutcome, Sync
from .item_rows import ItemRow
from .leases import QueueLeases
from .memory import QueueContext
from .pure.core import report_due, settle, usable_claims
from .pure.states import ADMITTED, QUEUED, Item, LocalGrant, TimerKind, Via

log = logging.getLogger("durability.semaphore.queue")


class QueueGrants:
    def __init__(self, ctx: QueueContext, leases: QueueLeases, wake: Callable[[str, float, bool], None]) -> None:
        self.ctx = ctx
        self.leases = leases
        self._wake = wake

    # -- inside a commit -----------------------------------------------------------
    def claim(self, key: str, now: float) -> None:
        """Claim, for queued items, permits this object already holds unclaimed."""
        ctx = self.ctx
        reserved = ctx.reserved(key)
        for grant in ctx.grants.grants(key):
            if grant.claim_deadline <= now:
                if self.finished_here(grant, now):
                    ctx.grants.forget(grant.grant_id, now, grant.claimed)  # the holder takes it back
                    continue
                if grant.claimed == grant.confirmed == grant.released:
                    continue  # its last releases are still to be reported
            else:
                skip = reserved.get(grant.group, 0)
                items = ctx.store.oldest_queued(key, grant.group, grant.unclaimed, skip) if grant.unclaimed > 0 else []
                if items:
                    # The grant's claimed count is the claim's durable report
                    # (report sends it at once, and a new instance again);
                    # the claims hold the oldest queued items without a write.
                    reserved[grant.group] = skip + len(items)
                    ctx.grants.keep(replace(grant, claimed=grant.claimed + len(items)))

    def finished_here(self, grant: LocalGrant, now: float) -> bool:
        """Past its claim deadline, every claim answered and released, and the
        holder told: nothing about the grant is left to do here."""
        return (grant.claim_deadline <= now and grant.claimed == grant.confirmed == grant.released
                and not self.report_due(grant))

    def forget_finished(self, now: float) -> set[str]:
        """Forget the grants finished here that no pump came by to forget;
        the ids of the others, whose items their counts are made of."""
        held = set()
        for grant in self.ctx.grants.grants():
            if self.finished_here(grant, now):
                self.ctx.grants.forget(grant.grant_id, now, grant.claimed)
            else:
                held.add(grant.grant_id)
        return held

    def learn(self, key: str, entries: tuple[GrantEntry, ...], *, admits_after: bool = False) -> bool:
        """Keep what the holder lists of the key's grants (new grants, their
        permits and deadlines) and admit on the claims it confirmed: those a
        grant came with, and those an older instance made here and this one
        never knew (see grant_book). True if it gave back claims it heard of
        past their grant's claim deadline (its items wait for new permits).
        ``admits_after``: the caller hands what it admits to ``admit()``
        once its commit is done (``QueueContext.admit_in_this_event``)."""
        ctx = self.ctx
        gave_back = False  #: claims it heard of too late to take up: given back
        for entry in entries:
            if ctx.grants.stale(entry.grant_id, entry.claimed):
                continue  # a reply sent before it was settled here
            known = ctx.grants.grant(entry.grant_id)
            if known is None and entry.new is False and key in ctx.memory.asking:
                # Perhaps the grant the round made for the request on its way,
                # listed by an answer that overtook that request's reply: taken
                # as not new here, it would go back unused (its items waiting
                # for the key's fallback). The reply decides, or, if it does not
                # name it, this listing once the reply is in (decide_deferred).
                ctx.memory.deferred.setdefault(key, []).append(entry)
                continue
            if known is None:
                known = LocalGrant(entry.grant_id, key, entry.group, entry.permits, 0, 0, 0, entry.claim_deadline)
            learned = replace(known, permits=entry.permits, claim_deadline=entry.claim_deadline,
                              claimed=max(known.claimed, entry.claimed))
            unknown = entry.claimed - learned.confirmed  # confirmed there, no item here counts
            if unknown > 0:  # the listing is the holder's confirmation: admit on it now
                admitted = self.answer_claims(learned, usable_claims(entry, known, unknown, now_ms()), 0)
                learned = replace(learned, extra=learned.extra + unknown - admitted)  # no item left: given back
                if admitted and admits_after:
                    ctx.admit_in_this_event()
                elif admitted:
                    ctx.due_by(TimerKind.ADMIT, None, now_ms())
                if unknown > admitted:  # the holder hears at once of what went back
                    ctx.due_by(TimerKind.REPORT, key, now_ms())
                    gave_back = True
            if learned != known or not ctx.grants.knows_terms(entry.grant_id):
                ctx.grants.keep(learned)
            ctx.memory.heard_up_to[key] = max(ctx.memory.heard_up_to.get(key, 0.0), entry.claim_deadline)
        return gave_back

    def decide_deferred(self, key: str) -> bool:
        """The listings ``learn`` put off while a request was on its way,
        decided now that its reply is applied (or failed): a grant the reply
        named is known by now and changes nothing; one it did not is given
        back, as before. True if any claims went back (see ``learn``)."""
        entries = self.ctx.memory.deferred.pop(key, [])
        return self.learn(key, tuple(entries), admits_after=True) if entries else False

    def apply_outcomes(self, outcomes: tuple[ReportOutcome, ...], sent: dict[str, Report] | None = None) -> None:
        """Confirmed claims admit their items; claims the holder refused go back in line.

        ``sent``: the reports the answer is to, by grant id: whatever the
        holder answered, it has heard those released counts."""
        ctx = self.ctx
        admitted = False
        for outcome in outcomes:
            grant = ctx.grants.grant(outcome.grant_id)
            if grant is None:
                continue
            settlement = settle(grant, outcome)
            count = self.answer_claims(grant, settlement.admit, settlement.requeue)
            admitted = admitted or count > 0
            if settlement.forget:
                ctx.grants.forget(grant.grant_id, now_ms(), grant.claimed)
                ctx.memory.acked.pop(grant.grant_id, None)
            else:
                sent_report = (sent or {}).get(grant.grant_id)
                heard = outcome.released if sent_report is None else sent_report.released
                ctx.memory.acked[grant.grant_id] = max(ctx.memory.acked.get(grant.grant_id, 0), heard)
                # Confirmed claims with no queued item left (claims taken up
                # from an older instance) are released at once.
                extra = grant.extra + settlement.admit - count
                ctx.grants.keep(replace(settlement.grant, extra=extra))
            if settlement.requeue:
                self._wake(grant.key, now_ms(), False)
        if admitted:
            ctx.admit_in_this_event()

    def answer_claims(self, grant: LocalGrant, admit: int, requeue: int) -> int:
        """Admit ``admit`` of the items the grant's claims hold, oldest first,
        and let ``requeue`` more go back in line. Returns how many were
        admitted: fewer only if fewer items are queued.

        Items written as claiming by an older version come first; then the
        oldest queued items of the group, which claims hold in line order.
        (Claims on other grants of the group hold the next ones: any item
        the group's claims hold may be admitted by any of them.)
        """
        store = self.ctx.store
        rows = store.claiming(grant.grant_id) if grant.claiming_rows else []
        to_admit: list[Item | ItemRow] = list(rows[:admit])
        if len(to_admit) < admit:
            to_admit += store.oldest_queued(grant.key, grant.group, admit - len(to_admit))
        for item in to_admit:
            self.ctx.move(item, ADMITTED, grant.grant_id, Via.GRANT)
        for item in rows[admit:admit + requeue]:
            self.ctx.move(item, QUEUED)
        return len(to_admit)

    def learn_listed(self, key: str, reply: Reply) -> None:
        """The grants a sync's answer lists, learned (inside its commit), and
        claims on them: a grant a round made at that sync comes new in that
        answer only, so an answer to a lease report must not drop it."""
        self.learn(key, reply.grants, admits_after=True)  # (exchange hands them to admit() after its commit)
        claimed = {grant.grant_id: grant.claimed for grant in self.ctx.grants.grants(key)}
        self.claim(key, now_ms())
        if any(grant.claimed > claimed.get(grant.grant_id, 0) for grant in self.ctx.grants.grants(key)):
            self.ctx.due_by(TimerKind.REPORT, key, now_ms())  # claims on a listed grant go to the holder at once

    # -- reports ----------------------------------------------------------------------
    def report_due(self, grant: LocalGrant) -> bool:
        return report_due(grant, self.ctx.memory.acked.get(grant.grant_id, 0))

    def due_reports(self, key: str) -> dict[str, Report]:
        """The key's grant reports the holder may not have heard, by grant id."""
        grants = [g for g in self.ctx.grants.grants(key) if self.report_due(g)][:MAX_REPORTS]
        return {g.grant_id: Report(g.grant_id, g.claimed, g.released) for g in grants}

    async def report(self, key: str) -> None:
        """Send the key's due grant reports in one ``sync`` and apply the answer."""
        reports = self.due_reports(key)
        if not reports:
            return

        def apply(reply: Reply) -> None:  # (the grants it lists: learn_listed)
            self.apply_outcomes(reply.reports, reports)
            if reply.leases:  # leases retired since: stop drawing now
                self.leases.learn(key, reply.leases, now_ms())
            self.leases.after_contended(key, reply)
            if any(self.report_due(g) for g in self.ctx.grants.grants(key)):
                self.ctx.due_by(TimerKind.REPORT, key, now_ms())  # more than one sync holds

        await self.ctx.exchange(key, Sync(self.ctx.client_id, tuple(reports.values())), apply)

    async def report_safely(self, key: str) -> None:
        try:
            await self.report(key)
        except Exception as error:  # the report timer retries, with backoff
            log.warning("reporting grants of %s failed: %r; it will be retried", key, error)
            await self.ctx.commit(lambda: self.ctx.due_by(TimerKind.REPORT, key, now_ms()))

