"""The grant book and the records an allocation round reads and returns, pure.

Lives here: the grant (``Grant``) and its accounting, below; the changes
a round or a report decides (``Changes``) and the copy-on-write view of
the books they are decided over (``Working``); what the grants charge
(``usage``); the limits a round is given (``Limits``, with
``ResolutionFailed`` for a callback that raised) and what it returns
(``ClientOutcome`` per client, ``RoundResult``). Must not know: how a
round or a report decides, storage, RPC or clocks.

Accounting. A grant holds ``permits`` for one (client, group). The client
reports ``claimed`` (permits it used) and ``released`` (claimed permits it
gave back) as cumulative high-water marks. The holder keeps each count at the
highest value it was told, clamped to the grant (``released <= claimed <=
permits``), so a lost, repeated or reordered report never frees capacity
twice. A grant charges ``permits - released`` against the limit: its permits
in use plus those still reserved for claiming. At its claim deadline the
unclaimed rest returns to the pool (``permits`` shrinks to ``claimed``); a
grant whose permits are all released is settled and removed, except one
that was reclaimed after some of its permits were claimed: it stays,
settled, for ``SETTLED_MEMORY_MS`` past its deadline, so that a claim
arriving late is answered ``expired`` with the clamped count (``not_found``
is kept for grants on which nothing was claimed).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from ...messages import LeaseOutcome, ProtocolError, ReportOutcome
from .leases import SETTLED_MEMORY_MS, Lease, tally


class Grant(NamedTuple):
    """Permits lent to one (client, group): immutable, changed by making a new
    one. A named tuple, not a frozen dataclass: a round makes one per report
    that moves a count and one per new grant, and a tuple is built in a third
    of the time (10,000 clients: about 19,000 per round)."""

    grant_id: str
    client_id: str
    group: str
    permits: int
    claimed: int
    released: int
    claim_deadline: float  #: epoch ms when unclaimed permits return to the pool
    reclaimed: bool = False  #: the unclaimed rest was taken back
    #: under a start rate, kept in the book settled until then: its starts
    #: count in the rate's window (``holder/pure/rate``); 0: not kept
    kept_until: float = 0.0
    #: under a start rate, when the holder knew its client had heard of it
    #: (its starts came before; ``holder/pure/rate.started_by``); 0: not known
    placed_at: float = 0.0

    @property
    def unclaimed(self) -> int:
        return self.permits - self.claimed

    @property
    def charged(self) -> int:
        return self.permits - self.released

    @property
    def settled(self) -> bool:
        return self.released == self.permits

    @property
    def remembered(self) -> bool:
        """Kept in the book once settled: reclaimed after claims (see the module
        notes), or counted by a start rate."""
        return (self.reclaimed and self.claimed > 0) or self.kept_until > 0

    @property
    def forget_at(self) -> float:
        if self.kept_until and not (self.reclaimed and self.claimed > 0):
            return self.kept_until
        return max(self.claim_deadline + SETTLED_MEMORY_MS, self.kept_until)

    def counted(self, claimed: int, released: int) -> Grant:
        """This grant with new counts (``_replace`` does the same, at twice the cost)."""
        return Grant(self.grant_id, self.client_id, self.group, self.permits, claimed, released,
                     self.claim_deadline, self.reclaimed, self.kept_until, self.placed_at)


@dataclass
class Changes:
    """Grants and leases to write and to delete, in the order they were decided,
    and the new count of lease ids issued (None: unchanged)."""

    written: dict[str, Grant] = field(default_factory=dict)
    deleted: dict[str, None] = field(default_factory=dict)
    leases_written: dict[str, Lease] = field(default_factory=dict)
    leases_deleted: dict[str, None] = field(default_factory=dict)
    issued: int | None = None

    def put(self, grant: Grant) -> None:
        self.deleted.pop(grant.grant_id, None)
        self.written[grant.grant_id] = grant

    def delete(self, grant_id: str) -> None:
        self.written.pop(grant_id, None)
        self.deleted[grant_id] = None

    def put_lease(self, lease: Lease) -> None:
        self.leases_deleted.pop(lease.lease_id, None)
        self.leases_written[lease.lease_id] = lease

    def delete_lease(self, lease_id: str) -> None:
        self.leases_written.pop(lease_id, None)
        self.leases_deleted[lease_id] = None

    def apply_to(self, book: dict[str, Grant], leases: dict[str, Lease] | None = None) -> None:
        for grant_id in self.deleted:
            book.pop(grant_id, None)
        book.update(self.written)
        if leases is not None:
            for lease_id in self.leases_deleted:
                leases.pop(lease_id, None)
            leases.update(self.leases_written)

    def __bool__(self) -> bool:
        return bool(self.written or self.deleted or self.leases_written or self.leases_deleted
                    or self.issued is not None)


class Working:
    """A copy-on-write view of the book while a round or a report decides changes."""

    def __init__(self, book: dict[str, Grant], leases: dict[str, Lease] | None = None) -> None:
        self.book = book
        self.lease_book = leases if leases is not None else {}
        self.changes = Changes()

    def get(self, grant_id: str) -> Grant | None:
        if grant_id in self.changes.deleted:
            return None
        return self.changes.written.get(grant_id) or self.book.get(grant_id)

    def put(self, grant: Grant) -> None:
        if grant.settled and not grant.remembered:
            self.changes.delete(grant.grant_id)
        else:
            self.changes.put(grant)

    def grants(self) -> Iterable[Grant]:
        for grant_id, grant in self.book.items():
            if grant_id not in self.changes.deleted and grant_id not in self.changes.written:
                yield grant
        yield from self.changes.written.values()

    def get_lease(self, lease_id: str) -> Lease | None:
        if lease_id in self.changes.leases_deleted:
            return None
        return self.changes.leases_written.get(lease_id) or self.lease_book.get(lease_id)

    def put_lease(self, lease: Lease) -> None:
        if lease.settled:
            self.changes.delete_lease(lease.lease_id)
        else:
            self.changes.put_lease(lease)

    def leases(self) -> Iterable[Lease]:
        changes = self.changes
        for lease_id, lease in self.lease_book.items():
            if lease_id not in changes.leases_deleted and lease_id not in changes.leases_written:
                yield lease
        yield from changes.leases_written.values()


class ResolutionFailed:
    """A limit callback raised: the groups it governs fail closed."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __repr__(self) -> str:
        return f"ResolutionFailed({self.error!r})"


@dataclass(frozen=True)
class Limits:
    """Everything the user's callbacks said for one round, resolved in advance."""

    total: int | ResolutionFailed
    groups: dict[str, int | None | ResolutionFailed]  #: None: no limit of its own
    permitted: dict[tuple[str, str], bool]  #: can_grant per (client, group)


@dataclass
class ClientOutcome:
    """What one client learns from a round."""

    reports: list[ReportOutcome] = field(default_factory=list)
    new_grants: list[Grant] = field(default_factory=list)
    open_grants: list[Grant] = field(default_factory=list)  #: every grant with unclaimed permits
    #: grants with claims not all released: listed so that a client that lost
    #: its record of a claim (a crash after the holder confirmed it) learns it
    held_grants: list[Grant] = field(default_factory=list)
    blocked: dict[str, tuple[str, int]] = field(default_factory=dict)  #: group -> (reason, waiting)
    lease_reports: list[LeaseOutcome] = field(default_factory=list)
    new_leases: list[Lease] = field(default_factory=list)
    #: the client's leases not settled, new or not: a lease in a lost reply
    #: reaches it with the next one, and a new instance hears of leases an
    #: older one drew from and kept no item of (it takes them as stopped)
    listed_leases: list[Lease] = field(default_factory=list)
    #: the holder left some of the client's leases out of ``listed_leases``
    #: (a call on its way lists them): the reply does not list them all
    some_leases_unlisted: bool = False


@dataclass
class RoundResult:
    """What a round decided. The holder applies ``changes`` (the new count of
    lease ids issued, ``changes.issued``, included): the round itself changed
    nothing it was given."""

    changes: Changes
    outcomes: dict[str, ClientOutcome]
    errors: dict[int, ProtocolError]  #: request index -> why it was refused
    contended: bool = False  #: demand was left waiting for capacity


def usage(grants: Iterable[Grant]) -> tuple[int, dict[str, int]]:
    return tally((grant.group, grant.charged) for grant in grants)
