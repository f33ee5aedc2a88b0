"""A Worker module for the retention tests: a job runner that keeps finished jobs an hour.

``Retained`` runs ``echo`` jobs (a payload with ``fail`` fails for good),
counts every handler call in a table of its own, and keeps finished jobs
four hours (``MAX_AGE_MS``) and at most ``MAX_COUNT``; its ``keep`` hook
holds back the ids listed in its ``held`` table, raises while its ``broken`` flag is
set, as an owner's hook may (or returns None while it is ``"returns nothing"``),
and takes 10 s per call while ``slow`` is.
``Upgraded`` starts from the jobs' schema version 2 (before ``done_at``),
holding one completed job.
"""

import asyncio
import time

from workers import DurableObject

from durability import DurabilityJobs, DurabilityScheduler, JobRetention, NonRetryableError

HOUR_MS = 3_600_000
MAX_AGE_MS = 4 * HOUR_MS
MAX_COUNT = 1_000


class Retained(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        sql = ctx.storage.sql
        sql.exec("CREATE TABLE IF NOT EXISTS calls (job TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID")
        sql.exec("CREATE TABLE IF NOT EXISTS held (job TEXT PRIMARY KEY) WITHOUT ROWID")
        sql.exec("CREATE TABLE IF NOT EXISTS keep_calls (seq INTEGER PRIMARY KEY, n INTEGER, at REAL)")
        self.broken = False
        self.slow = False
        self.scheduler = DurabilityScheduler(ctx)
        self.jobs = DurabilityJobs(
            self.scheduler, handlers={"echo": self._echo},
            retention=JobRetention(max_age_ms=MAX_AGE_MS, max_count=MAX_COUNT), keep=self._keep,
        )

    def _echo(self, payload):
        job = payload["job"]
        self.ctx.storage.sql.exec("INSERT INTO calls VALUES (?, 1) ON CONFLICT (job) DO UPDATE SET n = n + 1", job)
        if payload.get("fail"):
            raise NonRetryableError("told to fail")
        return payload

    async def _keep(self, ids):
        sql = self.ctx.storage.sql
        sql.exec("INSERT INTO keep_calls (n, at) VALUES (?, ?)", len(ids), time.time() * 1000)
        if self.slow:
            await asyncio.sleep(10)
        if self.broken == "returns nothing":
            return None  # a hook that forgot its return
        if self.broken:
            raise RuntimeError("the keep hook fails")
        held = {r["job"] for r in sql.exec("SELECT job FROM held").toArray()}
        return [job for job in ids if job in held]

    async def submit(self, job_id, payload=None):
        return await self.jobs.run(job_id, payload or {"job": job_id})

    async def submit_many(self, ids, fail=False):
        for job_id in ids:
            await self.jobs.run(job_id, {"job": job_id, "fail": fail})

    async def result(self, job_id):
        return await self.jobs.run.get_result(job_id)

    async def calls(self, job_id):
        rows = self.ctx.storage.sql.exec("SELECT n FROM calls WHERE job = ?", job_id).toArray()
        return rows[0]["n"] if rows else 0

    async def hold(self, ids):
        for job in ids:
            self.ctx.storage.sql.exec("INSERT OR IGNORE INTO held VALUES (?)", job)

    async def unhold(self):
        self.ctx.storage.sql.exec("DELETE FROM held")

    async def break_keep(self, broken=True):
        self.broken = broken

    async def slow_keep(self):
        self.slow = True

    async def keep_calls(self):
        return [dict(r) for r in self.ctx.storage.sql.exec("SELECT n, at FROM keep_calls ORDER BY seq").toArray()]

    async def jobs_left(self):
        return self.ctx.storage.sql.exec("SELECT count(*) AS n FROM durability_jobs").one()["n"]

    async def purge_timer(self):
        timers = self.scheduler.timers("durability.jobs.retention")
        return None if not timers else timers[0].due_at

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)


class Upgraded(DurableObject):
    """Storage written by the version before retention: one job completed, no ``done_at``."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        sql = ctx.storage.sql
        if not sql.exec("SELECT name FROM sqlite_master WHERE name = 'durability_schema'").toArray():
            sql.exec("CREATE TABLE durability_schema (component TEXT PRIMARY KEY, version INTEGER NOT NULL) "
                     "WITHOUT ROWID")
            sql.exec("INSERT INTO durability_schema VALUES ('jobs', 2)")
            sql.exec("CREATE TABLE durability_jobs (id TEXT NOT NULL PRIMARY KEY, handler TEXT NOT NULL, "
                     "payload TEXT NOT NULL, status TEXT NOT NULL, attempt INTEGER NOT NULL DEFAULT 0, "
                     "result TEXT, error TEXT, created_at REAL NOT NULL, due_at REAL) WITHOUT ROWID")
            sql.exec("INSERT INTO durability_jobs VALUES ('old', 'echo', '{}', 'completed', 1, '\"done\"', NULL, "
                     "0, 0)")
        self.scheduler = DurabilityScheduler(ctx)
        self.jobs = DurabilityJobs(self.scheduler, handlers={"echo": lambda payload: payload},
                                   retention=JobRetention(max_age_ms=MAX_AGE_MS))

    async def result(self, job_id):
        return await self.jobs.run.get_result(job_id)

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)
