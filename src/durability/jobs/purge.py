"""The purge of finished jobs: their rows deleted in batches from a scheduler timer.

Lives here: the purge timer (participant ``durability.jobs.retention``,
kept in memory and derived again from the rows by each new instance), the
census of finished jobs it is set from, and one batch of deletions per
firing, minus the jobs the owner's ``keep`` hook holds back. Must not know:
how a job runs, or why the owner still needs a job (the rules are
``retention``'s; the owner answers ``keep``).

Cost, per purged job: one row written (its ``DELETE``). The timer costs no
row. It fires ``slack_ms`` (a day, by default) after the oldest finished job
comes due, so jobs that finished within it share a firing. Each firing scans
the table twice (a count, then the oldest rows: there is no index on
``done_at``, which would cost a row written per job when it finishes and
again when it goes; a new instance's read of the table, the runner's, gives
its census) and deletes up to ``PURGE_BATCH`` of them in one
transaction, so its wake-up (a request) and its alarm (at most one row,
and only when nothing sooner is due) are shared by up to 500 jobs: 0.002
rows per job at most. A batch cut short by a crash rolls back whole; the
next instance derives the timer from the rows again, already due, and
starts over. An idle object still purges: the timer holds the alarm.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

from .._common.clock import now_ms
from ..scheduler.alarm import DurabilityScheduler, Timer
from .retention import HOUR_MS, PURGE_BATCH, JobRetention

PARTICIPANT = "durability.jobs.retention"
KEY = "purge"
#: a job ``keep`` held back is not offered to it again for this long (in this instance)
HELD_RECHECK_MS = HOUR_MS

#: ``keep(ids) -> the ids of those the owner still needs``, sync or async
Keep = Callable[[list[str]], Any]


class JobPurge:
    """Deletes finished jobs that ``retention`` says are due, in batches, oldest first."""

    def __init__(self, scheduler: DurabilityScheduler, retention: JobRetention, keep: Keep | None,
                 census: tuple[int, float | None]) -> None:
        """``census``: how many jobs are finished here, and when the oldest of
        them finished (the runner's one read of the table per instance)."""
        self.scheduler = scheduler
        self.sql = scheduler.sql
        self.retention = retention
        self.keep = keep
        self._held: dict[str, float] = {}  #: job id -> until when ``keep`` is not asked about it again
        scheduler.register(PARTICIPANT, self._on_timer, durable=False)
        self._finished, self._oldest = census
        self._arm()

    def finished(self, done_at: float) -> None:
        """A job finished at ``done_at`` (called with the write that says so):
        the purge comes due no later than the rules say. In memory only."""
        self._finished += 1
        self._oldest = done_at if self._oldest is None else min(self._oldest, done_at)
        self._arm()

    def _arm(self, at: float | None = None) -> None:
        due = self.retention.purge_at(self._finished, self._oldest) if at is None else at
        if due is not None:
            self.scheduler.schedule_by(PARTICIPANT, KEY, due)

    async def _on_timer(self, timer: Timer) -> None:
        now = now_ms()
        self._held = {job: until for job, until in self._held.items() if until > now}
        rows, due = self._oldest_rows(now)
        candidates = [r["id"] for r in rows[:due] if r["id"] not in self._held][:PURGE_BATCH]
        oldest, self._oldest = self._oldest, None  # from here on, only jobs finishing meanwhile set it
        try:
            kept = set(await self._kept(candidates)) if candidates and self.keep is not None else set()
        except BaseException:
            self._oldest = min((t for t in (oldest, self._oldest) if t is not None), default=None)  # none deleted
            raise
        for job in kept:
            self._held[job] = now + HELD_RECHECK_MS
        gone = [job for job in candidates if job not in kept]
        self.sql.transaction(lambda: self._delete(gone))
        self._finished -= len(gone)
        # ``rows`` reach one past the batch and the held: the first left is the oldest not held.
        deleted = set(gone)
        rest = [r["done_at"] for r in rows if r["id"] not in deleted and r["id"] not in self._held]
        self._oldest = min(rest[:1] + ([] if self._oldest is None else [self._oldest]), default=None)
        self._arm_after(now, more=len(candidates) == PURGE_BATCH and bool(gone))
        await self.scheduler.sync()

    def _oldest_rows(self, now: float) -> tuple[list[dict[str, Any]], int]:
        """The oldest finished jobs (id, done_at), one more than a batch and
        the held-back ones, and how many of the oldest are due. Two scans of
        the table (no index on ``done_at``: see the module's docstring)."""
        past_max, past_min = self.retention.cutoffs(now)
        row = self.sql.one(
            "SELECT count(*) AS n, coalesce(sum(done_at <= ?), 0) AS old, coalesce(sum(done_at <= ?), 0) AS settled "
            "FROM durability_jobs WHERE done_at IS NOT NULL", -1 if past_max is None else past_max, past_min)
        assert row is not None  # an aggregate always answers one row
        self._finished = int(row["n"])
        due = self.retention.due_count(self._finished, int(row["old"]), int(row["settled"]))
        rows = self.sql.exec("SELECT id, done_at FROM durability_jobs WHERE done_at IS NOT NULL "
                             "ORDER BY done_at, created_at, id LIMIT ?", PURGE_BATCH + len(self._held) + 1)
        return rows, due

    async def _kept(self, ids: list[str]) -> Iterable[str]:
        kept = self.keep(list(ids)) if self.keep is not None else ()
        if inspect.isawaitable(kept):
            kept = await kept
        # Anything but ids fails closed: a hook that forgot to return would
        # otherwise hold back nothing, and work the owner still needs would go.
        if isinstance(kept, (str, bytes)) or not isinstance(kept, Iterable):
            raise TypeError(f"keep must return the ids to keep (an iterable of str), not {kept!r}")
        kept = list(kept)
        if not all(isinstance(job_id, str) for job_id in kept):
            raise TypeError(f"keep must return job ids (str), not {kept[:3]!r}")
        return kept

    def _delete(self, ids: list[str]) -> None:
        # One row written per job; a job still unfinished (it cannot be: a
        # finished job stays finished) would be left alone by the condition.
        for job in ids:
            self.sql.exec("DELETE FROM durability_jobs WHERE id = ? AND done_at IS NOT NULL", job)

    def _arm_after(self, now: float, *, more: bool) -> None:
        """Set the timer for the next batch: at once when this one was full,
        else ``slack_ms`` after the oldest finished job not held back comes
        due (the jobs that finish within it go together), and no
        later than the first held-back job is to be asked about again."""
        if more:
            self._arm(now)
            return
        due = self.retention.purge_at(self._finished, self._oldest)
        if due is not None and due <= now:
            # Due already, yet nothing more could go: the jobs beyond
            # max_count are held back. Look again a slack_ms on, not at once.
            due = now + self.retention.slack_ms
        if self._held:
            recheck = min(self._held.values())
            due = recheck if due is None else min(due, recheck)
        if due is not None:
            self._arm(max(due, now))
