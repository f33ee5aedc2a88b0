"""A Queue consumer that runs the attempts ``DurabilityJobs(runs_in=QueueHandoff(...))`` hands it.

Lives here: ``JobConsumer``: for each message of a batch, the attempt's
handler run under its time limit (a late message dropped, a redelivered one
first checked with its object), the outcome reported to the object that
sent it with one short call, and the message acked or retried; messages of
the dead-letter queue end their attempts as failed. Must not know: the
runner's rows, the semaphore, or what a handler does.

Runs where stateless Workers run, billed by CPU: awaiting a webhook costs
nothing there, where the object that holds the job bills every second it
waits. The object stays the job's record and its permit's holder until the
report comes. A message is acked only once its report is heard; a report
that is lost is sent again by the next delivery (which asks the object
first, and runs the attempt again only if it is still out, so a run may
repeat but never overlaps another: ``jobs/handoff``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

from .._common.checks import compact_json
from .._common.clock import now_ms
from .handoff import AttemptMessage, AttemptReport
from .records import Handler, JobContext, NonRetryableError, _current_job, _error_text

log = logging.getLogger("durability.jobs.consumer")
#: a message whose report could not be sent comes again after this, doubled at each delivery (5, 10, 20 s...):
#: an object out of reach for half a minute does not send its attempts to the dead-letter queue
RETRY_DELAY_S = 5
MAX_RETRY_DELAY_S = 300


class JobConsumer:
    """What a Worker's ``queue(batch, env, ctx)`` runs for handed-off attempts.

    Args:
        handlers: handler name -> ``handler(payload)``, as ``DurabilityJobs``
            takes them (the same names the object's runner knows).
        binding: the name of the Durable Object binding in ``env`` through
            which the objects that sent the attempts are reached.
        dead_letter_queue: the name of the queue that gets the messages the
            consumer's queue gave up on: each ends its attempt as failed, with
            no attempt more.
    """

    def __init__(self, handlers: Mapping[str, Handler], *, binding: str,
                 dead_letter_queue: str | None = None) -> None:
        if not handlers or not all(isinstance(n, str) and n and callable(h) for n, h in handlers.items()):
            raise ValueError("JobConsumer needs handlers: name -> callable")
        if not isinstance(binding, str) or not binding:
            raise ValueError("binding must name the Durable Object binding the attempts report to")
        self.handlers = dict(handlers)
        self.binding = binding
        self.dead_letter_queue = dead_letter_queue

    async def handle(self, batch: Any, env: Any) -> None:
        """Run every attempt of ``batch`` at once (each under its own permit), report each, ack each."""
        dead = batch.queue == self.dead_letter_queue
        each: Callable[[Any, Any], Any] = self._dead_letter if dead else self._attempt
        # (A message that fails in an unforeseen way leaves the others to end as they end:
        # it is retried alone, by the word it did not get.)
        outcomes = await asyncio.gather(*(each(message, env) for message in batch.messages), return_exceptions=True)
        for message, outcome in zip(batch.messages, outcomes):
            if isinstance(outcome, Exception):
                log.error("a message failed: %r", outcome)
                message.retry(delaySeconds=_retry_delay(message))

    def _object(self, env: Any, message: AttemptMessage) -> Any:
        namespace = getattr(env, self.binding)
        return namespace.get(namespace.idFromString(message.reply_to))

    async def _attempt(self, message: Any, env: Any) -> None:
        try:
            attempt = AttemptMessage.parse(message.body)
        except ValueError as error:
            log.error("dropped a message that is no attempt: %s", error)
            message.ack()  # no delivery could make it one
            return
        try:
            target = self._object(env, attempt)
            if message.attempts > 1 and not (await target.job_report(_question(attempt)))["out"]:
                message.ack()  # its report was heard, or the attempt was given up: nothing to run
                return
            if now_ms() > attempt.start_by:  # (after the question, which takes time too)
                log.warning("job %s: attempt %d came after its start limit: dropped (its object sends "
                            "another)", attempt.job, attempt.attempt)
                message.ack()
                return
            report = await self._run(attempt, message.attempts)
            await target.job_report(report.to_wire())
        except Exception as error:  # the object is unreachable now: the message comes again
            log.warning("job %s: attempt %d not reported: %r", attempt.job, attempt.attempt, error)
            message.retry(delaySeconds=_retry_delay(message))
            return
        message.ack()

    async def _run(self, attempt: AttemptMessage, delivery: int) -> AttemptReport:
        handler = self.handlers.get(attempt.handler)
        if handler is None:
            return AttemptReport(attempt.job, attempt.attempt, "failed",
                                 error=f"LookupError: no job handler named {attempt.handler!r} in the consumer",
                                 final=True)
        token = _current_job.set(JobContext(attempt.job, attempt.attempt, attempt.handler, delivery))
        # Stopped by start_by + run_ms whenever it started: so every run of the
        # attempt has ended by then, which the object counts on (jobs/handoff).
        limit = asyncio.timeout(max(0.0, attempt.start_by + attempt.run_ms - now_ms()) / 1000)
        try:
            async with limit:
                result = handler(attempt.payload)
                if inspect.isawaitable(result):
                    result = await result
        except NonRetryableError as error:
            return AttemptReport(attempt.job, attempt.attempt, "failed", error=_error_text(error), final=True)
        except Exception as error:
            text = (f"TimeoutError: the attempt ran past its limit ({attempt.run_ms:.0f} ms)" if limit.expired()
                    else _error_text(error))
            return AttemptReport(attempt.job, attempt.attempt, "failed", error=text)
        finally:
            _current_job.reset(token)
        try:
            compact_json(result, "its result")
        except ValueError as error:  # as the runner takes it: a failed attempt, not a lost report
            return AttemptReport(attempt.job, attempt.attempt, "failed",
                                 error=f"TypeError: job handler {attempt.handler!r} returned {error}")
        return AttemptReport(attempt.job, attempt.attempt, "completed", result=result)

    async def _dead_letter(self, message: Any, env: Any) -> None:
        try:
            attempt = AttemptMessage.parse(message.body)
        except ValueError:
            message.ack()
            return
        report = AttemptReport(attempt.job, attempt.attempt, "failed", final=True,
                               error="its queue gave the attempt up: no delivery of it was reported")
        try:
            await self._object(env, attempt).job_report(report.to_wire())
        except Exception as error:
            log.warning("job %s: dead letter not reported: %r", attempt.job, error)
            message.retry(delaySeconds=_retry_delay(message))
            return
        message.ack()


def _retry_delay(message: Any) -> int:
    return int(min(MAX_RETRY_DELAY_S, RETRY_DELAY_S * 2 ** max(0, message.attempts - 1)))


def _question(attempt: AttemptMessage) -> dict[str, Any]:
    """A report with no outcome: is the attempt still out?"""
    return AttemptReport(attempt.job, attempt.attempt).to_wire()
