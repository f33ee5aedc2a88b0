"""The semaphore's pure heart: allocation rounds, reports, reclaim and message parsing.

No runtime here. ``run_round`` and its helpers are driven directly, mostly
by Hypothesis: random rounds from random clients, reports, limit changes and
time passing, checked against the protocol's promises (never above the
limit, oldest demand first, reports that can never free capacity twice,
retries that are never served twice, ownership, reclaim, blocked reasons).
"""

from __future__ import annotations

import copy
import itertools
import math

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from durability.semaphore.holder.pure.allocation import (
    Changes,
    Grant,
    Limits,
    ResolutionFailed,
    Working,
    apply_reports,
    merged,
    reclaim,
    run_round,
    usage,
)
from durability.semaphore.holder.pure.leases import SETTLED_MEMORY_MS, Lease, LeaseIds, LeasePolicy
from durability.semaphore.holder.pure.line_mark import Line, permits_at_once
from durability.semaphore.messages import (
    EXPIRED,
    GROUP_LIMIT,
    LIMIT,
    LIMIT_RESOLUTION_ERROR,
    MAX_COUNT,
    MAX_DEMAND_ENTRIES,
    MAX_DEMAND_TIMES,
    MAX_ID_LENGTH,
    MAX_REPORTS,
    MAX_TREE_DEMAND_TIMES,
    NOT_FOUND,
    NOT_PERMITTED,
    OK,
    Demand,
    LeaseReport,
    ProtocolError,
    Report,
    Request,
    Sync,
    parse,
)

CLIENTS = ["c0", "c1", "c2", "c3"]
GROUPS = ["g0", "g1", "g2"]
TIMEOUT_MS = 10_000
T0 = 1_700_000_000_000.0

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def id_maker(prefix: str = "n"):
    counter = itertools.count()
    return lambda: f"{prefix}{next(counter)}"


def limits(total, groups=None, permitted=None) -> Limits:
    return Limits(total, dict(groups or {}), dict(permitted or {}))


def grants_of(book_or_grants) -> list[Grant]:
    return list(book_or_grants.values()) if isinstance(book_or_grants, dict) else list(book_or_grants)


def charged(grants) -> int:
    return usage(grants_of(grants))[0]


def group_charged(grants, group) -> int:
    return usage(grants_of(grants))[1].get(group, 0)


def commit(book: dict[str, Grant], changes: Changes) -> dict[str, Grant]:
    book = dict(book)
    changes.apply_to(book)
    return book


def assert_grant_sane(grant: Grant) -> None:
    assert 0 <= grant.released <= grant.claimed <= grant.permits, grant


# -- strategies -----------------------------------------------------------------

@st.composite
def reports_for(draw, grants: list[Grant], overshoot: int = 2) -> tuple[Report, ...]:
    """Cumulative reports that move some grants forward (and sometimes past their permits)."""
    chosen = draw(st.lists(st.sampled_from(grants), unique_by=lambda g: g.grant_id)) if grants else []
    reports = []
    for grant in chosen:
        claimed = draw(st.integers(grant.claimed, grant.permits + overshoot))
        released = draw(st.integers(grant.released, claimed))
        reports.append(Report(grant.grant_id, claimed, released))
    return tuple(reports)


@st.composite
def demands(draw, now: float) -> tuple[Demand, ...]:
    groups = draw(st.lists(st.sampled_from(GROUPS), unique=True, max_size=len(GROUPS)))
    return tuple(
        Demand(group, draw(st.integers(0, 8)), now - 1_000 * draw(st.integers(0, 6)))
        for group in groups
    )


group_ceiling = st.one_of(
    st.none(), st.integers(0, 8), st.just(ResolutionFailed(RuntimeError("groupLimit threw")))
)


# -- never above the limit, across any sequence of rounds ---------------------------

class Holder(RuleBasedStateMachine):
    """The book as the holder keeps it, driven by random rounds, syncs, alarms and limit changes."""

    @initialize(total=st.integers(0, 12), ceilings=st.fixed_dictionaries({g: group_ceiling for g in GROUPS}))
    def start(self, total, ceilings):
        self.book: dict[str, Grant] = {}
        self.now = T0
        self.total = total
        self.ceilings = ceilings
        self.new_id = id_maker("g")

    def limits(self) -> Limits:
        return limits(self.total, self.ceilings)

    @rule(total=st.integers(0, 12), group=st.sampled_from(GROUPS), ceiling=group_ceiling)
    def change_limits(self, total, group, ceiling):
        self.total = total  # lowering included: running work is never revoked
        self.ceilings[group] = ceiling

    @rule(ms=st.sampled_from([0, 500, 4_000, 9_999, 10_000, 15_000]))
    def time_passes(self, ms):
        self.now += ms

    @rule()
    def alarm_reclaims(self):
        before = charged(self.book)
        working = Working(self.book)
        reclaim(working, self.now)
        self.book = commit(self.book, working.changes)
        assert charged(self.book) <= before
        assert all(g.unclaimed == 0 for g in self.book.values() if g.claim_deadline <= self.now)

    @rule(data=st.data(), client=st.sampled_from(CLIENTS))
    def sync(self, data, client):
        own = [g for g in self.book.values() if g.client_id == client]
        reports = data.draw(reports_for(own))
        before = dict(self.book)
        working = Working(self.book)
        apply_reports(working, client, reports)
        self.book = commit(self.book, working.changes)
        assert charged(self.book) <= charged(before)
        for grant_id, old in before.items():
            new = self.book.get(grant_id)
            if new is not None:
                assert (new.permits, new.claimed >= old.claimed, new.released >= old.released) == (
                    old.permits, True, True)

    @rule(data=st.data())
    def round(self, data):
        requests = []
        for client in data.draw(st.lists(st.sampled_from(CLIENTS), max_size=6)):
            own = [g for g in self.book.values() if g.client_id == client]
            requests.append(Request(client, data.draw(demands(self.now)), data.draw(reports_for(own))))
        limits_now = self.limits()
        before_total, before_groups = usage(self.book.values())

        result = run_round(self.book, requests, limits_now, self.now, TIMEOUT_MS, self.new_id)
        after = merged(self.book, result.changes)
        after_total, after_groups = usage(after)
        new = [g for o in result.outcomes.values() for g in o.new_grants]

        assert not result.errors  # every report here names the reporter's own grant
        if new:
            assert after_total <= self.total
        else:
            assert after_total <= before_total  # nothing granted: reports and reclaim only free
        for group in GROUPS:
            ceiling = limits_now.groups.get(group)
            granted_here = [g for g in new if g.group == group]
            if isinstance(ceiling, ResolutionFailed):
                assert not granted_here
            elif granted_here and ceiling is not None:
                assert after_groups.get(group, 0) <= ceiling
            elif not granted_here:
                assert after_groups.get(group, 0) <= before_groups.get(group, 0)
        for grant in after:
            assert_grant_sane(grant)
            assert grant.permits > 0 and (not grant.settled or grant.remembered)
        self.book = commit(self.book, result.changes)

    @invariant()
    def book_is_sane(self):
        for grant in self.book.values():
            assert_grant_sane(grant)


Holder.TestCase.settings = settings(max_examples=80, stateful_step_count=25, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow])
TestNeverAboveTheLimit = Holder.TestCase


# -- oldest demand first within one round ---------------------------------------------

@st.composite
def a_round(draw):
    """A book of earlier grants, limits and a round of requests over it."""
    new_id = id_maker("old")
    book = {}
    for _ in range(draw(st.integers(0, 6))):
        permits = draw(st.integers(1, 4))
        claimed = draw(st.integers(0, permits))
        released = draw(st.integers(0, claimed))
        if released == permits:
            continue
        grant = Grant(new_id(), draw(st.sampled_from(CLIENTS)), draw(st.sampled_from(GROUPS)),
                      permits, claimed, released, T0 + draw(st.sampled_from([-1, 5_000])))
        book[grant.grant_id] = grant
    total = draw(st.integers(0, 14))
    ceilings = draw(st.fixed_dictionaries({g: group_ceiling for g in GROUPS}))
    requests = [
        Request(client, draw(demands(T0)), ())
        for client in draw(st.lists(st.sampled_from(CLIENTS), max_size=6))
    ]
    permitted = {(r.client_id, d.group): draw(st.booleans() | st.just(True))
                 for r in requests for d in r.demand}
    return book, requests, limits(total, ceilings, permitted)


def served_entries(book, requests, lim, result):
    """Per (client, group) entry of each client's latest request: (oldest_at, want, got, group)."""
    latest = {r.client_id: r for r in requests}
    after = merged(book, result.changes)
    new_ids = {g.grant_id for o in result.outcomes.values() for g in o.new_grants}
    entries = []
    for client, request in latest.items():
        for demand in request.demand:
            held = sum(g.unclaimed for g in after
                       if (g.client_id, g.group) == (client, demand.group) and g.grant_id not in new_ids)
            got = sum(g.permits for g in result.outcomes[client].new_grants if g.group == demand.group)
            entries.append((demand.oldest_at, max(0, demand.count - held), got, client, demand.group))
    return entries


@FAST
@given(a_round())
def test_oldest_demand_first_no_capacity_left_idle_and_what_waits_is_explained(case):
    book, requests, lim = case
    result = run_round(book, requests, lim, T0, TIMEOUT_MS, id_maker())
    after_total, after_groups = usage(merged(book, result.changes))
    entries = served_entries(book, requests, lim, result)

    for oldest_at, want, got, client, group in entries:
        assert got <= want
        blocked = result.outcomes[client].blocked
        if got == want:
            assert group not in blocked
            continue
        # What stays queued is explained, and the explanation is true.
        reason, waiting = blocked[group]
        assert waiting == want - got
        ceiling = lim.groups.get(group)
        assert (reason == LIMIT_RESOLUTION_ERROR) == isinstance(ceiling, ResolutionFailed)
        if reason == NOT_PERMITTED:
            assert not lim.permitted.get((client, group), True)
        if reason == GROUP_LIMIT:
            assert ceiling is not None and after_groups.get(group, 0) >= ceiling
        if reason == LIMIT:
            assert after_total >= lim.total
        if isinstance(ceiling, ResolutionFailed) or not lim.permitted.get((client, group), True):
            assert got == 0
            continue
        if ceiling is not None and after_groups.get(group, 0) >= ceiling:
            continue  # held back by its own group's ceiling: blocks no other group
        # Short because of the total limit: the pool is empty, and nothing younger got in.
        assert after_total >= lim.total
        younger = [(e[3], e[4]) for e in entries if e[0] > oldest_at and e[2] > 0]
        assert younger == [], f"{client}/{group} (oldestAt {oldest_at}) left short while {younger} were served"


def test_a_group_at_its_ceiling_does_not_hold_back_younger_demand_of_other_groups():
    requests = [
        Request("c0", (Demand("g0", 5, T0 - 9_000),), ()),  # oldest, but g0 may hold only 1
        Request("c1", (Demand("g1", 3, T0),), ()),
    ]
    result = run_round({}, requests, limits(10, {"g0": 1}), T0, TIMEOUT_MS, id_maker())
    assert [g.permits for g in result.outcomes["c0"].new_grants] == [1]
    assert result.outcomes["c0"].blocked == {"g0": (GROUP_LIMIT, 4)}
    assert [g.permits for g in result.outcomes["c1"].new_grants] == [3]


def test_older_demand_short_on_the_limit_takes_everything_and_younger_waits():
    requests = [
        Request("young", (Demand("g0", 2, T0),), ()),  # arrives first, but is younger
        Request("old", (Demand("g1", 5, T0 - 5_000),), ()),
    ]
    result = run_round({}, requests, limits(4), T0, TIMEOUT_MS, id_maker())
    assert [g.permits for g in result.outcomes["old"].new_grants] == [4]
    assert result.outcomes["old"].blocked == {"g1": (LIMIT, 1)}
    assert result.outcomes["young"].new_grants == []
    assert result.outcomes["young"].blocked == {"g0": (LIMIT, 2)}


@st.composite
def timed_demand(draw):
    """Clients each with items of known enqueue times (some sending none), a limit, a group ceiling."""
    requests = []
    for i in range(draw(st.integers(1, 6))):
        times = sorted(draw(st.lists(st.integers(0, 50), min_size=1, max_size=MAX_DEMAND_TIMES)))
        extra = draw(st.integers(0, 3))  # items past the times given
        sent = () if draw(st.integers(0, 4)) == 0 else tuple(T0 + t for t in times)
        requests.append(Request(f"c{i}", (Demand("g0", len(times) + extra, T0 + times[0], sent),), ()))
    return requests, draw(st.integers(0, 40)), draw(st.none() | st.integers(0, 40))


def item_times(demand: Demand) -> list[float]:
    """Where each of a demand's items stands in line: its time, or the last one given."""
    times = demand.times or (demand.oldest_at,)
    return list(times) + [times[-1]] * (demand.count - len(times))


@FAST
@given(timed_demand())
def test_a_round_serves_items_oldest_first_across_clients(case):
    requests, total, ceiling = case
    result = run_round({}, requests, limits(total, {"g0": ceiling}), T0, TIMEOUT_MS, id_maker())
    served, waiting = [], []
    for request in requests:
        outcome = result.outcomes[request.client_id]
        got = sum(grant.permits for grant in outcome.new_grants)
        assert len(outcome.new_grants) <= 1  # one grant per client and group, however many items
        line = item_times(request.demand[0])
        served += line[:got]
        waiting += line[got:]
        assert outcome.blocked.get("g0", (None, 0))[1] == len(line) - got
    room = min(total, total if ceiling is None else ceiling)
    assert len(served) == min(room, len(served) + len(waiting))  # no room left idle
    assert not served or not waiting or max(served) <= min(waiting)  # and no item served before an older one


def test_a_client_with_many_young_items_gets_only_its_old_ones():
    requests = [Request("many", (Demand("g0", 10, T0, (T0, T0 + 1, *[T0 + 100 + i for i in range(8)])),), ()),
                Request("one", (Demand("g0", 1, T0 + 50, (T0 + 50,)),), ())]
    result = run_round({}, requests, limits(4), T0, TIMEOUT_MS, id_maker())
    assert [g.permits for g in result.outcomes["many"].new_grants] == [3]
    assert [g.permits for g in result.outcomes["one"].new_grants] == [1]
    assert result.outcomes["many"].blocked == {"g0": (LIMIT, 7)}


# -- reports: monotonic, clamped, never freeing capacity twice ------------------------

@st.composite
def a_grant_and_reports(draw):
    permits = draw(st.integers(1, 8))
    claimed = draw(st.integers(0, permits))
    released = draw(st.integers(0, claimed))
    assume(released < permits)
    grant = Grant("g", "c0", "g0", permits, claimed, released, T0 + 5_000,
                  reclaimed=draw(st.booleans()) and claimed == permits)
    reports = []
    for _ in range(draw(st.integers(1, 5))):
        c = draw(st.integers(0, permits + 3))
        reports.append(Report("g", c, draw(st.integers(0, c))))
    # Any order, with repetitions: what a lossy, retrying transport delivers.
    delivered = draw(st.lists(st.sampled_from(reports), min_size=len(reports), max_size=3 * len(reports)))
    delivered = draw(st.permutations(delivered + reports))
    return grant, reports, delivered


def deliver(book, client, reports):
    """Each report in its own message (one message may not repeat a grant), committed in turn."""
    seen = []
    for report in reports:
        working = Working(book)
        apply_reports(working, client, [report])
        book = commit(book, working.changes)
        seen.append(book.get(report.grant_id))
    return book, seen


@FAST
@given(a_grant_and_reports())
def test_reports_in_any_order_and_repetition_end_in_the_same_grant(case):
    grant, reports, delivered = case
    book = {"g": grant}
    in_order, _ = deliver(book, "c0", sorted(reports, key=lambda r: (r.claimed, r.released)))
    shuffled, states = deliver(book, "c0", delivered)
    highest = Report("g", max(r.claimed for r in reports), max(r.released for r in reports))
    only_max, _ = deliver(book, "c0", [highest])

    assert shuffled == in_order == only_max
    assert charged(shuffled) == charged(only_max)  # capacity freed once, whatever arrived
    previous = grant
    for state in states:
        if state is None:  # settled and removed; it stays removed
            previous = None
            continue
        assert previous is not None, "a settled grant came back"
        assert_grant_sane(state)
        assert state.permits == grant.permits
        assert state.claimed >= previous.claimed and state.released >= previous.released
        previous = state


@FAST
@given(a_grant_and_reports())
def test_a_report_is_clamped_to_the_grant_and_answered_with_what_the_holder_confirms(case):
    grant, reports, _ = case
    working = Working({"g": grant})
    (outcome,) = apply_reports(working, "c0", [reports[0]])
    expect_claimed = max(grant.claimed, min(reports[0].claimed, grant.permits))
    expect_released = max(grant.released, min(reports[0].released, expect_claimed))
    assert (outcome.claimed, outcome.released, outcome.permits) == (expect_claimed, expect_released, grant.permits)
    overclaimed = reports[0].claimed > grant.permits
    assert outcome.status == (EXPIRED if grant.reclaimed and overclaimed else OK)


# -- retries after a lost reply ------------------------------------------------------

@FAST
@given(data=st.data(), total=st.integers(0, 12), ceiling=st.none() | st.integers(0, 6))
def test_a_request_repeated_after_a_lost_reply_is_not_served_twice(data, total, ceiling):
    mine = data.draw(demands(T0), label="demand")
    others = [Request(c, data.draw(demands(T0)), ()) for c in data.draw(st.lists(st.sampled_from(CLIENTS[1:])))]
    lim = limits(total, {g: ceiling for g in GROUPS})
    new_id = id_maker()
    request = Request("c0", mine, ())

    first = run_round({}, [request, *others], lim, T0, TIMEOUT_MS, new_id)
    book = commit({}, first.changes)
    # The reply was lost: the client asks again, unchanged, maybe twice in one round.
    copies = data.draw(st.integers(1, 2))
    later = T0 + data.draw(st.integers(0, TIMEOUT_MS - 1))
    second = run_round(book, [request] * copies, lim, later, TIMEOUT_MS, new_id)

    for demand in mine:
        granted = sum(g.permits for r in (first, second) for g in r.outcomes["c0"].new_grants
                      if g.group == demand.group)
        assert granted <= demand.count
    missed = {g.grant_id for g in first.outcomes["c0"].new_grants}
    listed = {g.grant_id for g in second.outcomes["c0"].open_grants}
    assert missed <= listed  # the client learns of the grants whose reply it lost
    assert all(g.client_id == "c0" and g.unclaimed > 0 for g in second.outcomes["c0"].open_grants)


def test_a_retry_after_the_claim_deadline_is_served_again_because_the_permits_came_back():
    request = Request("c0", (Demand("g0", 3, T0),), ())
    new_id = id_maker()
    first = run_round({}, [request], limits(5), T0, TIMEOUT_MS, new_id)
    book = commit({}, first.changes)
    second = run_round(book, [request], limits(5), T0 + TIMEOUT_MS, TIMEOUT_MS, new_id)
    assert [g.permits for g in second.outcomes["c0"].new_grants] == [3]
    assert charged(merged(book, second.changes)) == 3


# -- ownership -------------------------------------------------------------------------

@FAST
@given(data=st.data(), position=st.integers(0, 2))
def test_reporting_another_clients_grant_refuses_that_request_alone(data, position):
    book = {
        "a1": Grant("a1", "alice", "g0", 4, 1, 0, T0 + 5_000),
        "m1": Grant("m1", "mallory", "g0", 3, 0, 0, T0 + 5_000),
    }
    own_report = Report("m1", data.draw(st.integers(0, 3)), 0)
    stolen = Report("a1", data.draw(st.integers(0, 4)), data.draw(st.integers(0, 4)))
    assume(stolen.released <= stolen.claimed)
    bad = Request("mallory", (Demand("g1", 2, T0 - 9_000),),
                  tuple(data.draw(st.permutations([own_report, stolen]))))
    fine = [Request("alice", (Demand("g1", 2, T0),), ()), Request("bob", (Demand("g2", 1, T0),), ())]
    requests = fine[:position] + [bad] + fine[position:]

    result = run_round(book, requests, limits(10), T0, TIMEOUT_MS, id_maker())
    assert set(result.errors) == {position}
    assert result.errors[position].code == "forbidden"
    assert "mallory" not in result.outcomes
    after = {g.grant_id: g for g in merged(book, result.changes)}
    assert after["a1"] == book["a1"] and after["m1"] == book["m1"]  # not even mallory's own report
    assert all(g.client_id != "mallory" for g in after.values() if g.grant_id not in book)
    assert [g.permits for g in result.outcomes["alice"].new_grants] == [2]
    assert [g.permits for g in result.outcomes["bob"].new_grants] == [1]


def test_a_sync_naming_another_clients_grant_is_refused_and_changes_nothing():
    book = {"a1": Grant("a1", "alice", "g0", 4, 1, 0, T0 + 5_000),
            "m1": Grant("m1", "mallory", "g0", 3, 0, 0, T0 + 5_000)}
    working = Working(book)
    with pytest.raises(ProtocolError) as refused:
        apply_reports(working, "mallory", [Report("m1", 3, 3), Report("a1", 4, 4)])
    assert refused.value.code == "forbidden"
    assert not working.changes


# -- reclaim ---------------------------------------------------------------------------

@FAST
@given(permits=st.integers(1, 6), data=st.data(), late=st.integers(0, 20_000))
def test_reclaim_returns_unclaimed_permits_at_the_deadline(permits, data, late):
    claimed = data.draw(st.integers(0, permits))
    released = data.draw(st.integers(0, claimed))
    assume(released < permits)
    grant = Grant("g", "c0", "g0", permits, claimed, released, T0 + TIMEOUT_MS)
    at = T0 + late
    working = Working({"g": grant})
    reclaim(working, at)
    book = commit({"g": grant}, working.changes)

    if at < grant.claim_deadline or claimed == permits:
        assert book == {"g": grant}
        return
    if claimed == 0:  # nothing was ever claimed: the grant is gone
        assert book == {}
    else:  # kept, settled or not, so that a late claim is answered expired
        assert book["g"] == grant._replace(permits=claimed, reclaimed=True)
    assert charged(book) == claimed - released

    # A late claim: clamped and expired while the grant stands, not_found when nothing was claimed.
    late_claim = data.draw(st.integers(0, permits))
    working = Working(book)
    (outcome,) = apply_reports(working, "c0", [Report("g", late_claim, 0)])
    if "g" not in book:
        assert (outcome.status, outcome.claimed) == (NOT_FOUND, 0)
    else:
        assert outcome.claimed == claimed
        assert outcome.status == (EXPIRED if late_claim > claimed else OK)
    assert charged(commit(book, working.changes)) <= charged(book)


def test_a_round_reclaims_before_it_allocates():
    book = {"old": Grant("old", "c1", "g0", 5, 2, 0, T0)}
    requests = [Request("c0", (Demand("g0", 5, T0),), ())]
    result = run_round(book, requests, limits(5), T0, TIMEOUT_MS, id_maker())
    assert [g.permits for g in result.outcomes["c0"].new_grants] == [3]
    after = {g.grant_id: g for g in merged(book, result.changes)}
    assert (after["old"].permits, after["old"].reclaimed) == (2, True)


def test_a_reclaimed_grant_with_nothing_claimed_is_not_found_afterwards():
    book = {"g": Grant("g", "c0", "g0", 3, 0, 0, T0)}
    first = run_round(book, [Request("c0", (), ())], limits(5), T0, TIMEOUT_MS, id_maker())
    book = commit(book, first.changes)
    assert book == {}
    second = run_round(book, [Request("c0", (), (Report("g", 1, 0),))], limits(5), T0 + 1, TIMEOUT_MS, id_maker())
    assert [(o.status, o.claimed) for o in second.outcomes["c0"].reports] == [(NOT_FOUND, 0)]



def test_a_round_changes_nothing_it_was_given():
    # A round in which every phase has work: reports (one request refused),
    # a reclaim, a settled grant forgotten, leases retired past their ttl and
    # under a lowered limit, grants, and a lease issued under a new id.
    book = {
        "due": Grant("due", "a", "g0", 3, 1, 0, T0 - 1),
        "reported": Grant("reported", "a", "g0", 2, 0, 0, T0 + 5_000),
        "forgotten": Grant("forgotten", "b", "g1", 2, 2, 2, T0 - SETTLED_MEMORY_MS - 1, reclaimed=True),
    }
    leases = {
        "le-1": Lease("le-1", "a", "g0", 4, 1, 0, T0 + 60_000, False, 10),
        "le-2": Lease("le-2", "b", "g1", 4, 0, 0, T0 - 1, False, 10),
        "le-3": Lease("le-3", "c", "g2", 4, 4, 0, T0 + 60_000, False, 20),
    }
    lease_ids = LeaseIds("e", 3)
    requests = [
        Request("a", (Demand("g0", 5, T0),), (Report("reported", 2, 1),), leases=True, claims=True,
                lease_reports=(LeaseReport("le-1", "g0", 4, 2, 1),)),
        Request("b", (Demand("g1", 5, T0 - 1),), (), leases=True),
        Request("c", (Demand("g2", 3, T0 - 2),), (), claims=True),
        Request("d", (Demand("g0", 1, T0),), (Report("reported", 1, 0),)),  # a's grant: refused
    ]
    lim = limits(19)  # 14 charged: room for c's grant and a lease of 2 for b; below le-3's 20
    given = (book, leases, lease_ids, requests, lim)
    before = copy.deepcopy(given)
    result = run_round(book, requests, lim, T0, TIMEOUT_MS, id_maker(), leases=leases,
                       policy=LeasePolicy(permits_per_lease=4), lease_ids=lease_ids)
    assert given == before
    assert lease_ids.issued == 3  # the holder moves it on when it commits the round
    # ... and the round did decide all of that, in what it returns:
    assert result.changes.issued == 4
    assert [lease.lease_id for lease in result.outcomes["b"].new_leases] == ["le-4"]
    assert result.outcomes["c"].new_grants and list(result.errors) == [3]
    assert {"due", "reported"} <= set(result.changes.written) and "forgotten" in result.changes.deleted
    assert {"le-1", "le-2", "le-3"} <= set(result.changes.leases_written)

# -- blocked reasons -----------------------------------------------------------------

def blocked(book, demand_groups, lim, client="c0"):
    request = Request(client, tuple(Demand(g, n, T0) for g, n in demand_groups), ())
    return run_round(book, [request], lim, T0, TIMEOUT_MS, id_maker()).outcomes[client].blocked


BUSY = {"b": Grant("b", "other", "g0", 4, 4, 0, T0 + 5_000)}
FAILED = ResolutionFailed(RuntimeError("boom"))


@pytest.mark.parametrize("book, lim, expected", [
    pytest.param({}, limits(4), {"g1": (LIMIT, 1)}, id="limit"),
    pytest.param(BUSY, limits(5), {"g0": (LIMIT, 1), "g1": (LIMIT, 3)}, id="limit-with-usage"),
    pytest.param({}, limits(10, {"g0": 1}), {"g0": (GROUP_LIMIT, 1)}, id="group_limit"),
    pytest.param(BUSY, limits(10, {"g0": 4}), {"g0": (GROUP_LIMIT, 2)}, id="group_limit-with-usage"),
    pytest.param({}, limits(10, permitted={("c0", "g0"): False}), {"g0": (NOT_PERMITTED, 2)}, id="not_permitted"),
    pytest.param({}, limits(10, {"g0": FAILED}), {"g0": (LIMIT_RESOLUTION_ERROR, 2)},
                 id="one-group-fails-closed-alone"),
    pytest.param({}, limits(FAILED), {"g0": (LIMIT_RESOLUTION_ERROR, 2), "g1": (LIMIT_RESOLUTION_ERROR, 3)},
                 id="the-limit-failing-blocks-all"),
    pytest.param(BUSY, limits(10, {"g0": FAILED}, {("c0", "g0"): False}),
                 {"g0": (LIMIT_RESOLUTION_ERROR, 2)}, id="resolution-error-checked-first"),
    pytest.param({}, limits(10, {"g0": 0}, {("c0", "g0"): False}), {"g0": (NOT_PERMITTED, 2)},
                 id="not_permitted-before-group_limit"),
    pytest.param({}, limits(2, {"g1": 8}), {"g1": (LIMIT, 3)}, id="limit-below-a-roomy-group"),
])
def test_blocked_reasons(book, lim, expected):
    # c0 wants 2 in g0 (the older) and 3 in g1.
    request = Request("c0", (Demand("g0", 2, T0 - 1), Demand("g1", 3, T0)), ())
    outcome = run_round(book, [request], lim, T0, TIMEOUT_MS, id_maker()).outcomes["c0"]
    assert outcome.blocked == expected
    got = {g.group: g.permits for g in outcome.new_grants}
    for group, wanted in (("g0", 2), ("g1", 3)):
        assert got.get(group, 0) + expected.get(group, (None, 0))[1] == wanted


def test_a_failing_group_limit_blocks_only_its_group():
    request = Request("c0", (Demand("g0", 2, T0 - 1), Demand("g1", 3, T0)), ())
    result = run_round({}, [request], limits(10, {"g0": FAILED, "g1": None}), T0, TIMEOUT_MS, id_maker())
    outcome = result.outcomes["c0"]
    assert outcome.blocked == {"g0": (LIMIT_RESOLUTION_ERROR, 2)}
    assert [(g.group, g.permits) for g in outcome.new_grants] == [("g1", 3)]


@pytest.mark.parametrize("book, lim", [
    pytest.param(BUSY, limits(4, {"g1": 0}), id="group-limit-0-and-total-full"),
    pytest.param({"x": Grant("x", "other", "g1", 2, 2, 0, T0 + 5_000)}, limits(2, {"g1": 2}),
                 id="group-full-and-total-full-by-the-same-grant"),
    pytest.param({"x": Grant("x", "other", "g1", 2, 2, 0, T0 + 5_000), **BUSY}, limits(3, {"g1": 2}),
                 id="limit-lowered-below-usage-and-group-full"),
])
def test_a_group_with_no_room_under_its_own_ceiling_is_blocked_by_group_limit(book, lim):
    # Even when the total is exhausted too: the group's ceiling is checked first, and it
    # would hold the group back whatever the total did.
    assert blocked(book, [("g1", 1)], lim) == {"g1": (GROUP_LIMIT, 1)}


# -- messages.parse -------------------------------------------------------------------

def request_message(**fields):
    message = {"type": "request", "v": 1, "clientId": "c0",
               "demand": [{"group": "g0", "count": 3, "oldestAt": T0}],
               "grants": [{"grantId": "x", "claimed": 2, "released": 1}]}
    message.update(fields)
    return message


def demand_entry(**fields):
    return {"group": "g0", "count": 3, "oldestAt": T0, **fields}


def report_entry(**fields):
    return {"grantId": "x", "claimed": 2, "released": 1, **fields}


def without(d, key):
    return {k: v for k, v in d.items() if k != key}


LONG = "x" * (MAX_ID_LENGTH + 1)

REFUSED = [
    ("not-an-object", ["request"], "invalid_message"),
    ("unknown-type", request_message(type="acquire"), "unsupported"),
    ("missing-type", without(request_message(), "type"), "unsupported"),
    ("reply-type", request_message(type="grants"), "unsupported"),
    ("v2", request_message(v=2), "unsupported"),
    ("v-string", request_message(v="1"), "unsupported"),
    ("v-true", request_message(v=True), "unsupported"),
    ("missing-v", without(request_message(), "v"), "unsupported"),
    ("missing-clientId", without(request_message(), "clientId"), "invalid_message"),
    ("empty-clientId", request_message(clientId=""), "invalid_message"),
    ("long-clientId", request_message(clientId=LONG), "invalid_message"),
    ("int-clientId", request_message(clientId=7), "invalid_message"),
    ("demand-not-list", request_message(demand={"g0": 3}), "invalid_message"),
    ("demand-entry-not-object", request_message(demand=[3]), "invalid_message"),
    ("missing-group", request_message(demand=[without(demand_entry(), "group")]), "invalid_message"),
    ("missing-count", request_message(demand=[without(demand_entry(), "count")]), "invalid_message"),
    ("missing-oldestAt", request_message(demand=[without(demand_entry(), "oldestAt")]), "invalid_message"),
    ("long-group", request_message(demand=[demand_entry(group=LONG)]), "invalid_message"),
    ("bool-count", request_message(demand=[demand_entry(count=True)]), "invalid_message"),
    ("float-count", request_message(demand=[demand_entry(count=2.5)]), "invalid_message"),
    ("whole-float-count", request_message(demand=[demand_entry(count=2.0)]), "invalid_message"),
    ("negative-count", request_message(demand=[demand_entry(count=-1)]), "invalid_message"),
    ("huge-count", request_message(demand=[demand_entry(count=MAX_COUNT + 1)]), "invalid_message"),
    ("string-count", request_message(demand=[demand_entry(count="3")]), "invalid_message"),
    ("nan-oldestAt", request_message(demand=[demand_entry(oldestAt=math.nan)]), "invalid_message"),
    ("inf-oldestAt", request_message(demand=[demand_entry(oldestAt=math.inf)]), "invalid_message"),
    ("negative-oldestAt", request_message(demand=[demand_entry(oldestAt=-1)]), "invalid_message"),
    ("bool-oldestAt", request_message(demand=[demand_entry(oldestAt=False)]), "invalid_message"),
    ("duplicate-group", request_message(demand=[demand_entry(), demand_entry(count=1)]), "invalid_message"),
    ("times-not-list", request_message(demand=[demand_entry(times=T0)]), "invalid_message"),
    ("times-not-from-oldestAt", request_message(demand=[demand_entry(times=[T0 + 1])]), "invalid_message"),
    ("times-out-of-order", request_message(demand=[demand_entry(times=[T0, T0 + 2, T0 + 1])]), "invalid_message"),
    ("times-past-count", request_message(demand=[demand_entry(count=1, times=[T0, T0])]), "invalid_message"),
    ("times-nan", request_message(demand=[demand_entry(times=[T0, math.nan])]), "invalid_message"),
    ("too-many-times", request_message(demand=[demand_entry(count=999, times=[T0] * (MAX_TREE_DEMAND_TIMES + 1))]),
     "too_large"),
    ("too-many-demand", request_message(demand=[demand_entry(group=f"g{i}") for i in range(MAX_DEMAND_ENTRIES + 1)]),
     "too_large"),
    ("grants-not-list", request_message(grants=None), "invalid_message"),
    ("missing-grantId", request_message(grants=[without(report_entry(), "grantId")]), "invalid_message"),
    ("missing-claimed", request_message(grants=[without(report_entry(), "claimed")]), "invalid_message"),
    ("missing-released", request_message(grants=[without(report_entry(), "released")]), "invalid_message"),
    ("long-grantId", request_message(grants=[report_entry(grantId=LONG)]), "invalid_message"),
    ("float-claimed", request_message(grants=[report_entry(claimed=2.0)]), "invalid_message"),
    ("bool-released", request_message(grants=[report_entry(released=True)]), "invalid_message"),
    ("negative-released", request_message(grants=[report_entry(released=-1)]), "invalid_message"),
    ("huge-claimed", request_message(grants=[report_entry(claimed=MAX_COUNT + 1)]), "invalid_message"),
    ("released-above-claimed", request_message(grants=[report_entry(claimed=1, released=2)]), "invalid_message"),
    ("duplicate-grant", request_message(grants=[report_entry(), report_entry(claimed=3)]), "invalid_message"),
    ("too-many-reports", request_message(grants=[report_entry(grantId=f"x{i}") for i in range(MAX_REPORTS + 1)]),
     "too_large"),
    ("sync-too-many-reports", {"type": "sync", "v": 1, "clientId": "c0",
                               "grants": [report_entry(grantId=f"x{i}") for i in range(MAX_REPORTS + 1)]},
     "too_large"),
    ("sync-bad-report", {"type": "sync", "v": 1, "clientId": "c0", "grants": [report_entry(claimed=-3)]},
     "invalid_message"),
]


@pytest.mark.parametrize("message, code", [pytest.param(m, c, id=i) for i, m, c in REFUSED])
def test_parse_refuses_bad_messages_with_a_code(message, code):
    with pytest.raises(ProtocolError) as refused:
        parse(message)
    assert refused.value.code == code
    reply = refused.value.reply()
    assert (reply["type"], reply["v"], reply["code"]) == ("error", 1, code)


def test_parse_accepts_messages_at_every_bound():
    at_bounds = request_message(
        clientId="c" * MAX_ID_LENGTH,
        demand=[demand_entry(group=f"g{i}", count=MAX_COUNT if i == 0 else 0, oldestAt=0)
                for i in range(MAX_DEMAND_ENTRIES)],
        grants=[report_entry(grantId=f"x{i}", claimed=MAX_COUNT, released=MAX_COUNT) for i in range(MAX_REPORTS)],
    )
    parsed = parse(at_bounds)
    assert isinstance(parsed, Request)
    assert (len(parsed.demand), len(parsed.reports)) == (MAX_DEMAND_ENTRIES, MAX_REPORTS)
    assert parsed.demand[0] == Demand("g0", MAX_COUNT, 0.0)

    minimal = parse({"type": "sync", "v": 1, "clientId": "c0"})
    assert minimal == Sync("c0", ())
    assert parse({"type": "request", "v": 1, "clientId": "c0"}) == Request("c0", (), ())


@FAST
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12))
def test_parse_never_fails_with_anything_but_a_protocol_error(value):
    try:
        parsed = parse(value)
    except ProtocolError as error:
        assert error.code in {"invalid_message", "unsupported", "too_large"}
    else:
        assert isinstance(parsed, (Request, Sync))


def held(client_id, *demand):
    return Request(client_id, tuple(Demand(group, 1, at) for group, at in demand), ())


def line_ahead(client_id, held_requests, limits_, policy=None, groups=("g0", "g1")):
    return Line.of(held_requests, limits_, policy).ahead_of(client_id, groups)


def test_the_line_mark_is_the_kth_oldest_other_request_held_k_the_permits_a_group_may_use():
    line = [held("c1", ("g0", 30.0)), held("c2", ("g0", 10.0), ("g1", 5.0)), held("c3", ("g0", 20.0)),
            held("c0", ("g0", 1.0), ("g1", 1.0))]
    # c0 is the served client: its own requests are not ahead of it.
    assert line_ahead("c0", line, limits(2)) == {"g0": 20.0}  # g1: one other request, fewer than 2
    assert line_ahead("c0", line, limits(1)) == {"g0": 10.0, "g1": 5.0}
    assert line_ahead("c0", line, limits(3, {"g0": 1})) == {"g0": 10.0}  # its own limit is lower
    assert line_ahead("c0", line, limits(4)) == {}
    assert line_ahead("c0", line, limits(ResolutionFailed(RuntimeError("x")))) == {}
    assert line_ahead("c0", line, limits(1, {"g0": ResolutionFailed(RuntimeError("x")), "g1": 0})) == {}
    # Only the groups the served client asked for are marked.
    assert line_ahead("c0", line, limits(1), groups=("g1",)) == {"g1": 5.0}
    # A client is ahead once however often its request was delivered, and not
    # at all where it may not be granted.
    twice = [held("c1", ("g0", 10.0)), held("c1", ("g0", 10.0)), held("c2", ("g0", 20.0))]
    assert line_ahead("c0", twice, limits(2)) == {"g0": 20.0}
    assert line_ahead("c0", twice, limits(1, permitted={("c1", "g0"): False})) == {"g0": 20.0}
    # Over its limit by an extra for leases, a group turns over its ceiling's worth per job length.
    over = LeasePolicy.from_options({"provisioning": {"mode": "over", "extra": {"count": 2}}})
    assert line_ahead("c0", line, limits(1), over) == {"g0": 30.0}


@given(st.lists(st.tuples(st.sampled_from(["c0", "c1", "c2", "c3", "c4"]), st.sampled_from(["g0", "g1", "g2"]),
                          st.sampled_from([1.0, 2.0, 3.0, 5.0, 8.0])), max_size=14),
       st.integers(0, 5), st.sampled_from(["c0", "c1", "c9"]))
def test_the_line_mark_read_per_client_is_the_kth_oldest_of_the_others_recomputed_for_it(entries, total, served):
    requests = [held(client, (group, at)) for client, group, at in entries]
    marks = Line.of(requests, limits(total))
    for group in ("g0", "g1", "g2"):
        others: dict[str, float] = {}
        for client, g, at in entries:
            if g == group and client != served:
                others[client] = min(at, others.get(client, at))
        k = permits_at_once(group, limits(total), None)
        expected = sorted(others.values())[k - 1] if 0 < k <= len(others) else None
        assert marks.ahead_of(served, [group]).get(group) == expected


def test_demand_a_grant_it_may_not_know_of_serves_waits_until_that_grants_claim_deadline_which_is_named():
    # A claimed grant whose client has not said it heard of it (a reply lost,
    # or the holder restarted since) counts for the client's demand in its
    # group until its claim deadline: a round then neither serves nor blocks
    # that demand, and only a round after the deadline sees it wait. The
    # holder runs one then (``claims_lapse_at``): tree seed 9610 waited 17 s
    # for its sweep instead.
    from durability.semaphore.holder.pure.news import claims_lapse_at

    deadline = T0 + 5_000
    book = {"g1": Grant("g1", "c0", "g0", 1, 1, 0, deadline)}
    asking = Request("c0", (Demand("g0", 1, T0),), (), claims=True)  # has heard of nothing
    before = run_round(book, [asking], limits(1), T0 + 1_000, TIMEOUT_MS, id_maker())
    assert not before.outcomes["c0"].new_grants and not before.outcomes["c0"].blocked
    assert claims_lapse_at([asking], book.values(), T0 + 1_000) == deadline
    assert claims_lapse_at([asking], book.values(), deadline) == deadline  # it counts at its deadline still
    after = run_round(book, [asking], limits(1), deadline + 1, TIMEOUT_MS, id_maker())
    assert after.outcomes["c0"].blocked["g0"][0] == LIMIT and after.contended
    assert claims_lapse_at([asking], book.values(), deadline + 1) is None
    # Nothing to name: a grant it said it heard of, one released, one in another group, no demand.
    heard = Request("c0", (Demand("g0", 1, T0),), (), claims=True, heard_up_to=deadline)
    assert claims_lapse_at([heard], book.values(), T0) is None
    released = {"g1": Grant("g1", "c0", "g0", 1, 1, 1, deadline)}
    assert claims_lapse_at([asking], released.values(), T0) is None
    other_group = Request("c0", (Demand("g9", 1, T0),), (), claims=True)
    assert claims_lapse_at([other_group], book.values(), T0) is None
    assert claims_lapse_at([Request("c0", (), (), claims=True)], book.values(), T0) is None
