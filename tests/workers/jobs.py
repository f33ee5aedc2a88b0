"""A Worker module for the job runner's tests: jobs that fail, sleep or raise on demand.

``Jobs`` has one handler, ``run``, steered by its payload (``job`` names the
counters it keeps, ``fail_times``, ``sleep``, ``error``, ``refused`` (final), ``bad_result``,
``result``), and a listener that records every lifecycle event. ``Plain``
has two sync handlers, one async one that reports ``current_job()``, and no
listener, so it writes nothing but the runner's own rows. ``Keeper`` is a
``Plain`` whose kept jobs keep their outcome in a table of its own
(``outcomes=``), as a semaphore queue's released item keeps one.
"""

import asyncio
import json
import time

from timer_table import durable_timer_rows
from workers import DurableObject

from durability import Backoff, DurabilityJobs, DurabilityScheduler, NonRetryableError, current_job


class Jobs(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx)
        self.jobs = DurabilityJobs(
            scheduler=self.scheduler,
            handlers={"run": self._run_job},
            on_lifecycle_event=self._on_job_event,
            retries=Backoff(initial_ms=1_000, jitter=0, max_attempts=3),
        )
        sql = ctx.storage.sql
        sql.exec("CREATE TABLE IF NOT EXISTS calls (job TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID")
        sql.exec("CREATE TABLE IF NOT EXISTS completions (seq INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT, at REAL)")
        sql.exec(
            "CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, type TEXT, "
            "id TEXT, attempt INTEGER, outcome TEXT, result TEXT, error TEXT, status TEXT, at REAL)"
        )

    # -- the handler and the listener ------------------------------------
    async def _run_job(self, payload):
        sql = self.ctx.storage.sql
        job = payload["job"]
        sql.exec("INSERT INTO calls VALUES (?, 1) ON CONFLICT (job) DO UPDATE SET n = n + 1", job)
        n = sql.exec("SELECT n FROM calls WHERE job = ?", job).one()["n"]
        if payload.get("sleep"):
            await asyncio.sleep(payload["sleep"])
        if n <= payload.get("fail_times", 0):
            raise RuntimeError(f"{job} fails (call {n})")
        if payload.get("error"):
            raise RuntimeError(payload["error"])
        if payload.get("refused"):
            raise NonRetryableError(payload["refused"])
        if payload.get("bad_result"):
            return {"not json": {1, 2}}
        sql.exec("INSERT INTO completions (job, at) VALUES (?, ?)", job, time.time() * 1000)
        return payload.get("result", {"job": job, "calls": n})

    async def _on_job_event(self, event):
        # The state as the listener sees it: the event's write is already made.
        status = (await self.jobs.run.get_result(event.id))["status"]
        self.ctx.storage.sql.exec(
            "INSERT INTO events (type, id, attempt, outcome, result, error, status, at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            event.type, event.id, event.attempt, event.outcome,
            None if event.result is None else json.dumps(event.result), event.error, status,
            time.time() * 1000,
        )
        if event.id.startswith("boom"):
            raise RuntimeError("the listener fails")
        if event.id.startswith("slow-listener") and event.type == "terminal":
            await asyncio.sleep(5)

    # -- RPC ----------------------------------------------------------------
    async def submit(self, job_id, payload=None, handler=None):
        return await self.jobs.run(job_id, payload, handler)

    async def submit_default(self, job_id, payload):
        return await self.jobs.run(id=job_id, payload=payload)

    async def submit_kept(self, job_id, payload=None, handler=None, resumed=False):
        """As a queue hands in an admitted item: the caller keeps its record."""
        return await self.jobs.run.kept(job_id, payload, handler, resumed=resumed)

    async def result(self, job_id):
        return await self.jobs.run.get_result(job_id)

    async def events(self, job_id=None):
        rows = self.ctx.storage.sql.exec(
            "SELECT type, id, attempt, outcome, result, error, status, at FROM events ORDER BY seq"
        ).toArray()
        return [dict(r) for r in rows if job_id is None or r["id"] == job_id]

    async def calls(self, job):
        rows = self.ctx.storage.sql.exec("SELECT n FROM calls WHERE job = ?", job).toArray()
        return rows[0]["n"] if rows else 0

    async def completions(self, job):
        return self.ctx.storage.sql.exec(
            "SELECT count(*) AS n FROM completions WHERE job = ?", job
        ).one()["n"]

    async def retrigger(self, job_id):
        """Fire the job's timer once more, as a repeated alarm would."""
        self.scheduler.schedule("durability.jobs", job_id, time.time() * 1000)
        await self.scheduler.sync()

    async def stored(self):
        sql = self.ctx.storage.sql
        return {
            "jobs": sql.exec("SELECT count(*) AS n FROM durability_jobs").one()["n"],
            "timers": durable_timer_rows(sql)
            + len(self.scheduler.timers("durability.jobs")),  # the jobs' timers live in memory
            "alarm": await self.ctx.storage.getAlarm(),
        }

    async def drop(self, version=None):
        DurabilityJobs.migrate(self.ctx, version)
        rows = self.ctx.storage.sql.exec(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
        ).toArray()
        return [r["name"] for r in rows]

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)


async def whoami(payload):
    """The job this handler runs for, read before and after an await."""
    before = current_job()
    await asyncio.sleep(payload.get("sleep", 0))
    job = current_job()
    if payload.get("fail_first") and job.attempt == 1:
        raise RuntimeError("the first attempt fails")
    return {"id": job.id, "attempt": job.attempt, "handler": job.handler, "same": before == job}


class Plain(DurableObject):
    """No listener, default retries: only the runner writes."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx)
        self.jobs = DurabilityJobs(
            scheduler=self.scheduler,
            handlers={"echo": lambda payload: payload, "upper": lambda payload: str(payload).upper(),
                      "whoami": whoami},
        )

    async def submit(self, job_id, payload=None, handler=None):
        return await self.jobs.run(job_id, payload, handler)

    async def submit_kept(self, job_id, payload=None, handler=None):
        return await self.jobs.run.kept(job_id, payload, handler)

    async def result(self, job_id):
        return await self.jobs.run.get_result(job_id)

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)


class Keeper(Plain):
    """Keeps the outcome of a job handed in with ``run.kept`` in its own table, one row each."""

    refuse = False  #: keep() answers that it can keep nothing (the runner writes its row)

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        ctx.storage.sql.exec("CREATE TABLE IF NOT EXISTS kept (id TEXT PRIMARY KEY, row TEXT) WITHOUT ROWID")
        self.jobs.outcomes = self

    def keep(self, job_id, row):
        if Keeper.refuse:
            return False
        self.ctx.storage.sql.exec("INSERT INTO kept VALUES (?, ?)", job_id, json.dumps(row))
        return True

    def get(self, job_id):
        rows = self.ctx.storage.sql.exec("SELECT row FROM kept WHERE id = ?", job_id).toArray()
        return json.loads(rows[0]["row"]) if rows else None

    async def stored(self):
        sql = self.ctx.storage.sql
        tables = ("durability_jobs", "kept")
        return {table: sql.exec(f"SELECT count(*) AS n FROM {table}").one()["n"] for table in tables}
