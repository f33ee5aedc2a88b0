"""``jobs.run``: what a caller hands a job in with, and how it reads one back.

Lives here: ``RunCall`` (``run(id, payload)`` records a job and schedules
its first attempt; ``run.kept(...)`` for a job whose caller keeps its
record; ``run.get_result(id)``). Must not know: how an attempt runs or
settles (``jobs/runner``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._common.checks import is_number
from .._common.clock import now_ms
from .records import JobStatus, _checked, _state

if TYPE_CHECKING:
    from .runner import DurabilityJobs

PARTICIPANT = "durability.jobs"


class RunCall:
    """``jobs.run``: call it to start a job; ``get_result(id)`` reads one."""

    def __init__(self, durability: DurabilityJobs) -> None:
        self._durability = durability

    async def __call__(self, id: str, payload: Any = None, handler: str | None = None) -> dict[str, Any]:
        """Record job ``id`` and start its first attempt now (on its timer, or
        sent to its queue in this call); idempotent on ``id``.

        A job already recorded under ``id`` is left as it is (whatever
        payload or handler this call gives) and its state is returned, as
        ``get_result`` reads it. Raises ``ValueError`` for an empty or
        over-long id, an unknown handler or a payload that is not JSON;
        nothing is stored then.
        """
        d = self._durability
        name, text = _checked(d, id, payload, handler)
        if d.runs_in is not None:
            d.runs_in.check_payload(text)
        if id in d._kept:
            return {"status": JobStatus.PENDING}  # run here with its caller's record, no row yet
        existing = d.sql.transaction(lambda: d._record(id, name, text, due_at=self._first_due()))
        if existing is not None:
            return existing
        d._first_attempt_due.add(id)  # before any await: its timer cannot fire sooner
        await self._first_attempt(id)
        return {"status": JobStatus.PENDING}

    async def kept(self, id: str, payload: Any = None, handler: str | None = None, *,
                   resumed: bool = False, since: float | None = None) -> dict[str, Any]:
        """Run job ``id`` whose record the caller keeps until the job's
        terminal event: a semaphore queue's admitted item, say. No row is
        written for it until its first attempt settles (one row written per
        job, where ``run`` writes two). Idempotent on ``id`` as ``run`` is.

        The caller's record stands for the job while its first attempt
        runs, so the caller hands the job in again from every new instance
        for as long as it keeps that record, with ``resumed=True``. A job
        handed in again with no row here is recorded then, as ``run``
        records one, and starts over: a first attempt the old instance had
        begun left no row to count it by, so it is not counted, but every
        attempt cut short from then on is (at most one run more than
        ``retries`` allows, for a job that brings its instance down each time).

        With ``runs_in`` (attempts in a queue's consumer) the first attempt
        is sent in this call, with no row either, its message counted from
        ``since`` (epoch ms: when the caller's record was made, a queue
        item's ``admitted_at``; default now). Handed in again, the job is not
        sent: its attempt may be out, so it is taken for lost, and counted,
        once any run of it has ended (``since`` plus ``span_ms``: the same
        time in every instance), unless its report comes first. A report
        must therefore find the job handed in: the caller hands in its
        records before it passes a report on (a semaphore queue's
        ``hand_in_admitted()``).
        """
        d = self._durability
        name, text = _checked(d, id, payload, handler)
        if d.runs_in is not None:
            d.runs_in.check_payload(text)
        if since is not None and not is_number(since):
            raise ValueError(f"since must be a time in epoch milliseconds, not {since!r}")
        if id in d._kept or id in d._in_flight:
            return {"status": JobStatus.PENDING}  # this instance runs it already
        if resumed and d.runs_in is None:
            return await self(id, payload, handler)  # starts over, recorded now
        existing = d._row(id)
        if existing is not None:
            return _state(existing)
        d._kept[id] = (name, text, now_ms() if since is None else min(float(since), now_ms()))
        if resumed:
            # Its first attempt, sent by an instance before this one, may be
            # out in the queue still: nothing is sent now, and the attempt is
            # taken for lost once any run of it has ended, unless its report
            # settles it first (no row meanwhile, as before).
            lost_at = None if since is None or d.runs_in is None else float(since) + d.runs_in.span_ms
            d.scheduler.schedule(PARTICIPANT, id, d.running_again_at(lost_at))
            await d.scheduler.sync()
            return {"status": JobStatus.PENDING}
        d._first_attempt_due.add(id)
        d.scheduler.schedule(PARTICIPANT, id, self._first_due())  # (kept in memory: no row)
        await self._first_attempt(id)
        return {"status": JobStatus.PENDING}

    def _first_due(self) -> float:
        """When a new job's timer is due: now, or, for a job whose attempts
        go to a queue and are sent in this call, when the first would be
        taken for lost (the send sets it so again). ``run`` writes its row
        before the send: such a job with no row was never sent, and one
        with a row ``running`` may be out, until its report or that time
        (a ``kept`` job's caller keeps its record instead: see ``kept``)."""
        d = self._durability
        return now_ms() + (d.runs_in.span_ms if d.runs_in is not None else 0.0)

    async def _first_attempt(self, id: str) -> None:
        """Start the job's first attempt: on its timer, now, or, when it goes
        to a queue, by sending it in this very call. A send costs no wait,
        and setting the alarm to now for it cost a row, an alarm run and a
        row to set the alarm back, per job."""
        d = self._durability
        if d.runs_in is not None:
            await d.start_attempt(id)
        await d.scheduler.sync()

    async def get_result(self, id: str) -> dict[str, Any]:
        """``{"status": "pending"}`` (also while an attempt runs), ``{"status":
        "completed", "result": ...}``, ``{"status": "failed", "error": "..."}``
        or ``{"status": "not_found"}``: no job has this id, either because
        none was run under it or because it finished and ``retention``
        purged it (a purged job leaves no row to tell the two apart)."""
        d = self._durability
        d.scheduler.resume_if_overdue()  # a read resumes an object whose alarm was lost
        if not isinstance(id, str):
            return {"status": JobStatus.NOT_FOUND}
        row = d._row(id)
        if row is None:
            return {"status": JobStatus.PENDING if id in d._kept else JobStatus.NOT_FOUND}
        return _state(row)
