"""Leases in the holder's pure logic: budgets per provisioning mode, sharing, reports, retirement.

No runtime here: ``run_round`` and the lease helpers are driven directly,
by hand for each rule and by Hypothesis for the safety invariant (grants
charged plus every lease's footprint, retired ones in full until settled,
never above the ceiling when anything is issued; never below what clients
may really have in use or still draw).
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from durability.semaphore.holder.pure.allocation import (
    Limits,
    Working,
    apply_all_reports,
    merged_leases,
    news_for,
    next_reclaim_at,
    reclaim,
    run_round,
    usage,
)
from durability.semaphore.holder.pure.leases import (
    Lease,
    LeaseIds,
    LeasePolicy,
    lease_usage,
    needs_row,
    no_leases,
    retire_expired,
    share,
)
from durability.semaphore.messages import (
    LIMIT,
    OK,
    RETIRED,
    SETTLED,
    Demand,
    LeaseReport,
    ProtocolError,
    Request,
    parse,
)

T0 = 1_700_000_000_000.0
TTL = 60_000


def policy(mode="strict", per_lease=64, ttl_ms=TTL, limited_groups=None, **provisioning):
    return LeasePolicy.from_options({"provisioning": {"mode": mode, **provisioning}, "permits_per_lease": per_lease,
                                     "ttl_ms": ttl_ms, "limited_groups": limited_groups})


def ids():
    counter = itertools.count()
    return lambda: f"g{next(counter)}"


def want(client, group="g", count=5, age=0, leases=True, reports=()):
    return Request(client, (Demand(group, count, T0 - age),), (), 0.0, leases, tuple(reports))


class Book:
    """A holder's books between rounds, as the holder keeps them."""

    def __init__(self, pol: LeasePolicy | None, total: int = 10, groups=None) -> None:
        self.policy, self.total, self.groups = pol, total, dict(groups or {})
        # An epoch begun at T0, as a holder's is when its table is made.
        self.grants, self.leases, self.now = {}, {}, T0
        self.ids = LeaseIds("e", 0, T0, pol.ttl_ms if pol else TTL)

    def round(self, *requests, permitted=None, held_over=()):
        result = run_round(self.grants, list(requests), Limits(self.total, self.groups, dict(permitted or {})),
                           self.now, 10_000, ids(), leases=self.leases, policy=self.policy, lease_ids=self.ids,
                           held_over=held_over)
        result.changes.apply_to(self.grants, self.leases)
        if result.changes.issued is not None:
            self.ids = replace(self.ids, issued=result.changes.issued)
        return result

    def sync(self, client, *lease_reports):
        working = Working(self.grants, self.leases)
        _, outcomes = apply_all_reports(working, client, (), lease_reports, self.ids, self.now, self.ids.ttl_ms)
        retire_expired(working, self.now)
        working.changes.apply_to(self.grants, self.leases)
        return outcomes

    def footprint(self):
        return lease_usage(self.leases.values())[0]

    def charged(self):
        return usage(self.grants.values())[0] + self.footprint()


def sizes(result, client_order):
    return [sum(lease.permits for lease in result.outcomes[c].new_leases) for c in client_order]


# -- options ---------------------------------------------------------------------------

@pytest.mark.parametrize("options", [
    {"provisioning": {"mode": "sometimes"}},
    {"provisioning": {"mode": "under"}},
    {"provisioning": {"mode": "under", "reserve": -1}},
    {"provisioning": {"mode": "over", "extra": {"ratio": -0.5}}},
    {"provisioning": {"mode": "over", "extra": {"ratio": 0.5, "count": 3}}},
    {"provisioning": {"mode": "strict", "reserve": 3}},
    {"permits_per_lease": 0},
    {"ttl_ms": 0},
    {"limited_groups": "always"},
    {"lease_size": 4},
    "strict",
])
def test_bad_lease_options_are_refused(options):
    with pytest.raises(ValueError):
        LeasePolicy.from_options(options)


def test_a_lease_row_is_written_for_what_a_new_instance_must_not_count_low():
    ttl = 60_000
    row = Lease("l-1", "a", "g", 4, 1, 0, T0 + ttl, False, 8)
    assert needs_row(None, row, ttl)  # issued: the row is what says it exists
    heard = replace(row, drawn=3, released=2, expires_at=T0 + ttl + 10_000)
    assert not needs_row(row, heard, ttl)  # lost, the row counts more in use, and a shorter life
    assert needs_row(row, replace(heard, expires_at=T0 + ttl + ttl / 2), ttl)  # half a life: a heartbeat row
    assert needs_row(row, replace(heard, retired=True), ttl)
    assert needs_row(row, replace(heard, permits=3), ttl)  # stopped: its footprint shrinks
    assert needs_row(row, replace(heard, drawn=4, released=4), ttl)  # settled (one of another epoch, kept)


def test_budgets_per_mode():
    strict = policy().budgets(10)
    assert (strict.ceiling, strict.grant_cap, strict.lease_cap) == (10, 10, 10)
    under = policy("under", reserve=4).budgets(10)
    assert (under.ceiling, under.grant_cap, under.lease_cap) == (10, 6, 10)
    # The reserve never takes the last permit, even above the limit.
    assert policy("under", reserve=50).budgets(10).grant_cap == 1
    assert policy("under", reserve=50).budgets(0).grant_cap == 0
    ratio = policy("over", extra={"ratio": 0.5}).budgets(10)
    assert (ratio.ceiling, ratio.grant_cap, ratio.lease_cap) == (15, 10, 5)
    count = policy("over", extra={"count": 3}).budgets(10)
    assert (count.ceiling, count.grant_cap, count.lease_cap) == (13, 10, 3)


@pytest.mark.parametrize("pol", [None, policy(), policy("under", reserve=4), policy("over", extra={"ratio": 0.5}),
                                 policy("over", extra={"count": 3})])
def test_a_limit_of_0_hands_out_nothing_in_any_mode(pol):
    budgets = pol.budgets(0) if pol is not None else no_leases(0)
    assert (budgets.ceiling, budgets.grant_cap, budgets.lease_cap) == (0, 0, 0)
    book = Book(pol, total=0)
    result = book.round(want("a", count=5), want("b", count=5, leases=False))
    assert all(not o.new_grants and not o.new_leases for o in result.outcomes.values())
    assert book.charged() == 0


# -- sharing -----------------------------------------------------------------------------

def test_share_is_equal_oldest_first_and_capped():
    assert share(10, 3, 64) == [4, 3, 3]
    assert share(10, 3, 2) == [2, 2, 2]
    assert share(2, 5, 64) == [1, 1, 0, 0, 0]
    assert share(0, 2, 64) == [0, 0]


def test_a_round_shares_the_lease_budget_equally_oldest_first():
    book = Book(policy(), total=10)
    result = book.round(want("young", count=1, age=0), want("old", count=1, age=3_000), want("mid", count=1, age=1_000))
    assert sizes(result, ["old", "mid", "young"]) == [4, 3, 3]
    assert book.footprint() == 10 and not result.contended
    assert all(o.new_grants == [] for o in result.outcomes.values())


def test_with_fewer_permits_than_candidates_the_oldest_get_one_each_and_the_round_is_contended():
    book = Book(policy(), total=2)
    result = book.round(*(want(f"c{i}", age=1_000 * i) for i in range(5)))
    assert sizes(result, ["c4", "c3", "c2", "c1", "c0"]) == [1, 1, 0, 0, 0]
    assert result.outcomes["c0"].blocked == {"g": (LIMIT, 5)}
    assert result.contended


def test_a_lease_is_capped_by_permits_per_lease_and_that_is_not_contention():
    book = Book(policy(per_lease=4), total=100)
    result = book.round(want("a", count=50))
    assert sizes(result, ["a"]) == [4] and not result.contended and result.outcomes["a"].blocked == {}


# -- who gets leases -------------------------------------------------------------------------

def test_leases_only_for_clients_that_support_them_and_groups_without_their_own_limit():
    book = Book(policy(), total=20, groups={"capped": 5})
    result = book.round(want("plain", count=3, leases=False), want("q", "capped", 3), want("q2", "free", 3))
    assert [g.permits for g in result.outcomes["plain"].new_grants] == [3]
    assert result.outcomes["plain"].new_leases == []
    assert [g.permits for g in result.outcomes["q"].new_grants] == [3] and result.outcomes["q"].new_leases == []
    assert result.outcomes["q2"].new_grants == [] and sizes(result, ["q2"]) == [20 - 6]


def test_within_group_limit_lets_limited_groups_lease_within_their_limit():
    book = Book(policy(limited_groups="withinGroupLimit"), total=20, groups={"capped": 5})
    result = book.round(want("q", "capped", 3))
    assert sizes(result, ["q"]) == [5] and result.outcomes["q"].new_grants == []


def test_no_second_lease_while_the_client_holds_undrawn_permits_in_the_group():
    book = Book(policy(per_lease=4), total=100)
    [lease] = book.round(want("a", count=2)).outcomes["a"].new_leases
    again = book.round(want("a", count=2))
    assert again.outcomes["a"].new_leases == [] and again.outcomes["a"].listed_leases == [book.leases[lease.lease_id]]
    report = LeaseReport(lease.lease_id, "g", 4, 4, 0)  # all drawn: it may have another
    assert sizes(book.round(want("a", count=2, reports=[report])), ["a"]) == [4]


# -- provisioning modes ------------------------------------------------------------------------

def test_strict_serves_grants_first_then_leases_from_what_is_left():
    book = Book(policy(), total=10)
    result = book.round(want("lease", count=9, age=5_000), want("plain", count=7, leases=False))
    assert [g.permits for g in result.outcomes["plain"].new_grants] == [7]
    assert sizes(result, ["lease"]) == [3] and result.contended
    assert book.charged() == 10
    # A live lease's footprint is reserved: nothing is left for anyone.
    later = book.round(want("plain2", count=1, leases=False))
    assert later.outcomes["plain2"].new_grants == [] and later.outcomes["plain2"].blocked == {"g": (LIMIT, 1)}


def test_under_keeps_a_reserve_for_leases():
    book = Book(policy("under", reserve=4), total=10)
    result = book.round(want("plain", count=10, leases=False), want("lease", count=4))
    assert [g.permits for g in result.outcomes["plain"].new_grants] == [6]
    assert sizes(result, ["lease"]) == [4] and book.charged() == 10


def test_the_reserve_never_takes_the_last_permit():
    book = Book(policy("under", reserve=10), total=10)
    first = book.round(want("plain", count=3, leases=False))
    assert [g.permits for g in first.outcomes["plain"].new_grants] == [1]
    book.total = 0  # lowered to nothing: nothing for anyone
    assert book.round(want("other", count=3, leases=False)).outcomes["other"].new_grants == []


def test_over_gives_leases_a_budget_above_the_limit():
    book = Book(policy("over", extra={"ratio": 0.5}), total=10)
    result = book.round(want("plain", count=10, leases=False), want("lease", count=20))
    assert [g.permits for g in result.outcomes["plain"].new_grants] == [10]
    assert sizes(result, ["lease"]) == [5] and book.charged() == 15
    # Leases alone never take more than the extra, whatever grants leave.
    alone = Book(policy("over", extra={"count": 3}), total=10)
    assert sizes(alone.round(want("lease", count=20)), ["lease"]) == [3]


# -- reports, retirement, settlement -------------------------------------------------------------

def issue(book, client="a", count=5):
    [lease] = book.round(want(client, count=count)).outcomes[client].new_leases
    return lease


def test_reports_heartbeat_a_lease_and_an_unreported_one_is_retired_not_forgotten():
    book = Book(policy(per_lease=5), total=10)
    lease = issue(book)
    book.now += TTL / 2
    assert [o.status for o in book.sync("a", LeaseReport(lease.lease_id, "g", 5, 3, 1))] == [OK]
    book.now += TTL - 1
    book.round()
    assert not book.leases[lease.lease_id].retired  # the report moved its expiry
    book.now += 1
    book.round()
    retired = book.leases[lease.lease_id]
    assert retired.retired and retired.footprint == 4  # counted in full: it may have drawn more
    # A late report without a stop keeps it counted in full and says so.
    assert [o.status for o in book.sync("a", LeaseReport(lease.lease_id, "g", 5, 4, 2))] == [RETIRED]
    assert book.leases[lease.lease_id].footprint == 3
    # The client stops: drawn is final, the undrawn rest comes back.
    book.sync("a", LeaseReport(lease.lease_id, "g", 5, 4, 2, stopped=True))
    assert book.leases[lease.lease_id].footprint == 2
    assert [o.status for o in book.sync("a", LeaseReport(lease.lease_id, "g", 5, 4, 4, stopped=True))] == [SETTLED]
    assert book.leases == {} and book.footprint() == 0
    # Duplicated and reordered reports of a settled lease change nothing.
    assert [o.status for o in book.sync("a", LeaseReport(lease.lease_id, "g", 5, 3, 1))] == [SETTLED]
    assert book.leases == {}


def test_a_late_report_of_an_older_instance_frees_nothing_its_successor_still_runs():
    # Found by the campaign (over, seed 31): the client drew twice and
    # released the second draw, whose item went; it restarted, found one
    # draw running and stopped the lease at one. Then a request of the old
    # instance, sent before, reported two draws and one release. That
    # release was the second draw's: the one draw running stays charged.
    book = Book(policy(per_lease=2), total=10)
    lease = issue(book)
    book.sync("a", LeaseReport(lease.lease_id, "g", 2, 1, 0, stopped=True))  # the new instance
    assert book.leases[lease.lease_id].footprint == 1
    assert [o.status for o in book.sync("a", LeaseReport(lease.lease_id, "g", 2, 2, 1))] == [RETIRED]
    assert book.leases[lease.lease_id].footprint == 1  # still running
    assert [o.status for o in book.sync("a", LeaseReport(lease.lease_id, "g", 1, 1, 1, stopped=True))] == [SETTLED]
    assert book.leases == {} and book.footprint() == 0


def test_lowering_the_limit_retires_live_leases_on_the_next_round():
    book = Book(policy(per_lease=4), total=10)
    lease = issue(book, count=4)
    book.total = 12
    book.round()
    assert not book.leases[lease.lease_id].retired  # raising changes nothing
    book.total = 9
    book.round()
    assert book.leases[lease.lease_id].retired and book.footprint() == 4
    # Retired: no more draws, so a new lease may go to the same client, under the new limit.
    assert sizes(book.round(want("a", count=2)), ["a"]) == [4]


def test_losing_eligibility_retires_leases_on_the_next_round():
    book = Book(policy(per_lease=2), total=10)
    a, b, c = issue(book, "a", 1), issue(book, "b", 1), issue(book, "c", 1)
    book.groups = {"g": 3}  # the group now has its own limit
    book.round()
    assert all(book.leases[x.lease_id].retired for x in (a, b, c))
    other = Book(policy(), total=10)
    lease = issue(other, "a", 1)
    other.round(permitted={("a", "g"): False})
    assert other.leases[lease.lease_id].retired
    off = Book(policy(), total=10)
    lease = issue(off, "a", 1)
    off.policy = None  # leases turned off
    off.round()
    assert off.leases[lease.lease_id].retired


def test_a_report_for_a_lease_never_known_is_answered_retired_and_charged_in_that_round():
    book = Book(policy(), total=10)
    foreign = LeaseReport("l0123-7", "g", 6, 4, 1)  # another epoch: a holder whose storage was reset
    result = book.round(want("a", count=9, reports=[foreign]))
    assert [o.status for o in result.outcomes["a"].lease_reports] == [RETIRED]
    assert book.leases["l0123-7"].retired and book.leases["l0123-7"].footprint == 5
    assert sizes(result, ["a"]) == [5]  # charged against this very round
    # A stopped report charges only what was drawn and is still running.
    assert [o.status for o in book.sync("b", LeaseReport("lzz", "g", 6, 3, 1, stopped=True))] == [RETIRED]
    assert book.leases["lzz"].footprint == 2
    # An id under this holder's own prefix that it never issued is refused:
    # charging it could collide with an id the holder issues later.
    for never_issued in ("le-99", "le-01", "le-x"):
        with pytest.raises(ProtocolError) as refused:
            book.sync("b", LeaseReport(never_issued, "g", 2, 0, 0))
        assert refused.value.code == "forbidden"


def foreign_life(book, report):
    """A lease of another epoch reported to ``book``: the footprint charged at once."""
    book.sync("a", report)
    lease = book.leases.get(report.lease_id)
    return lease.footprint if lease is not None else 0


def test_a_lease_of_another_epoch_is_charged_only_within_a_ttl_of_the_epochs_start():
    report = LeaseReport("l0123-7", "g", 6, 4, 1)
    within = Book(policy(), total=10)
    within.now = T0 + TTL - 1  # a lease live when the rows were lost is heard within a ttl
    assert foreign_life(within, report) == 5
    past = Book(policy(), total=10)
    past.now = T0 + TTL
    outcomes = past.sync("a", report)
    assert [(o.status, o.drawn, o.released) for o in outcomes] == [(SETTLED, 4, 1)]
    assert past.leases == {} and past.charged() == 0  # answered settled: nothing charged, nothing written


def test_a_lease_of_another_epoch_is_charged_while_heard_and_no_longer_than_a_ttl_unheard():
    book = Book(policy(), total=10)
    report = LeaseReport("l0123-7", "g", 6, 4, 1)
    assert foreign_life(book, report) == 5
    for _ in range(6):  # its client reports it every half ttl: charged all along, past the first ttl
        book.now += TTL / 2
        reclaim_now(book)
        assert book.sync("a", report)[0].status == RETIRED and book.footprint() == 5
    expiry = book.leases["l0123-7"].expires_at
    assert next_reclaim_at((), book.leases.values(), book.ids) == expiry == book.now + TTL
    book.now = expiry  # unheard for a ttl: no client with work under it can reach the holder
    reclaim_now(book)
    assert book.footprint() == 0 and book.leases == {}  # past the epoch's first ttl: nothing to remember
    assert book.sync("a", report)[0].status == SETTLED and book.charged() == 0  # heard again: nothing


def test_a_settled_lease_of_another_epoch_is_remembered_until_the_epochs_first_ttl_ends():
    book = Book(policy(), total=10)
    assert foreign_life(book, LeaseReport("lfeed-1", "g", 4, 0, 0)) == 4
    book.now += 1_000
    assert book.sync("a", LeaseReport("lfeed-1", "g", 4, 0, 0, stopped=True))[0].status == SETTLED
    remembered = book.leases["lfeed-1"]
    assert remembered.settled and remembered.expires_at == T0 + TTL
    book.now = T0 + TTL - 1
    assert book.sync("a", LeaseReport("lfeed-1", "g", 4, 0, 0))[0].status == SETTLED  # a late duplicate
    book.now = T0 + TTL
    reclaim_now(book)
    assert book.leases == {}
    assert book.sync("a", LeaseReport("lfeed-1", "g", 4, 0, 0))[0].status == SETTLED and book.charged() == 0
    # Settled after the first ttl, it is not remembered at all: no report of it could charge it.
    late = Book(policy(), total=10)
    late.now = T0 + TTL / 2
    assert foreign_life(late, LeaseReport("lfeed-2", "g", 4, 2, 0)) == 4
    late.now = T0 + 2 * TTL
    late.sync("a", LeaseReport("lfeed-2", "g", 4, 2, 2, stopped=True))
    assert late.leases == {}


def test_a_heartbeat_of_a_lease_of_another_epoch_is_a_row():
    row = Lease("l0123-7", "a", "g", 6, 4, 1, T0 + TTL, True, 0)
    assert needs_row(row, replace(row, expires_at=T0 + TTL + 1), TTL)  # a new instance must not drop it sooner
    assert not needs_row(row, replace(row, released=2), TTL)


def reclaim_now(book):
    working = Working(book.grants, book.leases)
    reclaim(working, book.now, book.ids)
    working.changes.apply_to(book.grants, book.leases)


def test_a_client_cannot_report_on_another_clients_lease():
    book = Book(policy(), total=10)
    lease = issue(book, "a", 2)
    result = book.round(Request("b", (), (), 0.0, True, (LeaseReport(lease.lease_id, "g", 10, 10, 10, True),)))
    assert isinstance(result.errors[0], ProtocolError) and result.errors[0].code == "forbidden"
    assert book.leases[lease.lease_id].footprint == lease.permits


def test_a_lease_is_listed_until_settled_and_is_news_only_to_a_client_that_did_not_report_it():
    book = Book(policy(per_lease=3), total=10)
    lease = issue(book, "a", 3)
    unreported = want("a", count=3)
    outcome = book.round(unreported).outcomes["a"]
    assert [x.lease_id for x in outcome.listed_leases] == [lease.lease_id]
    assert news_for(unreported, outcome)  # a lost reply's lease: the reply goes at once
    reported = want("a", count=0, reports=[LeaseReport(lease.lease_id, "g", 3, 1, 0)])
    outcome = book.round(reported).outcomes["a"]
    assert [(x.lease_id, x.drawn) for x in outcome.listed_leases] == [(lease.lease_id, 1)]
    assert not news_for(reported, outcome)  # known: the reply may be held
    settle = want("a", count=0, reports=[LeaseReport(lease.lease_id, "g", 3, 1, 1, True)])
    assert book.round(settle).outcomes["a"].listed_leases == []


@pytest.mark.parametrize("bad", [
    {"leaseReports": [{"leaseId": "l", "group": "g", "permits": 2, "drawn": 3, "released": 0}]},
    {"leaseReports": [{"leaseId": "l", "group": "g", "permits": 2, "drawn": 1, "released": 2}]},
    {"leaseReports": [{"leaseId": "l", "group": "g", "permits": 2, "drawn": 1, "released": 0, "stopped": 1}]},
    {"leaseReports": [{"leaseId": "l", "permits": 2, "drawn": 1, "released": 0}]},
    {"leaseReports": [{"leaseId": "l", "group": "g", "permits": 2, "drawn": 0, "released": 0}] * 2},
    {"leaseReports": [{"leaseId": "", "group": "g", "permits": 2, "drawn": 0, "released": 0}]},
    {"leaseReports": [{"leaseId": f"l{i}", "group": "g", "permits": 1, "drawn": 0, "released": 0}
                      for i in range(257)]},
    {"leases": "yes"},
])
def test_bad_lease_fields_are_refused(bad):
    with pytest.raises(ProtocolError):
        parse({"type": "request", "v": 1, "clientId": "c", **bad})


# -- the invariant, by property ------------------------------------------------------------------

CLIENTS = ["c0", "c1", "c2"]
GROUPS = ["g0", "g1"]
MODES = [policy(per_lease=4), policy("under", per_lease=4, reserve=3),
         policy("over", per_lease=4, extra={"ratio": 0.5}),
         policy("over", per_lease=3, extra={"count": 2}, limited_groups="withinGroupLimit")]


class LeasingHolder(RuleBasedStateMachine):
    """A holder and clients that draw, release, stop, lose replies and send stale reports."""

    @initialize(mode=st.sampled_from(MODES), total=st.integers(0, 10), ceiling=st.sampled_from([None, 2, 5]))
    def start(self, mode, total, ceiling):
        self.book = Book(mode, total, {"g1": ceiling})
        # What each client really holds: lease id -> [group, permits, drawn, released, stopped].
        self.local: dict[str, dict[str, list]] = {c: {} for c in CLIENTS}
        self.sent: list[tuple[str, LeaseReport]] = []  # every report ever made, to replay out of order

    def reports(self, client):
        made = [LeaseReport(i, g, p, d, r, s) for i, (g, p, d, r, s) in self.local[client].items()]
        self.sent.extend((client, r) for r in made)
        return made

    def learn(self, client, outcome):
        local = self.local[client]
        for lease in outcome.listed_leases:
            if lease.lease_id not in local and lease.drawn == 0 and lease.lease_id in self.book.leases:
                local[lease.lease_id] = [lease.group, lease.permits, 0, 0, lease.retired]
        for report in outcome.lease_reports:
            held = local.get(report.lease_id)
            if held is None:
                continue
            if report.status != OK:
                held[4] = True
            if report.status == SETTLED and held[3] == held[2]:
                del local[report.lease_id]

    @rule(data=st.data(), lost=st.booleans())
    def round(self, data, lost):
        clients = data.draw(st.lists(st.sampled_from(CLIENTS), unique=True, max_size=3))
        requests = [Request(c, tuple(Demand(g, data.draw(st.integers(0, 6)), T0) for g in GROUPS), (), 0.0,
                            data.draw(st.booleans()), tuple(self.reports(c))) for c in clients]
        ceiling = self.book.policy.budgets(self.book.total).ceiling
        result = self.book.round(*requests)
        assert not result.errors
        leased = [x for o in result.outcomes.values() for x in o.new_leases]
        granted = [x for o in result.outcomes.values() for x in o.new_grants]
        if leased or granted:
            assert self.book.charged() <= ceiling
        if leased and self.book.policy.mode == "over":
            assert self.book.footprint() <= self.book.policy.extra(self.book.total)
        if granted:
            grant_cap = self.book.policy.budgets(self.book.total).grant_cap
            assert usage(self.book.grants.values())[0] <= grant_cap
        for client, outcome in result.outcomes.items():
            if not lost:
                self.learn(client, outcome)

    @rule(client=st.sampled_from(CLIENTS), data=st.data())
    def draw_or_release(self, client, data):
        if not self.local[client]:
            return
        held = self.local[client][data.draw(st.sampled_from(sorted(self.local[client])))]
        action = data.draw(st.sampled_from(["draw", "release", "stop"]))
        if action == "draw" and not held[4] and held[2] < held[1]:
            held[2] += 1
        elif action == "release" and held[3] < held[2]:
            held[3] += 1
        elif action == "stop":
            held[4] = True

    @rule(client=st.sampled_from(CLIENTS))
    def sync(self, client):
        for outcome in self.book.sync(client, *self.reports(client)):
            self.learn(client, type("O", (), {"listed_leases": [], "lease_reports": [outcome]})())

    @rule(data=st.data())
    def stale_report_arrives(self, data):
        if self.sent:
            client, report = data.draw(st.sampled_from(self.sent))
            self.book.sync(client, report)

    @rule(ms=st.sampled_from([1_000, TTL // 2, TTL]))
    def time_passes(self, ms):
        self.book.now += ms

    @rule(total=st.integers(0, 10))
    def limit_changes(self, total):
        self.book.total = total

    @invariant()
    def every_lease_is_counted_at_least_as_the_client_may_use_it(self):
        for client, local in self.local.items():
            for lease_id, (_group, permits, drawn, released, stopped) in local.items():
                may_use = (drawn if stopped else permits) - released
                held = self.book.leases.get(lease_id)
                if held is None:
                    assert may_use == 0 and stopped or drawn == permits == released
                else:
                    assert held.footprint >= may_use and held.client_id == client
                    if not stopped:
                        assert held.permits == permits  # what it may draw is still charged

    @invariant()
    def counts_are_sane(self):
        for lease in self.book.leases.values():
            assert 0 <= lease.released <= lease.drawn <= lease.permits and not lease.settled


TestLeasingHolder = LeasingHolder.TestCase
TestLeasingHolder.settings = settings(max_examples=60, stateful_step_count=30, deadline=None,
                                      suppress_health_check=[HealthCheck.too_slow])


def test_merged_leases_sees_the_changes():
    book = Book(policy(), total=4)
    lease = issue(book, "a", 1)
    working = Working(book.grants, book.leases)
    working.put_lease(Lease(lease.lease_id, "a", "g", 4, 4, 4, T0, False, 4))
    assert merged_leases(book.leases, working.changes) == []


def test_demand_a_lease_leaves_uncovered_gets_grants_from_what_remains():
    over = Book(policy("over", per_lease=4, extra={"count": 3}), total=10)
    result = over.round(want("a", count=8))
    assert sizes(result, ["a"]) == [3]  # the extra, as a lease
    assert [g.permits for g in result.outcomes["a"].new_grants] == [5]  # the rest from the limit
    strict = Book(policy(per_lease=2), total=10)
    result = strict.round(want("a", count=5))
    assert sizes(result, ["a"]) == [2] and [g.permits for g in result.outcomes["a"].new_grants] == [3]
    assert not result.contended


def test_a_request_held_over_to_later_rounds_is_no_heartbeat():
    book = Book(policy(), total=4)
    lease = issue(book, "a", 1)
    report = LeaseReport(lease.lease_id, "g", lease.permits, 1, 0)
    book.now += TTL / 2
    book.round(Request("a", (), (), 0.0, True, (report,)))
    heard = book.leases[lease.lease_id].expires_at
    assert heard == book.now + TTL
    book.now += TTL / 2
    book.round(Request("a", (), (), 0.0, True, (report,)), held_over={0})
    assert book.leases[lease.lease_id].expires_at == heard
