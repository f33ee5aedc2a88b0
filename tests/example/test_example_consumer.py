"""The example Worker's jobs run by the job-attempts queue's consumer (JOBS_RUN_IN), or in their shard."""

import asyncio

import pytest

from durability.testing import HIBERNATE_AFTER_MS, JsException, Runtime
from support import ROOT, example_runtime

JOB = {"id": "job-1", "account": "acct-a", "work_ms": 20_000}


def shard_host(runtime, job_id):
    """The shard with the job's row, or its item's (which keeps the outcome of a job its first attempt ends)."""
    return next(h for h in runtime.hosts() if h.class_name == "JobShard" and h.db.inspect(
        "SELECT 1 FROM durability_jobs WHERE id = ? UNION SELECT 1 FROM durability_queue_items WHERE id = ?",
        job_id, job_id))


def run_one(runtime, then_s=60):
    async def scenario():
        await runtime.call_entrypoint("submit_job", JOB)
        await asyncio.sleep(then_s)
        return await runtime.call_entrypoint("job_status", JOB["id"])

    return runtime.run(scenario())


def test_a_job_runs_in_the_consumer_while_its_shard_sleeps():
    runtime = example_runtime(crons=[], hibernate_after_ms=HIBERNATE_AFTER_MS)
    status = run_one(runtime)
    assert status["state"] == "released" and status["job"] == {"status": "completed", "result": {"worked_ms": 20_000}}
    assert shard_host(runtime, "job-1").awake_s() < 1  # its 20 s of work were not the shard's
    assert runtime.queues["job-attempts"].stats.acked == 1 and runtime.worker_stats.by_kind["queue"] == 1


def test_with_jobs_run_in_the_shard_the_shard_is_awake_while_its_job_runs():
    runtime = Runtime.from_wrangler(ROOT / "wrangler.toml", crons=[], vars={"JOBS_RUN_IN": "shard"})
    assert run_one(runtime)["job"]["status"] == "completed"
    assert shard_host(runtime, "job-1").awake_s() >= 20
    assert runtime.queues["job-attempts"].stats.sent == 0


def test_a_release_lost_at_a_job_s_end_comes_back_at_its_report_not_a_minute_later():
    runtime = example_runtime(crons=[])
    queue_class = runtime.module.DurabilitySemaphoreQueue
    real_release, real_keeping = queue_class.release, queue_class.release_keeping

    async def lose_every_release(queue, item_id):  # as if the application never released it
        return True

    queue_class.release = lose_every_release
    queue_class.release_keeping = lambda queue, item_id, record: False  # (the runner keeps the outcome)

    async def scenario():
        await runtime.call_entrypoint("submit_job", JOB)
        await asyncio.sleep(21)  # the job ran 20 s; its report came
        return await runtime.call_entrypoint("account_usage", "acct-a")

    try:
        usage = runtime.run(scenario())
    finally:
        queue_class.release, queue_class.release_keeping = real_release, real_keeping
    assert usage["outstanding"] == 0


def test_a_shard_cut_off_while_telling_its_holder_of_a_release_has_it_told_within_seconds():
    # The job ends; its report reaches the shard, which releases the permit
    # and tells the holder in a task of the report's event. The shard is cut
    # off before the holder hears. Answered first, the report was taken as
    # heard, and nothing started the shard again until the holder woke the
    # silent holder of its permit, a minute on; answered once the holder
    # heard, the report fails, and the consumer's next delivery starts an
    # instance that tells the holder.
    from durability.semaphore.client import SemaphoreClient

    runtime = example_runtime(crons=[])
    real_sync, hanging = SemaphoreClient.sync, []

    async def sync_cut_off_once(client, key, message):
        if not hanging:
            hanging.append(message)
            await asyncio.sleep(3_600)  # never heard: the shard goes first
        return await real_sync(client, key, message)

    async def scenario():
        await runtime.call_entrypoint("submit_job", JOB)
        while not hanging:
            await asyncio.sleep(0.1)
        ended_at = runtime.now_ms()
        shard_host(runtime, JOB["id"]).evict()
        await asyncio.sleep(15)
        return ended_at, await runtime.call_entrypoint("account_usage", "acct-a")

    SemaphoreClient.sync = sync_cut_off_once
    try:
        ended_at, usage = runtime.run(scenario())
    finally:
        SemaphoreClient.sync = real_sync
    assert hanging and usage["outstanding"] == 0
    assert runtime.run(runtime.call_entrypoint("job_status", JOB["id"]))["job"]["status"] == "completed"


def test_a_report_waits_for_its_own_release_only_not_another_accounts_request_held_at_its_holder():
    # One shard for two accounts. Account b's holder hangs, so b's job's
    # enqueue leaves its request waiting (for minutes, a request's limit).
    # Account a's job ends meanwhile: its report is answered, and acked by the
    # consumer, as soon as its own release is done.
    from durability.semaphore.client import SemaphoreClient

    runtime = Runtime.from_wrangler(ROOT / "wrangler.toml", crons=[], vars={"API_TOKEN": "t0ken", "SHARDS": "1"})
    real_request = SemaphoreClient.request

    async def account_b_hangs(client, key, message):
        if key == "acct-b":
            await asyncio.sleep(3_600)
        return await real_request(client, key, message)

    async def scenario():
        await runtime.call_entrypoint("submit_job", {**JOB, "work_ms": 5_000})
        await asyncio.sleep(1)
        SemaphoreClient.request = account_b_hangs
        await runtime.call_entrypoint("submit_job", {"id": "job-b", "account": "acct-b", "work_ms": 1_000})
        await asyncio.sleep(6)  # job-1's work ends at 5 s
        return runtime.queues["job-attempts"].stats.acked

    try:
        acked = runtime.run(scenario())
    finally:
        SemaphoreClient.request = real_request
    assert acked == 1


@pytest.mark.parametrize("vars", [{"JOBS_RUN_IN": "elsewhere"}, {"JOBS_RUN_IN": "queue", "JOB_ATTEMPTS": None}])
def test_a_misconfigured_place_to_run_jobs_is_a_clear_error(vars):
    runtime = Runtime.from_wrangler(ROOT / "wrangler.toml", crons=[], vars=vars)

    async def scenario():
        with pytest.raises(JsException) as caught:
            await runtime.call_entrypoint("submit_job", JOB)
        return str(caught.value)

    assert "JOBS_RUN_IN" in runtime.run(scenario())
