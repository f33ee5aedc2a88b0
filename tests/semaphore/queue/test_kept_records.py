"""Records kept by released items (release_keeping, keep_records_ms) and the bound on done items (keep_done_max)."""

import asyncio

import pytest

from support import holders_runtime, queue_jobs as jobs, released_then_evicted

HOUR_S = 3_600


@pytest.fixture
def runtime():
    with holders_runtime(seed=1) as rt:
        yield rt


def shard(runtime, name="s1"):
    return runtime.env.SHARD.getByName(name)


def test_a_record_kept_by_a_released_item_outlives_its_grant_and_is_never_reported_again(runtime):
    # keep_done_ms 0 with records: the release writes the item once (its
    # state and record) and the grant counts it as released and gone, as an
    # item deleted at its release. The holder still hears of the release
    # after an eviction; later instances do not report the grant again.
    runtime.module.CONFIG.update(keep_done_ms=0, records=True, keep_records_ms=HOUR_S * 1000)
    holder = runtime.env.HOLDER.getByName("holder")
    messages = runtime.module.WORLD["messages"]

    async def outstanding():
        return (await holder.usage())["outstanding"]

    async def scenario():
        before, after = await released_then_evicted(runtime, shard(runtime), outstanding, 10)
        kept = await shard(runtime).record("a0"), await shard(runtime).states()
        heard = len(messages)
        for _ in range(3):  # new instances, started by reads
            runtime.evict(shard(runtime))
            await shard(runtime).status("a0")
            await asyncio.sleep(10)
        later = messages[heard:]
        await asyncio.sleep(HOUR_S + 60)
        return before, after, kept, later, await shard(runtime).states(), await shard(runtime).record("a0")

    before, after, kept, later, states, gone = runtime.run(scenario())
    assert before == 1 and after == 0
    assert kept == ({"ran": "a0"}, {"a0": "released"})
    # The first of them asks once, as the key's row says (and drops the row:
    # the key holds nothing); then nothing: no sync reports the grant again,
    # as one would from every instance if the item still counted for it.
    assert later == ["request"]
    assert states == {} and gone is None  # purged keep_records_ms after its release


def test_an_item_released_with_no_record_still_goes_at_once(runtime):
    runtime.module.CONFIG.update(keep_done_ms=0, keep_records_ms=HOUR_S * 1000)

    async def scenario():
        await shard(runtime).submit(jobs("a", 2, ms=1_000))
        await asyncio.sleep(10)
        return await shard(runtime).states(), await shard(runtime).record("a0")

    states, record = runtime.run(scenario())
    assert states == {} and record is None


def test_past_keep_done_max_the_oldest_done_items_go_within_the_hour(runtime):
    runtime.module.CONFIG.update(limit=5, keep_done_ms=24 * HOUR_S * 1000, keep_done_max=2)

    async def scenario():
        await shard(runtime).submit(jobs("a", 5, ms=1_000))
        await asyncio.sleep(10)
        done = await shard(runtime).states()
        await asyncio.sleep(HOUR_S + 60)
        return done, await shard(runtime).states()

    done, kept = runtime.run(scenario())
    assert done == {f"a{n}": "released" for n in range(5)}
    assert kept == {"a3": "released", "a4": "released"}  # the newest two, long before their day


@pytest.mark.parametrize("options, message", [
    ({"keep_done_max": -1}, "keep_done_max"), ({"keep_done_max": 1.5}, "keep_done_max"),
    ({"keep_records_ms": -1}, "keep_records_ms"),
])
def test_bad_retention_options_are_refused(runtime, options, message):
    queue_class = runtime.module.DurabilitySemaphoreQueue
    with pytest.raises(ValueError, match=message):
        queue_class(object(), server=object(), admit=lambda items: None, **options)
