"""The queue's lease rules, pure: the client-side twin of ``leases.py``.

Lives here: what a lease listed by the holder becomes here (taken up,
stopped, or known already), what the holder's answer to a lease report
does to it (``after_outcome``), when a lease is reported again, which
leases go back when the holder is short, and a lease's report as the
holder is told it. Must not know: storage, timers, RPC or the clock
(``now`` is passed in); it imports only ``messages``, the queue's states
and the standard library.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import Enum

from ...messages import RETIRED, SETTLED, LeaseEntry, LeaseOutcome, LeaseReport
from .states import LocalLease

MIN_RENEW_MS = 1_000  # a lease listed with no ttl (leases turned off) is not renewed in a tight loop


def renew_at(now: float, ttl_ms: float) -> float:
    """Half a lease's lifetime from now: reported then, it never reaches its ttl unreported."""
    return now + max(ttl_ms / 2, MIN_RENEW_MS)


def lease_report(lease: LocalLease) -> LeaseReport:
    """The lease's current counts, as the holder is told them."""
    return LeaseReport(lease.lease_id, lease.group, lease.permits, lease.drawn, lease.released, lease.stopped)


def with_heard_draws(lease: LocalLease, heard_drawn: int) -> LocalLease:
    """The holder heard of more draws than this instance counts: an older
    one made them, and their items are gone, so each was released (see
    lease_book). The holder heard no more draws than were made: every one
    it heard of beyond those counted here is one whose item went."""
    if heard_drawn <= lease.drawn:
        return lease
    # (A lease known from its items only took its permits as their count.)
    return replace(lease, permits=max(lease.permits, heard_drawn), drawn=heard_drawn,
                   released=heard_drawn - lease.in_use)


def may_take_up(entry: LeaseEntry, listed_all: bool, waiting_groups: Callable[[], set[str]]) -> bool:
    """May a listed lease unknown here be drawn from? Only one issued for
    this instance's own request: any other may have been drawn from by an
    older instance whose items are gone (its draws' numbers with them), so
    it goes back, as one with nothing queued in its group does. (A holder
    that does not list every lease marks none new; its listing holds
    only leases nothing was drawn from, while every drawn item is kept.)
    ``waiting_groups`` is called only if the answer depends on it (it scans
    the items)."""
    if listed_all and not entry.new:
        return False
    return entry.drawn == 0 and entry.group in waiting_groups()


def taken_up(key: str, entry: LeaseEntry, now: float, may_draw: bool) -> LocalLease:
    """A listed lease unknown here, as it is kept: stopped unless it may be drawn from."""
    lease = LocalLease(entry.lease_id, key, entry.group, entry.permits, 0, 0, entry.retired or not may_draw,
                       entry.ttl_ms, renew_at(now, entry.ttl_ms), None)
    # Drawn from by an older instance with no item here left: each draw was
    # released (its item deleted), and it settles with the report.
    return with_heard_draws(lease, entry.drawn)


class Then(Enum):
    """What to do with a lease after the holder's answer about it."""

    FORGET = "forget"  #: settled at the holder, every draw released: forget it (its items may go)
    REPORT = "report"  #: keep it and report it again (a stop the holder must hear)
    KEEP = "keep"  #: keep it as it now is
    NOTHING = "nothing"  #: it is as it was


@dataclass(frozen=True)
class LeaseAnswer:
    lease: LocalLease
    then: Then


def after_outcome(known: LocalLease, outcome: LeaseOutcome, now: float) -> LeaseAnswer:
    """The holder answered a report of ``known`` (a lease held here, not settled)."""
    lease = with_heard_draws(known, outcome.drawn)
    renewed = lease
    if lease.renew_at < now + lease.ttl_ms / 4:
        # Heard: the next report may wait half a lifetime. A renewal still
        # far off is kept (one row write fewer; it only comes early).
        renewed = replace(lease, renew_at=renew_at(now, lease.ttl_ms))
    if outcome.status == SETTLED:
        if lease.released == lease.drawn:
            return LeaseAnswer(lease, Then.FORGET)
        renewed = replace(renewed, stopped=True)  # the holder gave up its part; draw nothing more, report releases
    elif outcome.status == RETIRED:
        renewed = replace(renewed, stopped=True)
        if not lease.stopped or lease.released == lease.drawn:
            return LeaseAnswer(renewed, Then.REPORT)  # reported until the holder settles it
    return LeaseAnswer(renewed, Then.KEEP if renewed != known else Then.NOTHING)


def idle_to_return(leases: Iterable[LocalLease], waiting_groups: set[str]) -> list[LocalLease]:
    """The holder is short of permits: the leases with undrawn permits in a
    group with nothing waiting here, stopped (their undrawn permits go back)."""
    return [replace(lease, stopped=True) for lease in leases
            if lease.undrawn > 0 and lease.group not in waiting_groups]


def renewed(lease: LocalLease, now: float, waiting_groups: set[str]) -> LocalLease:
    """A lease at half its lifetime, as it is reported again: one with permits
    in use keeps them counted; one idle with nothing queued goes back."""
    idle = lease.in_use == 0 and lease.group not in waiting_groups
    return replace(lease, stopped=lease.stopped or idle, renew_at=renew_at(now, lease.ttl_ms))
