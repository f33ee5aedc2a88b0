"""The example Worker keeps no row per finished job once its retention window has passed.

Every table of every object is counted. Left out, by name, are rows that
stand for an object or a key, never for a job: ``durability_schema`` (one
row per component of an object), ``durability_semaphore_lease_ids`` (a
holder's one lease counter) and ``durability_queue_pacing`` (a shard's row
per account it has queued for: the holder's pacing of that key). The test
checks that those stay within their bounds whatever the number of jobs.
"""

import asyncio

from durability.semaphore import AdmittedItem
from support import example_runtime

HOUR_S = 3_600
#: rows per object or per key, not per job (see the module's docstring)
FIXED = {"durability_schema", "durability_semaphore_lease_ids", "durability_queue_pacing"}
ACCOUNTS = 3


def rows_by_table(runtime) -> dict[tuple[str, str], int]:
    """(object, table) -> rows, for every table of every object that has any."""
    counts = {}
    for host in runtime.hosts():
        for table in host.db.inspect("SELECT name FROM sqlite_master WHERE type = 'table'"):
            name = table["name"]
            n = host.db.inspect(f'SELECT count(*) AS n FROM "{name}"')[0]["n"]
            if n:
                counts[(str(host.name), name)] = n
    return counts


def test_no_row_per_finished_job_is_left_past_the_retention_window():
    jobs = [{"id": f"job-{n}", "account": f"acct-{n % ACCOUNTS}", "work_ms": 1_000, "fail": n % 10 == 0}
            for n in range(60)]
    with example_runtime() as runtime:
        async def scenario():
            for job in jobs:
                await runtime.call_entrypoint("submit_job", job)
            await asyncio.sleep(600)
            done = [(await runtime.call_entrypoint("job_status", job["id"]))["job"]["status"] for job in jobs]
            during = rows_by_table(runtime)
            window_s = runtime.module.JOBS_KEPT_MS / 1000
            await asyncio.sleep(window_s - 4 * HOUR_S)
            kept = rows_by_table(runtime)
            await asyncio.sleep(6 * HOUR_S)  # past the window, and the hour the purge may wait (slack_ms)
            after = rows_by_table(runtime)
            answers = [await runtime.call_entrypoint("job_status", job["id"]) for job in jobs[:3]]
            return done, during, kept, after, answers

        done, during, kept, after, answers = runtime.run(scenario())
        shards = {name for name, table in during if table == "durability_queue_items"}
    assert done.count("failed") == 6 and done.count("completed") == 54

    def rows_of(counts, table):
        return sum(n for (_, name), n in counts.items() if name == table)

    # The 54 jobs that ended in their first attempt keep their outcome in
    # their released item; the 6 retried ones in a row of the runner (their
    # items went at their release).
    assert (rows_of(during, "durability_queue_items"), rows_of(during, "durability_jobs")) == (54, 6)
    assert (rows_of(kept, "durability_queue_items"), rows_of(kept, "durability_jobs")) == (54, 6)  # within the window
    per_job = {key: n for key, n in after.items() if key[1] not in FIXED}
    assert per_job == {}, per_job  # 0 rows per finished job
    for (name, table), n in after.items():  # what is left is bounded by objects and keys, not jobs
        limit = {"durability_schema": 4, "durability_semaphore_lease_ids": 1, "durability_queue_pacing": ACCOUNTS}
        assert n <= limit[table], (name, table, n)
    assert shards  # the jobs were spread over shards, which all purged
    assert answers == [{"id": job["id"], "state": "not_found"} for job in jobs[:3]]


def test_a_finished_job_whose_queue_item_is_still_kept_is_not_purged_and_never_runs_twice():
    # A job's release is lost and the finished() sweep is told it still runs,
    # so its queue item stays admitted past the window: the shard's keep hook
    # holds the job back, and the queue's admit() again (it calls admit until
    # it returns) finds the job and runs nothing. Without the hook the job's
    # row would be gone and admit() would run the job a second time.
    with example_runtime() as runtime:
        shard = runtime.env.JOB_SHARD.getByName("shard-3")  # job-3's

        async def scenario():
            await shard.wake()  # starts the instance
            instance = runtime.host_of(shard).instance
            real_get_result = instance.jobs.run.get_result

            async def still_running(job_id):
                return {"status": "pending"}

            async def lost(job_id):
                return True

            instance.permits.release = lost
            instance.permits.release_keeping = lambda item_id, record: False  # the runner keeps the outcome
            await runtime.call_entrypoint("submit_job", {"id": "job-3", "account": "acme", "work_ms": 1_000})
            instance.jobs.run.get_result = still_running  # what the finished() sweep asks
            await asyncio.sleep(60)
            item = instance.permits.status("job-3")
            # Past the window, as far as the job's row says (waiting it out
            # would run the finished() sweep thousands of times): its purge is due.
            instance.ctx.storage.sql.exec("UPDATE durability_jobs SET done_at = done_at - ? WHERE id = 'job-3'",
                                          runtime.module.JOBS_KEPT_MS + 2 * HOUR_S * 1000)
            instance.scheduler.schedule("durability.jobs.retention", "purge", runtime.now_ms())
            await instance.scheduler.sync()
            await asyncio.sleep(60)
            row = instance.jobs._row("job-3")
            [item_row] = instance.permits.store.admitted()
            admitted = AdmittedItem(item_row.id, item_row.key, item_row.group, item_row.body, item_row.via, True)
            await instance._admit([admitted])  # the queue's admit(), once more, as from a new instance
            await asyncio.sleep(5)
            return item, row, await real_get_result("job-3"), instance.jobs._row("job-3")

        item, row, result, after = runtime.run(scenario())
    assert item["state"] == "admitted"
    assert row is not None and row["status"] == "completed" and row["attempt"] == 1
    assert result["status"] == "completed"
    assert after["attempt"] == 1  # not run again
