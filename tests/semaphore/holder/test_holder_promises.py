"""The holders keep their word against faulty and hostile clients, one defect at a time.

Each test here failed before the fix it names: numbers too large for a
float, strings storage cannot hold, lease ids charged from a report and
then issued again, settled leases charged again, claims that reached the
holder in time but were reclaimed, and ``not_found`` given where the spec
says ``expired``.
"""

import asyncio

import pytest

from durability.locks import semaphore
from durability.semaphore.holder.store import GRANT_ROWS
from support import holders_runtime, locks_runtime

TTL = 60_000
LEASES = {"provisioning": {"mode": "strict"}, "permits_per_lease": 4, "ttl_ms": TTL}


@pytest.fixture
def runtime():
    with holders_runtime(seed=1) as rt:
        rt.module.CONFIG.update(limit=10)
        yield rt


def holder(runtime):
    return runtime.env.HOLDER.getByName("holder")


def request(client, demand=(), grants=(), leases=None, lease_reports=(), wait=None):
    message = {
        "type": "request", "v": 1, "clientId": client,
        "demand": [{"group": g, "count": n, "oldestAt": t} for g, n, t in demand],
        "grants": [{"grantId": i, "claimed": c, "released": r} for i, c, r in grants],
        "leaseReports": [dict(zip(("leaseId", "group", "permits", "drawn", "released", "stopped"), r))
                         for r in lease_reports],
    }
    if leases is not None:
        message["leases"] = leases
    if wait is not None:
        message["wait"] = wait
    return message


def sync(client, grants=(), lease_reports=()):
    message = request(client, (), grants, None, lease_reports)
    message["type"] = "sync"
    del message["demand"]
    return message


def held_in_storage(runtime):
    db = runtime.host_of(holder(runtime)).db
    return {
        "grants": db.inspect(f"SELECT * FROM ({GRANT_ROWS}) ORDER BY grant_id"),
        "leases": db.inspect("SELECT * FROM durability_semaphore_leases ORDER BY lease_id"),
    }


# -- 1. numbers out of float range ---------------------------------------------------

@pytest.mark.parametrize("value", [10**400, -(10**400), 2**53 + 1], ids=["10**400", "-10**400", "2**53+1"])
def test_a_number_too_large_for_a_float_is_refused_not_crashed(runtime, value):
    message = request("c", [("g", 1, 0)])
    message["demand"][0]["oldestAt"] = value

    async def scenario():
        return await holder(runtime).permits(message)

    reply = runtime.run(scenario())
    assert (reply["type"], reply["code"]) == ("error", "invalid_message")


def test_a_huge_wait_is_refused(runtime):
    message = request("c", [("g", 1, 0)])
    message["wait"] = 10**400
    reply = runtime.run(holder(runtime).permits(message))
    assert (reply["type"], reply["code"]) == ("error", "invalid_message")


@pytest.mark.parametrize("field", ["ttlMs", "waitMs", "maxHoldMs"])
def test_a_lock_number_too_large_for_a_float_is_refused(field):
    message = {"v": 1, "requestId": "r1", "limit": 3, "ttlMs": 30_000, "waitMs": 0, field: 10**400}
    with locks_runtime() as runtime:
        reply = runtime.run(runtime.env.SLOTS.getByName("uploads:u").semaphore_acquire(message))
    assert (reply["type"], reply["code"]) == ("error", "invalid_message")


# -- 2. strings storage cannot hold ------------------------------------------------------

@pytest.mark.parametrize("where", ["clientId", "group", "grantId", "leaseId"])
def test_an_unstorable_id_fails_its_sender_alone_and_the_round_serves_the_rest(runtime, where):
    bad = "\ud800"
    hostile = request(bad if where == "clientId" else "hostile", [(bad if where == "group" else "g", 1, 0)],
                      grants=[(bad, 1, 0)] if where == "grantId" else (),
                      lease_reports=[(bad, "g", 1, 0, 0, False)] if where == "leaseId" else ())

    async def scenario():
        return await asyncio.gather(holder(runtime).permits(hostile),
                                    holder(runtime).permits(request("honest", [("g", 2, 0)])))

    refused, served = runtime.run(scenario())
    assert (refused["type"], refused["code"]) == ("error", "invalid_message")
    assert [g["permits"] for g in served["grants"]] == [2]
    assert runtime.run(holder(runtime).usage())["outstanding"] == 2


def test_an_unstorable_request_id_leaves_the_lock_line_and_its_waiters_alone():
    with locks_runtime() as runtime:
        uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1, ttl="30s", wait="10s")
        stub = runtime.env.SLOTS.getByName("uploads:u")

        seen = {}

        async def hold(name, ms):
            async with uploads.hold("u"):
                seen[name] = await stub.semaphore_usage()
                await asyncio.sleep(ms / 1000)

        async def hostile():
            await asyncio.sleep(1)  # while the second hold waits in line
            return await stub.semaphore_acquire(
                {"v": 1, "requestId": "\udfff", "limit": 1, "ttlMs": 30_000, "waitMs": 0})

        async def scenario():
            first = asyncio.ensure_future(hold("first", 2_000))
            await asyncio.sleep(0.1)
            _, refused, _ = await asyncio.gather(first, hostile(), hold("second", 0))
            return refused, seen["second"]

        refused, usage = runtime.run(scenario())
    assert (refused["type"], refused["code"]) == ("error", "invalid_message")
    assert (usage["held"], usage["waiting"]) == (1, 0)  # the honest waiter got its place


# -- 3. a lease id charged from a report is never issued again ---------------------------------

def test_a_lease_id_of_the_holder_it_never_issued_is_refused_and_never_collides(runtime):
    runtime.module.CONFIG.update(leases=LEASES)

    async def scenario():
        first = await holder(runtime).permits(request("a", [("g", 1, 0)], leases=True))
        issued = first["leases"][0]["leaseId"]
        prefix, number = issued.rsplit("-", 1)
        upcoming = f"{prefix}-{int(number) + 1}"
        forged = request("b", [("g", 1, 0)], leases=True, lease_reports=[(upcoming, "g", 4, 2, 0, False)])
        refused, honest = await asyncio.gather(holder(runtime).permits(forged),
                                               holder(runtime).permits(request("c", [("g", 3, 0)], leases=True)))
        return first, upcoming, refused, honest, await holder(runtime).usage()

    first, upcoming, refused, honest, usage = runtime.run(scenario())
    assert (refused["type"], refused["code"]) == ("error", "forbidden")
    assert [lease["leaseId"] for lease in honest["leases"]] == [upcoming]  # issued once, to c
    assert usage["leaseFootprint"] == first["leases"][0]["permits"] + honest["leases"][0]["permits"]
    assert usage["leases"] == 2


# -- 4. a settled lease stays settled ------------------------------------------------------------

def test_a_late_report_of_a_settled_foreign_lease_is_answered_settled_and_charges_nothing(runtime):
    runtime.module.CONFIG.update(leases=LEASES)
    foreign = "l0123456789ab-7"  # issued by this key's holder before its storage was reset

    async def scenario():
        charged = await holder(runtime).permits(sync("a", lease_reports=[(foreign, "g", 4, 2, 0, False)]))
        settled = await holder(runtime).permits(sync("a", lease_reports=[(foreign, "g", 4, 2, 2, True)]))
        late = await holder(runtime).permits(sync("a", lease_reports=[(foreign, "g", 4, 2, 0, False)]))
        return charged, settled, late, await holder(runtime).usage()

    charged, settled, late, usage = runtime.run(scenario())
    assert [o["status"] for o in charged["leaseReports"]] == ["retired"]
    assert [o["status"] for o in settled["leaseReports"]] == ["settled"]
    assert [o["status"] for o in late["leaseReports"]] == ["settled"]
    assert (usage["outstanding"], usage["leaseFootprint"], usage["leases"]) == (0, 0, 0)


def test_a_settled_foreign_lease_stays_settled_across_an_eviction_with_a_long_ttl(runtime):
    # A ttl of 30 minutes: a heartbeat of the remembered lease moves its expiry
    # by less than half of it, yet its settlement must reach the row.
    runtime.module.CONFIG.update(leases=dict(LEASES, ttl_ms=30 * 60_000))
    foreign = "l0123456789ab-7"

    async def scenario():
        await holder(runtime).permits(sync("a", lease_reports=[(foreign, "g", 4, 4, 0, False)]))
        await holder(runtime).permits(sync("a", lease_reports=[(foreign, "g", 4, 4, 4, True)]))
        runtime.evict(holder(runtime))
        return await holder(runtime).usage()

    usage = runtime.run(scenario())
    assert (usage["leaseFootprint"], usage["leases"]) == (0, 0)


def test_a_settled_foreign_lease_is_forgotten_after_its_memory(runtime):
    runtime.module.CONFIG.update(leases=LEASES)
    foreign = "lfeed-1"

    async def scenario():
        await holder(runtime).permits(sync("a", lease_reports=[(foreign, "g", 2, 1, 1, True)]))
        remembered = held_in_storage(runtime)["leases"]
        await asyncio.sleep(10 * 60 + 1)  # SETTLED_MEMORY_MS, then the holder's timer
        return remembered, held_in_storage(runtime)["leases"]

    remembered, later = runtime.run(scenario())
    assert [row["lease_id"] for row in remembered] == [foreign] and later == []


# -- 5. a claim that reached the holder in time is never reclaimed ---------------------------------

def test_a_claim_waiting_for_its_round_at_the_deadline_is_kept(runtime):
    async def scenario():
        first = await holder(runtime).permits(request("a", [("g", 3, 0)]))
        grant = first["grants"][0]
        # Arrive just before the deadline, so that the round runs after it.
        await asyncio.sleep((grant["claimDeadline"] - runtime.now_ms() - 200) / 1000)
        return await holder(runtime).permits(request("a", grants=[(grant["grantId"], 3, 0)]))

    reply = runtime.run(scenario())
    assert [(o["status"], o["claimed"]) for o in reply["reports"]] == [("ok", 3)]
    assert runtime.run(holder(runtime).usage())["outstanding"] == 3


# -- 6. expired, not not_found, once something was claimed ------------------------------------------

def test_a_late_claim_on_a_reclaimed_grant_with_claims_is_answered_expired(runtime):
    async def scenario():
        first = await holder(runtime).permits(request("a", [("g", 3, 0)]))
        grant_id = first["grants"][0]["grantId"]
        await holder(runtime).permits(sync("a", [(grant_id, 1, 1)]))  # one claimed, and released
        await asyncio.sleep(11)  # past the claim deadline: the rest is reclaimed
        late = await holder(runtime).permits(sync("a", [(grant_id, 3, 1)]))
        never = await holder(runtime).permits(request("b", [("g", 2, 0)]))
        await asyncio.sleep(11)
        nothing_claimed = await holder(runtime).permits(sync("b", [(never["grants"][0]["grantId"], 1, 0)]))
        return late, nothing_claimed, await holder(runtime).usage()

    late, nothing_claimed, usage = runtime.run(scenario())
    assert [(o["status"], o["claimed"], o["released"], o["permits"]) for o in late["reports"]] == [
        ("expired", 1, 1, 1)]
    assert [(o["status"], o["claimed"]) for o in nothing_claimed["reports"]] == [("not_found", 0)]
    assert (usage["outstanding"], usage["grants"]) == (0, 0)


# -- a lowered limit reaches a client on its next exchange of any kind ------------------------------

def test_a_sync_reply_tells_the_client_its_lease_was_retired_by_a_lowered_limit(runtime):
    runtime.module.CONFIG.update(leases=LEASES)

    async def scenario():
        first = await holder(runtime).permits(request("a", [("g", 4, 0)], leases=True))
        lease = first["leases"][0]
        before = await holder(runtime).permits(sync("a"))
        runtime.module.CONFIG.update(limit=3)  # below the limit the lease was issued under
        after = await holder(runtime).permits(sync("a"))  # no lease report in it
        return lease, before, after

    lease, before, after = runtime.run(scenario())
    assert before["leases"] == []
    assert [(entry["leaseId"], entry["retired"]) for entry in after["leases"]] == [(lease["leaseId"], True)]
