"""Reclaim: what returns to the pool as time passes, and when to look next, pure.

Lives here: taking back permits not claimed by their deadline and
forgetting settled grants and leases (``reclaim``), the books as changes
leave them (``merged``, ``merged_leases``), and when the reclaim timer
must next run (``next_reclaim_at``). Must not know: how a round serves
demand, storage, timers or clocks; the holder reads the time and sets
the timer.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from .leases import Lease, LeaseIds, foreign, forget_settled
from .records import Changes, Grant, Working


def reclaim(working: Working, now: float, ids: LeaseIds | None = None,
            waiting: Collection[tuple[str, str]] = ()) -> None:
    """Take back permits not claimed by their deadline; drop grants left empty,
    and settled ones remembered long enough; forget settled leases likewise,
    and stop charging leases of another epoch unheard for their ttl.
    ``waiting``: the (client, group) rows whose client waits in line there."""
    grants = list(working.grants())
    idle = idle_kept_rows(grants, waiting)
    for grant in grants:
        if grant.unclaimed > 0 and grant.claim_deadline <= now:
            working.put(grant._replace(permits=grant.claimed, reclaimed=True))
        elif not grant.settled or grant.forget_at > now:
            continue
        elif not kept_for_rate(grant) or idle.get(_row(grant), now + 1) <= now:
            working.changes.delete(grant.grant_id)
    forget_settled(working, now, ids)


def kept_for_rate(grant: Grant) -> bool:
    """Settled, and kept only while a start rate counts it (``Grant.kept_until``).
    Such grants leave the book with the next write of their client's row
    (``forgotten_with_row``), which comes anyway while the client holds
    permits or waits there; a row with nothing else in it is forgotten
    once all of them are past (``idle_kept_rows``): a write per row then,
    where it would have been deleted at its last release, not one per grant."""
    return grant.settled and grant.kept_until > 0 and not (grant.reclaimed and grant.claimed > 0)


def forgotten_with_row(grants: Iterable[Grant], written_rows: set[tuple[str, str]], now: float) -> list[str]:
    """The grants a start rate kept that leave the book with the rows written now."""
    return [g.grant_id for g in grants if kept_for_rate(g) and g.forget_at <= now and _row(g) in written_rows]


def idle_kept_rows(grants: Iterable[Grant], waiting: Collection[tuple[str, str]] = ()) -> dict[tuple[str, str], float]:
    """Rows holding nothing but grants a start rate keeps, whose client waits
    in no line there: when the last of those grants may be forgotten."""
    grants = list(grants)
    busy = {_row(g) for g in grants if not kept_for_rate(g)} | set(waiting)
    last: dict[tuple[str, str], float] = {}
    for g in grants:
        if kept_for_rate(g) and _row(g) not in busy:
            last[_row(g)] = max(last.get(_row(g), 0.0), g.forget_at)
    return last


def _row(grant: Grant) -> tuple[str, str]:
    return grant.client_id, grant.group


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
                    ids: LeaseIds | None = None, waiting: Collection[tuple[str, str]] = ()) -> float | None:
    """When the reclaim timer must next run: unclaimed permits due back, a
    settled grant or lease to forget, or a lease of another epoch to stop
    charging (see ``reclaim``)."""
    grants = list(grants)
    due = [g.claim_deadline for g in grants if g.unclaimed > 0]
    due += [g.forget_at for g in grants if g.settled and not kept_for_rate(g)]
    due += list(idle_kept_rows(grants, waiting).values())
    due += [lease.expires_at for lease in leases if foreign(lease, ids)]
    return min(due) if due else None
