"""DurabilitySemaphore on the embedded runtime: rounds, pacing, reclaim, blocked reasons, faults."""

import asyncio

import pytest

from durability.semaphore.holder.store import GRANT_ROWS
from durability.semaphore.messages import MAX_WAIT_MS
from durability.testing import Faults, JsException
from support import holders_runtime


@pytest.fixture
def runtime():
    with holders_runtime() as rt:
        yield rt


def request(client, demand=(), grants=(), wait=None):
    message = {
        "type": "request", "v": 1, "clientId": client,
        "demand": [{"group": g, "count": n, "oldestAt": t} for g, n, t in demand],
        "grants": [{"grantId": i, "claimed": c, "released": r} for i, c, r in grants],
    }
    if wait is not None:
        message["wait"] = wait
    return message


def sync(client, grants):
    return {"type": "sync", "v": 1, "clientId": client,
            "grants": [{"grantId": i, "claimed": c, "released": r} for i, c, r in grants]}


def holder(runtime):
    return runtime.env.HOLDER.getByName("holder")


def test_requests_in_one_round_are_allocated_together_oldest_first(runtime):
    async def scenario():
        start = runtime.now_ms()
        young, old = await asyncio.gather(
            holder(runtime).permits(request("young", [("g", 3, 2_000)])),
            holder(runtime).permits(request("old", [("g", 3, 1_000)])),
        )
        return start, runtime.now_ms(), young, old

    start, answered, young, old = runtime.run(scenario())
    # Held for round_wait_ms, then one round (a wait ends microseconds past its moment).
    assert answered - start == pytest.approx(1_000, abs=0.01)
    assert [g["permits"] for g in old["grants"]] == [3]
    assert young["grants"] == [] and young["blocked"] == [{"group": "g", "reason": "limit", "waiting": 3}]
    # Handed permits, a client may ask again at once (held for the next round);
    # one that got nothing waits for the period.
    assert old["nextRequestAt"] == pytest.approx(start + 1_000, abs=0.01)
    assert young["nextRequestAt"] == pytest.approx(start + 1_000 + 2_000, abs=0.01)


def test_rounds_are_no_closer_than_the_period(runtime):
    async def scenario():
        first = await holder(runtime).permits(request("a", [("g", 1, 0)]))
        asked = runtime.now_ms()
        await holder(runtime).permits(request("b", [("g", 1, 0)]))
        return first["nextRequestAt"], asked, runtime.now_ms()

    next_at, asked, answered = runtime.run(scenario())
    assert answered >= next_at and answered - asked == pytest.approx(2_000, abs=0.01)


def test_unclaimed_permits_are_reclaimed_by_the_alarm(runtime):
    async def scenario():
        first = await holder(runtime).permits(request("a", [("g", 3, 0)]))
        grant = first["grants"][0]["grantId"]
        busy = await holder(runtime).usage()
        await asyncio.sleep(11)  # past grant_timeout_ms; no request comes in
        idle = await holder(runtime).usage()
        late = await holder(runtime).permits(sync("a", [(grant, 3, 0)]))
        return busy, idle, late

    busy, idle, late = runtime.run(scenario())
    assert busy["outstanding"] == 3 and idle["outstanding"] == 0 and idle["grants"] == 0
    assert late["reports"] == [{"grantId": late["reports"][0]["grantId"], "status": "not_found",
                               "claimed": 0, "released": 0, "permits": 0}]


def test_a_claim_after_reclaim_is_clamped_and_expired(runtime):
    async def scenario():
        first = await holder(runtime).permits(request("a", [("g", 3, 0)]))
        grant = first["grants"][0]["grantId"]
        await holder(runtime).permits(sync("a", [(grant, 1, 0)]))
        await asyncio.sleep(11)
        late = await holder(runtime).permits(sync("a", [(grant, 3, 0)]))
        return late["reports"][0], await holder(runtime).usage()

    report, usage = runtime.run(scenario())
    assert (report["status"], report["claimed"], report["permits"]) == ("expired", 1, 1)
    assert usage["outstanding"] == 1


def test_each_blocked_reason(runtime):
    config = runtime.module.CONFIG
    config.update(limit=10, group_limits={"capped": 1}, denied={("c", "denied")}, failing_groups={"broken"})

    async def scenario():
        return await holder(runtime).permits(request("c", [
            ("capped", 3, 0), ("denied", 1, 0), ("broken", 1, 0), ("free", 20, 0)]))

    reply = runtime.run(scenario())
    assert {b["group"]: (b["reason"], b["waiting"]) for b in reply["blocked"]} == {
        "capped": ("group_limit", 2), "denied": ("not_permitted", 1),
        "broken": ("limit_resolution_error", 1), "free": ("limit", 11),
    }
    assert sorted((g["group"], g["permits"]) for g in reply["grants"]) == [("capped", 1), ("free", 9)]


def test_lowering_the_limit_revokes_nothing_and_stops_admissions(runtime):
    config = runtime.module.CONFIG

    async def scenario():
        first = await holder(runtime).permits(request("a", [("g", 3, 0)]))
        grant = first["grants"][0]["grantId"]
        await holder(runtime).permits(sync("a", [(grant, 3, 0)]))
        config["limit"] = 1
        await asyncio.sleep(2)
        blocked = await holder(runtime).permits(request("b", [("g", 1, 0)], ()))
        await holder(runtime).permits(sync("a", [(grant, 3, 2)]))
        await asyncio.sleep(2)
        still = await holder(runtime).permits(request("b", [("g", 1, 0)]))
        await holder(runtime).permits(sync("a", [(grant, 3, 3)]))
        await asyncio.sleep(2)
        served = await holder(runtime).permits(request("b", [("g", 1, 0)]))
        return blocked, still, served

    blocked, still, served = runtime.run(scenario())
    assert blocked["grants"] == [] and blocked["blocked"][0]["reason"] == "limit"
    assert still["grants"] == []  # one permit in use = the new limit
    assert [g["permits"] for g in served["grants"]] == [1]


def test_eviction_mid_round_fails_the_waiting_calls_and_grants_nothing(runtime):
    async def scenario():
        waiting = asyncio.ensure_future(holder(runtime).permits(request("a", [("g", 2, 0)])))
        await asyncio.sleep(0.5)
        runtime.evict(holder(runtime))
        with pytest.raises(JsException, match="Network connection lost"):
            await waiting
        empty = await holder(runtime).usage()
        again = await holder(runtime).permits(request("a", [("g", 2, 0)]))
        return empty, again

    empty, again = runtime.run(scenario())
    assert empty["outstanding"] == 0
    assert [g["permits"] for g in again["grants"]] == [2]


def test_a_grant_is_written_at_its_first_claim_and_lost_unclaimed_with_the_instance(runtime):
    def grant_rows():
        return runtime.host_of(holder(runtime)).db.inspect(f"SELECT grant_id, claimed FROM ({GRANT_ROWS})")

    async def scenario():
        unclaimed = (await holder(runtime).permits(request("a", [("g", 2, 0)])))["grants"][0]["grantId"]
        claimed = (await holder(runtime).permits(request("b", [("g", 1, 0)])))["grants"][0]["grantId"]
        await holder(runtime).permits(sync("b", [(claimed, 1, 0)]))
        rows = grant_rows()
        runtime.evict(holder(runtime))
        usage = await holder(runtime).usage()
        late = await holder(runtime).permits(sync("a", [(unclaimed, 2, 0)]))
        return rows, usage, late["reports"][0]

    rows, usage, late = runtime.run(scenario())
    assert [row["claimed"] for row in rows] == [1]  # the unclaimed grant has no row
    # The new instance knows only the claimed grant: the other's permits are
    # back in the pool, and a claim on it is refused, so nothing runs on it.
    assert usage["outstanding"] == 1
    assert (late["status"], late["claimed"]) == ("not_found", 0)


def test_a_request_that_may_wait_is_held_until_a_permit_frees(runtime):
    async def scenario():
        first = await holder(runtime).permits(request("a", [("g", 3, 0)]))
        grant = first["grants"][0]["grantId"]
        await holder(runtime).permits(sync("a", [(grant, 3, 0)]))
        asked = runtime.now_ms()
        waiting = asyncio.ensure_future(holder(runtime).permits(request("b", [("g", 1, 0)], wait=20_000)))
        await asyncio.sleep(6)
        held = not waiting.done()
        await runtime.env.HOLDER.getByName("holder").permits(sync("a", [(grant, 3, 1)]))
        reply = await waiting
        return held, runtime.now_ms() - asked, reply

    held, elapsed, reply = runtime.run(scenario())
    assert held and 6_000 <= elapsed <= 6_000 + 2_000
    assert [g["permits"] for g in reply["grants"]] == [1]


def test_a_held_request_is_answered_by_its_deadline(runtime):
    async def scenario():
        await holder(runtime).permits(request("a", [("g", 3, 0)]))
        asked = runtime.now_ms()
        reply = await holder(runtime).permits(request("b", [("g", 1, 0)], wait=9_000))
        return runtime.now_ms() - asked, reply

    elapsed, reply = runtime.run(scenario())
    assert 7_000 <= elapsed <= 9_000
    assert reply["grants"] == [] and reply["blocked"][0]["reason"] == "limit"


def test_a_newer_request_from_a_client_answers_its_held_one_which_is_never_served_later(runtime):
    # The held request may be from an instance of the client that is gone:
    # served later, its permits would come claimed for nobody.
    def claiming(message):
        return {**message, "claims": True}

    async def scenario():
        first = await holder(runtime).permits(claiming(request("a", [("g", 3, 0)])))
        old = asyncio.ensure_future(holder(runtime).permits(claiming(request("b", [("g", 1, 0)], wait=30_000))))
        await asyncio.sleep(3)
        held = not old.done()
        newer = await holder(runtime).permits(claiming(request("b", [("g", 1, 0)], wait=0)))  # asks once, then cancels
        await asyncio.sleep(0.1)
        answered = old.done()
        [grant] = first["grants"]
        await holder(runtime).permits(sync("a", [(grant["grantId"], 3, 3)]))  # every permit comes back
        await asyncio.sleep(40)
        return held, answered, newer, grant, await holder(runtime).usage()

    held, answered, newer, grant, usage = runtime.run(scenario())
    assert grant["claimed"] == 3  # a request that says "claims" gets its grant claimed
    assert held and answered and newer["grants"] == []
    assert usage["outstanding"] == 0 and usage["grants"] == 0


def test_a_repeated_request_after_a_lost_reply_is_not_served_twice(runtime):
    async def scenario():
        first = await holder(runtime).permits(request("a", [("g", 2, 0)]))
        await asyncio.sleep(2)
        again = await holder(runtime).permits(request("a", [("g", 2, 0)]))
        return first, again, await holder(runtime).usage()

    first, again, usage = runtime.run(scenario())
    # The same open grant, listed again: no longer new (a client that never
    # heard of it may claim its unclaimed permits, not reuse its claims).
    assert [g["new"] for g in first["grants"]] == [True] and [g["new"] for g in again["grants"]] == [False]
    assert [{**g, "new": None} for g in again["grants"]] == [{**g, "new": None} for g in first["grants"]]
    assert usage["outstanding"] == 2


@pytest.mark.parametrize("message, code", [
    ({"type": "nope", "v": 1}, "unsupported"),
    ({"type": "request", "v": 2, "clientId": "a"}, "unsupported"),
    ({"type": "request", "v": 1}, "invalid_message"),
    (request("a", [("g", -1, 0)]), "invalid_message"),
    (request("a", [("g", 1.5, 0)]), "invalid_message"),
    (request("a", [("g", 1, float("nan"))]), "invalid_message"),
    (request("x" * 300, [("g", 1, 0)]), "invalid_message"),
    (request("a", [(f"g{i}", 1, 0) for i in range(65)]), "too_large"),
    (request("a", grants=[("z", 1, 2)]), "invalid_message"),
    (request("a", [("g", 1, 0)], wait=-1), "invalid_message"),
    (request("a", [("g", 1, 0)], wait=MAX_WAIT_MS + 1), "invalid_message"),
    ("not an object", "invalid_message"),
])
def test_bad_messages_get_an_error_reply_and_change_nothing(runtime, message, code):
    async def scenario():
        await holder(runtime).usage()  # the holder exists, its schema is written
        before = runtime.totals()["rows_written"]
        reply = await holder(runtime).permits(message)
        return reply, await holder(runtime).usage(), runtime.totals()["rows_written"] - before

    reply, usage, written = runtime.run(scenario())
    assert reply["type"] == "error" and reply["code"] == code and reply["message"]
    assert usage["outstanding"] == 0 and usage["grants"] == 0
    assert written == 0


def test_a_client_cannot_touch_another_clients_grant(runtime):
    async def scenario():
        mine = await holder(runtime).permits(request("a", [("g", 2, 0)]))
        grant = mine["grants"][0]["grantId"]
        thief, honest = await asyncio.gather(
            holder(runtime).permits(request("b", [("g", 1, 0)], [(grant, 2, 2)])),
            holder(runtime).permits(request("c", [("g", 1, 0)])),
        )
        stolen = await holder(runtime).permits(sync("b", [(grant, 2, 2)]))
        return thief, honest, stolen, await holder(runtime).usage()

    thief, honest, stolen, usage = runtime.run(scenario())
    assert thief["type"] == "error" and thief["code"] == "forbidden"
    assert stolen["code"] == "forbidden"
    assert [g["permits"] for g in honest["grants"]] == [1]
    assert usage["outstanding"] == 3


def test_sync_releases_free_capacity_at_once(runtime):
    async def scenario():
        first = await holder(runtime).permits(request("a", [("g", 3, 0)]))
        grant = first["grants"][0]["grantId"]
        await holder(runtime).permits(sync("a", [(grant, 3, 0)]))
        synced = await holder(runtime).permits(sync("a", [(grant, 3, 3)]))
        return synced, await holder(runtime).usage()

    synced, usage = runtime.run(scenario())
    assert synced["type"] == "synced" and synced["reports"][0]["status"] == "ok"
    assert usage["outstanding"] == 0 and usage["grants"] == 0


def test_usage_reports_groups(runtime):
    runtime.module.CONFIG.update(limit=10, group_limits={"a": 4})

    async def scenario():
        reply = await holder(runtime).permits(request("c", [("a", 3, 0), ("b", 2, 0)]))
        grant = next(g for g in reply["grants"] if g["group"] == "a")["grantId"]
        await holder(runtime).permits(sync("c", [(grant, 2, 0)]))
        return await holder(runtime).usage()

    assert runtime.run(scenario()) == {
        "limit": 10, "ceiling": 10, "outstanding": 5, "leaseFootprint": 0, "retiredFootprint": 0,
        "grants": 2, "leases": 0,
        "groups": {"a": {"outstanding": 3, "inUse": 2, "reserved": 1, "leaseFootprint": 0, "limit": 4,
                         "rate": None},
                   "b": {"outstanding": 2, "inUse": 0, "reserved": 2, "leaseFootprint": 0, "limit": None,
                         "rate": None}},
        "waiting": [], "policy": "oldest_first", "shares": {}, "rate": None,
    }


def test_a_fair_share_splits_the_limit_by_weight_changes_live_and_shows_in_usage(runtime):
    weights = {"big": 1, "small": 3}
    runtime.module.CONFIG.update(limit=8, fair_share={"key": lambda group: group.split("-")[0],
                                                      "weight": lambda key: weights[key]})

    async def scenario():
        old, young = await asyncio.gather(
            holder(runtime).permits(request("a", [("big-1", 5, 0), ("big-2", 5, 1)])),
            holder(runtime).permits(request("b", [("small-1", 10, 5_000)])))
        weights["small"] = 1  # read again by the next round
        return old, young, await holder(runtime).usage()

    old, young, usage = runtime.run(scenario())
    assert sum(g["permits"] for g in old["grants"]) == 2 and sum(g["permits"] for g in young["grants"]) == 6
    assert usage["policy"] == "fair_share"
    assert usage["shares"]["small"] == {"held": 6, "weight": 1.0, "floor": 0, "priority": 0, "waiting": 4}
    assert usage["shares"]["big"]["held"] == 2 and usage["shares"]["big"]["waiting"] == 8


def test_a_fair_share_callback_that_raises_serves_the_round_oldest_first_and_usage_says_so(runtime):
    runtime.module.CONFIG.update(limit=4, fair_share={"weight": lambda key: 1 / 0})

    async def scenario():
        young, old = await asyncio.gather(holder(runtime).permits(request("y", [("g1", 4, 5_000)])),
                                          holder(runtime).permits(request("o", [("g2", 4, 0)])))
        return young, old, await holder(runtime).usage()

    young, old, usage = runtime.run(scenario())
    assert [g["permits"] for g in old["grants"]] == [4] and not young["grants"]
    assert usage["policy"] == "oldest_first_fallback" and usage["shares"] == {}


def test_fair_share_and_leases_together_are_refused_at_construction():
    from durability.semaphore.holder.fair_options import fair_share_of

    with pytest.raises(ValueError, match="fair_share= or leases="):
        fair_share_of({"weight": 1}, {"provisioning": {"mode": "strict"}})


def test_usage_reports_what_waits_and_why_until_its_clients_stop_asking(runtime):
    runtime.module.CONFIG.update(limit=10, group_limits={"a": 4})

    async def scenario():
        await asyncio.gather(holder(runtime).permits(request("c", [("a", 6, 0), ("b", 8, 1)])),
                             holder(runtime).permits(request("d", [("b", 1, 2)])))
        blocked = (await holder(runtime).usage())["waiting"]
        await holder(runtime).permits(request("d", []))  # d no longer waits
        after_d = (await holder(runtime).usage())["waiting"]
        await asyncio.sleep(61)  # nobody asks again for a minute: c has stopped waiting
        return blocked, after_d, (await holder(runtime).usage())["waiting"]

    blocked, after_d, after_a_minute = runtime.run(scenario())
    # a: 4 granted under its ceiling of 4; b: the 6 left of the limit, 3 wait.
    assert blocked == [{"group": "a", "reason": "group_limit", "waiting": 2, "clients": 1},
                       {"group": "b", "reason": "limit", "waiting": 3, "clients": 2}]
    assert after_d == [{"group": "a", "reason": "group_limit", "waiting": 2, "clients": 1},
                       {"group": "b", "reason": "limit", "waiting": 2, "clients": 1}]
    assert after_a_minute == []


def test_migrate_removes_the_schema(runtime):
    async def scenario():
        await holder(runtime).permits(request("a", [("g", 1, 0)]))
        return await holder(runtime).drop_schema()

    assert runtime.run(scenario()) == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_clients_under_faults_never_run_more_than_the_limit_and_all_get_served(seed):
    faults = Faults(lost_request=0.1, lost_reply=0.1, duplicate=0.1, latency_ms=(0, 80),
                    evict=0.05, crash_before_commit=0.02)
    runtime = holders_runtime(seed=seed, faults=faults)
    world, config = runtime.module.WORLD, runtime.module.CONFIG
    config.update(limit=4, grant_timeout_ms=3_000)
    clients = [f"client-{i}" for i in range(8)]

    async def scenario():
        with runtime.no_faults():
            for i, name in enumerate(clients):
                await runtime.env.SIM.getByName(name).start(f"group-{i % 3}", 6, 1_000 + i)
        await asyncio.sleep(120)
        runtime.faults.enabled = False  # faults stop; everything must settle
        await asyncio.sleep(180)
        with runtime.no_faults():
            statuses = [await runtime.env.SIM.getByName(name).status() for name in clients]
            return statuses, await holder(runtime).usage()

    statuses, usage = runtime.run(scenario())
    assert world["violations"] == []
    assert world["max_running"] == config["limit"]  # the budget was used to the full
    assert statuses == [{"want": 0, "running": 0}] * len(clients)
    assert len(world["completed"]) == 6 * len(clients)
    assert usage["outstanding"] == 0
    events = {event for _, _, event, _ in runtime.trace}
    assert {"lost request", "lost reply", "duplicate"} <= events
    assert runtime.totals()["evictions"] > 0
    runtime.close()
