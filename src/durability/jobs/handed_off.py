"""Attempts handed to a queue's consumer: the send, and the report that settles one.

Lives here: ``HandedOffAttempts``, the part of ``DurabilityJobs`` that
sends an attempt to its ``QueueHandoff`` and settles it on the consumer's
report (``report``). Must not know: how a message is spelled or checked
(``jobs/handoff``), or how an outcome is written (the runner's).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .._common.checks import compact_json
from ..scheduler.alarm import DurabilityScheduler
from .handoff import AttemptReport, QueueHandoff, refused
from .records import JobEvent, JobEventType, JobStatus, _error_text, _state
from .run_call import PARTICIPANT

log = logging.getLogger("durability.jobs")


class HandedOffAttempts:
    """The hand-off of ``DurabilityJobs``, which sets these attributes."""

    runs_in: QueueHandoff | None
    scheduler: DurabilityScheduler
    _in_flight: set[str]
    _emit: Callable[[list[JobEvent]], Awaitable[None]]
    _row_or_kept: Callable[[str], dict[str, Any] | None]
    _complete: Callable[[str, int, str, Any], list[JobEvent]]
    _fail: Callable[..., list[JobEvent]]

    async def _hand_off(self, job_id: str, attempt: int, row: dict[str, Any], sent_at: float) -> None:
        """Send the attempt, counted from ``sent_at`` (its start limit, and when it is taken for lost):
        it settles at its consumer's report (``report``), or fails once its timer finds it still out."""
        assert self.runs_in is not None
        self._in_flight.add(job_id)
        try:
            await self._emit([JobEvent(JobEventType.ATTEMPT_STARTED, job_id, attempt)])
            lost_at, events = sent_at + self.runs_in.span_ms, []
            try:
                await self.runs_in.send(job_id, attempt, row["handler"], json.loads(row["payload"]), sent_at)
            except Exception as error:
                if refused(error):  # as it is, no attempt of it can be sent
                    events = self._fail(job_id, attempt, f"the queue refused the attempt: {_error_text(error)}",
                                        final=True)
                else:  # it may have been queued all the same: out until taken for lost
                    log.warning("job %s: sending attempt %d failed: %r", job_id, attempt, error)
            current = self._row_or_kept(job_id)  # (its report may have come already)
            if not events and current is not None and current["status"] == JobStatus.RUNNING and int(
                    current["attempt"]) == attempt:
                self.scheduler.schedule(PARTICIPANT, job_id, lost_at)
        finally:
            self._in_flight.discard(job_id)
        await self._emit(events)

    async def report(self, report: Any) -> dict[str, Any]:
        """A consumer's ``AttemptReport`` (a dict): its outcome settles the attempt
        if it is the job's attempt out now, and changes nothing otherwise (a
        repeat, or an attempt taken for lost); with no outcome it only asks.
        Returns ``{"out": bool, **state as get_result reads it}``; ``ValueError``
        for what is not a report."""
        if self.runs_in is None:
            raise ValueError("this runner runs its attempts itself: no report is expected")
        parsed = AttemptReport.parse(report)
        row = self._row_or_kept(parsed.job)
        if row is None:
            return {"out": False, "status": JobStatus.NOT_FOUND}
        out = row["status"] == JobStatus.RUNNING and int(row["attempt"]) == parsed.attempt
        if not out or parsed.outcome is None:
            return {"out": out, **_state(row)}
        if parsed.outcome == "completed":
            events = self._complete(parsed.job, parsed.attempt, compact_json(parsed.result, "its result"),
                                    parsed.result)
            self.scheduler.cancel(PARTICIPANT, parsed.job)
        else:
            assert parsed.error is not None
            events = self._fail(parsed.job, parsed.attempt, parsed.error, final=parsed.final)
            if parsed.final:
                self.scheduler.cancel(PARTICIPANT, parsed.job)
        await self.scheduler.sync()
        await self._emit(events)
        return {"out": False, **_state(self._row_or_kept(parsed.job) or {"status": JobStatus.NOT_FOUND})}
