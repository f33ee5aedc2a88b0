"""Finished jobs purged under their retention: in batches, from the alarm, past restarts."""

import asyncio
from pathlib import Path

import pytest

from durability import DurabilityJobs, JobRetention
from durability.testing import Runtime, load_worker_module

WORKER = Path(__file__).resolve().parents[1] / "workers" / "retained_jobs.py"
HOUR_S = 3_600
MAX_AGE_S = 4 * HOUR_S  # the worker's max_age_ms
SLACK_S = HOUR_S  # a purge runs up to an hour after its oldest job comes due (slack_ms, for 4 hours)
GONE_S = MAX_AGE_S + SLACK_S  # by then a finished job is gone


def retained_runtime(**options) -> Runtime:
    return Runtime(load_worker_module(WORKER), {"RETAINED": "Retained", "UPGRADED": "Upgraded"}, **options)


@pytest.fixture
def runtime():
    with retained_runtime() as rt:
        yield rt


def written(runtime, stub):
    host = runtime.host_of(stub)
    return host.db.rows_written + host.stats.alarm_writes


def test_finished_jobs_are_purged_past_their_age_and_then_read_as_not_found(runtime):
    stub = runtime.env.RETAINED.getByName("r")

    async def scenario():
        await stub.submit_many(["a", "b"])
        await stub.submit_many(["c"], fail=True)
        await asyncio.sleep(5)
        before = [(await stub.result(j))["status"] for j in "abc"]
        await asyncio.sleep(MAX_AGE_S - 60)
        kept = await stub.jobs_left()
        await asyncio.sleep(SLACK_S + 120)
        after = [await stub.result(j) for j in "abc"]
        return before, kept, after, await stub.jobs_left(), await stub.purge_timer()

    before, kept, after, left, timer = runtime.run(scenario())
    assert before == ["completed", "completed", "failed"]
    assert kept == 3
    assert after == [{"status": "not_found"}] * 3
    assert left == 0 and timer is None


def test_an_idle_object_purges_through_its_alarm_after_an_eviction(runtime):
    # Nothing calls the object after its jobs finish, and it is evicted: the
    # alarm it left for the purge starts a new instance, which derives the
    # purge timer from the rows and runs it.
    stub = runtime.env.RETAINED.getByName("r")

    async def scenario():
        await stub.submit_many(["a", "b", "c"])
        await asyncio.sleep(5)
        runtime.evict(stub)
        await asyncio.sleep(GONE_S + 60)
        return runtime.host_of(stub).db.inspect("SELECT id FROM durability_jobs")

    assert runtime.run(scenario()) == []


def test_purging_goes_oldest_first_in_batches_of_500_at_one_row_written_per_job(runtime):
    # 1,200 jobs finished together against a limit of 1,000: the 200 beyond
    # it (oldest first, then by id) are due an hour after they finished and go
    # an hour later (the purge's slack), in one batch; the other 1,000 are
    # due at four hours and go at five, in two. Rows written: one delete per
    # job, and the alarm set again once the first batch left the object idle.
    stub = runtime.env.RETAINED.getByName("r")
    ids = [f"job-{n:04}" for n in range(1_200)]

    async def scenario():
        await stub.submit_many(ids)  # all finish together: due together
        await asyncio.sleep(60)
        start = written(runtime, stub)
        await asyncio.sleep(2 * HOUR_S)
        by_count = await stub.jobs_left(), await stub.keep_calls()
        edge = await stub.result("job-0199"), await stub.result("job-0200")
        await asyncio.sleep(GONE_S - 2 * HOUR_S)
        return by_count, edge, await stub.jobs_left(), written(runtime, stub) - start, await stub.keep_calls()

    (left1, keeps1), (last_gone, first_kept), left2, rows, keeps = runtime.run(scenario())
    assert left1 == 1_000 and [k["n"] for k in keeps1] == [200]
    assert last_gone == {"status": "not_found"} and first_kept["status"] == "completed"
    assert left2 == 0 and [k["n"] for k in keeps] == [200, 500, 500]
    # 1,200 deletes; the alarm set again for the second purge once the first
    # left the object idle; and the keep hook's own row per call (the worker's).
    assert rows == 1_200 + 1 + len(keeps)


def test_jobs_the_keep_hook_holds_back_stay_and_are_never_run_again(runtime):
    stub = runtime.env.RETAINED.getByName("r")

    async def scenario():
        await stub.submit_many(["held", "free"])
        await asyncio.sleep(5)
        await stub.hold(["held"])
        await asyncio.sleep(GONE_S + 60)
        while_held = await stub.result("held"), await stub.result("free")
        again = await stub.submit("held")  # the owner runs the id again: a no-op, the job is still known
        await stub.unhold()
        await asyncio.sleep(HOUR_S + 60)  # the hook is asked again an hour on
        return while_held, again, await stub.result("held"), await stub.calls("held"), await stub.jobs_left()

    (held, free), again, after, calls, left = runtime.run(scenario())
    assert held["status"] == "completed" and free == {"status": "not_found"}
    assert again["status"] == "completed"
    assert after == {"status": "not_found"} and left == 0
    assert calls == 1


@pytest.mark.parametrize("broken", [True, "returns nothing"])
def test_a_failing_keep_hook_purges_nothing_and_the_purge_is_retried(runtime, broken):
    stub = runtime.env.RETAINED.getByName("r")

    async def scenario():
        await stub.submit_many(["a", "b"])
        await asyncio.sleep(5)
        await stub.break_keep(broken)
        await asyncio.sleep(GONE_S + 60)
        during = await stub.jobs_left()
        await stub.break_keep(False)
        await asyncio.sleep(600)  # the scheduler's backoff: at most 5 minutes between tries
        return during, await stub.jobs_left()

    assert runtime.run(scenario()) == (2, 0)


def test_an_eviction_in_the_middle_of_a_purge_loses_nothing_and_the_purge_resumes(runtime):
    # 1,000 jobs purged together at five hours (200 more went at two, by
    # count); each keep call takes 10 s, and the object is evicted 15 s in,
    # while the second batch waits for its hook: the first batch's 500
    # deletions are committed, the second's never started. The new instance
    # (started by the alarm) derives the purge timer from the rows and
    # deletes the rest.
    stub = runtime.env.RETAINED.getByName("r")
    ids = [f"job-{n:04}" for n in range(1_200)]

    async def scenario():
        await stub.submit_many(ids)
        await asyncio.sleep(5)
        await stub.slow_keep()
        await asyncio.sleep(GONE_S + 10)
        runtime.evict(stub)
        host = runtime.host_of(stub)
        middle = host.db.inspect("SELECT count(*) AS n FROM durability_jobs")[0]["n"]
        await asyncio.sleep(HOUR_S)
        left = host.db.inspect("SELECT count(*) AS n FROM durability_jobs")[0]["n"]
        return middle, left, [row["n"] for row in await stub.keep_calls()]

    middle, left, keeps = runtime.run(scenario())
    assert middle == 500
    assert left == 0
    assert keeps == [200, 500, 500, 500]  # the cut batch is asked about again


def test_jobs_finished_before_the_upgrade_are_kept_a_full_window_from_it(runtime):
    stub = runtime.env.UPGRADED.getByName("u")

    async def scenario():
        first = await stub.result("old")
        await asyncio.sleep(MAX_AGE_S - 60)
        kept = await stub.result("old")
        await asyncio.sleep(SLACK_S + 120)
        return first, kept, await stub.result("old")

    first, kept, after = runtime.run(scenario())
    assert first == kept == {"status": "completed", "result": "done"}
    assert after == {"status": "not_found"}


@pytest.mark.parametrize("options, error", [
    ({"retention": 30}, "retention must be a JobRetention"),
    ({"retention": {"max_age_ms": 1}}, "retention must be a JobRetention"),
    ({"keep": ["a"]}, "keep must be callable"),
])
def test_bad_options_are_refused_before_anything_is_stored(options, error):
    untouched = object()  # a scheduler that is never reached: the check comes first
    with pytest.raises(ValueError, match=error):
        DurabilityJobs(untouched, handlers={"echo": print}, **options)


def test_a_retention_shorter_than_an_hour_is_refused():
    with pytest.raises(ValueError, match="at least 3600000"):
        JobRetention(max_age_ms=60_000)


def test_a_job_that_finishes_while_the_keep_hook_is_asked_is_purged_in_its_turn(runtime):
    stub = runtime.env.RETAINED.getByName("r")

    async def scenario():
        await stub.submit_many(["first"])
        await asyncio.sleep(5)
        await stub.slow_keep()  # each keep call now takes 10 s
        await asyncio.sleep(GONE_S)
        await stub.submit_many(["meanwhile"])  # finishes while "first"'s batch waits for the hook
        await asyncio.sleep(30)
        between = await stub.result("first"), await stub.result("meanwhile")
        await asyncio.sleep(GONE_S)
        return between, await stub.jobs_left()

    (first, meanwhile), left = runtime.run(scenario())
    assert first == {"status": "not_found"} and meanwhile["status"] == "completed"
    assert left == 0


def test_jobs_held_back_beyond_the_count_do_not_make_the_purge_spin(runtime):
    # 1,001 finished jobs against a limit of 1,000: the one beyond it is held
    # back. Nothing else is due, so the purge waits (an hour: the worker's
    # slack_ms) instead of firing again at once for the same held job.
    stub = runtime.env.RETAINED.getByName("r")
    ids = [f"job-{n:04}" for n in range(1_001)]

    async def scenario():
        await stub.submit_many(ids)
        await stub.hold(["job-0000"])  # the oldest (all finished together: then by id)
        await asyncio.sleep(3 * HOUR_S)
        return await stub.keep_calls(), await stub.jobs_left()

    keeps, left = runtime.run(scenario())
    assert left == 1_001
    assert 1 <= len(keeps) <= 3 and all(k["n"] == 1 for k in keeps)
