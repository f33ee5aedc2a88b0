"""What an allocation round decides under, and what it has decided so far, pure.

Lives here: the round's terms, the same from its first phase to its last
(``RoundTerms``, with the budgets ``budgets_for`` derives from the
limit), its state, added to phase by phase (``RoundState``), and one
client's demand in one group net of what it holds there (``Wanted``).
Must not know: the phases' rules, storage, RPC or clocks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ...messages import ProtocolError, Request
from .fairness import FairPolicy
from .leases import Budgets, LeaseIds, LeasePolicy, no_leases
from .rate import Rate
from .records import ClientOutcome, Grant, Limits, ResolutionFailed, Working


def _add(counts: dict[Any, int], key: Any, amount: int) -> None:
    counts[key] = counts.get(key, 0) + amount


def budgets_for(policy: LeasePolicy | None, total: int | ResolutionFailed) -> Budgets | None:
    """What the round may hand out; None when the limit did not resolve."""
    if not isinstance(total, int):
        return None
    return policy.budgets(total) if policy is not None else no_leases(total)


@dataclass(frozen=True)
class RoundTerms:
    """What one round decides under, the same from its first phase to its last."""

    limits: Limits
    now: float
    grant_timeout_ms: float
    new_grant_id: Callable[[], str]
    policy: LeasePolicy | None
    lease_ids: LeaseIds  #: as the holder last committed them; the round's ids follow
    budgets: Budgets | None  #: None: the limit did not resolve, nothing is handed out
    #: indexes of requests held over from an earlier round: their reports
    #: were heard then, and are no heartbeat now (the client may be gone since)
    held_over: frozenset[int] = frozenset()
    fair: FairPolicy | None = None  #: how keys share the room (None: oldest first)
    rate: Rate | None = None  #: the key's start rate (None: none)
    group_rates: Mapping[str, Rate] = field(default_factory=dict)  #: the groups' own start rates
    #: grant id -> when the holder knew its client had heard of it (``rate.started_by``)
    placed: Mapping[str, float] = field(default_factory=dict)
    pace_room: int | None = None  #: what the key rate's pace lets start now (``rate.Pace``)
    group_pace_room: Mapping[str, int] = field(default_factory=dict)  #: the same per group rate

    def kept_for_ms(self, group: str) -> float:
        """How long past its start a grant of ``group`` counts in a window (0: no rate counts it)."""
        periods = [r.period_ms for r in (self.rate, self.group_rates.get(group)) if r is not None]
        return max(periods, default=0.0)

    @property
    def ttl_ms(self) -> float:
        """A lease's ttl; with leases off, the one that bounds leases of another epoch."""
        return self.policy.ttl_ms if self.policy is not None else self.lease_ids.ttl_ms


@dataclass
class RoundState:
    """A round's decisions so far, added to phase by phase.

    All of it is the round's own: ``Working`` keeps the changes apart from
    the books it reads, and the count of lease ids issued is kept here, so
    the books and the ``LeaseIds`` the round was given stay as they were.
    """

    working: Working
    issued: int  #: lease ids issued, this round's included
    outcomes: dict[str, ClientOutcome] = field(default_factory=dict)
    errors: dict[int, ProtocolError] = field(default_factory=dict)  #: request index -> why it was refused
    latest: dict[str, Request] = field(default_factory=dict)  #: the request each client is served by
    arrival: dict[str, int] = field(default_factory=dict)  #: the index of each client's first request
    granted: int = 0  #: permits charged to grants, this round's included
    granted_groups: dict[str, int] = field(default_factory=dict)
    leased: int = 0  #: lease footprint, this round's included
    leased_groups: dict[str, int] = field(default_factory=dict)
    #: each served client's ``held_of`` before the round's new grants: its
    #: reply lists these with the new ones, so the book is read for it once
    held: dict[str, list[Grant]] = field(default_factory=dict)
    rate_left: int | None = None  #: permits the key's start rate lets this round grant still (None: no rate)
    group_rate_left: dict[str, int] = field(default_factory=dict)  #: the same per group with a rate

    def grant_room(self, budgets: Budgets) -> int:
        """Room for grants in the total: under the limit, and the start rate."""
        room = budgets.grant_room(self.granted, self.leased)
        return room if self.rate_left is None else min(room, self.rate_left)

    def group_room(self, group: str, ceiling: int | None, room_total: int) -> int:
        """Room under the group's own ceiling; with none, the room in the total."""
        if ceiling is None:
            return room_total
        return ceiling - self.granted_groups.get(group, 0) - self.leased_groups.get(group, 0)


class Wanted(NamedTuple):
    """One client's demand in one group, net of what it holds there already
    (a tuple: a round makes one per demand, and a frozen dataclass costs
    several times more to make)."""

    client_id: str
    group: str
    want: int
    ceiling: int | None | ResolutionFailed  #: the group's own limit (None: none)
