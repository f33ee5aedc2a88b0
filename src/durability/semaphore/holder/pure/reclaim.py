"""Reclaim: what returns to the pool as time passes, and when to look next, pure.

Lives here: taking back permits not claimed by their deadline and
forgetting settled grants and leases (``reclaim``), the books as changes
leave them (``merged``, ``merged_leases``), and when the reclaim timer
must next run (``next_reclaim_at``). Must not know: how a round serves
demand, storage, timers or clocks; the holder reads the time and sets
the timer.
"""

from __future__ import annotations

from collections.abc import Iterable

from .leases import Lease, LeaseIds, foreign, forget_settled
from .records import Changes, Grant, Working


def reclaim(working: Working, now: float, ids: LeaseIds | None = None) -> None:
    """Take back permits not claimed by their deadline; drop grants left empty,
    and settled ones remembered long enough; forget settled leases likewise,
    and stop charging leases of another epoch unheard for their ttl."""
    for grant in list(working.grants()):
        if grant.unclaimed > 0 and grant.claim_deadline <= now:
            working.put(grant._replace(permits=grant.claimed, reclaimed=True))
        elif grant.settled and grant.forget_at <= now:
            working.changes.delete(grant.grant_id)
    forget_settled(working, now, ids)


def merged(book: dict[str, Grant], changes: Changes) -> list[Grant]:
    """The grants as they stand once ``changes`` apply to ``book``."""
    working = Working(book)
    working.changes = changes
    return list(working.grants())


def merged_leases(leases: dict[str, Lease], changes: Changes) -> list[Lease]:
    """The leases as they stand once ``changes`` apply to ``leases``."""
    working = Working({}, leases)
    working.changes = changes
    return list(working.leases())


def next_reclaim_at(grants: Iterable[Grant], leases: Iterable[Lease] = (),
                    ids: LeaseIds | None = None) -> float | None:
    """When the reclaim timer must next run: unclaimed permits due back, a
    settled grant or lease to forget, or a lease of another epoch to stop
    charging (see ``reclaim``)."""
    due = [g.claim_deadline for g in grants if g.unclaimed > 0]
    due += [g.forget_at for g in grants if g.settled]
    due += [lease.expires_at for lease in leases if foreign(lease, ids)]
    return min(due) if due else None
