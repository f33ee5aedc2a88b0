"""Jobs whose attempts run in a Queue consumer: sent, run, reported, retried, never overlapping."""

import asyncio
from pathlib import Path

import pytest

from durability.jobs.handoff import CLOCK_MARGIN_MS
from durability.testing import HIBERNATE_AFTER_MS, Faults, Outage, QueueConsumer, Runtime, load_worker_module

HANDOFF = Path(__file__).resolve().parents[1] / "workers" / "handoff.py"
SPAN_S = (60_000 + 120_000 + CLOCK_MARGIN_MS) / 1000  #: the test Worker's start and run limits, and the margin


def handoff_runtime(*, consumer=True, **options):
    module = load_worker_module(HANDOFF)
    module.RUNS.clear()
    module.EVENTS.clear()
    module.KEPT.clear()
    consumers = [QueueConsumer("attempts", max_batch_size=10, max_batch_timeout=1, max_retries=3,
                               dead_letter_queue="attempts-dead"),
                 QueueConsumer("attempts-dead", max_batch_size=10, max_batch_timeout=1)] if consumer else []
    return Runtime(module, {"SHARD": "Shard"}, queues={"ATTEMPTS": "attempts"}, consumers=consumers, **options)


def shard(runtime, name="s"):
    return runtime.env.SHARD.getByName(name)


def runs(runtime, job=None):
    """(job, attempt, delivery) of each run, in order."""
    return [(j, attempt, delivery) for j, attempt, delivery, _, _ in runtime.module.RUNS if job in (None, j)]


def test_an_attempt_runs_in_the_consumer_while_its_object_sleeps_and_its_report_settles_the_job():
    runtime = handoff_runtime()

    async def scenario():
        await shard(runtime).submit("j1", {"sleep": 30})
        await asyncio.sleep(5)
        during = await shard(runtime).result("j1")
        await asyncio.sleep(60)
        return during, await shard(runtime).result("j1")

    during, after = runtime.run(scenario())
    assert during == {"status": "pending"}
    assert after == {"status": "completed", "result": {"job": "j1", "calls": 1}}
    assert runs(runtime) == [("j1", 1, 1)]
    assert [e[1] for e in runtime.module.EVENTS] == ["attempt_started", "attempt_settled", "terminal"]
    host = runtime.host_of(shard(runtime))
    assert host.awake_s() < 1  # the 30 s of work ran where the object bills nothing
    stats = runtime.queues["attempts"].stats
    assert (stats.sent, stats.acked, stats.operations) == (1, 1, 3)
    assert runtime.worker_stats.by_kind == {"queue": 1}


def test_a_failed_attempt_is_retried_by_the_runner_and_a_final_failure_ends_the_job():
    runtime = handoff_runtime()

    async def scenario():
        await shard(runtime).submit("j1", {"fail_times": 1})
        await shard(runtime).submit("j2", {"refused": "no such account"})
        await shard(runtime).submit("j3", {"bad_result": True})
        await asyncio.sleep(30)
        return [await shard(runtime).result(j) for j in ("j1", "j2", "j3")]

    j1, j2, j3 = runtime.run(scenario())
    assert j1 == {"status": "completed", "result": {"job": "j1", "calls": 2}}
    assert runs(runtime, "j1") == [("j1", 1, 1), ("j1", 2, 1)]  # a new message per attempt
    assert j2 == {"status": "failed", "error": "NonRetryableError: no such account"} and len(runs(runtime, "j2")) == 1
    assert j3["status"] == "failed" and "returned" in j3["error"] and len(runs(runtime, "j3")) == 3


@pytest.mark.parametrize("lost", ["lose_reply", "lose_request"])
def test_a_lost_report_comes_again_with_the_redelivery_which_runs_the_attempt_again_only_if_still_out(lost):
    # The first report the consumer sends is lost (on its way, or its
    # answer): the message comes again, and asks first.
    runtime = handoff_runtime(faults=Faults())
    reports = []
    plan_call = runtime.faults.plan_call

    def lose_first_report(class_name, from_object):  # (a consumer's calls are faulted as an object's)
        plan = plan_call(class_name, from_object)
        if class_name == "Shard" and from_object and not reports:
            reports.append(lost)
            setattr(plan, lost, True)
        return plan

    runtime.faults.plan_call = lose_first_report

    async def scenario():
        await shard(runtime).submit("j1", {})
        await asyncio.sleep(20)
        return await shard(runtime).result("j1")

    assert runtime.run(scenario())["status"] == "completed"
    if lost == "lose_reply":  # the shard settled the job: the redelivery asks, and runs nothing
        assert runs(runtime) == [("j1", 1, 1)]
    else:  # it never heard the report: the attempt runs again, said by its delivery
        assert runs(runtime) == [("j1", 1, 1), ("j1", 1, 2)]
    assert reports == [lost] and runtime.queues["attempts"].stats.deliveries == 2


def test_a_consumer_that_dies_mid_run_gets_the_attempt_again_and_runs_never_overlap():
    runtime = handoff_runtime(faults=Faults(consumer_crash=0.5, lost_ack=0.2, evict_window_ms=4_000), seed=3)

    async def scenario():
        for n in range(60):
            await shard(runtime).submit(f"j{n}", {"sleep": 2})
            await asyncio.sleep(0.5)  # (batches of a few)
        await asyncio.sleep(300)
        return [await shard(runtime).result(f"j{n}") for n in range(60)]

    results = runtime.run(scenario())
    assert all(r["status"] == "completed" for r in results), results
    stats = runtime.queues["attempts"].stats
    assert stats.crashed_invocations > 0 and stats.acks_lost > 0
    assert any(delivery > 1 for _, _, delivery in runs(runtime))
    by_job = {}
    for job, _, _, start, end in runtime.module.RUNS:
        by_job.setdefault(job, []).append((start, end if end is not None else float("inf")))
    for job, spans in by_job.items():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), (job, spans)  # one run at a time


def test_an_attempt_out_while_its_object_restarts_is_settled_by_its_report():
    runtime = handoff_runtime()

    async def scenario():
        await shard(runtime).submit("j1", {"sleep": 20})
        await shard(runtime).submit_kept("k1", {"sleep": 20})  # its caller keeps its record: no row yet
        await asyncio.sleep(5)
        runtime.evict(shard(runtime))
        # A new instance, handed the kept job in again: its attempt may be out, so nothing is sent now.
        await shard(runtime).submit_kept("k1", {"sleep": 20}, True)
        await asyncio.sleep(60)
        return await shard(runtime).result("j1"), await shard(runtime).result("k1")

    j1, k1 = runtime.run(scenario())
    assert j1["status"] == k1["status"] == "completed"
    assert runs(runtime) == [("j1", 1, 1), ("k1", 1, 1)]  # each ran once
    assert runtime.queues["attempts"].stats.sent == 2


def test_a_kept_job_sent_to_its_queue_writes_its_row_only_when_its_report_settles_it():
    runtime = handoff_runtime()

    async def scenario():
        await shard(runtime).submit_kept("k1", {"sleep": 20})
        await asyncio.sleep(5)
        during = await shard(runtime).job_rows(), await shard(runtime).result("k1")
        await asyncio.sleep(30)
        return during, await shard(runtime).job_rows()

    (rows_during, state_during), rows_after = runtime.run(scenario())
    assert rows_during == [] and state_during == {"status": "pending"}  # its caller's record stands for it
    assert rows_after == [["k1", "completed", 1]]
    assert runs(runtime) == [("k1", 1, 1)]


def test_a_kept_job_handed_in_again_is_not_sent_until_its_attempt_is_taken_for_lost_and_counted():
    runtime = handoff_runtime(consumer=False)  # the first attempt's message is never run

    async def scenario():
        await shard(runtime).submit_kept("k1", {})
        await asyncio.sleep(5)
        runtime.evict(shard(runtime))
        await shard(runtime).submit_kept("k1", {}, True)  # a new instance: its attempt may be out
        await asyncio.sleep(SPAN_S - 10)
        before = runtime.queues["attempts"].stats.sent, await shard(runtime).job_rows()
        await asyncio.sleep(20)
        return before, runtime.queues["attempts"].stats.sent, await shard(runtime).job_rows()

    (sent_before, rows_before), sent_after, rows_after = runtime.run(scenario())
    assert (sent_before, rows_before) == (1, [])
    assert sent_after == 2 and rows_after == [["k1", "running", 2]]  # attempt 1 counted as failed
    assert ("k1", "attempt_settled", 1, "failed") in runtime.module.EVENTS


def test_an_attempt_out_is_taken_for_lost_at_its_send_plus_its_span_however_often_its_object_hibernates():
    # Each wake-up is a new instance (10 s idle: hibernated): a time each set
    # from its own start would put the attempt off for good. A kept job's
    # caller hands it in again in each new instance (the test Worker at its
    # alarm, as a queue does at its next reply, sync or alarm).
    runtime = handoff_runtime(consumer=False, hibernate_after_ms=HIBERNATE_AFTER_MS)

    async def scenario():
        await shard(runtime).submit("j1", {})
        await shard(runtime).submit_kept("k1", {}, False, runtime.now_ms())
        await asyncio.sleep(SPAN_S - 10)
        before = runtime.queues["attempts"].stats.sent
        await asyncio.sleep(15)  # past the span (and the retries' 1 s backoff)
        return before, runtime.queues["attempts"].stats.sent, runtime.host_of(shard(runtime)).stats.hibernations

    before, after, hibernations = runtime.run(scenario())
    assert hibernations >= 1  # the alarm at the span woke a new instance
    assert (before, after) == (2, 4)  # each job's attempt 2, a span after its first was sent


def test_a_row_from_before_lost_at_is_given_one_by_the_first_instance_that_finds_it():
    runtime = handoff_runtime(consumer=False)

    async def scenario():
        await shard(runtime).submit("j1", {})
        assert await shard(runtime).lost_at("j1", forget=True) is None
        runtime.evict(shard(runtime))
        now = runtime.now_ms()
        return now, await shard(runtime).lost_at("j1")  # (the call starts a new instance)

    now, lost_at = runtime.run(scenario())
    assert lost_at == now + SPAN_S * 1000  # later than any send of it; the next instance keeps it


def test_a_kept_job_handed_in_long_after_its_record_was_made_is_recorded_and_sent_as_of_now():
    runtime = handoff_runtime()

    async def scenario():
        long_ago = runtime.now_ms() - 61_000  # past the test Worker's start limit (60 s)
        await shard(runtime).submit_kept("k1", {"sleep": 1}, False, long_ago)
        rows = await shard(runtime).job_rows()
        await asyncio.sleep(10)
        return rows, await shard(runtime).result("k1")

    rows, state = runtime.run(scenario())
    assert rows == [["k1", "running", 1]]  # its own row: counted from now, in any instance
    assert state["status"] == "completed" and runs(runtime) == [("k1", 1, 1)]  # not dropped as late


def test_an_attempt_that_never_reaches_a_consumer_is_taken_for_lost_after_its_span_and_sent_again():
    runtime = handoff_runtime(consumer=False)  # the queue keeps its messages: no consumer runs them

    async def scenario():
        await shard(runtime).submit("j1", {})
        await asyncio.sleep(SPAN_S - 5)
        before = runtime.queues["attempts"].stats.sent
        await asyncio.sleep(10)
        return before, runtime.queues["attempts"].stats.sent, await shard(runtime).result("j1")

    before, after, state = runtime.run(scenario())
    assert (before, after, state["status"]) == (1, 2, "pending")
    assert ("j1", "attempt_settled", 1, "failed") in runtime.module.EVENTS


def test_a_message_the_queue_gives_up_on_ends_its_job_as_failed_through_the_dead_letter_queue():
    # The shard answers no call for 40 s: every report fails, the queue
    # retries the message until max_retries (5, 10 and 20 s apart), then
    # dead-letters it; the dead-letter queue's report gets through at last.
    runtime = handoff_runtime(faults=Faults(outages=(Outage("Shard", 100, 40_000, alarms=False, calls=True),),
                                            external=True))

    async def scenario():
        await shard(runtime).submit("j1", {"refused": "x", "sleep": 0})
        await asyncio.sleep(120)
        with runtime.no_faults():
            return await shard(runtime).result("j1")

    error = "its queue gave the attempt up: no delivery of it was reported"
    assert runtime.run(scenario()) == {"status": "failed", "error": error}
    assert runtime.queues["attempts"].stats.dead_lettered == 1


def test_bad_reports_are_refused_and_change_nothing():
    runtime = handoff_runtime(consumer=False)

    async def scenario():
        await shard(runtime).submit("j1", {})
        refused = []
        for bad in (None, {"job": "j1"}, {"job": "j1", "attempt": 0}, {"job": "j1", "attempt": 1, "outcome": "done"},
                    {"job": "j1", "attempt": 1, "outcome": "failed"}, {"job": "", "attempt": 1}):
            try:
                await shard(runtime).job_report(bad)
            except Exception as error:
                refused.append("ValueError" in str(error))
        stale = await shard(runtime).job_report({"job": "j1", "attempt": 2, "outcome": "completed", "result": 1})
        unknown = await shard(runtime).job_report({"job": "nope", "attempt": 1, "outcome": "completed"})
        asked = await shard(runtime).job_report({"job": "j1", "attempt": 1})
        return refused, stale, unknown, asked, await shard(runtime).result("j1")

    refused, stale, unknown, asked, state = runtime.run(scenario())
    assert refused == [True] * 6
    assert stale == {"out": False, "status": "pending"} and unknown == {"out": False, "status": "not_found"}
    assert asked == {"out": True, "status": "pending"} and state == {"status": "pending"}


def test_a_message_that_is_no_attempt_fails_alone_and_the_others_of_its_batch_run_once():
    runtime = handoff_runtime()

    async def scenario():
        await runtime.env.ATTEMPTS.send({"job": "x", "attempt": 1, "handler": "run", "replyTo": "not an id",
                                         "startBy": runtime.now_ms() + 60_000, "runMs": 1_000})
        await shard(runtime).submit("j1", {"sleep": 3})
        await asyncio.sleep(30)
        return await shard(runtime).result("j1")

    assert runtime.run(scenario())["status"] == "completed"
    assert runs(runtime, "j1") == [("j1", 1, 1)]


def test_what_no_attempt_could_carry_is_refused_at_once():
    from durability import QueueHandoff

    with pytest.raises(ValueError, match="run_within_ms"):
        QueueHandoff(object(), "id", run_within_ms=16 * 60_000)
    with pytest.raises(ValueError, match="reply_to"):
        QueueHandoff(object(), "")
    runtime = handoff_runtime(consumer=False)

    async def scenario():
        with pytest.raises(Exception, match="payload"):
            await shard(runtime).submit("big", {"blob": "x" * 130_000})
        return await shard(runtime).result("big")

    assert runtime.run(scenario()) == {"status": "not_found"}
    assert runtime.queues["attempts"].stats.sent == 0
