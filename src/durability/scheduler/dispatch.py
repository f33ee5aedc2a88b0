"""Running due timers within one alarm: several at once, until none is left or the alarm's budget ends.

Lives here: ``Timer`` (what a participant's handler receives), the loop
that ``alarm()`` runs to start due timers up to ``max_concurrency`` at once
(and those that come due, or are scheduled, while it runs), the alarm's
budget for starting timers (``starts_left_ms``), running one timer, and
retrying a failed one under its participant's backoff, and running one
due timer in the event that made it due (``run_now``). Must not know: the
physical alarm (when it is set, or whether the runtime gave up on it), or
what any participant does when its timer fires.

``AlarmDispatch`` is a base of ``DurabilityScheduler``, whose state it
reads and writes: the scheduler sets every attribute declared on it.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Collection, Container
from dataclasses import dataclass
from typing import Any

from .._common.clock import now_ms, wait_s
from ..retry import Backoff, decide_retry
from .timer_stores import MemoryTimers, SqlTimers

log = logging.getLogger("durability.scheduler")

#: an alarm's budget is drawn from [1 - BUDGET_SPREAD, 1] x alarm_budget_ms
BUDGET_SPREAD = 0.25


@dataclass(frozen=True)
class Timer:
    """A due timer as its participant's handler receives it."""

    participant: str
    key: str
    due_at: float  #: epoch milliseconds it was due at
    attempt: int  #: how many times it already failed


TimerHandler = Callable[[Timer], Awaitable[None]]


class AlarmDispatch:
    """The part of ``DurabilityScheduler`` that runs due timers while its alarm runs."""

    backoff: Backoff
    max_concurrency: int
    alarm_budget_ms: float
    _participants: dict[str, tuple[TimerHandler, Backoff]]
    _memory: MemoryTimers
    _rows: SqlTimers
    _running: dict[tuple[str, str], None]
    _starts_until: float | None
    _wake: asyncio.Event

    async def _dispatch(self, started: float) -> None:
        """Run due timers, up to ``max_concurrency`` at once, starting those
        that come due meanwhile, until none runs or this alarm's budget ends."""
        running: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._starts_until = started + self.alarm_budget_ms * (1 - BUDGET_SPREAD * random.random())
        try:
            while True:
                room = self.max_concurrency - len(running)
                if room > 0 and now_ms() < self._starts_until:
                    for row in self._due(now_ms(), running, room):
                        key = (row["participant"], row["key"])
                        running[key] = asyncio.ensure_future(self._run_timer(row))
                if not running:
                    return
                self._wake.clear()
                waker = asyncio.ensure_future(self._wake.wait())
                can_start = len(running) < self.max_concurrency and now_ms() < self._starts_until
                next_due = self._next_due(running) if can_start else None
                # Never less than a few ms: a shorter wait returns with the clock unmoved and spins.
                timeout = None if next_due is None else wait_s(next_due)
                await asyncio.wait([*running.values(), waker], timeout=timeout,
                                   return_when=asyncio.FIRST_COMPLETED)
                waker.cancel()
                for key, task in list(running.items()):
                    if task.done():
                        del running[key]
                        task.result()  # _run_timer keeps handler errors to itself
        finally:
            for task in running.values():
                task.cancel()

    def starts_left_ms(self) -> float | None:
        """How much longer the alarm running now starts timers (None when none
        runs). A timer that would leave work waiting for a timer started
        after that (a request for permits, say) can hold off: the work would
        idle until the alarm's running timers end and a fresh one starts."""
        if self._starts_until is None:
            return None
        return max(0.0, self._starts_until - now_ms())

    async def run_now(self, participant: str, key: str) -> bool:
        """Run the ``durable=False`` timer ``(participant, key)`` here, in the
        caller's event, if it is due and not running already, as an alarm
        run would: a failure is retried under its participant's backoff,
        from the alarm (then call ``sync()``). For work an event makes due
        and does itself: setting the alarm to now for it cost a row, an
        alarm run and a row to set the alarm back. True if it ran."""
        row = self._memory.get(participant, key)
        if row is None or row["due_at"] > now_ms() or (participant, key) in self._running:
            return False
        await self._run_timer(dict(row))
        return True

    def _due(self, now: float, running: Container[tuple[str, str]], limit: int) -> list[dict[str, Any]]:
        # A row of a participant now kept in memory (written by an older
        # deployment) still runs once, and is then deleted.
        rows = self._rows.due(now) + self._memory.due(now)
        rows.sort(key=lambda r: r["due_at"])
        chosen: dict[tuple[str, str], dict[str, Any]] = {}
        for row in rows:
            key = (row["participant"], row["key"])
            if key not in running and key not in self._running and key not in chosen:  # (run_now's too)
                chosen[key] = row
        return list(chosen.values())[:limit]

    def _next_due(self, running: Collection[tuple[str, str]]) -> float | None:
        busy = {*running, *self._running}  # (run_now's too)
        due = self._rows.next_due(busy) + self._memory.next_due(busy)
        return min(due) if due else None

    async def _run_timer(self, row: dict[str, Any]) -> None:
        participant, key, version = row["participant"], row["key"], row["version"]
        store = self._memory if row.get("memory") else self._rows  # where the row came from
        if store.version(participant, key) != version:
            return  # cancelled or moved by another timer of this alarm
        timer = Timer(participant, key, row["due_at"], row["attempt"])
        entry = self._participants.get(participant)
        backoff = entry[1] if entry else self.backoff
        self._running[(participant, key)] = None
        try:
            if entry is None:
                raise LookupError(f"no participant {participant!r} is registered")
            await entry[0](timer)
        except Exception as error:
            self._after_failure(timer, version, store, backoff, error)
            return
        finally:
            self._running.pop((participant, key), None)
        store.forget(participant, key, version)  # done, unless the handler moved it meanwhile

    def _after_failure(self, timer: Timer, version: int, store: SqlTimers | MemoryTimers, backoff: Backoff,
                       error: Exception) -> None:
        failures = timer.attempt + 1
        decision = decide_retry(backoff, failures, now_ms(), random.random())
        if not decision.retry:
            log.error("timer %s/%s failed %d times: %r; giving up",
                      timer.participant, timer.key, failures, error)
            store.forget(timer.participant, timer.key, version)
            return
        log.warning("timer %s/%s failed (attempt %d): %r; retrying",
                    timer.participant, timer.key, failures, error)
        assert decision.at_ms is not None  # a retry has its time
        store.retry(timer.participant, timer.key, version, decision.at_ms, failures)
