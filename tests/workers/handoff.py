"""A Worker module whose jobs' attempts run in a Queue consumer, for the hand-off's tests.

``Shard`` runs jobs with ``DurabilityJobs(runs_in=QueueHandoff(env.ATTEMPTS,
...))`` and records every lifecycle event; ``Default.queue`` runs what it is
handed with ``JobConsumer``. The handler, ``run``, is steered by its payload:
``sleep`` (seconds), ``fail_times`` (the first calls raise), ``refused``
(final), ``bad_result``. ``RUNS`` records each run: (job, attempt, delivery,
start ms, end ms or None while it runs).
"""

import asyncio
import time

from workers import DurableObject, WorkerEntrypoint

from durability import (
    Backoff,
    DurabilityJobs,
    DurabilityScheduler,
    JobConsumer,
    NonRetryableError,
    QueueHandoff,
    current_job,
)

RUNS = []
EVENTS = []  #: (job, type, attempt, outcome)
#: job id -> (payload, since) of each job run with ``run.kept``: its caller's
#: record, handed in again at every alarm (as a queue hands in its admitted items)
KEPT = {}
CONFIG = {"start_within_ms": 60_000, "run_within_ms": 120_000}


async def run_job(payload):
    job = current_job()
    run = [job.id, job.attempt, job.delivery, time.time() * 1000, None]
    RUNS.append(run)
    calls = sum(1 for r in RUNS if r[0] == job.id)
    try:
        if payload.get("sleep"):
            await asyncio.sleep(payload["sleep"])
    finally:
        run[4] = time.time() * 1000  # (a consumer that dies cancels its run here)
    if calls <= payload.get("fail_times", 0):
        raise RuntimeError(f"{job.id} fails (call {calls})")
    if payload.get("refused"):
        raise NonRetryableError(payload["refused"])
    if payload.get("bad_result"):
        return {"not json": {1, 2}}
    return {"job": job.id, "calls": calls}


class Shard(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx)
        self.jobs = DurabilityJobs(
            scheduler=self.scheduler,
            handlers={"run": run_job},
            on_lifecycle_event=self._on_job_event,
            retries=Backoff(initial_ms=1_000, jitter=0, max_attempts=3),
            runs_in=QueueHandoff(env.ATTEMPTS, ctx.id.toString(), **CONFIG),
        )

    async def _on_job_event(self, event):
        EVENTS.append((event.id, event.type, event.attempt, event.outcome))

    async def submit(self, job_id, payload=None):
        return await self.jobs.run(job_id, payload)

    async def submit_kept(self, job_id, payload=None, resumed=False, since=None):
        KEPT[job_id] = (payload, since)
        return await self.jobs.run.kept(job_id, payload, resumed=resumed, since=since)

    async def result(self, job_id):
        return await self.jobs.run.get_result(job_id)

    async def lost_at(self, job_id, forget=False):
        """The job's ``lost_at`` as its row keeps it (``forget``: as a row from before version 4 has none)."""
        sql = self.ctx.storage.sql
        if forget:
            sql.exec("UPDATE durability_jobs SET lost_at = NULL WHERE id = ?", job_id)
        return next(iter(sql.exec("SELECT lost_at FROM durability_jobs WHERE id = ?", job_id)))["lost_at"]

    async def job_rows(self):
        return [[r["id"], r["status"], r["attempt"]] for r in self.ctx.storage.sql.exec(
            "SELECT id, status, attempt FROM durability_jobs ORDER BY id")]

    async def job_report(self, report):
        return await self.jobs.report(report)

    async def alarm(self, alarm_info=None):
        for job_id, (payload, since) in KEPT.items():  # (this instance's own are known: a no-op)
            await self.jobs.run.kept(job_id, payload, resumed=True, since=since)
        await self.scheduler.alarm(alarm_info)


consumer = JobConsumer({"run": run_job}, binding="SHARD", dead_letter_queue="attempts-dead")


class Default(WorkerEntrypoint):
    async def queue(self, batch, env, ctx):
        await consumer.handle(batch, self.env)
