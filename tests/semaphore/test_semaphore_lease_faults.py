"""Randomized fault runs with leases, per provisioning mode, on the embedded runtime.

Shards queue bursts of work in groups that lease and in a group with its
own limit (grants only) while calls are lost (replies carrying leases
included), duplicated, delayed and reordered, objects are evicted and
crash before commits, and for a while every client is cut off from the
holder past the leases' ttl with work still running. Ground truth (work
really running, outside the objects) is checked at every start against the
limit, or limit + extra for ``over``; at the end every lease must be
settled, or be one its client never learned of, charged as the spec says.
"""

import asyncio

import pytest

from durability.testing import Faults
from support import holders_runtime

TTL_MS = 20_000
LIMIT = 6
MODES = {
    "strict": ({"mode": "strict"}, 0),
    "under": ({"mode": "under", "reserve": 3}, 0),
    "over": ({"mode": "over", "extra": {"ratio": 0.5}}, 3),
}
NOISE = Faults(lost_request=0.08, lost_reply=0.15, duplicate=0.1, latency_ms=(0, 80), evict=0.05,
               crash_before_commit=0.02, alarm_failure=0.05, duplicate_alarm=0.05)
CUT_OFF = Faults(lost_request=1.0, targets=frozenset({"Holder"}))


def burst(shard_name, n, start, rng):
    return [{"id": f"{shard_name}/{start + i}", "key": "holder", "group": rng.choice(["wf0", "wf0", "wf1", "capped"]),
             "body": {"ms": rng.choice([500, 2_000, 6_000, 15_000, 4 * TTL_MS])}} for i in range(n)]


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_leases_under_faults_keep_work_within_the_ceiling_and_settle(mode, seed):
    provisioning, extra = MODES[mode]
    runtime = holders_runtime(seed=seed, faults=NOISE)
    config, world = runtime.module.CONFIG, runtime.module.WORLD
    config.update(limit=LIMIT, ceiling=LIMIT + extra, group_limits={"capped": 2}, lose_releases=0.1,
                  keep_done_ms=3_600_000, finished_check_ms=10_000, grant_timeout_ms=5_000, lease_report_delay_ms=2_000,
                  leases={"provisioning": provisioning, "permits_per_lease": 3, "ttl_ms": TTL_MS})
    names = [f"shard-{i}" for i in range(4)]
    rng = runtime.rng
    submitted = {name: 0 for name in names}

    async def submit_bursts(rounds):
        for _ in range(rounds):
            name = rng.choice(names)
            items = burst(name, rng.randint(1, 6), submitted[name], rng)
            submitted[name] += len(items)
            with runtime.no_faults():
                await runtime.env.SHARD.getByName(name).submit(items)
            await asyncio.sleep(rng.uniform(0.5, 6))

    async def scenario():
        await submit_bursts(16)
        runtime.faults.faults = CUT_OFF  # everyone cut off, past the ttl, with work running
        await asyncio.sleep(1.5 * TTL_MS / 1000)
        cut_off = await runtime.env.HOLDER.getByName("holder").usage()
        running_when_cut_off = len(world["running"])
        runtime.faults.faults = NOISE
        await submit_bursts(16)
        await asyncio.sleep(60)
        runtime.faults.enabled = False
        await asyncio.sleep(600)
        with runtime.no_faults():
            states = {name: await runtime.env.SHARD.getByName(name).states() for name in names}
            leases = {name: await runtime.env.SHARD.getByName(name).leases() for name in names}
            vias = {name: await runtime.env.SHARD.getByName(name).vias() for name in names}
            usage = await runtime.env.HOLDER.getByName("holder").usage()
            return states, leases, vias, usage, cut_off, running_when_cut_off

    states, leases, vias, usage, cut_off, running_when_cut_off = runtime.run(scenario())
    # The run exercised what it claims to: draws and grants, leases retired
    # with work running while cut off, replies lost.
    all_vias = [v for by_item in vias.values() for v in by_item.values()]
    assert all_vias.count("lease") >= 10 and all_vias.count("grant") >= 3
    assert cut_off["retiredFootprint"] > 0 and running_when_cut_off > 0, (cut_off, running_when_cut_off)
    assert sum(1 for event in runtime.trace if event[2] == "lost reply") >= 3
    assert world["violations"] == []
    assert world["max_running"] <= LIMIT + extra
    assert all(count == 1 for count in world["starts"].values())  # no item ran twice
    assert sum(len(s) for s in states.values()) == sum(submitted.values())
    stuck = {i: st for s in states.values() for i, st in s.items() if st != "released"}
    assert not stuck, (stuck, leases, usage)
    assert runtime.totals()["evictions"] > 0
    # Every lease is settled, or is one its client never learned of, retired
    # with nothing drawn: the only footprint the spec lets stay charged.
    known = {lease["lease_id"] for held in leases.values() for lease in held}
    holder_host = runtime.host_of(runtime.env.HOLDER.getByName("holder"))
    remaining = holder_host.db.inspect("SELECT lease_id, drawn, released, retired FROM durability_semaphore_leases")
    for lease in remaining:
        assert lease["lease_id"] not in known and lease["drawn"] == lease["released"] == 0, lease
    assert usage["outstanding"] == usage["leaseFootprint"] == sum(
        r["permits"] for r in holder_host.db.inspect("SELECT permits FROM durability_semaphore_leases"))
    assert all(lease["settled_at"] is not None for held in leases.values() for lease in held)
    runtime.close()
