"""DurabilityJobs: durable jobs, each run to completion or final failure, retried with backoff.

Lives here: running one attempt per timer firing (or, with ``runs_in``,
sending it to a queue's consumer and settling it on the consumer's
report: ``jobs/handed_off``), retrying failed attempts under a ``retry.Backoff``, results and
errors, and best-effort lifecycle events. ``run(id=..., payload=...)``,
which records a job idempotently on its id, is in ``jobs/run_call``; the
jobs' table, a job's statuses and events, and ``current_job()`` in
``jobs/records``; the hand-off's messages and limits in ``jobs/handoff``;
finished jobs are purged under a ``JobRetention`` by ``jobs/purge``.
Must not know: what a handler does with its payload, or what a listener
does with an event.

A job is one row of ``durability_jobs``, and the row says when its next
attempt is due (``due_at``); its timer (participant ``durability.jobs``,
key = the job id) is kept in memory and derived from the rows again when
the object starts, so an accepted job is never lost and its timer costs no
row. (A job handed in by a caller that keeps its record, ``run.kept``, has
no row until its first attempt settles, and with ``outcomes`` none at all
if that attempt ends it: see ``records.KeptOutcomes``.) Each firing of the
timer runs one attempt:

1. the attempt is marked started (``attempt + 1``, status ``running``)
   before the handler is called, and that write commits at the first await
   that follows (the listener's or the handler's), so an attempt
   that a crash or an eviction cuts short is still counted: when the timer
   fires again and finds the job ``running``, that attempt is settled as
   failed (interrupted) and retried like any other failure. The first
   attempt is counted by the row that records the job (written ``running``,
   attempt 1): recording and starting cost one row, not two, and a crash
   between the two costs that attempt, as a crash during it would;
2. the handler runs; its exceptions are caught here, never left to the
   scheduler (whose own backoff applies only when storage itself fails);
3. the outcome is written: ``completed`` with the JSON result, or a failure,
   which either moves ``due_at`` and the timer by ``retries`` (status back
   to ``pending``) or, once the attempts are spent or the handler raised
   ``NonRetryableError`` (another attempt would fail the same way), makes
   the job ``failed``.

With ``runs_in`` (a ``QueueHandoff``), step 2 is a message to the queue:
the attempt stays ``running`` until its consumer reports (``report``), or
its timer takes it for lost, as an interrupted one, once any run of it has
ended: its send plus ``span_ms``, which its row (``lost_at``) or its
caller's record keeps for every instance.

Timers run at least once, so a firing for a job that is already completed
or failed does nothing. An attempt cut short after its handler had
effects is retried all the same, so handlers must be idempotent on the job
id. A crash also delays the retry: the platform retries the failed alarm
first, then ``retries`` adds its own delay.

Lifecycle events (``attempt_started``, ``attempt_settled``, ``terminal``)
are delivered after the write they report, awaited in line; anything a
listener sends out is held by the output gate until that write commits. They
are best effort: a crash between the commit and the listener loses the
event, and a listener that raises is logged and ignored. Read
``run.get_result(id)`` for the authoritative state.

A finished job is kept under ``retention`` (30 days, the newest 100,000
by default), then its row goes: ``run`` under its id starts a new job, so
an owner that could run an id again (a queue admitting an item again)
holds it back with ``keep``.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Mapping
from typing import Any

from .._common.clock import now_ms
from .._common.listeners import notify
from .._common.schema import migrate, public_migrate
from .._common.sql import Sql
from ..retry import Backoff, RetryDecision, decide_retry
from ..scheduler.alarm import DurabilityScheduler, Timer
from .handed_off import HandedOffAttempts
from .handoff import QueueHandoff
from .purge import JobPurge, Keep
from .records import (
    _SCHEMA,
    _TABLES,
    _TERMINAL,
    MAX_ERROR_LENGTH as MAX_ERROR_LENGTH,
    MAX_ID_LENGTH as MAX_ID_LENGTH,
    Handler,
    JobContext as JobContext,
    JobEvent as JobEvent,
    JobEventType as JobEventType,
    JobStatus as JobStatus,
    KeptOutcomes,
    Listener,
    NonRetryableError as NonRetryableError,
    _error_text,
    _state,
    call_handler,
    check_options,
    current_job as current_job,
)
from .retention import JobRetention
from .run_call import PARTICIPANT, RunCall

log = logging.getLogger("durability.jobs")


class DurabilityJobs(HandedOffAttempts):
    """Durable jobs on a scheduler: each runs until it completes or its attempts are spent.

    Args:
        scheduler: the object's ``DurabilityScheduler``; jobs use its
            participant ``durability.jobs`` (one ``DurabilityJobs`` per scheduler).
        handlers: handler name -> ``handler(payload)``, sync or async,
            returning a JSON value. Raising fails the attempt;
            ``NonRetryableError`` fails the job, with no further attempt.
        on_lifecycle_event: optional ``listener(JobEvent)``, sync or async;
            best effort (see the module's docstring).
        retries: backoff between failed attempts and the attempt limit
            (default: 3 attempts, from 1 s). ``max_attempts=None`` retries forever.
        retention: how long finished jobs are kept before their rows are
            purged (default ``JobRetention()``: 30 days, and the newest
            100,000; see ``durability.jobs.retention``).
        keep: optional ``keep(ids) -> ids``, sync or async: of finished
            jobs due to be purged, the ones the owner still needs (work a
            queue could still admit again, say); they are kept and offered
            again an hour later.
        outcomes: optional ``KeptOutcomes``: where a job whose caller keeps
            its record (``run.kept``) and that ends in its first attempt
            keeps its outcome, with no row here (a semaphore queue's
            released item, say: see ``records.KeptOutcomes``).
    """

    def __init__(self, scheduler: DurabilityScheduler, *, handlers: Mapping[str, Handler],
                 on_lifecycle_event: Listener | None = None,
                 retries: Backoff | None = None, retention: JobRetention | None = None,
                 keep: Keep | None = None, runs_in: QueueHandoff | None = None,
                 outcomes: KeptOutcomes | None = None) -> None:
        check_options(handlers, retention, keep)
        if runs_in is not None and not isinstance(runs_in, QueueHandoff):
            raise ValueError(f"runs_in must be a QueueHandoff, not {runs_in!r}")
        #: where attempts run: None, in this object; a ``QueueHandoff``, in that queue's consumer
        self.runs_in = runs_in
        self.outcomes = outcomes
        self.scheduler = scheduler
        self.sql: Sql = scheduler.sql
        self.handlers = dict(handlers)
        self.on_lifecycle_event = on_lifecycle_event
        self.retries = retries or Backoff(max_attempts=3)
        self.run = RunCall(self)
        # Jobs whose attempt runs in this instance now: a second firing of
        # the timer meanwhile must not take it for an interrupted attempt.
        self._in_flight: set[str] = set()
        # Jobs recorded here with attempt 1 counted, that attempt not begun:
        # ``running`` in their row, but not interrupted.
        self._first_attempt_due: set[str] = set()
        # Jobs whose caller keeps their record (``run.kept``) and that have no
        # row yet: id -> (handler name, payload's JSON text, when handed in).
        self._kept: dict[str, tuple[str, str, float]] = {}
        migrate(self.sql, "jobs", _SCHEMA)
        scheduler.register(PARTICIPANT, self._on_timer, durable=False)
        census = self._derive_timers()
        self.retention = retention or JobRetention()
        self._purge = JobPurge(scheduler, self.retention, keep, census)

    def _derive_timers(self) -> tuple[int, float | None]:
        """A new instance sets again the timer of every job not settled (a pending one when its row
        says, a running one as ``running_again_at`` says; a row from before version 4 is given that
        time once: now is later than its send) and returns the purge's census, read together: one
        scan of the table per instance (billed a row read per job kept)."""
        census = self.sql.one(
            "SELECT count(done_at) AS finished, min(done_at) AS oldest, "
            "json_group_array(json_array(id, status, due_at, lost_at)) "
            "FILTER (WHERE status IN ('pending', 'running')) AS open FROM durability_jobs")
        assert census is not None  # an aggregate always answers one row
        for job_id, status, due_at, lost_at in json.loads(census["open"]):
            at = due_at if status == JobStatus.PENDING else self.running_again_at(lost_at)
            if status == JobStatus.RUNNING and lost_at is None and self.runs_in is not None:
                self.sql.exec("UPDATE durability_jobs SET lost_at = ? WHERE id = ?", at, job_id)
            self.scheduler.schedule(PARTICIPANT, job_id, at if at is not None else now_ms())
        return int(census["finished"]), census["oldest"]

    def running_again_at(self, lost_at: float | None = None) -> float:
        """When an attempt a new instance finds started runs again: at once here
        (it went with the old instance); one out in a queue may still run, and
        is taken for lost once any run of it has ended: at ``lost_at`` (its send plus
        ``span_ms``, from its record: each instance of an object that hibernates
        as it waits would put a time of its own off for good)."""
        if self.runs_in is None:
            return now_ms()
        return now_ms() + self.runs_in.span_ms if lost_at is None else max(now_ms(), lost_at)

    migrate = public_migrate("jobs", _TABLES, "the jobs' table")

    def _handler_name(self, handler: str | None) -> str:
        if handler is None:
            if len(self.handlers) != 1:
                raise ValueError(f"name a handler: there are {len(self.handlers)} ({', '.join(sorted(self.handlers))})")
            return next(iter(self.handlers))
        if handler not in self.handlers:
            raise ValueError(f"no job handler named {handler!r}")
        return handler

    def _row(self, job_id: str) -> dict[str, Any] | None:
        """The job's row, or the outcome its caller keeps for it (``outcomes``)."""
        row = self.sql.one(
            "SELECT handler, payload, status, attempt, result, error, lost_at FROM durability_jobs WHERE id = ?",
            job_id,
        )
        if row is None and self.outcomes is not None:
            row = self.outcomes.get(job_id)
        return row

    def _record(self, job_id: str, name: str, text: str, due_at: float | None = None) -> dict[str, Any] | None:
        """Inside a transaction: the state of the job kept under ``job_id``,
        or None once its row is written with its first attempt counted (see
        the module's docstring) and its timer set, for now unless ``due_at``."""
        existing = self._row(job_id)
        if existing is not None:
            return _state(existing)
        now = now_ms()
        lost_at = now + self.runs_in.span_ms if self.runs_in is not None else None  # (sent at ``now``)
        self.sql.exec(
            "INSERT INTO durability_jobs (id, handler, payload, status, attempt, created_at, due_at, lost_at) "
            "VALUES (?, ?, ?, 'running', 1, ?, ?, ?)",
            job_id, name, text, now, now, lost_at,
        )
        self.scheduler.schedule(PARTICIPANT, job_id, now if due_at is None else due_at)
        return None

    def _row_or_kept(self, job_id: str) -> dict[str, Any] | None:
        """The job's row, or for a job its caller keeps, the row it would have: running its first attempt."""
        row = self._row(job_id)
        if row is None and job_id in self._kept:
            name, text, _ = self._kept[job_id]
            row = {"handler": name, "payload": text, "status": JobStatus.RUNNING, "attempt": 1}
        return row

    def _settle(self, job_id: str, status: str, *, error: str | None = None, result: str | None = None,
                due_at: float | None = None, done_at: float | None = None) -> bool:
        """Write an attempt's outcome: into the job's row, or, for a job its
        caller keeps, as its first row, or, once it ends, into the caller's
        record (``outcomes``; one row written every way). True if written here."""
        kept = self._kept.get(job_id)
        if kept is None:
            self.sql.exec(
                "UPDATE durability_jobs SET status = ?, result = ?, error = ?, due_at = ?, done_at = ? "
                "WHERE id = ?", status, result, error, due_at, done_at, job_id,
            )
            return True
        name, text, created_at = kept
        if self.outcomes is not None and done_at is not None and self.outcomes.keep(job_id, {
                "handler": name, "payload": text, "status": status, "attempt": 1, "result": result,
                "error": error, "lost_at": None}):
            return False
        self.sql.exec(
            "INSERT INTO durability_jobs (id, handler, payload, status, attempt, result, error, created_at, "
            "due_at, done_at) VALUES (?, ?, ?, ?, 1, ?, ?, ?, ?, ?)",
            job_id, name, text, status, result, error, created_at, due_at, done_at,
        )
        return True

    # -- one attempt per timer firing ---------------------------------------
    async def _on_timer(self, timer: Timer) -> None:
        await self.start_attempt(timer.key)

    async def start_attempt(self, job_id: str) -> None:
        """Run the job's next attempt now (its timer's work), unless one is running here."""
        if job_id in self._in_flight:
            return  # its attempt, still running here, settles and reschedules itself
        row = self._row_or_kept(job_id)
        if row is None or row["status"] in _TERMINAL:
            return  # a repeated firing, or a job removed under its timer
        attempt, sent_at = int(row["attempt"]), now_ms()
        if job_id in self._first_attempt_due:
            self._first_attempt_due.discard(job_id)  # its row counts it already
            sent_at = self._first_sent_at(job_id, row)
        elif row["status"] == JobStatus.RUNNING:
            error = (f"attempt {attempt} was interrupted before it settled (the object was evicted or crashed)"
                     if self.runs_in is None else
                     f"attempt {attempt}: no report from its queue's consumer within {self.runs_in.span_ms:.0f} ms")
            await self._emit(self._fail(job_id, attempt, error))
            return
        else:
            attempt += 1
            lost_at = sent_at + self.runs_in.span_ms if self.runs_in is not None else None
            self.sql.exec(
                "UPDATE durability_jobs SET status = 'running', attempt = ?, lost_at = ? WHERE id = ?",
                attempt, lost_at, job_id,
            )
        if self.runs_in is not None:
            await self._hand_off(job_id, attempt, row, sent_at)
            return
        self._in_flight.add(job_id)
        try:
            await self._emit([JobEvent(JobEventType.ATTEMPT_STARTED, job_id, attempt)])
            try:
                job = JobContext(job_id, attempt, row["handler"])
                result, text = await call_handler(self.handlers, job, json.loads(row["payload"]))
            except Exception as error:
                events = self._fail(job_id, attempt, _error_text(error),
                                    final=isinstance(error, NonRetryableError))
            else:
                events = self._complete(job_id, attempt, text, result)
        finally:
            self._in_flight.discard(job_id)
        await self._emit(events)

    def _first_sent_at(self, job_id: str, row: dict[str, Any]) -> float:
        """When a first attempt's message counts from: its row's writing, or the making of its caller's
        record (``run.kept``'s ``since``), which a new instance reads again; one sent long after that
        (``admit()`` retried) gets a row and counts from now, not to reach its consumer too late."""
        kept, lost_at, handoff = self._kept.get(job_id), row.get("lost_at"), self.runs_in
        if kept is not None and (handoff is None or now_ms() - kept[2] < handoff.start_within_ms / 2):
            return kept[2]
        if kept is not None and handoff is not None:
            del self._kept[job_id]
            self.sql.transaction(lambda: self._record(job_id, kept[0], kept[1], now_ms() + handoff.span_ms))
        return now_ms() if handoff is None or lost_at is None else float(lost_at) - handoff.span_ms

    def _complete(self, job_id: str, attempt: int, text: str, result: Any) -> list[JobEvent]:
        done_at = now_ms()
        if self._settle(job_id, JobStatus.COMPLETED, result=text, done_at=done_at):
            self._purge.finished(done_at)
        self._kept.pop(job_id, None)  # its row (or its caller's record) says so now
        return [
            JobEvent(JobEventType.ATTEMPT_SETTLED, job_id, attempt, JobStatus.COMPLETED, result=result),
            JobEvent(JobEventType.TERMINAL, job_id, attempt, JobStatus.COMPLETED, result=result),
        ]

    def _fail(self, job_id: str, attempt: int, error: str, final: bool = False) -> list[JobEvent]:
        """Settle ``attempt`` as failed: retry by moving the timer, or give up (at once when ``final``)."""
        decision = RetryDecision(False, None) if final else decide_retry(
            self.retries, attempt, now_ms(), random.random())
        settled = JobEvent(JobEventType.ATTEMPT_SETTLED, job_id, attempt, JobStatus.FAILED, error=error)
        if decision.retry:
            log.warning("job %s: attempt %d failed: %s; retrying", job_id, attempt, error)
            at_ms = decision.at_ms
            assert at_ms is not None  # a decision to retry always says when

            def retry() -> None:
                self._settle(job_id, JobStatus.PENDING, error=error, due_at=at_ms)
                # The timer is running, so this always moves it and the
                # scheduler keeps it; its alarm() re-arms afterwards.
                self.scheduler.schedule(PARTICIPANT, job_id, at_ms)

            self.sql.transaction(retry)
            self._kept.pop(job_id, None)
            return [settled]
        log.error("job %s: attempt %d failed: %s; giving up", job_id, attempt, error)
        done_at = now_ms()
        if self._settle(job_id, JobStatus.FAILED, error=error, done_at=done_at):
            self._purge.finished(done_at)
        self._kept.pop(job_id, None)
        return [settled, JobEvent(JobEventType.TERMINAL, job_id, attempt, JobStatus.FAILED, error=error)]

    async def _emit(self, events: list[JobEvent]) -> None:
        for event in events:
            await notify(self.on_lifecycle_event, event, log, "job %s: lifecycle listener failed on %s", event.id,
                         event.type)


#: The name the job runner had first (and the spec's): kept, it is the same class.
Durability = DurabilityJobs
