"""The baseline the benchmark holds the library to: what a competent developer writes in an afternoon.

Lives here: a Worker module with ``NaiveLimit`` (one per account:
``acquire(job_id)`` inserts a holder row while fewer than the limit hold,
``release(job_id)`` deletes it, and the alarm sweeps holders past their ttl,
so a lost release costs capacity for a while, not for good) and
``NaiveShard`` (queues jobs; polls ``acquire`` for its queued jobs every
``POLL_MS`` on its alarm, oldest first per account, stopping at the first
refusal, and runs each job it is granted inside itself, as the simplest
Durable Object awaits its work or its webhook: a task that waits out the
job's work, then ends it and releases its permit; the alarm ends a job whose
task went with an evicted instance).
Honest and reasonably efficient: WITHOUT ROWID tables with no index, an
alarm only while there is something to do, an idempotent ``acquire`` so a
lost reply is not a lost permit, one refusal per account per poll. Must not
know: the benchmark or the library.

``LEDGER`` (set by the benchmark) hears when work really starts and ends;
``LOSE_RELEASES`` (with ``RNG``) drops that share of release calls, as the
library's benchmark loses releases (bench/workload.py, LostReleases).
"""

import asyncio
import json
import time

from workers import DurableObject

from bench.measure import running_object

LEDGER = None
LOSE_RELEASES = 0.0
RNG = None
POLL_MS = 5_000
TTL_MARGIN_MS = 30_000  #: a holder row outlives its job's work by this much before the sweep takes it


def now_ms():
    return time.time() * 1000


class NaiveLimit(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        ctx.storage.sql.exec("CREATE TABLE IF NOT EXISTS holders (job_id TEXT PRIMARY KEY, expires_at REAL NOT NULL)"
                             " WITHOUT ROWID")

    def _limit(self):
        limits = json.loads(getattr(self.env, "ACCOUNT_LIMITS", "") or "{}")
        return int(limits.get(self.ctx.id.name, getattr(self.env, "ACCOUNT_CONCURRENCY", 3)))

    async def acquire(self, job_id, ttl_ms):
        sql = self.ctx.storage.sql
        now = now_ms()
        if sql.exec("SELECT job_id FROM holders WHERE job_id = ?", job_id).toArray():
            return True  # a retry after a lost reply: it holds already
        held = sql.exec("SELECT count(*) AS n FROM holders WHERE expires_at > ?", now).one()["n"]
        if held >= self._limit():
            return False
        sql.exec("INSERT INTO holders (job_id, expires_at) VALUES (?, ?)", job_id, now + ttl_ms)
        if await self.ctx.storage.getAlarm() is None:
            await self.ctx.storage.setAlarm(now + ttl_ms)
        return True

    async def release(self, job_id):
        self.ctx.storage.sql.exec("DELETE FROM holders WHERE job_id = ?", job_id)
        return True

    async def alarm(self, alarm_info=None):
        sql = self.ctx.storage.sql
        sql.exec("DELETE FROM holders WHERE expires_at <= ?", now_ms())
        row = sql.exec("SELECT min(expires_at) AS at FROM holders").one()
        if row["at"] is not None:
            await self.ctx.storage.setAlarm(row["at"])


class NaiveShard(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        ctx.storage.sql.exec(
            "CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, account TEXT NOT NULL, work_ms REAL NOT NULL,"
            " submitted_at REAL NOT NULL, ends_at REAL) WITHOUT ROWID")

    async def submit(self, job):
        sql = self.ctx.storage.sql
        if not sql.exec("SELECT id FROM jobs WHERE id = ?", job["id"]).toArray():
            sql.exec("INSERT INTO jobs (id, account, work_ms, submitted_at) VALUES (?, ?, ?, ?)",
                     job["id"], job["account"], job["work_ms"], now_ms())
        if await self.ctx.storage.getAlarm() is None:
            await self.ctx.storage.setAlarm(now_ms())
        return {"id": job["id"], "state": "queued"}

    async def _end(self, job_id, account):
        """The job's work is done: it ends, and its permit goes back."""
        sql = self.ctx.storage.sql
        if not sql.exec("SELECT id FROM jobs WHERE id = ?", job_id).toArray():
            return  # ended already
        sql.exec("DELETE FROM jobs WHERE id = ?", job_id)
        try:
            if not (LOSE_RELEASES and RNG.random() < LOSE_RELEASES):
                await self.env.NAIVE_LIMIT.getByName(account).release(job_id)
        except Exception:
            pass  # lost: the holder's ttl sweep takes the row back

    async def _run(self, job_id, account, work_ms):
        try:
            await asyncio.sleep(work_ms / 1000)  # the work itself, awaited in the object
        finally:
            LEDGER.ended(job_id, now_ms())  # done, or cut short with its instance
        await self._end(job_id, account)
        await self.alarm()  # its permit is free: start what waits now, not at the next poll

    def _polling(self):
        """One poll at a time: the alarm's and a finished job's would start a job twice."""
        if not hasattr(self, "_poll_lock"):
            self._poll_lock = asyncio.Lock()
        return self._poll_lock

    async def alarm(self, alarm_info=None):
        async with self._polling():
            await self._poll()

    async def _poll(self):
        sql = self.ctx.storage.sql
        now = now_ms()
        for job in sql.exec("SELECT id, account FROM jobs WHERE ends_at <= ?", now).toArray():
            await self._end(job["id"], job["account"])  # its task went with an evicted instance: release
        refused = set()
        queued = sql.exec("SELECT id, account, work_ms FROM jobs WHERE ends_at IS NULL ORDER BY submitted_at").toArray()
        for job in queued:
            if job["account"] in refused:
                continue
            try:
                granted = await self.env.NAIVE_LIMIT.getByName(job["account"]).acquire(
                    job["id"], job["work_ms"] + TTL_MARGIN_MS)
            except Exception:
                granted = False  # lost: ask again at the next poll
            if not granted:
                refused.add(job["account"])
                continue
            start = now_ms()
            sql.exec("UPDATE jobs SET ends_at = ? WHERE id = ?", start + job["work_ms"], job["id"])
            LEDGER.started(job["id"], start, where=running_object())
            self.ctx.waitUntil(self._run(job["id"], job["account"], job["work_ms"]))
        ends = sql.exec("SELECT min(ends_at) AS at FROM jobs").one()["at"]
        waiting = sql.exec("SELECT count(*) AS n FROM jobs WHERE ends_at IS NULL").one()["n"]
        # A job's own task ends it; the alarm only backs that up, a margin later.
        due = [at for at in (ends and ends + TTL_MARGIN_MS, now_ms() + POLL_MS if waiting else None) if at]
        if due:
            await self.ctx.storage.setAlarm(min(due))
