"""A start rate next to the limit: exact by the starts, whatever the grants' delivery, kept across restarts.

The pure rules (``holder/pure/rate``) first, then a round under a rate,
then the holders Worker on the embedded runtime, where ground truth is
when each item was admitted.
"""

import asyncio
import random

import pytest

from bench.rates import most_in_any_window
from durability.semaphore import DurabilitySemaphore
from durability.semaphore.holder.pure.allocation import Grant, Limits, run_round
from durability.semaphore.holder.pure.rate import Pace, Rate, next_start_at, rate_room, starts_in_window
from durability.semaphore.messages import Request
from durability.testing import HIBERNATE_AFTER_MS
from support import holders_runtime, queue_jobs

MINUTE = 60_000.0


def grant(grant_id, at, permits=1, timeout=10_000, settled=False):
    released = permits if settled else 0
    return Grant(grant_id, "c", "g", permits, permits, released, at + timeout, False, at + timeout + MINUTE)




# -- the option ------------------------------------------------------------------------
@pytest.mark.parametrize("value, expected", [
    ((60, MINUTE), Rate(60, MINUTE, 0)),
    ((60, MINUTE, 10), Rate(60, MINUTE, 10)),
    ([60, MINUTE], Rate(60, MINUTE, 0)),
    ({"limit": 5, "period_ms": 1_000}, Rate(5, 1_000.0, 0)),
    ("60/min", Rate(60, MINUTE, 0)),
    ("5/s", Rate(5, 1_000.0, 0)),
    ("1000/hour, burst 50", Rate(1000, 3_600_000.0, 50)),
])
def test_a_rate_is_read_from_each_form(value, expected):
    assert Rate.parse(value) == expected


@pytest.mark.parametrize("value", [
    (60,), (60, 0), (60, -1.0), (-1, MINUTE), (1.5, MINUTE), (60, MINUTE, -1), (True, MINUTE),
    "60", "60/fortnight", "sixty/min", "60/min, bursts 5", "60/min, burst", {"limit": 1, "period": 5}, 60,
])
def test_a_bad_rate_is_refused_with_what_a_rate_looks_like(value):
    with pytest.raises(ValueError, match="rate"):
        Rate.parse(value)


def test_a_holder_refuses_a_bad_rate_and_a_rate_with_leases_or_a_parent_when_it_is_made():
    # Refused before the holder touches its scheduler or storage.
    with pytest.raises(ValueError, match="rate"):
        DurabilitySemaphore(None, limit=1, rate="60/fortnight")
    with pytest.raises(ValueError, match="leases"):
        DurabilitySemaphore(None, limit=1, rate="60/min", leases={"provisioning": {"mode": "strict"}})
    with pytest.raises(ValueError, match="parent"):
        DurabilitySemaphore(None, limit=1, rate="60/min", parent=object())


# -- the window --------------------------------------------------------------------------
def test_a_grant_counts_until_its_start_is_placed_or_its_claim_deadline_then_a_period():
    grants = [grant("a", 0.0)]  # claim deadline 10 s
    rate = Rate(1, MINUTE)
    assert starts_in_window(grants, {}, 69_999.0, rate) == 1
    assert starts_in_window(grants, {}, 70_000.0, rate) == 0
    placed = {"a": 2_000.0}  # the call that brought it was answered at 2 s
    assert starts_in_window(grants, placed, 61_999.0, rate) == 1
    assert starts_in_window(grants, placed, 62_000.0, rate) == 0
    assert next_start_at(grants, placed, 30_000.0, rate) == 62_000.0
    assert next_start_at(grants, {}, 30_000.0, rate) == 70_000.0


def test_room_and_the_next_start_count_permits_and_the_burst():
    grants = [grant("a", 0.0, permits=3), grant("b", 1_000.0, permits=2, settled=True)]
    placed = {"a": 100.0, "b": 1_100.0}
    assert rate_room(grants, placed, 5_000.0, Rate(6, MINUTE)) == 1
    assert rate_room(grants, placed, 5_000.0, Rate(4, MINUTE, burst=2)) == 1
    assert rate_room(grants, placed, 5_000.0, Rate(4, MINUTE)) == 0
    # Four starts allowed, five counted: the second-oldest start must leave the window.
    assert next_start_at(grants, placed, 5_000.0, Rate(4, MINUTE)) == 100.0 + MINUTE
    assert next_start_at(grants, placed, 5_000.0, Rate(3, MINUTE)) == 100.0 + MINUTE  # all three of a
    assert next_start_at(grants, placed, 5_000.0, Rate(2, MINUTE)) == 1_100.0 + MINUTE
    assert next_start_at(grants, placed, 5_000.0, Rate(0, MINUTE)) is None


def test_the_pace_lets_a_burst_start_at_once_then_the_limit_per_period():
    rate, pace = Rate(6, MINUTE, burst=4), Pace()
    assert pace.room(0.0, rate) == 10
    pace.started(10, 0.0, rate)
    assert pace.room(0.0, rate) == 0
    assert pace.next_at(0.0, rate) == 10_000.0  # one interval (60 s / 6) on
    assert pace.room(10_000.0, rate) == 1
    pace.started(1, 10_000.0, rate)
    assert pace.next_at(10_000.0, rate) == 20_000.0
    assert pace.room(10 * MINUTE, rate) == 10  # quiet long enough: a full burst again


# -- a round -----------------------------------------------------------------------------
def request(client, count, oldest=0.0):
    return Request.parse({"type": "request", "v": 1, "clientId": client * 64, "claims": True, "wait": 0,
                          "demand": [{"group": "g", "count": count, "oldestAt": oldest}]})


def round_with(book, requests, now, rate, limit=100, placed=None):
    ids = iter(range(10**6))
    return run_round(book, requests, Limits(limit, {}, {}), now, 10_000, lambda: f"n{next(ids)}-{now}",
                     rate=rate, placed=placed or {})


def test_a_round_grants_what_both_the_limit_and_the_rate_allow_and_says_which_held_back():
    rate = Rate(3, MINUTE)
    by_rate = round_with({}, [request("a", 5)], 0.0, rate, limit=10)
    outcome = next(iter(by_rate.outcomes.values()))
    assert sum(g.permits for g in outcome.new_grants) == 3
    assert outcome.blocked["g"] == ("rate", 2)
    assert all(g.kept_until == 10_000 + MINUTE for g in outcome.new_grants)
    by_limit = round_with({}, [request("a", 5)], 0.0, rate, limit=2)
    outcome = next(iter(by_limit.outcomes.values()))
    assert sum(g.permits for g in outcome.new_grants) == 2 and outcome.blocked["g"] == ("limit", 3)
    unlimited = round_with({}, [request("a", 5)], 0.0, None)
    assert all(g.kept_until == 0 for g in next(iter(unlimited.outcomes.values())).new_grants)


def test_a_settled_grant_stays_in_the_book_while_the_rate_counts_it():
    rate = Rate(2, MINUTE)
    first = round_with({}, [request("a", 2)], 0.0, rate)
    book = {g.grant_id: g for g in first.changes.written.values()}
    released = [g.counted(g.claimed, g.permits) for g in book.values()]
    book = {g.grant_id: g for g in released}
    later = round_with(book, [request("a", 1, oldest=1.0)], 30_000.0, rate)
    assert not later.changes.deleted
    assert next(iter(later.outcomes.values())).blocked["g"] == ("rate", 1)
    past = round_with(book, [request("a", 1, oldest=1.0)], 10_000 + MINUTE, rate)
    assert sum(g.permits for g in next(iter(past.outcomes.values())).new_grants) == 1


def test_a_group_rate_holds_its_group_under_the_key_and_says_rate():
    result = run_round({}, [request("a", 5), request("b", 5)], Limits(20, {}, {}), 0.0, 10_000,
                       iter(f"g{n}" for n in range(99)).__next__, group_rates={"g": Rate(3, MINUTE)})
    granted = sum(g.permits for outcome in result.outcomes.values() for g in outcome.new_grants)
    assert granted == 3  # both clients ask in group g: three start in its window, whatever the limit
    assert all(g.kept_until == 10_000 + MINUTE for o in result.outcomes.values() for g in o.new_grants)
    assert [o.blocked["g"][0] for o in result.outcomes.values()] == ["rate", "rate"]


def test_a_group_rate_holds_its_group_and_one_that_does_not_resolve_fails_closed(runtime):
    # group_rate returns a rate for g, something that is no rate for "broken".
    runtime.module.CONFIG.update(rate=None, group_rates={"g": (2, 10_000), "broken": "two a minute"})

    async def scenario():
        await runtime.env.SHARD.getByName("b").submit(queue_jobs("b", 2, ms=500, group="broken"))
        await flood(runtime, "a", 4, 500, 3)
        return (await runtime.env.HOLDER.getByName("holder").usage(),
                await runtime.env.SHARD.getByName("b").status("b0"))

    usage, broken = runtime.run(scenario())
    assert usage["rate"] is None
    rate = usage["groups"]["g"]["rate"]
    assert (rate["limit"], rate["startsInWindow"], rate["room"]) == (2, 2, 0)
    assert most_in_any_window(admitted_times(runtime), 10_000) == 2  # and b's items never started
    assert broken["blocked"]["reason"] == "limit_resolution_error"


def test_a_group_window_is_kept_for_the_group_period_when_a_round_does_not_read_it(runtime):
    # The key's rate is short, the group's long: g's grants must stay counted
    # for g's period even when they settle in rounds that serve only h.
    runtime.module.CONFIG.update(rate=(100, 1_000), group_rates={"g": (2, 20_000)})

    async def scenario():
        await runtime.env.SHARD.getByName("a").submit(queue_jobs("a", 2, ms=2_000))
        await asyncio.sleep(1)
        await runtime.env.SHARD.getByName("b").submit(queue_jobs("b", 3, ms=300, group="h"))
        await asyncio.sleep(3)  # a's g grants were released meanwhile, after rounds that served h alone
        await runtime.env.SHARD.getByName("c").submit(queue_jobs("c", 2, ms=300))
        await asyncio.sleep(40)

    runtime.run(scenario())
    world = runtime.module.WORLD
    g_starts = [at for item, at in world["started"].items() if item[0] in "ac"]
    assert len(g_starts) == 4 and most_in_any_window(g_starts, 20_000) == 2


def test_under_a_rate_a_client_that_claims_in_two_steps_is_not_served(runtime):
    # It starts when it hears its claim confirmed, any time later: no window could count it.
    runtime.module.CONFIG.update(two_phase=True, calls=False)

    async def scenario():
        await flood(runtime, "a", 2, 500, 60)  # (its request is held: it hears at the end of its wait)
        return await runtime.env.SHARD.getByName("a").status("a0")

    status = runtime.run(scenario())
    assert runtime.module.WORLD["started"] == {}
    assert status["blocked"]["reason"] == "not_permitted"


@pytest.mark.parametrize("seed", range(20))
def test_no_window_of_real_starts_holds_more_than_the_rate_wherever_each_start_falls(seed):
    # Rounds at random times; each grant's permits start anywhere between its
    # round and its started_by (a placement the holder learned, or its claim
    # deadline). Whatever the draw, no window of a period holds more than
    # limit + burst starts.
    rng = random.Random(seed)
    rate = Rate(rng.randint(1, 6), rng.choice([5_000.0, MINUTE]), rng.choice([0, 2]))
    book, placed, starts, now, pace = {}, {}, [], 0.0, Pace()
    ids = (f"g{n}" for n in range(10**6))
    for _ in range(200):
        now += rng.expovariate(1 / 3_000)
        want, room = rng.randint(1, 4), rate_room(book.values(), placed, now, rate, pace if rate.burst else None)
        result = run_round(book, [request("a", want, oldest=now)], Limits(50, {}, {}), now, 10_000,
                           lambda: next(ids), rate=rate, placed=placed,
                           pace_room=pace.room(now, rate) if rate.burst else None)
        new = next(iter(result.outcomes.values())).new_grants
        assert sum(g.permits for g in new) == min(want, room)  # and all the room there is
        pace.started(sum(g.permits for g in new), now, rate)
        for g in new:
            latest = g.claim_deadline
            if rng.random() < 0.7:  # the call that brought it was answered
                latest = placed[g.grant_id] = now + rng.uniform(0, 500)
            starts += [rng.uniform(now, latest) for _ in range(g.permits)]
        result.changes.apply_to(book)
        for g in list(book.values()):  # released at once
            book[g.grant_id] = g.counted(g.claimed, g.permits)
            if book[g.grant_id].settled and not book[g.grant_id].remembered:
                del book[g.grant_id]
    assert most_in_any_window(starts, rate.period_ms) <= rate.most


# -- the holders Worker --------------------------------------------------------------------
@pytest.fixture
def runtime():
    with holders_runtime(seed=3, hibernate_after_ms=HIBERNATE_AFTER_MS) as rt:
        rt.module.CONFIG.update(limit=4, calls=True, round_wait_ms=20, round_period_ms=100,
                                finished_check_ms=5_000, request_wait_ms=30_000, rate=(5, 10_000))
        rt.module.WORLD["admitted_at"] = {}
        yield rt


def admitted_times(runtime):
    world = runtime.module.WORLD
    return [world["started"][item] for item in world["started"]]


async def flood(runtime, shards, per_shard, ms, seconds):
    for name in shards:
        await runtime.env.SHARD.getByName(name).submit(queue_jobs(name, per_shard, ms=ms))
    await asyncio.sleep(seconds)


def test_a_flood_starts_at_most_the_rate_in_any_window_and_keeps_it_busy(runtime):
    runtime.run(flood(runtime, "abcdef", 10, 500, 60))
    times = admitted_times(runtime)
    assert most_in_any_window(times, 10_000) <= 5
    assert len(times) >= 5 * 6 - 2  # about the rate, over six periods (60 items waited throughout)
    assert runtime.module.WORLD["violations"] == []


def test_a_restarted_holder_counts_the_window_its_rows_keep(runtime):
    async def scenario():
        await flood(runtime, "ab", 6, 500, 3)  # five start, and are done
        runtime.evict(runtime.env.HOLDER.getByName("holder"))
        await flood(runtime, "cd", 3, 500, 30)

    runtime.run(scenario())
    times = admitted_times(runtime)
    assert most_in_any_window(times, 10_000) <= 5
    assert len(times) >= 15


def test_a_holder_evicted_while_it_waits_for_the_window_serves_the_line_when_it_opens(runtime):
    # The round for the next window is on the alarm: evicted, the holder is
    # started again by it, and does not wait for its clients' fallback (30 s).
    runtime.module.CONFIG.update(rate=(2, 3_000))

    async def scenario():
        await flood(runtime, "ab", 3, 100, 2.2)  # two start; the window opens at about 3 s
        await flood(runtime, "c", 1, 100, 0.3)  # a round now: the window's round is due within a second
        runtime.evict(runtime.env.HOLDER.getByName("holder"))
        await asyncio.sleep(15)

    runtime.run(scenario())
    times = sorted(admitted_times(runtime))
    assert len(times) == 7 and times[-1] - times[0] < 12_000
    assert most_in_any_window(times, 3_000) == 2


def test_usage_says_the_rate_and_status_says_rate_is_why_work_waits(runtime):
    async def scenario():
        await flood(runtime, "a", 8, 60_000, 2)  # the limit (4) binds: four run a minute
        at_limit = await runtime.env.HOLDER.getByName("holder").usage()
        for item in ("a0", "a1"):  # two permits come back: one may start (a4), and the rate binds
            await runtime.env.SHARD.getByName("a").release(item)
        await asyncio.sleep(2)
        await flood(runtime, "b", 3, 100, 1)  # b's queue is told it waits for the rate
        return at_limit, await runtime.env.HOLDER.getByName("holder").usage(), \
            await runtime.env.SHARD.getByName("b").status("b0")

    at_limit, at_rate, waiting = runtime.run(scenario())
    rate = at_limit["rate"]
    assert (rate["limit"], rate["periodMs"], rate["burst"]) == (5, 10_000, 0)
    assert (rate["room"], rate["startsInWindow"]) == (1, 4)
    assert at_limit["outstanding"] == 4
    assert (at_rate["rate"]["room"], at_rate["rate"]["startsInWindow"]) == (0, 5)
    assert at_rate["rate"]["nextStartAt"] > 0
    assert waiting["state"] == "queued" and waiting["blocked"]["reason"] == "rate"
