"""What changes a holder's books between rounds: a client's sync, its answer to a call, the reclaim on the alarm.

Lives here: a sync (its reports applied and committed at once, the
leases past their ttl and those a lowered limit or a lost eligibility
retires, a round where a tree's permits came back and requests wait, and
its reply: the reports' outcomes, the leases to stop drawing from, and
the client's grants); the lease reports on a client's answer to a call,
applied as a sync's are; and the reclaim on the alarm, which counts the
claims of requests still waiting for their round first. Functions of the
holder, kept out of its class for size. Must not know: how a round
decides (``allocation``), or how messages look on the wire
(``messages``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..._common.clock import now_ms
from ..messages import MAX_REPORTS, LeaseOutcome, ProtocolError, Reply, ReportOutcome, Request, Sync
from .pure.allocation import Working, apply_all_reports, apply_reports, held_grants, reclaim
from .pure.leases import lease_usage, retire_expired, retire_ineligible
from .replies import _grant_entry, _lease_entry
from .rounds import _news, _round_if_waiting

if TYPE_CHECKING:
    from .shell import DurabilitySemaphore

log = logging.getLogger("durability.semaphore")


async def _sync(holder: DurabilitySemaphore, sync: Sync) -> dict[str, Any]:
    working = Working(holder.books.grants(), holder.books.leases())
    now = now_ms()
    ids = holder.books.lease_ids()
    try:
        outcomes, lease_outcomes = apply_all_reports(
            working, sync.client_id, sync.reports, sync.lease_reports, ids, now, ids.ttl_ms)
    except ProtocolError as error:
        return error.reply()
    _retire_leases(holder, working, now)
    if working.changes:
        holder._commit(working.changes)
        await holder.scheduler.sync()
    holder.tree.after_sync(sync.client_id)
    if working.changes and (holder.tree.has_parent or holder.tree.is_child(sync.client_id)):
        _round_if_waiting(holder)
    holder.tree.after_change()
    if holder._parked is not None:
        holder._parked.heard(sync.client_id)
        if working.changes:  # permits may have come back: the reply lists what the round grants the client
            await _news(holder, None if holder.lease_policy is not None else sync.client_id)
    return _synced_reply(holder, sync.client_id, outcomes, lease_outcomes)


def _retire_leases(holder: DurabilitySemaphore, working: Working, now: float) -> None:
    """On a sync, the leases past their ttl, and those a lowered limit or a
    lost eligibility retires: the client hears on its next exchange of any
    kind, not only on its next request."""
    retire_expired(working, now)
    if any(not lease.retired for lease in working.leases()):
        limits = holder._resolve_limits([])
        retire_ineligible(working, holder.lease_policy, limits.total, limits.groups, limits.permitted)


def _synced_reply(holder: DurabilitySemaphore, client_id: str, outcomes: list[ReportOutcome],
                  lease_outcomes: list[LeaseOutcome]) -> dict[str, Any]:
    """A sync's reply: its reports' outcomes, the client's leases to stop
    drawing from, and its grants (new ones a round just made included)."""
    working = Working(holder.books.grants(), holder.books.leases())
    ttl_ms = holder.lease_policy.ttl_ms if holder.lease_policy is not None else 0
    stopping = [lease for lease in working.leases()
                if lease.client_id == client_id and lease.retired and not lease.settled]
    listed = [g for g in working.grants() if g.client_id == client_id and g.unclaimed > 0]
    listed += held_grants(working, client_id)
    if holder._parked is not None:  # (see _uncarried)
        carried = holder._parked.calls.carried(client_id)
        listed = [g for g in listed if g.grant_id not in carried]
    listed = listed[:MAX_REPORTS]
    first = holder.books.first_listing(g.grant_id for g in listed)
    return Reply("synced", tuple(outcomes), tuple(lease_outcomes),
                 tuple(_lease_entry(lease, ttl_ms) for lease in stopping[:MAX_REPORTS]), holder._contended,
                 grants=tuple(_grant_entry(g, first) for g in listed),
                 **holder.tree.limits_for(client_id),
                 ).to_wire()


def _take_answer_reports(holder: DurabilitySemaphore, answer: Request) -> bool | None:
    """The lease reports on a client's answer to a call (what it drew from
    the leases the call brought, and released since), applied as a sync's
    are, with nobody to tell the outcome (a later listing says what
    changed). Without them the books would show a lease drawn at once as
    drawable still, and the client's older work would wait out of the
    rounds until its next report. True if permits came back; None if the
    reports were refused (a lease not the client's, say): the answer then
    changes nothing."""
    if not answer.lease_reports or holder.lease_policy is None:
        return False
    working = Working(holder.books.grants(), holder.books.leases())
    ids = holder.books.lease_ids()
    before = lease_usage(holder.books.leases().values())[0]
    try:
        apply_all_reports(working, answer.client_id, (), answer.lease_reports, ids, now_ms(), ids.ttl_ms)
    except ProtocolError as error:
        log.warning("semaphore: %s answered a call with reports refused: %s", answer.client_id, error)
        return None
    if not working.changes:
        return False
    holder._commit(working.changes)
    return lease_usage(holder.books.leases().values())[0] < before


async def _reclaim(holder: DurabilitySemaphore) -> None:
    working = Working(holder.books.grants(), holder.books.leases())
    # A claim that reached the holder before the deadline counts, even if
    # its request still waits for a round: apply those claims first.
    for waiting in holder._waiting:
        try:
            apply_reports(working, waiting.request.client_id, waiting.request.reports)
        except ProtocolError:
            pass  # refused to its sender when its round runs
    reclaim(working, now_ms(), holder.books.lease_ids(), holder._parked.line.rows() if holder._parked else ())
    holder._commit(working.changes)
    if working.changes:
        await _news(holder)  # permits came back
