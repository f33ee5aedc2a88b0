"""Attempts run by a Queue consumer: the message an attempt travels as, its time limits, and the report that settles it.

Lives here: ``QueueHandoff`` (given to ``DurabilityJobs`` as ``runs_in=``:
each attempt goes to a queue as one message instead of running in the
object), the message (``AttemptMessage``) and the report
(``AttemptReport``) with their checks, and the time an attempt may stay
out before its object takes it for lost. Must not know: the runner's rows
or timers, or what the consumer runs (``jobs/consumer``).

An attempt out in a queue holds its job (and whatever its caller holds for
it: a semaphore's permit) until its report comes. Its message says by when
a consumer may start it (``startBy``: ``start_within_ms`` after the send)
and for how long it may run (``runMs``); a consumer that gets it later
drops it, and stops a run at its limit. So every run of an attempt ends by
``span_ms`` after its send, and only then does the object take an attempt
with no report for lost and hand out the next one: two runs of one job
never overlap, though a run may repeat (a redelivery after a lost ack),
which the handler learns from ``current_job().delivery``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .._common.checks import is_number
from .records import MAX_ERROR_LENGTH, MAX_ID_LENGTH

START_WITHIN_MS = 5 * 60_000  #: a consumer starts an attempt within this of its send, or drops it
RUN_WITHIN_MS = 14 * 60_000  #: and stops it this long after its start (a consumer runs up to 15 minutes)
MAX_RUN_MS = 15 * 60_000  #: a consumer's invocation ends by then, whatever it runs
#: a message's body at most (Queues takes 128,000 bytes, its own metadata among them)
MAX_MESSAGE_BYTES = 120_000
#: what clocks of a consumer and an object may disagree by, and a report take to arrive
CLOCK_MARGIN_MS = 60_000
OUTCOMES = ("completed", "failed")


@dataclass(frozen=True)
class QueueHandoff:
    """Run a job's attempts in a Queue consumer: ``queue`` is the producer
    binding (``env.JOBS``); ``reply_to`` the id of the object the consumer
    reports to (``ctx.id.toString()``), through the binding the consumer is
    given (``JobConsumer``)."""

    queue: Any
    reply_to: str
    start_within_ms: float = START_WITHIN_MS
    run_within_ms: float = RUN_WITHIN_MS

    def __post_init__(self) -> None:
        if not isinstance(self.reply_to, str) or not self.reply_to:
            raise ValueError("reply_to must be the object's id as a string: ctx.id.toString()")
        for name in ("start_within_ms", "run_within_ms"):
            value = getattr(self, name)
            if not is_number(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number of milliseconds, not {value!r}")
        if self.run_within_ms > MAX_RUN_MS:
            raise ValueError(f"run_within_ms must be at most {MAX_RUN_MS}: a consumer's invocation lasts no longer")

    def check_payload(self, payload_text: str) -> None:
        """ValueError if a payload (its JSON text) is too big for an attempt's message."""
        if len(payload_text.encode()) > MAX_MESSAGE_BYTES - 2_000:
            raise ValueError(f"a job's payload must be under {MAX_MESSAGE_BYTES - 2_000} bytes of JSON to go "
                             "to a queue")

    @property
    def span_ms(self) -> float:
        """How long after its send an attempt with no report is taken for lost."""
        return self.start_within_ms + self.run_within_ms + CLOCK_MARGIN_MS

    async def send(self, job_id: str, attempt: int, handler: str, payload: Any, now: float) -> float:
        """Send the attempt; when it is taken for lost if no report came."""
        message = AttemptMessage(job_id, attempt, handler, payload, self.reply_to,
                                 now + self.start_within_ms, self.run_within_ms)
        await self.queue.send(message.to_wire())
        return now + self.span_ms


@dataclass(frozen=True)
class AttemptMessage:
    """One attempt as it travels through the queue."""

    job: str
    attempt: int
    handler: str
    payload: Any
    reply_to: str  #: the id of the object to report to
    start_by: float  #: epoch ms: a consumer that gets it later drops it
    run_ms: float  #: a run is stopped this long after it started

    def to_wire(self) -> dict[str, Any]:
        return {"job": self.job, "attempt": self.attempt, "handler": self.handler, "payload": self.payload,
                "replyTo": self.reply_to, "startBy": self.start_by, "runMs": self.run_ms}

    @classmethod
    def parse(cls, body: Any) -> AttemptMessage:
        """The message, or ValueError if ``body`` is not one."""
        if not isinstance(body, dict):
            raise ValueError("an attempt's message is an object")
        job, reply_to = _id(body.get("job"), "job"), _id(body.get("replyTo"), "replyTo")
        handler = _id(body.get("handler"), "handler")
        attempt = _attempt(body.get("attempt"))
        start_by, run_ms = body.get("startBy"), body.get("runMs")
        if not is_number(start_by) or not is_number(run_ms) or run_ms <= 0:
            raise ValueError("an attempt's message needs startBy and runMs, in milliseconds")
        return cls(job, attempt, handler, body.get("payload"), reply_to, float(start_by), float(run_ms))


@dataclass(frozen=True)
class AttemptReport:
    """What a consumer tells the object of one attempt: ``completed`` with
    its result, ``failed`` with its error (``final``: no attempt more), or
    no outcome: a question, whether the attempt is still out."""

    job: str
    attempt: int
    outcome: str | None = None
    result: Any = None
    error: str | None = None
    final: bool = False

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"job": self.job, "attempt": self.attempt, "outcome": self.outcome}
        if self.outcome == "completed":
            wire["result"] = self.result
        elif self.outcome == "failed":
            wire.update(error=self.error, final=self.final)
        return wire

    @classmethod
    def parse(cls, body: Any) -> AttemptReport:
        """The report, or ValueError if ``body`` is not one (nothing changes)."""
        if not isinstance(body, dict):
            raise ValueError("a job report is an object")
        job, attempt, outcome = _id(body.get("job"), "job"), _attempt(body.get("attempt")), body.get("outcome")
        if outcome is not None and outcome not in OUTCOMES:
            raise ValueError(f"a job report's outcome is one of {OUTCOMES} or null, not {outcome!r}")
        final = body.get("final", False)
        error = _error(body.get("error"), final) if outcome == "failed" else None
        result = body.get("result") if outcome == "completed" else None
        try:
            json.dumps(result, allow_nan=False)
        except (TypeError, ValueError):
            raise ValueError("a completed attempt's result must be a JSON value") from None
        return cls(job, attempt, outcome, result, error, final is True)


def _error(value: Any, final: Any) -> str:
    if not isinstance(value, str) or not isinstance(final, bool):
        raise ValueError("a failed attempt's report needs its error (a string) and final (a bool)")
    return value if len(value) <= MAX_ERROR_LENGTH else value[:MAX_ERROR_LENGTH - 1] + "…"


def refused(error: BaseException) -> bool:
    """A send refused for what it carries (a JavaScript TypeError or DataCloneError
    crossing into Python, or a Python one): no attempt of it will ever be sent."""
    return isinstance(error, (TypeError, ValueError)) or getattr(error, "name", None) in ("TypeError", "DataCloneError")


def _id(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH:
        raise ValueError(f"{what} must be a string of 1 to {MAX_ID_LENGTH} characters, not {value!r}")
    return value


def _attempt(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"attempt must be a whole number from 1, not {value!r}")
    return int(value)
