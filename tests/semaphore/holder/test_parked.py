"""The holder's line of parked requests, and when a parked client or a silent holder of permits is called: pure
(and what a client's answer to a call does to the line, with no runtime)."""

import asyncio
import math

import pytest
from hypothesis import given, strategies as st

from durability._common.clock import now_ms
from durability.semaphore.holder.parked import ParkedRequests, holdings, next_wake_at, silent_holders
from durability.semaphore.holder.pure.allocation import Grant
from durability.semaphore.holder.pure.leases import Lease
from durability.semaphore.holder.pure.line import ParkedLine
from durability.semaphore.messages import Demand, LeaseReport, Report, Request
from durability.semaphore.queue.pure.core import FALLBACK_SLACK_MS, fallback_at


def request(client, *demand, wait=30_000, **extra):
    return Request(client, tuple(Demand(g, n, t, tuple(t + i for i in range(n))) for g, n, t in demand),
                   (Report("g0", 1, 1),), wait, wake=True, **extra)


def test_a_parked_request_keeps_its_demand_but_not_its_reports():
    line = ParkedLine()
    entry = line.park(request("a", ("g", 2, 100)), now=1_000)
    assert entry.request.reports == () and entry.request.demand[0].count == 2
    assert line.requests() == [entry.request]


def test_a_client_with_no_demand_leaves_the_line_and_a_newer_request_replaces_an_older_one():
    line = ParkedLine()
    line.park(request("a", ("g", 2, 100)), now=1_000)
    line.park(request("a", ("g", 5, 100)), now=2_000)
    assert [r.demand[0].count for r in line.requests()] == [5]
    assert line.get("a").since == 1_000  # its place in line, kept
    line.park(request("a"), now=3_000)
    assert not line and line.get("a") is None


def test_a_round_takes_what_it_served_off_the_oldest_items_and_the_client_leaves_when_none_is_left():
    line = ParkedLine()
    line.park(request("a", ("g", 3, 100), ("h", 1, 50)), now=0)
    line.served("a", {"g": 2}, heard_up_to=9_000)
    entry = line.get("a")
    g = next(d for d in entry.request.demand if d.group == "g")
    assert (g.count, g.oldest_at, g.times) == (1, 102, (102,))
    assert entry.request.heard_up_to == 9_000  # it is taken to know those grants
    line.served("a", {"g": 1, "h": 1}, heard_up_to=9_500)
    assert line.get("a") is None


def test_ties_in_age_go_to_the_client_parked_first_and_suspended_clients_sit_out_rounds():
    line = ParkedLine()
    line.park(request("b", ("g", 1, 100)), now=1)
    line.park(request("a", ("g", 1, 100)), now=2)
    assert [r.client_id for r in line.requests()] == ["b", "a"]
    line.suspend("b")
    assert [r.client_id for r in line.requests()] == ["a"]
    line.heard("b", now=3)  # it spoke: served again
    assert [r.client_id for r in line.requests()] == ["b", "a"]


def test_a_reply_to_a_call_refreshes_the_demand_unless_a_newer_request_came_meanwhile():
    line = ParkedLine()
    version = line.park(request("a", ("g", 1, 100)), now=0).version
    assert line.refresh("a", version, request("a", ("g", 4, 100)), now=5)
    assert line.get("a").request.demand[0].count == 4
    line.park(request("a", ("g", 2, 100)), now=6)  # a newer request
    assert not line.refresh("a", version, request("a", ("g", 9, 100)), now=7)
    assert line.get("a").request.demand[0].count == 2


def test_a_reply_to_a_call_brings_back_a_client_a_round_took_out_of_the_line():
    line = ParkedLine()
    version = line.park(request("a", ("g", 1, 100)), now=0).version
    line.served("a", {"g": 1}, heard_up_to=1)
    assert line.get("a") is None
    assert line.refresh("a", version, request("a", ("g", 3, 200)), now=5)  # new items came meanwhile
    assert line.get("a").request.demand[0].count == 3


def test_the_line_as_rows_keep_it_comes_back_whole_in_a_new_instance():
    line = ParkedLine()
    line.park(request("a", ("g", 2, 100), name="shard-a"), now=10)
    line.park(request("b", ("h", 1, 50)), now=20)
    rows = line.waiting("a") + line.waiting("b")
    again = ParkedLine()
    again.restore(rows, now=99, names={"a": "shard-a"})
    assert [(r.client_id, r.name, [(d.group, d.count, d.times) for d in r.demand]) for r in again.requests()] == [
        ("a", "shard-a", [("g", 2, (100, 101))]), ("b", None, [("h", 1, (50,))])]
    assert again.get("a").since == 10 and again.get("a").heard_at == 99


def test_which_clients_changed_is_taken_once_and_given_back_if_their_rows_were_not_written():
    line = ParkedLine()
    line.park(request("a", ("g", 1, 100)), now=0)
    assert line.take_changed() == {"a"} and line.take_changed() == set()
    line.changed_again({"a"})
    assert line.take_changed() == {"a"}


def test_leases_a_client_reported_or_was_told_of_are_no_news_to_it():
    line = ParkedLine()
    lease = LeaseReport("L1", "g", 2, 1, 0)
    entry = line.park(request("a", ("g", 1, 100), lease_reports=(lease,)), now=0)
    assert entry.known_leases == {("L1", False)}
    line.told("a", [("L2", False), ("L1", True)])
    assert line.get("a").known_leases == {("L1", False), ("L2", False), ("L1", True)}


@given(since=st.floats(0, 1e9), every=st.floats(2 * FALLBACK_SLACK_MS, 1e6), after=st.floats(0, 1e7),
       phase=st.floats(0, 1), other=st.floats(0, 1e9))
def test_a_parked_keys_fallback_is_the_objects_next_point_and_never_put_off_by_a_new_instance(
        since, every, after, phase, other):
    now = since + after
    phase_ms = phase * every
    at = fallback_at([Demand("g", 1, since)], every, now, phase_ms)
    assert now - FALLBACK_SLACK_MS <= at < now - FALLBACK_SLACK_MS + every * (1 + 1e-9)
    assert math.isclose((at - phase_ms) / every, round((at - phase_ms) / every), abs_tol=1e-6)  # on the grid
    # An instance started later, but before that time, derives the same time,
    # and so does every other key of the object, however old its work.
    assert fallback_at([Demand("g", 1, since)], every, (now + at) / 2, phase_ms) == at
    assert fallback_at([Demand("h", 2, min(other, now))], every, now, phase_ms) == at


def test_a_key_with_nothing_waiting_asks_at_once():
    assert fallback_at([], 30_000, 123.0) == 123.0


def grant(client, deadline, permits=1, released=0):
    return Grant(f"g-{client}-{deadline}", client, "g", permits, permits, released, deadline)


def test_a_silent_holder_of_a_long_held_grant_or_a_lease_past_its_expiry_is_due_a_call():
    grants = [grant("old", 1_000), grant("new", 50_000), grant("done", 1_000, released=1)]
    leases = [Lease("L1", "leased", "g", 1, 0, 0, 2_000, False, 3), Lease("L2", "gone", "g", 1, 1, 1, 1_000, True, 3)]
    held = holdings(grants, leases)
    assert silent_holders(held, {}, now=62_000, after_ms=60_000) == ["leased", "old"]
    assert silent_holders(held, {"old": 30_000}, now=62_000, after_ms=60_000) == ["leased"]  # it spoke since


def test_wakes_come_at_times_the_rows_fix_so_that_every_instance_agrees():
    held = holdings([grant("a", 1_000), grant("b", 5_000, released=1)], [])
    assert next_wake_at(held, now=0, after_ms=60_000) == 61_000
    assert next_wake_at(held, now=61_000, after_ms=60_000) == 121_000
    assert next_wake_at(held, now=100_000, after_ms=60_000) == 121_000
    assert next_wake_at(holdings([grant("b", 5_000, released=1)], []), now=0, after_ms=60_000) is None


@pytest.mark.parametrize("refused", [True, False])
def test_an_answer_to_a_call_whose_reports_are_refused_changes_nothing(refused):
    news = []

    async def on_news(more, gave_back):
        news.append((more, gave_back))

    parked = ParkedRequests(None, "k", None, "p", news=on_news, take_reports=lambda answer: None if refused else False,
                            wake_after_ms=60_000, listing=lambda client: {}, first_listing=lambda ids: set())
    parked.park(request("a", ("g", 1, 100)))
    version = parked.line.version_of("a")
    asyncio.run(parked._on_reply("a", version, request("a", ("g", 5, 100))))
    kept = parked.line.get("a").request.demand[0].count
    assert (kept, news) == ((1, []) if refused else (5, [(True, False)]))


def test_a_round_calls_the_client_whose_sync_started_it_only_once_its_entry_is_used_up():
    # A sync's reply lists what the round grants its client; but a sync says
    # nothing of the client's demand, and items its queue gained since its
    # last word are in no entry: once the round used the entry up, only the
    # call's answer puts them in line (else they wait for the fallback).
    from durability.semaphore.holder.pure.allocation import ClientOutcome

    async def on_news(more, gave_back):
        pass

    parked = ParkedRequests(None, "k", None, "p", news=on_news, take_reports=lambda answer: False,
                            wake_after_ms=60_000, listing=lambda client: {}, first_listing=lambda ids: set())
    parked.park(request("a", ("g", 3, 100)))
    parked.park(request("b", ("g", 3, 100)))

    def granted(client_id, permits):
        return ClientOutcome(new_grants=[Grant(f"{client_id}-{permits}", client_id, "g", permits, permits, 0, 9_000.0)])

    calls = parked.served({"a": granted("a", 2), "b": granted("b", 3)}, asked=set(), synced="a")
    assert [call[0] for call in calls] == ["b"]  # a keeps an entry: its reply said it all
    calls = parked.served({"a": granted("a", 1)}, asked=set(), synced="a")
    assert [call[0] for call in calls] == ["a"]  # a's entry is used up: called, its answer says what waits
    assert parked.served({"c": granted("c", 1)}, asked={"c"}) == []  # not in line


def test_an_answer_saying_it_heard_of_grants_the_line_counted_for_its_demand_brings_a_round():
    # A new instance's line counts the claims of a grant an earlier one made,
    # still claimable, as serving a's demand (a may not know of it). a's
    # answer says it heard of that grant: those claims served items already
    # admitted, and the item it still asks for waits for new permits. Same
    # demand, but news: without it, that item waited for a's fallback or a
    # sweep (campaign tree seed 9610).
    news = []

    async def on_news(more, gave_back):
        news.append((more, gave_back))

    parked = ParkedRequests(None, "k", None, "p", news=on_news, take_reports=lambda answer: False,
                            wake_after_ms=60_000, listing=lambda client: {}, first_listing=lambda ids: set())
    parked.park(request("a", ("g", 1, 100), heard_up_to=1_000.0))
    version = parked.line.version_of("a")
    asyncio.run(parked._on_reply("a", version, request("a", ("g", 1, 100), heard_up_to=1_000.0)))
    assert news == [(False, False)]  # nothing more to serve: no round
    asyncio.run(parked._on_reply("a", version, request("a", ("g", 1, 100), heard_up_to=9_000.0)))
    assert news[-1] == (True, False)
    asyncio.run(parked._on_reply("a", parked.line.version_of("a"), request("a", heard_up_to=19_000.0)))
    assert news[-1] == (False, False)  # nothing asked for: nothing to serve


def test_a_new_instance_leaves_to_its_deadline_calls_the_clients_of_an_earlier_ones_grants_it_has_not_heard():
    # b holds a grant an earlier instance made, still claimable: the new
    # instance calls b at its claim deadline, and b's answer says what it
    # heard (the round for lapsed claims leaves b to it). c spoke since the
    # start: not called, so that round looks at c's demand. a's grant is
    # past its deadline: taken as known.
    class Scheduler:
        def schedule(self, *args):
            pass

        def cancel(self, *args):
            pass

    async def on_news(more, gave_back):
        pass

    parked = ParkedRequests(None, "k", Scheduler(), "p", news=on_news, take_reports=lambda answer: False,
                            wake_after_ms=60_000, listing=lambda client: {}, first_listing=lambda ids: set())
    now = now_ms()
    grants = [Grant("ga", "a", "g", 1, 1, 0, now - 1_000), Grant("gb", "b", "g", 1, 1, 0, now + 60_000),
              Grant("gc", "c", "g", 1, 1, 0, now + 60_000)]
    parked.restore([], {}, grants)
    assert parked.called_at_deadline() == {"b": now + 60_000, "c": now + 60_000}
    parked.park(request("c", ("g", 1, 100)))
    assert parked.called_at_deadline() == {"b": now + 60_000}


def test_the_round_for_lapsed_claims_leaves_out_the_clients_called_at_that_deadline():
    from types import SimpleNamespace

    from durability.semaphore.holder import rounds

    now = now_ms()
    grants = {"gb": Grant("gb", "b", "g", 1, 1, 0, now + 5_000), "gc": Grant("gc", "c", "g", 1, 1, 0, now + 7_000),
              "gb2": Grant("gb2", "b", "g", 1, 1, 0, now + 9_000)}
    line = [request(client, ("g", 1, 100), claims=True) for client in ("b", "c")]  # each heard of nothing
    set_for = []

    def holder(called):
        parked = SimpleNamespace(line=SimpleNamespace(requests=lambda: line), called_at_deadline=lambda: called)
        return SimpleNamespace(_parked=parked, tree=SimpleNamespace(is_child=lambda client_id: False),
                               books=SimpleNamespace(grants=lambda: grants),
                               scheduler=SimpleNamespace(schedule_by=lambda *args: set_for.append(args[2])))

    rounds._round_when_claims_lapse(holder({}), now)
    rounds._round_when_claims_lapse(holder({"b": now + 5_000}), now)
    rounds._round_when_claims_lapse(holder({"b": now + 9_000}), now)  # its call comes at its later grant's deadline
    rounds._round_when_claims_lapse(holder({"b": now + 9_000, "c": now + 7_000}), now)
    lapsed = rounds.CLAIM_LAPSED_MS
    # b's first deadline; c's; b's first again (before b's call); then b's
    # first still, c called at its own.
    assert set_for == [now + 5_000 + lapsed, now + 7_000 + lapsed, now + 5_000 + lapsed, now + 5_000 + lapsed]
