"""An allocation round's phases after the reports, pure.

Lives here: phase 2, retirement (``retire``); phase 3, grants, demand
oldest first across clients (``serve_grants``), each refused, granted or
set aside as a lease candidate; phase 4, leases from the lease budget
left after grants (``serve_leases``); phase 5, listing: the grants and
leases each reply lists (``list_for_replies``); and the round's result
(``result_of``). Phase 1, the reports, and the round as a whole
(``run_round``) are in ``allocation``; how the room is shared among
granted demand, in ``holder/pure/shares``. Must not know: storage, RPC,
clocks or the user's callbacks.
"""

from __future__ import annotations

from ...messages import GROUP_LIMIT, LIMIT, LIMIT_RESOLUTION_ERROR, MAX_REPORTS, NOT_PERMITTED, RATE, Demand
from .leases import Lease, lease_usage, retire_expired, retire_ineligible, share
from .news import held_by_client, held_of, unheard_grants
from .rate import rate_room
from .reclaim import reclaim
from .records import Grant, ResolutionFailed, RoundResult, usage
from .round_terms import RoundState, RoundTerms, Wanted, _add
from .shares import item_shares


def retire(state: RoundState, terms: RoundTerms) -> None:
    """Phase 2, retirement: unclaimed permits past their deadline come back;
    leases past their ttl, under a lowered limit or no longer eligible are
    retired. What is left is the usage the round hands out from."""
    limits = terms.limits
    waiting = {(client_id, d.group) for client_id, request in state.latest.items() for d in request.demand}
    reclaim(state.working, terms.now, terms.lease_ids, waiting)
    retire_expired(state.working, terms.now)
    retire_ineligible(state.working, terms.policy, limits.total, limits.groups, limits.permitted)
    state.granted, state.granted_groups = usage(state.working.grants())
    state.leased, state.leased_groups = lease_usage(state.working.leases())
    if terms.rate is not None:
        left = rate_room(state.working.grants(), terms.placed, terms.now, terms.rate)
        state.rate_left = left if terms.pace_room is None else min(left, terms.pace_room)
    for group, rate in terms.group_rates.items():
        left = rate_room((g for g in state.working.grants() if g.group == group), terms.placed, terms.now, rate)
        pace = terms.group_pace_room.get(group)
        state.group_rate_left[group] = left if pace is None else min(left, pace)


def held_for_demand(state: RoundState, now: float) -> dict[tuple[str, str], int]:
    """What each (client, group) holds that its demand already counts on:
    permits unclaimed, and claims made for it that it has not heard of yet
    while it may still take them up (a claim it hears of past the grant's
    claim deadline, it gives back: its demand waits for new permits).
    Keeps each client's held grants in ``state.held`` for its reply."""
    held: dict[tuple[str, str], int] = {}
    grants = list(state.working.grants())
    for grant in grants:
        if grant.unclaimed:
            _add(held, (grant.client_id, grant.group), grant.unclaimed)
    state.held = held_by_client(grants, state.outcomes)
    for client_id, request in state.latest.items():
        for grant in unheard_grants(request, state.held[client_id]):
            if grant.claim_deadline >= now:
                _add(held, (client_id, grant.group), grant.claimed - grant.released)
    return held


def oldest_first(state: RoundState) -> list[tuple[str, Demand]]:
    """Each client's demand, from its latest request, oldest first across all
    clients; ties go to the client that asked first, then to request order."""
    entries = sorted(
        (demand.oldest_at, state.arrival[client_id], position, client_id, demand)
        for client_id, request in state.latest.items()
        for position, demand in enumerate(request.demand)
    )
    return [(client_id, demand) for _, _, _, client_id, demand in entries]


def refusal(state: RoundState, terms: RoundTerms, wanted: Wanted) -> str | None:
    """Why this demand gets nothing at all this round, if it does not."""
    if terms.budgets is None or isinstance(wanted.ceiling, ResolutionFailed):
        return LIMIT_RESOLUTION_ERROR
    if not terms.limits.permitted.get((wanted.client_id, wanted.group), True):
        return NOT_PERMITTED
    if (terms.rate is not None or wanted.group in terms.group_rates) and not state.latest[wanted.client_id].claims:
        # A client that claims in two steps starts when it hears its claim
        # confirmed, which may be any time later: no window could count it.
        return NOT_PERMITTED
    return None


def may_lease(state: RoundState, terms: RoundTerms, wanted: Wanted) -> bool:
    """Does this demand go to the lease candidates rather than to grants?"""
    policy = terms.policy
    return bool(policy is not None and state.latest[wanted.client_id].leases
                and policy.group_eligible(wanted.ceiling))


def serve_grants(state: RoundState, terms: RoundTerms) -> list[Wanted]:
    """Phase 3, grants: demand oldest first. Demand that can only take grants
    is granted now; demand that may lease is set aside, in order, as the
    lease candidates (unless it holds lease permits to draw there first)."""
    held = held_for_demand(state, terms.now)
    drawable = {(lease.client_id, lease.group) for lease in state.working.leases() if lease.drawable > 0}
    candidates: list[Wanted] = []
    granting: list[tuple[Wanted, Demand]] = []
    for client_id, demand in oldest_first(state):
        want = demand.count - held.get((client_id, demand.group), 0)
        if want <= 0:
            continue
        wanted = Wanted(client_id, demand.group, want, terms.limits.groups.get(demand.group))
        reason = refusal(state, terms, wanted)
        if reason is not None:
            state.outcomes[client_id].blocked[demand.group] = (reason, want)
        elif not may_lease(state, terms, wanted):
            granting.append((wanted, demand))
        elif (client_id, demand.group) not in drawable:
            candidates.append(wanted)
    shares = item_shares(state, terms, granting)
    for (wanted, _), most in zip(granting, shares):
        issue_grant(state, terms, wanted, most)
    return candidates


def issue_grant(state: RoundState, terms: RoundTerms, wanted: Wanted, most: int | None = None) -> None:
    """Grant what room there is, up to the want (and ``most``); the rest waits, with why."""
    # Only demand that refusal() let through gets here: its limits resolved.
    assert terms.budgets is not None and not isinstance(wanted.ceiling, ResolutionFailed)
    room_limit = terms.budgets.grant_room(state.granted, state.leased)
    room_total = state.grant_room(terms.budgets)
    room_group = state.group_room(wanted.group, wanted.ceiling, room_total)
    room_rate = state.group_rate_left.get(wanted.group, room_group)
    give = max(0, min(wanted.want, room_total, room_group, room_rate, wanted.want if most is None else most))
    outcome = state.outcomes[wanted.client_id]
    if give:
        # A client that takes what it is granted gets it claimed: the
        # reply is the confirmation, and no permit waits for a claim.
        claimed = give if state.latest[wanted.client_id].claims else 0
        deadline = terms.now + terms.grant_timeout_ms
        # Under a start rate the grant stays in the book, settled, while its
        # starts count in the window (``rate`` notes).
        kept_for = terms.kept_for_ms(wanted.group)
        kept_until = deadline + kept_for if kept_for else 0.0
        new = Grant(terms.new_grant_id(), wanted.client_id, wanted.group, give, claimed, 0, deadline,
                    False, kept_until)
        state.working.put(new)
        outcome.new_grants.append(new)
        state.granted += give
        _add(state.granted_groups, wanted.group, give)
        if state.rate_left is not None:
            state.rate_left -= give
        if wanted.group in state.group_rate_left:
            state.group_rate_left[wanted.group] -= give
    if give < wanted.want:
        reason = _held_back_by(wanted, room_limit, room_total, room_group, room_rate)
        outcome.blocked[wanted.group] = (reason, wanted.want - give)


def _held_back_by(wanted: Wanted, room_limit: int, room_total: int, room_group: int, room_rate: int) -> str:
    """Why a grant came short: the group's own start rate when it leaves less
    room than anything else; the group's own ceiling whenever it leaves no
    more room than the total does (a total below usage leaves none); else
    the key's start rate when it leaves less room than the limit; else the
    limit. (A reason that holds until permits come back needs no round
    before they do; one of a rate gets a round when its window allows.)"""
    if room_rate < min(room_group, room_total):
        return RATE  # the group's own rate, alone
    if wanted.ceiling is not None and room_group <= max(room_total, 0):
        return GROUP_LIMIT
    return RATE if room_total < room_limit else LIMIT


def serve_leases(state: RoundState, terms: RoundTerms, candidates: list[Wanted]) -> None:
    """Phase 4, leases: the lease budget left after grants, shared among the
    candidates oldest first; then grants for what those leases leave
    uncovered (in "over", from the limit the leases do not use)."""
    if not candidates:
        return
    # Candidates passed refusal() and may_lease(): the limit resolved, and leases are on.
    assert terms.budgets is not None and terms.policy is not None
    budget = max(0, terms.budgets.lease_room(state.granted, state.leased))
    sizes = share(budget, len(candidates), terms.policy.permits_per_lease)
    for wanted, size in zip(candidates, sizes):
        issue_lease(state, terms, wanted, size)
    for wanted in candidates:
        new_leases = state.outcomes[wanted.client_id].new_leases
        covered = sum(lease.permits for lease in new_leases if lease.group == wanted.group)
        if wanted.want > covered:
            issue_grant(state, terms, wanted._replace(want=wanted.want - covered))


def issue_lease(state: RoundState, terms: RoundTerms, wanted: Wanted, size: int) -> None:
    """A lease of ``size`` permits, or fewer under the group's own ceiling."""
    # As in serve_leases: every limit resolved, and leases are on.
    assert terms.policy is not None and isinstance(terms.limits.total, int)
    assert not isinstance(wanted.ceiling, ResolutionFailed)
    give = max(0, min(size, state.group_room(wanted.group, wanted.ceiling, size)))
    if not give:
        return
    state.issued += 1
    lease = Lease(terms.lease_ids.nth(state.issued), wanted.client_id, wanted.group, give, 0, 0,
                  terms.now + terms.policy.ttl_ms, False, terms.limits.total)
    state.working.put_lease(lease)
    state.outcomes[wanted.client_id].new_leases.append(lease)
    state.leased += give
    _add(state.leased_groups, wanted.group, give)


def list_for_replies(state: RoundState) -> None:
    """Phase 5, listing: what each reply lists once the round has decided:
    the client's grants with unclaimed permits, its held grants, and its
    leases not settled, undrawn ones first (at most ``MAX_REPORTS``)."""
    working, outcomes = state.working, state.outcomes
    for grant in working.grants():
        outcome = outcomes.get(grant.client_id)
        if outcome is not None and grant.unclaimed > 0:
            outcome.open_grants.append(grant)
    for client_id, outcome in outcomes.items():
        # Of the new grants, those claimed on the reply are held; newer than
        # any, they go first, and held_of keeps the newest MAX_REPORTS.
        claimed_now = [grant for grant in outcome.new_grants if grant.unclaimed == 0]
        held = state.held.get(client_id, [])
        outcome.held_grants = held_of(claimed_now + held) if claimed_now else held
    for lease in sorted(working.leases(), key=lambda lease: lease.drawn > 0):  # undrawn ones first
        outcome = outcomes.get(lease.client_id)
        if outcome is not None and not lease.settled and len(outcome.listed_leases) < MAX_REPORTS:
            outcome.listed_leases.append(lease)


def result_of(state: RoundState, terms: RoundTerms) -> RoundResult:
    """The round's changes, with the count of lease ids if it issued any."""
    changes = state.working.changes
    if state.issued != terms.lease_ids.issued:
        changes.issued = state.issued
    contended = any(reason in (LIMIT, GROUP_LIMIT, RATE)
                    for outcome in state.outcomes.values() for reason, _ in outcome.blocked.values())
    return RoundResult(changes, state.outcomes, state.errors, contended)
