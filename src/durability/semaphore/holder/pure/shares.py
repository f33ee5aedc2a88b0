"""How an allocation round shares its room among the demand it grants, pure.

Lives here: each granted demand's share (``item_shares``): every demand
whole when all of it fits; otherwise the items oldest first across
clients, or under a fair-share policy each key's allotment first
(``fair_allotment``; the rule itself lives in ``fairness``), each group
under its own ceiling. Must not know: which demand may lease, storage,
RPC or clocks.
"""

from __future__ import annotations

import itertools

from ...messages import Demand
from .fairness import Claimant, FairPolicy, allot
from .records import ResolutionFailed
from .round_terms import RoundState, RoundTerms, Wanted, _add


def item_shares(state: RoundState, terms: RoundTerms, granting: list[tuple[Wanted, Demand]]) -> list[int]:
    """How many permits each demand gets when the room goes to items oldest
    first across clients (``Demand.times``), not to each client's whole
    demand at its oldest item's turn; a demand without times stands in
    line at its oldest item with all of it. What a client holds for its
    demand covers its oldest items. With a fair policy (``terms.fair``),
    each key first gets its allotment (``fairness.allot``), and takes it
    oldest first. O(S log S) in the slices: at most
    ``MAX_TREE_DEMAND_TIMES`` + 1 per demand."""
    wants = [wanted.want for wanted, _ in granting]
    in_order = terms.fair is None and not any(demand.times for _, demand in granting)
    if in_order or _room_for_all(state, terms, granting):
        return wants
    assert terms.budgets is not None  # refusal() let only resolved limits through
    room_total = state.grant_room(terms.budgets)
    fair = terms.fair
    allotted = {} if fair is None else fair_allotment(state, fair, granting, room_total)
    room_groups: dict[str, int] = {}
    shares = [0] * len(granting)
    in_line = sorted(piece for position, entry in enumerate(granting) for piece in _slices(position, *entry))
    for _, index, count in in_line:
        if room_total <= 0:
            break
        wanted = granting[index][0]
        take = min(count, room_total)
        if fair is not None:  # the key's allotment bounds what its items take
            take = min(take, allotted.get(fair.key(wanted.group), 0))
        if wanted.ceiling is not None:
            assert not isinstance(wanted.ceiling, ResolutionFailed)
            left = room_groups.get(wanted.group)
            if left is None:
                left = state.group_room(wanted.group, wanted.ceiling, room_total)
            take = max(0, min(take, left))
            room_groups[wanted.group] = left - take
        if fair is not None:  # charged after the group's ceiling: what it cut stays the key's
            key = fair.key(wanted.group)
            allotted[key] = allotted.get(key, 0) - take
        shares[index] += take
        room_total -= take
    return shares


def fair_allotment(state: RoundState, fair: FairPolicy, granting: list[tuple[Wanted, Demand]],
                   room_total: int) -> dict[str, int]:
    """Permits per key this round: each key's demand capped by its groups'
    own ceilings, what its groups hold, and its oldest work, shared by
    ``fairness.allot``."""
    by_group: dict[str, int] = {}
    oldest: dict[str, float] = {}
    for wanted, demand in granting:
        _add(by_group, wanted.group, wanted.want)
        key = fair.key(wanted.group)
        oldest[key] = min(oldest.get(key, demand.oldest_at), demand.oldest_at)
    wants: dict[str, int] = {}
    ceilings = {wanted.group: wanted.ceiling for wanted, _ in granting}
    for group, want in by_group.items():
        ceiling = ceilings[group]
        room = room_total if not isinstance(ceiling, int) else state.group_room(group, ceiling, room_total)
        _add(wants, fair.key(group), max(0, min(want, room)))
    held: dict[str, int] = {}
    for group, charged in state.granted_groups.items():
        _add(held, fair.key(group), charged)
    return allot(room_total, (Claimant(key, held.get(key, 0), want, fair.share(key), oldest[key])
                              for key, want in wants.items()))


def _room_for_all(state: RoundState, terms: RoundTerms, granting: list[tuple[Wanted, Demand]]) -> bool:
    """Every demand fits, in the total and under each group's ceiling: no order to keep, nothing to sort."""
    assert terms.budgets is not None
    room_total = state.grant_room(terms.budgets)
    by_group: dict[str, int] = {}
    for wanted, _ in granting:
        _add(by_group, wanted.group, wanted.want)
    if sum(by_group.values()) > room_total:
        return False
    ceilings = {wanted.group: wanted.ceiling for wanted, _ in granting if isinstance(wanted.ceiling, int)}
    return all(by_group[group] <= state.group_room(group, ceiling, room_total) for group, ceiling in ceilings.items())


def _slices(index: int, wanted: Wanted, demand: Demand) -> list[tuple[float, int, int]]:
    """(time, index, count): a demand's wanted items by enqueue time, runs of
    one time together; the oldest ``count - want`` are covered already, and
    items past the times given stand at the last one."""
    times = demand.times or (demand.oldest_at,)
    known = times[demand.count - wanted.want:demand.count]
    if len(known) <= 1 or known[0] == known[-1]:  # one run: most demands
        return [(known[0] if known else times[-1], index, wanted.want)]
    runs = [(at, index, len(list(run))) for at, run in itertools.groupby(known)]
    if wanted.want > len(known):
        at, _, count = runs[-1]
        runs[-1] = (at, index, count + wanted.want - len(known))
    return runs
