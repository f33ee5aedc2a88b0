"""A limit of 0 stops every mode: after the stale window nothing more is admitted."""

import asyncio

import pytest

from support import holders_runtime, queue_jobs as jobs

TTL = 60_000
#: How long a lowered limit may take to reach every client: each lease is
#: reported at half its lifetime at the latest, its report retires it, and
#: a round or two go by (docs/semaphore.md, "Lease accounting").
STALE_WINDOW_S = TTL / 2 / 1000 + 2 * 2
MODES = {
    "grants": None,
    "strict": {"mode": "strict"},
    "under": {"mode": "under", "reserve": 2},
    "over-by-ratio": {"mode": "over", "extra": {"ratio": 0.5}},
    "over-by-count": {"mode": "over", "extra": {"count": 3}},
}


@pytest.mark.parametrize("mode", list(MODES))
def test_a_limit_of_0_admits_nothing_after_the_stale_window(mode):
    with holders_runtime(seed=3) as runtime:
        config, world = runtime.module.CONFIG, runtime.module.WORLD
        provisioning = MODES[mode]
        config.update(limit=6, ceiling=9 if provisioning and provisioning["mode"] == "over" else None)
        if provisioning is not None:
            config.update(leases={"provisioning": provisioning, "permits_per_lease": 2, "ttl_ms": TTL})
        shards = [runtime.env.SHARD.getByName(f"s{i}") for i in range(3)]

        async def scenario():
            for i, shard in enumerate(shards):
                await shard.submit(jobs(f"s{i}-", 60, ms=2_000))
            await asyncio.sleep(20)
            config["limit"] = 0
            lowered_at = runtime.now_ms()
            await asyncio.sleep(STALE_WINDOW_S + 60)
            usage = await runtime.env.HOLDER.getByName("holder").usage()
            return lowered_at, usage

        lowered_at, usage = runtime.run(scenario())
        starts = world["started"].values()
        before = sum(1 for at in starts if at < lowered_at)
        late = sum(1 for at in starts if at >= lowered_at + STALE_WINDOW_S * 1000)
        print(f"{mode}: {before} admitted before the limit went to 0, {late} after the stale window")
        assert before > 0 and len(world["started"]) < 180  # it ran, and work was still queued
        assert late == 0, f"{mode}: {late} admitted after the stale window"
        assert (usage["limit"], usage["ceiling"]) == (0, 0)
