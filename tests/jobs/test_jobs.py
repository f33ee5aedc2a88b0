"""DurabilityJobs: durable jobs run to completion or final failure, retried with backoff."""

import asyncio
from pathlib import Path

import pytest

import durability
from durability.testing import Faults, JsException, Runtime, load_worker_module

JOBS = Path(__file__).resolve().parents[1] / "workers" / "jobs.py"


def jobs_runtime(**options) -> Runtime:
    return Runtime(load_worker_module(JOBS), {"JOBS": "Jobs", "PLAIN": "Plain", "KEEPER": "Keeper"}, **options)


@pytest.fixture
def runtime():
    with jobs_runtime() as rt:
        yield rt


def started_at(events, start):
    return [(e["attempt"], e["at"] - start) for e in events if e["type"] == "attempt_started"]


def kinds(events):
    return [(e["type"], e["attempt"], e["outcome"]) for e in events]


def test_run_is_idempotent_on_id(runtime):
    stub = runtime.env.JOBS.getByName("j")

    async def scenario():
        first = await stub.submit("job-1", {"job": "job-1", "result": "first"})
        again = await stub.submit("job-1", {"job": "job-1", "result": "second"})
        await asyncio.sleep(5)
        after = await stub.submit("job-1", {"job": "job-1", "result": "third"})
        return first, again, after, await stub.calls("job-1"), await stub.stored()

    first, again, after, calls, stored = runtime.run(scenario())
    assert first == again == {"status": "pending"}
    assert after == {"status": "completed", "result": "first"}
    assert calls == 1
    assert stored["jobs"] == 1 and stored["timers"] == 0


def test_get_result_reports_pending_then_completed(runtime):
    stub = runtime.env.JOBS.getByName("j")

    async def scenario():
        missing = await stub.result("job-1")
        await stub.submit_default("job-1", {"job": "job-1", "sleep": 2, "result": {"answer": 42}})
        await asyncio.sleep(1)
        running = await stub.result("job-1")
        await asyncio.sleep(2)
        return missing, running, await stub.result("job-1")

    missing, running, done = runtime.run(scenario())
    assert missing == {"status": "not_found"}
    assert running == {"status": "pending"}
    assert done == {"status": "completed", "result": {"answer": 42}}


def test_failed_attempts_are_retried_with_backoff(runtime):
    stub = runtime.env.JOBS.getByName("j")

    async def scenario():
        start = runtime.now_ms()
        await stub.submit("job-1", {"job": "job-1", "fail_times": 2})
        await asyncio.sleep(30)
        return start, await stub.events("job-1"), await stub.result("job-1"), await stub.calls("job-1")

    start, events, result, calls = runtime.run(scenario())
    assert started_at(events, start) == [(1, 0), (2, 1_000), (3, 3_000)]  # 1 s, then 2 s
    assert result == {"status": "completed", "result": {"job": "job-1", "calls": 3}}
    assert calls == 3


def test_a_job_fails_for_good_after_its_attempts(runtime):
    stub = runtime.env.JOBS.getByName("j")

    async def scenario():
        start = runtime.now_ms()
        await stub.submit("job-1", {"job": "job-1", "error": "the disk is full"})
        await asyncio.sleep(60)
        return (start, await stub.events("job-1"), await stub.result("job-1"),
                await stub.calls("job-1"), await stub.stored())

    start, events, result, calls, stored = runtime.run(scenario())
    assert result == {"status": "failed", "error": "RuntimeError: the disk is full"}
    assert calls == 3
    assert started_at(events, start) == [(1, 0), (2, 1_000), (3, 3_000)]
    assert stored["timers"] == 0


def test_a_non_retryable_error_fails_the_job_at_its_first_attempt(runtime):
    stub = runtime.env.JOBS.getByName("j")

    async def scenario():
        await stub.submit("job-1", {"job": "job-1", "fail_times": 1, "refused": "the receiver said 404"})
        await asyncio.sleep(60)
        return await stub.events("job-1"), await stub.result("job-1"), await stub.calls("job-1")

    events, result, calls = runtime.run(scenario())
    # The first attempt fails as any failure does and is retried; the second is final.
    assert result == {"status": "failed", "error": "NonRetryableError: the receiver said 404"}
    assert calls == 2
    assert kinds(events)[-2:] == [("attempt_settled", 2, "failed"), ("terminal", 2, "failed")]


def test_lifecycle_events_come_in_order_after_their_writes(runtime):
    stub = runtime.env.JOBS.getByName("j")

    async def scenario():
        await stub.submit("ok", {"job": "ok", "fail_times": 1})
        await stub.submit("bad", {"job": "bad", "error": "no"})
        await asyncio.sleep(60)
        return await stub.events("ok"), await stub.events("bad")

    ok, bad = runtime.run(scenario())
    assert kinds(ok) == [
        ("attempt_started", 1, None), ("attempt_settled", 1, "failed"),
        ("attempt_started", 2, None), ("attempt_settled", 2, "completed"),
        ("terminal", 2, "completed"),
    ]
    assert ok[1]["error"] == "RuntimeError: ok fails (call 1)"
    assert ok[-1]["result"] == '{"job": "ok", "calls": 2}'
    # Each event's write is made before the listener hears of it.
    assert [e["status"] for e in ok] == ["pending"] * 3 + ["completed"] * 2
    assert kinds(bad) == [
        ("attempt_started", 1, None), ("attempt_settled", 1, "failed"),
        ("attempt_started", 2, None), ("attempt_settled", 2, "failed"),
        ("attempt_started", 3, None), ("attempt_settled", 3, "failed"),
        ("terminal", 3, "failed"),
    ]
    assert bad[-1]["status"] == "failed" and bad[-1]["error"] == "RuntimeError: no"
    assert [e["type"] for e in ok + bad].count("terminal") == 2


def test_an_attempt_cut_short_by_eviction_counts_and_is_retried(runtime):
    stub = runtime.env.JOBS.getByName("j")

    async def scenario():
        await stub.submit("job-1", {"job": "job-1", "sleep": 5})
        await asyncio.sleep(1)  # the first attempt sleeps in its handler
        assert await stub.calls("job-1") == 1
        runtime.evict(stub)
        await asyncio.sleep(60)
        stub2 = runtime.env.JOBS.getByName("j")
        return (await stub2.events("job-1"), await stub2.result("job-1"),
                await stub2.completions("job-1"), await stub2.calls("job-1"))

    events, result, completions, calls = runtime.run(scenario())
    assert result == {"status": "completed", "result": {"job": "job-1", "calls": 2}}
    assert completions == 1 and calls == 2
    assert kinds(events) == [
        ("attempt_started", 1, None), ("attempt_settled", 1, "failed"),
        ("attempt_started", 2, None), ("attempt_settled", 2, "completed"),
        ("terminal", 2, "completed"),
    ]
    assert "interrupted" in events[1]["error"]


def test_interrupted_attempts_count_towards_the_limit(runtime):
    stub = runtime.env.JOBS.getByName("j")

    async def scenario():
        await stub.submit("job-1", {"job": "job-1", "sleep": 5})
        for _ in range(3):  # every attempt is cut short
            while await runtime.env.JOBS.getByName("j").calls("job-1") <= _:
                await asyncio.sleep(0.5)
            runtime.evict(runtime.env.JOBS.getByName("j"))
        await asyncio.sleep(60)
        stub2 = runtime.env.JOBS.getByName("j")
        return await stub2.result("job-1"), await stub2.calls("job-1"), await stub2.completions("job-1")

    result, calls, completions = runtime.run(scenario())
    assert result["status"] == "failed" and "attempt 3 was interrupted" in result["error"]
    assert (calls, completions) == (3, 0)


def test_a_repeated_alarm_does_not_rerun_a_finished_job():
    runtime = jobs_runtime(faults=Faults(duplicate_alarm=1.0))
    stub = runtime.env.JOBS.getByName("j")

    async def scenario():
        await stub.submit("done", {"job": "done"})
        await stub.submit("dead", {"job": "dead", "error": "no"})
        await asyncio.sleep(30)
        for job in ("done", "dead"):  # the timer fires once more, as at-least-once allows
            await stub.retrigger(job)
        await asyncio.sleep(30)
        return ([await stub.calls(j) for j in ("done", "dead")], await stub.completions("done"),
                [e["type"] for e in await stub.events()].count("terminal"),
                await stub.result("done"), await stub.stored())

    calls, completions, terminals, result, stored = runtime.run(scenario())
    assert calls == [1, 3] and completions == 1 and terminals == 2
    assert result == {"status": "completed", "result": {"job": "done", "calls": 1}}
    assert stored["timers"] == 0
    assert runtime.hosts()[0].stats.alarm_invocations >= 8
    runtime.close()


def test_eviction_after_the_outcome_commits_does_not_rerun_the_job(runtime):
    stub = runtime.env.JOBS.getByName("j")

    async def scenario():
        await stub.submit("slow-listener", {"job": "slow-listener"})
        await asyncio.sleep(1)  # the terminal listener sleeps; the timer is not yet deleted
        assert await stub.stored() == {"jobs": 1, "timers": 1, "alarm": None}
        runtime.evict(stub)
        await asyncio.sleep(60)
        stub2 = runtime.env.JOBS.getByName("j")
        return (await stub2.calls("slow-listener"), await stub2.result("slow-listener"),
                await stub2.stored())

    calls, result, stored = runtime.run(scenario())
    assert calls == 1 and result["status"] == "completed"
    assert stored["timers"] == 0


@pytest.mark.parametrize("args", [
    ("", {"job": "x"}),
    ("x" * 257, {"job": "x"}),
    ("x", {"job": "x"}, "nope"),
    ("x", {"job": "x", "not json": {1, 2}}),
    ("x", {"job": "x", "nan": float("nan")}),
])
@pytest.mark.parametrize("method", ["submit", "submit_kept"])  # run, and run.kept
def test_bad_input_is_refused_and_stores_nothing(runtime, args, method):
    async def scenario():
        with pytest.raises(JsException, match="ValueError"):
            await getattr(runtime.env.JOBS.getByName("j"), method)(*args)
        return await runtime.env.JOBS.getByName("j").stored()

    assert runtime.run(scenario()) == {"jobs": 0, "timers": 0, "alarm": None}


def test_the_handler_must_be_named_when_there_are_several(runtime):
    stub = runtime.env.PLAIN.getByName("p")

    async def scenario():
        with pytest.raises(JsException, match="ValueError: name a handler"):
            await stub.submit("a", "hi")
        stub2 = runtime.env.PLAIN.getByName("p")
        await stub2.submit("b", "hi", "upper")
        await asyncio.sleep(1)
        return await stub2.result("a"), await stub2.result("b")

    assert runtime.run(scenario()) == ({"status": "not_found"}, {"status": "completed", "result": "HI"})


def test_a_result_that_is_not_json_fails_the_attempt(runtime):
    stub = runtime.env.JOBS.getByName("j")

    async def scenario():
        await stub.submit("job-1", {"job": "job-1", "bad_result": True})
        await asyncio.sleep(60)
        return await stub.result("job-1"), await stub.calls("job-1")

    result, calls = runtime.run(scenario())
    assert result["status"] == "failed" and calls == 3
    assert result["error"].startswith("TypeError: job handler 'run' returned a result that is not JSON")


def test_a_listener_that_raises_does_not_break_the_runner(runtime):
    stub = runtime.env.JOBS.getByName("j")

    async def scenario():
        await stub.submit("boom-1", {"job": "boom-1", "fail_times": 1})
        await asyncio.sleep(30)
        return await stub.result("boom-1"), await stub.events("boom-1"), await stub.calls("boom-1")

    result, events, calls = runtime.run(scenario())
    assert result == {"status": "completed", "result": {"job": "boom-1", "calls": 2}}
    assert calls == 2
    assert [e["type"] for e in events] == [
        "attempt_started", "attempt_settled", "attempt_started", "attempt_settled", "terminal"
    ]
    assert not runtime.errors


def test_migrate_none_removes_the_tables(runtime):
    stub = runtime.env.JOBS.getByName("j")

    async def scenario():
        await stub.submit("job-1", {"job": "job-1"})
        await asyncio.sleep(2)
        with pytest.raises(JsException, match="ValueError"):
            await stub.drop(1)
        return await runtime.env.JOBS.getByName("j").drop()

    tables = runtime.run(scenario())
    assert "durability_jobs" not in tables
    # The version table stays for the scheduler and the rest; the scheduler
    # made no timer table (the runner's timers live in memory).
    assert "durability_schema" in tables and "durability_timers" not in tables


async def warmed_up(runtime, stub):
    """Run one job on ``stub`` first (its schema, its first alarm) and return
    a function giving (rows written with alarms, rows read) from then on."""
    await stub.submit("warm", "x", "echo")
    await asyncio.sleep(1)
    host = runtime.host_of(stub)
    return lambda: (host.db.rows_written + host.stats.alarm_writes, host.db.rows_read)


async def rows_of(runtime, stub, call):
    """(rows written with alarms, rows read) by ``await call()`` and the second after it, once warmed up."""
    rows = await warmed_up(runtime, stub)
    before = rows()
    await call()
    await asyncio.sleep(1)
    after = rows()
    return after[0] - before[0], after[1] - before[1]


def test_a_job_that_succeeds_first_time_costs_three_rows_written_and_an_idle_object_one_more(runtime):
    stub = runtime.env.PLAIN.getByName("p")

    async def scenario():
        return await rows_of(runtime, stub, lambda: stub.submit("job-1", {"n": 1}, "echo")), await stub.result("job-1")

    (written, read), result = runtime.run(scenario())
    assert result == {"status": "completed", "result": {"n": 1}}
    # The job with its first attempt, the alarm, the outcome (its timer lives
    # in memory); then, the object idle, the alarm set again for the purge 30
    # days on: one row per idle spell, shared by every job of a busy one.
    # Read: two rows, none of them a timer's (the scheduler made no timer table).
    assert (written, read) == (4, 2)


@pytest.mark.parametrize("refused", [False, True])
def test_a_kept_job_that_ends_in_its_first_attempt_keeps_its_outcome_with_its_caller(runtime, refused):
    # With outcomes=, a job handed in with run.kept that ends in its first
    # attempt writes no row of its own: its outcome goes to the caller's
    # record (one write there), and get_result reads it back. A job retried
    # gets its row, as without. A caller that can no longer keep it (False)
    # gets the row written instead.
    stub = runtime.env.KEEPER.getByName("k")
    runtime.module.Keeper.refuse = refused

    async def scenario():
        written, _ = await rows_of(runtime, stub, lambda: stub.submit_kept("job-1", {"n": 1}, "echo"))
        await stub.submit_kept("job-2", {"fail_first": True}, "whoami")
        await asyncio.sleep(5)
        again = await stub.submit_kept("job-1", {"n": 2}, "echo")  # handed in again: not run again
        return written, await stub.result("job-1"), await stub.result("job-2"), again, await stub.stored()

    try:
        written, first, retried, again, stored = runtime.run(scenario())
    finally:
        runtime.module.Keeper.refuse = False
    assert first == again == {"status": "completed", "result": {"n": 1}}
    assert retried["status"] == "completed" and retried["result"]["attempt"] == 2
    # The outcome (in the runner's row or the caller's), and the alarm set for
    # the attempt, then again for the purge of the job run first.
    assert written == 3
    # (The warm-up's job has its row too: it ran with run.)
    assert stored == ({"durability_jobs": 3, "kept": 0} if refused else {"durability_jobs": 2, "kept": 1})


def rows_a_new_instance_reads(finished: int) -> int:
    """Rows read by a new instance of an object with ``finished`` jobs kept, asked for one result."""
    with jobs_runtime() as runtime:
        stub = runtime.env.PLAIN.getByName("p")

        async def scenario():
            for n in range(finished):
                await stub.submit(f"job-{n}", {"n": n}, "echo")
            await asyncio.sleep(5)
            runtime.evict(stub)
            host = runtime.host_of(stub)
            before = host.db.rows_read
            assert (await stub.result("job-0"))["status"] == "completed"
            return host.db.rows_read - before

        return runtime.run(scenario())


def test_a_new_instance_reads_the_jobs_table_once():
    # Its unfinished jobs' timers and the purge's census come from one scan:
    # a row read per job kept (two, when each had a scan of its own).
    extra = rows_a_new_instance_reads(60) - rows_a_new_instance_reads(30)
    assert 30 <= extra < 40, extra


def test_a_handler_learns_its_job_from_current_job(runtime):
    stub = runtime.env.PLAIN.getByName("p")

    async def scenario():
        # Two jobs whose handlers overlap in time, and one whose first attempt fails.
        await stub.submit("slow", {"sleep": 2}, "whoami")
        await stub.submit("quick", {"sleep": 1}, "whoami")
        await stub.submit("again", {"fail_first": True}, "whoami")
        await asyncio.sleep(5)
        return [await stub.result(job_id) for job_id in ("slow", "quick", "again")]

    slow, quick, again = runtime.run(scenario())
    assert slow["result"] == {"id": "slow", "attempt": 1, "handler": "whoami", "same": True}
    assert quick["result"] == {"id": "quick", "attempt": 1, "handler": "whoami", "same": True}
    assert again["result"] == {"id": "again", "attempt": 2, "handler": "whoami", "same": True}


def test_current_job_outside_a_handler_raises():
    from durability import current_job

    with pytest.raises(LookupError, match="job handler"):
        current_job()


def test_a_retry_costs_three_rows_written(runtime):
    stub = runtime.env.PLAIN.getByName("p")

    async def scenario():
        rows = await warmed_up(runtime, stub)
        written = []
        for job_id, payload in (("once", {}), ("twice", {"fail_first": True})):
            before = rows()[0]
            await stub.submit(job_id, payload, "whoami")
            await asyncio.sleep(5)
            written.append(rows()[0] - before)
        return written, await stub.result("twice")

    written, result = runtime.run(scenario())
    assert result["result"]["attempt"] == 2
    # The retry: its failure, the alarm set for it, the next attempt's start
    # (and each time the object goes idle, the alarm set for the purge).
    assert written == [4, 7]


def test_the_job_runner_keeps_its_first_name():
    assert durability.Durability is durability.DurabilityJobs


def test_a_kept_job_runs_as_any_job_and_writes_its_row_only_when_it_settles(runtime):
    stub = runtime.env.JOBS.getByName("j")

    async def scenario():
        await stub.submit_kept("job-1", {"job": "job-1", "sleep": 2})
        await asyncio.sleep(1)
        running = await stub.result("job-1"), await stub.stored()
        again = await stub.submit_kept("job-1", {"job": "job-1"})  # handed in twice: run once
        await asyncio.sleep(5)
        return running, again, await stub.result("job-1"), await stub.calls("job-1"), await stub.events("job-1")

    (result, stored), again, done, calls, events = runtime.run(scenario())
    assert result == again == {"status": "pending"}
    assert stored["jobs"] == 0  # the caller's record stands for it while it runs
    assert done == {"status": "completed", "result": {"job": "job-1", "calls": 1}} and calls == 1
    assert kinds(events) == [("attempt_started", 1, None), ("attempt_settled", 1, "completed"),
                             ("terminal", 1, "completed")]


def test_a_kept_job_handed_in_again_by_a_new_instance_is_recorded_and_counts_attempts_cut_short(runtime):
    stub = runtime.env.JOBS.getByName("j")

    async def hand_in_again():  # as its queue does from a new instance
        runtime.evict(runtime.env.JOBS.getByName("j"))
        await runtime.env.JOBS.getByName("j").submit_kept("job-1", {"job": "job-1", "sleep": 5}, None, True)

    async def scenario():
        await stub.submit_kept("job-1", {"job": "job-1", "sleep": 5})
        await asyncio.sleep(1)
        await hand_in_again()  # the first attempt, cut short, left no row: it starts over
        await asyncio.sleep(1)
        stored = await runtime.env.JOBS.getByName("j").stored()
        await hand_in_again()  # its row counts this one
        await asyncio.sleep(30)
        stub2 = runtime.env.JOBS.getByName("j")
        after = await stub2.submit_kept("job-1", {"job": "job-1"}, None, True)  # once more: settled, left as it is
        return (stored, await stub2.events("job-1"), await stub2.result("job-1"), await stub2.calls("job-1"), after)

    stored, events, result, calls, after = runtime.run(scenario())
    assert stored["jobs"] == 1
    assert result == after == {"status": "completed", "result": {"job": "job-1", "calls": 3}}
    assert calls == 3
    assert kinds(events) == [
        ("attempt_started", 1, None), ("attempt_started", 1, None), ("attempt_settled", 1, "failed"),
        ("attempt_started", 2, None), ("attempt_settled", 2, "completed"), ("terminal", 2, "completed"),
    ]
    assert "interrupted" in events[2]["error"]


def test_a_kept_job_whose_first_attempt_fails_is_retried_from_its_row(runtime):
    stub = runtime.env.JOBS.getByName("j")

    async def scenario():
        start = runtime.now_ms()
        await stub.submit_kept("job-1", {"job": "job-1", "fail_times": 1})
        await asyncio.sleep(0.5)
        between = await stub.stored(), await stub.result("job-1")
        await asyncio.sleep(5)
        return start, between, await stub.events("job-1"), await stub.result("job-1")

    start, (stored, pending), events, result = runtime.run(scenario())
    assert stored["jobs"] == 1 and pending == {"status": "pending"}  # its row holds the retry
    assert started_at(events, start) == [(1, 0), (2, 1_000)]
    assert result == {"status": "completed", "result": {"job": "job-1", "calls": 2}}


def test_a_kept_job_costs_one_row_written_less_than_a_run_one(runtime):
    stub = runtime.env.PLAIN.getByName("p")

    async def scenario():
        rows = await warmed_up(runtime, stub)
        written = []
        for job_id, submit in (("run", stub.submit), ("kept", stub.submit_kept)):
            before = rows()[0]
            await submit(job_id, {"n": 1}, "echo")
            await asyncio.sleep(1)
            written.append(rows()[0] - before)
        return written, await stub.result("kept")

    written, result = runtime.run(scenario())
    assert result == {"status": "completed", "result": {"n": 1}}
    # run: the job with its first attempt, then its outcome; kept: the outcome
    # alone (each also moves the alarm to now and back for the purge).
    assert written == [4, 3]


def test_a_kept_job_handed_in_again_or_run_by_id_while_it_runs_runs_once_and_settles(runtime):
    stub = runtime.env.JOBS.getByName("j")

    async def scenario():
        await stub.submit_kept("job-1", {"job": "job-1", "sleep": 2})
        await asyncio.sleep(1)
        again = [await stub.submit_kept("job-1", {"job": "job-1"}, None, True),  # as from a new instance, but this one
                 await stub.submit("job-1", {"job": "job-1"})]  # run() under its id
        await asyncio.sleep(5)
        return again, await stub.result("job-1"), await stub.calls("job-1"), await stub.stored()

    again, result, calls, stored = runtime.run(scenario())
    assert again == [{"status": "pending"}, {"status": "pending"}]
    assert result == {"status": "completed", "result": {"job": "job-1", "calls": 1}} and calls == 1
    assert stored["jobs"] == 1 and stored["timers"] == 0


@pytest.mark.parametrize("job_id", [["job-1"], {"id": 1}, 7, None])
def test_get_result_of_an_id_that_is_not_a_string_is_not_found(runtime, job_id):
    stub = runtime.env.JOBS.getByName("j")

    async def scenario():
        await stub.submit_kept("job-1", {"job": "job-1", "sleep": 2})  # a job with no row yet, kept in memory
        return await stub.result(job_id)

    assert runtime.run(scenario()) == {"status": "not_found"}
