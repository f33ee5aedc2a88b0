"""A durable job's record: its row, the states and events it is reported by, and the job a handler runs for.

Lives here: the ``durability_jobs`` table and its upgrades, where a
caller keeps the outcome of a job it keeps the record of (``KeptOutcomes``), ``JobStatus``
and how a row reads as ``get_result`` reports it, lifecycle events
(``JobEvent``), ``NonRetryableError`` and the text a failure is kept as,
the checks a job must pass before anything is stored (and the options
of ``DurabilityJobs`` when it is made), and
``current_job()`` with the handler's call under it (``call_handler``).
Must not know: when an attempt runs, how a failed one is retried, or who
listens to the events.

A handler is called with the payload alone; ``current_job()``, called from
the handler (or a task it starts), says which job and attempt it runs for.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from .._common.checks import compact_json
from .._common.clock import now_ms
from .._common.schema import Step
from .._common.sql import Sql
from .retention import JobRetention

if TYPE_CHECKING:
    from .runner import DurabilityJobs


MAX_ID_LENGTH = 256
MAX_ERROR_LENGTH = 4_000


def _stamp_finished(sql: Sql, _version: int) -> None:
    sql.exec("UPDATE durability_jobs SET done_at = ? WHERE status IN ('completed', 'failed')", now_ms())


# One WITHOUT ROWID table keyed by id, with no other index: recording a job,
# starting an attempt and settling it each write one row. ``status`` is
# pending (waiting for its timer), running (an attempt started and has not
# settled), completed or failed (terminal). ``error`` keeps the last failure.
# ``due_at`` is when a pending job's next attempt is due (version 2; NULL,
# as in rows written before it, means at once). ``done_at`` is when a job
# finished (version 3), written with its outcome (no row more) and read by
# the purge (``jobs/purge``); jobs that had finished before version 3 are
# given the time of the upgrade, one write each, once, so that they are kept
# a full ``max_age_ms`` from then. ``lost_at`` (version 4) is when an
# attempt out in a queue is taken for lost (its send plus ``span_ms``),
# written with the attempt's start: every instance takes it for lost then,
# however often the object hibernates meanwhile (NULL, as in rows written
# before it: a ``span_ms`` after the instance that finds it started).
_SCHEMA: dict[int, list[Step]] = {
    1: [
        """
        CREATE TABLE IF NOT EXISTS durability_jobs (
          id TEXT NOT NULL PRIMARY KEY,
          handler TEXT NOT NULL,
          payload TEXT NOT NULL,
          status TEXT NOT NULL,
          attempt INTEGER NOT NULL DEFAULT 0,
          result TEXT,
          error TEXT,
          created_at REAL NOT NULL
        ) WITHOUT ROWID
        """
    ],
    2: ["ALTER TABLE durability_jobs ADD COLUMN due_at REAL"],
    3: ["ALTER TABLE durability_jobs ADD COLUMN done_at REAL", _stamp_finished],
    4: ["ALTER TABLE durability_jobs ADD COLUMN lost_at REAL"],
}
_TABLES = ["durability_jobs"]


class JobStatus(StrEnum):
    """A job's status, as ``get_result`` reports it and its row keeps it."""

    PENDING = "pending"  #: waiting for its first or next attempt
    RUNNING = "running"  #: an attempt started (reported as pending)
    COMPLETED = "completed"
    FAILED = "failed"
    NOT_FOUND = "not_found"  #: no such job: never run here, or purged by retention (reported only)


class JobEventType(StrEnum):
    ATTEMPT_STARTED = "attempt_started"
    ATTEMPT_SETTLED = "attempt_settled"
    TERMINAL = "terminal"


_TERMINAL = (JobStatus.COMPLETED, JobStatus.FAILED)


@dataclass(frozen=True)
class JobEvent:
    """A lifecycle event as ``on_lifecycle_event`` receives it.

    ``type`` is ``attempt_started``, ``attempt_settled`` (with ``outcome``
    ``completed`` or ``failed``, also for a failure that will be retried) or
    ``terminal`` (once per job, with the final ``outcome``).
    """

    type: str
    id: str
    attempt: int  #: the attempt it concerns, from 1
    outcome: str | None = None
    result: Any = None  #: the handler's result, on completion
    error: str | None = None  #: what failed, on failure


@dataclass(frozen=True)
class JobContext:
    """The job a handler runs for, as ``current_job()`` returns it."""

    id: str
    attempt: int  #: from 1; a retry's attempt is one more than the last
    handler: str  #: the handler's name
    #: for an attempt run by a queue's consumer (``jobs/consumer``), the queue's
    #: delivery of it, from 1: more than 1 when the attempt may have run before
    #: (its ack or its report was lost), so its effects must be idempotent on ``id``
    delivery: int = 1


Handler = Callable[[Any], Any]  # payload -> result, or an awaitable of it
Listener = Callable[[JobEvent], Any]

# Set around each handler call, in the timer's own task: concurrent jobs
# never see each other's, and tasks a handler starts inherit it.
_current_job: ContextVar[JobContext | None] = ContextVar("durability.jobs.current_job", default=None)


def current_job() -> JobContext:
    """The job whose handler is running: its id, attempt and handler name.

    A handler receives its payload alone; this is how it learns its job id,
    to make its effects idempotent on it. Raises ``LookupError`` outside a
    handler.
    """
    job = _current_job.get()
    if job is None:
        raise LookupError("current_job() is called from a job handler (or a task it starts) only")
    return job


class NonRetryableError(Exception):
    """Raised by a handler whose job must fail now, with no further attempt:
    the failure is final (a request the receiver refuses, say), so a retry
    would only fail again. Any other exception fails the attempt, and
    ``retries`` decides whether another follows."""


def _error_text(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= MAX_ERROR_LENGTH else text[: MAX_ERROR_LENGTH - 1] + "…"


def _checked(d: DurabilityJobs, id: Any, payload: Any, handler: str | None) -> tuple[str, str]:
    """The handler's name and the payload's JSON text, or ValueError (nothing is stored)."""
    if not isinstance(id, str) or not id or len(id) > MAX_ID_LENGTH:
        raise ValueError(f"a job id must be a string of 1 to {MAX_ID_LENGTH} characters, not {id!r}")
    return d._handler_name(handler), compact_json(payload, "job payload")


def _state(row: dict[str, Any]) -> dict[str, Any]:
    if row["status"] == JobStatus.COMPLETED:
        return {"status": JobStatus.COMPLETED, "result": json.loads(row["result"])}
    if row["status"] == JobStatus.FAILED:
        return {"status": JobStatus.FAILED, "error": row["error"]}
    return {"status": JobStatus.PENDING}


async def call_handler(handlers: dict[str, Handler], job: JobContext, payload: Any) -> tuple[Any, str]:
    """Run the job's handler, under ``current_job()``; return its result and the result's JSON text."""
    name = job.handler
    handler = handlers.get(name)
    if handler is None:
        raise LookupError(f"no job handler named {name!r} in this object")
    token = _current_job.set(job)
    try:
        result = handler(payload)
        if inspect.isawaitable(result):
            result = await result
    finally:
        _current_job.reset(token)
    try:
        return result, compact_json(result, "its result")
    except ValueError as error:
        raise TypeError(f"job handler {name!r} returned a result that is not JSON: {error}") from None


def check_options(handlers: Mapping[str, Any], retention: Any, keep: Any) -> None:
    """``DurabilityJobs``' handlers, retention and ``keep`` hook, checked when it is made."""
    if not handlers:
        raise ValueError("DurabilityJobs needs at least one handler")
    for name, handler in handlers.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"a handler name must be a non-empty string, not {name!r}")
        if not callable(handler):
            raise ValueError(f"handler {name!r} is not callable")
    if retention is not None and not isinstance(retention, JobRetention):
        raise ValueError(f"retention must be a JobRetention, not {retention!r}")
    if keep is not None and not callable(keep):
        raise ValueError("keep must be callable: keep(ids) -> the ids still needed")


class KeptOutcomes(Protocol):
    """Where the caller that keeps a job's record (``run.kept``) keeps its outcome too.

    A job handed in with ``run.kept`` has no row until its first attempt
    settles; if that attempt ends the job (completed, or failed for good),
    the runner hands ``keep`` the row it would have written, and writes
    none: the caller keeps it in the record it has already (a semaphore
    queue's item, released with it by ``release_keeping``), one row written
    where a row here would cost that write, then its purge, and the
    caller's own record its deletion. A job that is retried gets its row here
    as any other."""

    def keep(self, job_id: str, row: dict[str, Any]) -> bool:
        """Keep the finished job's row (its handler, payload, status, attempt,
        result, error, lost_at), synchronously: in the runner's write batch.
        False if the caller's record can no longer keep it (the runner writes
        its row then)."""

    def get(self, job_id: str) -> dict[str, Any] | None:
        """The row kept for ``job_id``, or None."""
