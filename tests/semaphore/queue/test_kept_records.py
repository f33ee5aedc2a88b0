"""Records kept by released items (release_keeping, keep_records_ms) and the bound on done items (keep_done_max)."""

import asyncio

import pytest

from support import (  # noqa: F401
    holders_runtime_fixture,
    queue_jobs as jobs,
    queue_shard as shard,
    released_then_evicted,
)

HOUR_S = 3_600


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
        await asyncio.sleep(HOUR_S * 31 / 30)  # kept keep_records_ms, gone within a thirtieth more
        return before, after, kept, later, await shard(runtime).states(), await shard(runtime).record("a0")

    before, after, kept, later, states, gone = runtime.run(scenario())
    assert before == 1 and after == 0
    assert kept == ({"ran": "a0"}, {"a0": "released"})
    # The first of them asks once, as the key's row says (and drops the row:
    # the key holds nothing); then nothing: no sync reports the grant again,
    # as one would from every instance if the item still counted for it.
    assert later == ["request"]
    assert states == {} and gone is None  # purged keep_records_ms after its release


def test_records_done_within_a_thirtieth_of_their_time_go_in_one_purge(runtime):
    # Kept 30 hours, five records released a minute apart share one purge (its
    # alarm set once, as the first was released) rather than an alarm each.
    runtime.module.CONFIG.update(limit=5, keep_done_ms=0, records=True, keep_records_ms=30 * HOUR_S * 1000)
    work = [{"id": f"a{n}", "key": "holder", "group": "g", "body": {"ms": 1_000 + 60_000 * n}} for n in range(5)]

    async def scenario():
        await shard(runtime).submit(work)
        await asyncio.sleep(10 * 60)
        host = runtime.host_of(shard(runtime))
        kept, writes = await shard(runtime).states(), host.stats.alarm_writes
        await asyncio.sleep(32 * HOUR_S)
        return kept, host.stats.alarm_writes - writes, await shard(runtime).states()

    kept, alarm_writes, left = runtime.run(scenario())
    assert kept == {f"a{n}": "released" for n in range(5)} and left == {}
    assert alarm_writes == 0  # (one each, the first's purge setting the alarm for the next's)


def test_release_keeping_refuses_a_transaction_around_it_and_a_none_record(runtime):
    # A rollback of the caller's transaction would leave the holder told of a
    # release that never was; None is what record() reads as no record. An
    # admitted item with no record is answered with no row read.
    runtime.module.CONFIG.update(keep_done_ms=0)

    async def scenario():
        await shard(runtime).submit(jobs("a", 1, ms=600_000))
        await asyncio.sleep(5)
        host = runtime.host_of(shard(runtime))
        queue = host.instance.queue
        with pytest.raises(RuntimeError, match="transaction"):
            queue.scheduler.transaction(lambda: queue.release_keeping("a0", {"ran": "a0"}))
        with pytest.raises(ValueError, match="None"):
            queue.release_keeping("a0", None)
        read = host.db.rows_read
        record = queue.record("a0")
        return record, host.db.rows_read - read, await shard(runtime).states()

    record, read, states = runtime.run(scenario())
    assert (record, read, states) == (None, 0, {"a0": "admitted"})


def test_an_item_released_with_no_record_still_goes_at_once(runtime):
    runtime.module.CONFIG.update(keep_done_ms=0, keep_records_ms=HOUR_S * 1000)

    async def scenario():
        await shard(runtime).submit(jobs("a", 2, ms=1_000))
        await asyncio.sleep(10)
        return await shard(runtime).states(), await shard(runtime).record("a0")

    states, record = runtime.run(scenario())
    assert states == {} and record is None


def test_past_keep_done_max_the_items_done_longest_ago_go_once_an_hour_old(runtime):
    # Past keep_done_max the items done longest ago go, long before their day,
    # but never one done within the hour: a caller asking again about work
    # just done still finds it. (Enqueued first is not done first: b waited.)
    runtime.module.CONFIG.update(limit=5, keep_done_ms=24 * HOUR_S * 1000, keep_done_max=2)

    async def scenario():
        await shard(runtime).submit(jobs("a", 5, ms=1_000))
        await asyncio.sleep(55 * 60)
        await shard(runtime).submit(jobs("b", 3, ms=1_000))
        await asyncio.sleep(10 * 60)  # past the hour of the first five, 10 minutes into the last three's
        soon = await shard(runtime).states()
        await asyncio.sleep(HOUR_S)
        return soon, await shard(runtime).states()

    soon, later = runtime.run(scenario())
    assert soon == {f"b{n}": "released" for n in range(3)}  # three past the bound: none an hour old
    assert later == {"b1": "released", "b2": "released"}


@pytest.mark.parametrize("options, message", [
    ({"keep_done_max": -1}, "keep_done_max"), ({"keep_done_max": 1.5}, "keep_done_max"),
    ({"keep_records_ms": -1}, "keep_records_ms"),
])
def test_bad_retention_options_are_refused(runtime, options, message):
    queue_class = runtime.module.DurabilitySemaphoreQueue
    with pytest.raises(ValueError, match=message):
        queue_class(object(), server=object(), admit=lambda items: None, **options)
