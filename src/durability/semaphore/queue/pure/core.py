"""The queue's decisions about grants, pacing, the line and retries, pure.

Lives here: the settlement of a grant's claims and releases by one report
outcome (``settle``), which grant reports the holder may not have heard
(``report_due``), the pacing interval kept in SQL (``pacing_interval``),
a key's waiting demand per group (``Wanted``, ``oldest_of``), whether a
served key may leave its holder's line until its next release
(``may_leave_line``), and whether a failed request is made again at once
or under the backoff (``ask_again_at_once``), and how many claims a
listing confirms that no item here counts may be used (``usable_claims``). The item life cycle is
``queue/pure/states``; the lease rules are ``queue/pure/lease_rules``. Must not
know: storage, timers, RPC or the clock; it imports only ``messages``,
``queue/pure/states`` and the standard library (tests/test_pure_modules.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ...messages import NOT_FOUND, OK, Demand, GrantEntry, ReportOutcome
from .states import LocalGrant


@dataclass(frozen=True)
class Settlement:
    """What one report outcome does to a grant held here."""

    grant: LocalGrant  #: the grant as it must be kept (ignored when ``forget``)
    admit: int  #: this many of its claiming items, oldest first, are admitted now
    requeue: int  #: the next this many go back in line: their claims can never be confirmed
    forget: bool  #: settled here and at the holder: its row goes


def settle(grant: LocalGrant, outcome: ReportOutcome) -> Settlement:
    """Apply the holder's answer about ``grant``.

    Confirmed claims only grow, and never past what was claimed here. A
    grant the holder no longer knows (``not_found``) confirms nothing more;
    any other refusal, or claims beyond the permits the holder says the grant
    has (its permits never grow), sends the unconfirmed claims back in line.
    """
    if outcome.status == NOT_FOUND:
        confirmed, permits = grant.confirmed, grant.permits
    else:
        confirmed, permits = max(grant.confirmed, min(outcome.claimed, grant.claimed)), outcome.permits
    if outcome.status != OK:
        refused = grant.claimed - confirmed
    else:
        refused = max(0, grant.claimed - max(confirmed, outcome.permits))
    settled_grant = replace(grant, claimed=grant.claimed - refused, confirmed=confirmed, permits=permits)
    at_holder = outcome.status == NOT_FOUND or outcome.released == outcome.permits == settled_grant.released
    here = settled_grant.released >= settled_grant.confirmed and settled_grant.claimed == settled_grant.confirmed
    return Settlement(settled_grant, confirmed - grant.confirmed, refused, at_holder and here)


def report_due(grant: LocalGrant, heard_released: int) -> bool:
    """Does the holder still need to hear about ``grant``: claims it has not
    confirmed, or releases beyond the count it confirmed hearing?"""
    return grant.claimed > grant.confirmed or grant.released > heard_released


def pacing_interval(ms: float) -> float:
    """The holder's pacing as kept in SQL: whole seconds, rounded up, so that
    it is written once per key rather than on every reply (replies arrive a
    few ms apart from the holder's clock) and a new instance never asks early."""
    return max(0.0, math.ceil(ms / 1000) * 1000)


Wanted = list[Demand]  #: per group, what waits for permits, oldest group first


def oldest_of(demand: Wanted) -> dict[str, float]:
    """Per group, the enqueue time of the oldest item of ``demand``."""
    return {d.group: d.oldest_at for d in demand}


def may_leave_line(line: dict[str, float], left: dict[str, float]) -> bool:
    """May a key just served leave its holder's line until its next release?

    ``left``: per group, the oldest item still waiting here; ``line``: per
    group, the mark the holder's answer gave (``allocation.line_ahead``):
    at least as many items of other clients as the group has permits are
    that old or older, so about a job's length of releases comes before
    this key's turn. A held request is how a key keeps its place, and each
    one is billed: a key behind the mark in every group it waits in asks
    again with its next release (the request carries the report, see
    ``queue.py``) instead of at once.
    """
    return bool(left) and all(group in line and oldest >= line[group] for group, oldest in left.items())


#: a fallback due within this long before now is due still: an alarm fires a
#: moment after the time it was set for, and the schedule must not skip it
FALLBACK_SLACK_MS = 1_000


def grid_at_or_after(at: float, every_ms: float, phase_ms: float) -> float:
    """The first point ``phase_ms + k * every_ms`` (``k`` an integer) at or after ``at``."""
    return phase_ms + math.ceil((at - phase_ms) / every_ms) * every_ms


def fallback_at(demand: Wanted, every_ms: float, now: float, phase_ms: float = 0.0) -> float:
    """When a new instance's key whose request a holder parked asks again by
    itself: the object's first fallback point (``phase_ms`` plus a multiple
    of ``every_ms``) that is not past; now, with no demand (it asks to hear
    what it holds). A function of the clock and the object alone, so every
    instance derives the same time, and every key of the object the same
    one: while work waits, one alarm run per ``every_ms`` asks for all of
    them, however often the object hibernates, and no row is written."""
    if not demand or every_ms <= 0:
        return now
    return grid_at_or_after(now - FALLBACK_SLACK_MS, every_ms, phase_ms)


#: a request that failed after this long in flight had reached the holder and
#: waited there: the holder restarted under it, or its reply was lost
REACHED_MS = 1_000
#: failures in a row made again at once, however they failed; then the backoff
AT_ONCE_IN_A_ROW = 3


def ask_again_at_once(retryable: bool, in_flight_ms: float, timed_out: bool, failures_before: int) -> bool:
    """Whether a failed request is made again now instead of under the backoff.

    The first failure in a row is made again at once, whatever it was (lost
    on the way, most often). So is one that reached the holder and failed
    there (a restart under it, a lost reply): that says nothing against
    asking again, back in line before the holder's next rounds, where a
    backoff would leave younger work served first. A request that timed out
    is not taken to have reached it (the holder may hang), and after
    ``AT_ONCE_IN_A_ROW`` failures in a row the backoff applies anyway: it is
    for a holder that stays out of reach, or fails every request it takes.
    """
    if not retryable:
        return False  # a refusal, or a failure of this object's own: the backoff
    if failures_before == 0:
        return True
    reached = in_flight_ms >= REACHED_MS and not timed_out
    return reached and failures_before < AT_ONCE_IN_A_ROW


def usable_claims(entry: GrantEntry, known: LocalGrant, unknown: int, now: float) -> int:
    """Of the ``unknown`` claims a listing confirms that no item here counts
    (``known``: the grant as this instance had it), how many this object may
    admit on; the rest it gives back.

    Releases the holder heard beyond those counted here were of items this
    object deleted and then forgot (keep_done_ms 0, a new instance): their
    permits may be anyone's by now. A claim left is as good as an unclaimed
    permit, and no better: used until the grant's claim deadline, given
    back after it (an older claim may be one an earlier instance used and
    lost the record of, again and again across restarts). And of a grant
    listed before (``entry.new`` False), only the claims this instance made
    itself are used: the others an earlier instance may have admitted on
    and released with its report still on the way, or the holder may have
    heard that report after this listing left; used again, they would run
    beyond the limit. A grant a round just made comes to one instance first,
    claimed for the request it answers, and no instance has used it.
    """
    if now > entry.claim_deadline:
        return 0
    usable = unknown - min(unknown, max(0, entry.released - known.released))
    if entry.new is False:  # (None: a holder of an older version, which does not say)
        usable = min(usable, known.claimed - known.confirmed)
    return usable
