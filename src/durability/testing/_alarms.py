"""The one alarm of a Durable Object: staged with its writes, set on commit, run, retried.

Lives here: the alarm as production keeps it (staged in the write batch,
set when the batch commits, ``None`` while its handler runs), its delivery
as an event, its retries (6, from 2 s doubling, with jitter drawn from the
runtime's seeded source, so that a seed replays them) and its limit of 15
minutes of wall time. ``ObjectHost`` takes all of this from ``ObjectAlarm``.
Must not know: how an event is admitted or a batch committed; it asks the
host.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from ._errors import reset_error
from ._storage import DurableObjectAbort
from ._values import JsDict, JsException

if TYPE_CHECKING:
    import random

    from ._clock import RuntimeLoop
    from ._meters import LoadMeter
    from ._sql import SqlDatabase
    from ._stats import ObjectStats

# Production's alarm retries: 6 after the first attempt, from 2 s doubling,
# with up to 25% jitter (workerd's alarm scheduler).
ALARM_MAX_RETRIES = 6
ALARM_FIRST_BACKOFF_MS = 2_000
ALARM_JITTER = 0.25

# An alarm's run ends after 15 minutes of wall time, as production ends it;
# the run counts as failed and is retried. Production aborts the object's
# context, and so the instance, with it (inferred from workerd's source).
ALARM_WALL_LIMIT_MS = 15 * 60_000
ALARM_TIME_LIMIT_MESSAGE = "Durable Object alarm exceeded its 15-minute wall-time limit and was reset."

# The staged alarm when the open write batch stages none.
_UNSET = object()


class ObjectAlarm:
    """The alarm of an ``ObjectHost``."""

    if TYPE_CHECKING:  # what these methods use of the host they are part of
        # HostServices, whose log_event takes the whole ObjectHost, not this part of it
        _services: Any
        db: SqlDatabase
        stats: ObjectStats
        class_name: str
        generation: int
        alarm_at: float | None
        _staged_alarm: Any
        _alarm_timer: asyncio.TimerHandle | None
        _alarm_retry: int
        _alarm_running: bool
        _load: LoadMeter

        @property
        def name(self) -> str: ...

        @property
        def loop(self) -> RuntimeLoop: ...

        @property
        def rng(self) -> random.Random: ...

        def evict(self, reason: str = ..., counted: bool = ...) -> None: ...

        def evict_if_current(self, generation: int) -> None: ...

        async def run_event(self, awaitable: Awaitable[Any]) -> Any: ...

        async def admit_event(self, named: bool = ...) -> Any: ...

        def batch_mark(self) -> int: ...

        async def flushed(self, since: int | None = ...) -> None: ...

    # -- the one alarm ----------------------------------------------------
    def stage_alarm(self, at_ms: float | None) -> None:
        self.db.open_batch()
        self._staged_alarm = at_ms
        self.stats.alarm_writes += 1  # each setAlarm is billed as a row written

    def alarm_for_reading(self) -> float | None:
        return self.alarm_at if self._staged_alarm is _UNSET else self._staged_alarm

    def _arm_alarm_timer(self) -> None:
        if self._alarm_timer is not None:
            self._alarm_timer.cancel()
            self._alarm_timer = None
        if self.alarm_at is not None and not self._alarm_running:
            when = max(self.loop.time(), self.loop.loop_time_for(self.alarm_at))
            self._alarm_timer = self.loop.call_at_exact(when, self._alarm_due)

    def _alarm_due(self) -> None:
        self._alarm_timer = None
        if self.alarm_at is None or self._alarm_running:
            return
        self._services.spawn_system(self._deliver_alarm())

    async def _deliver_alarm(self, duplicate: bool = False) -> None:
        retry = self._alarm_retry
        scheduled = self.alarm_at
        if not duplicate:
            self.alarm_at = None  # getAlarm() is None while the handler runs
        self._alarm_running = True
        self.stats.alarm_invocations += 1
        self._load.count_request()
        self._services.log_event(self, "alarm", f"retry {retry}" if retry else "")
        succeeded = False
        evict_after = self._services.faults.alarm_eviction(self.class_name)
        if evict_after is not None:
            self.loop.call_later_exact(evict_after / 1000, self.evict_if_current, self.generation)
        try:
            if self._services.faults.out_of_order(self.class_name, self.name, "alarms"):
                raise JsException("the alarm's run failed before its handler ran (an outage)")
            info = JsDict(retryCount=retry, isRetry=retry > 0, scheduledTime=scheduled)
            mark = self.batch_mark()
            await _alarm_within_limit(self, info)
            await self.flushed(since=mark)
            succeeded = not self._services.faults.alarm_fails(self.class_name)
        except (Exception, DurableObjectAbort) as error:  # the handler threw, or the instance was reset
            self._services.log_event(self, "alarm failed", repr(error))
        finally:
            self._alarm_running = False
        if succeeded:
            if not duplicate and self._services.faults.duplicate_alarm(self.class_name):
                self._services.spawn_system(self._deliver_alarm(duplicate=True))
        elif not duplicate and retry < ALARM_MAX_RETRIES:
            backoff = ALARM_FIRST_BACKOFF_MS * 2**retry
            retry_at = self.loop.now_ms() + backoff * (1 + ALARM_JITTER * self.rng.random())
            if self.alarm_at is None or retry_at <= self.alarm_at:
                self.alarm_at = retry_at
                self._alarm_retry = retry + 1
        elif not duplicate:
            self._services.log_event(self, "alarm abandoned", f"after {retry} retries")
        self._arm_alarm_timer()

    async def _alarm_event(self, info: JsDict) -> None:
        instance = await self.admit_event()
        handler = getattr(instance, "alarm", None)
        if handler is None:
            raise TypeError(f"{self.class_name} has no alarm() handler")
        await _call_alarm(handler, info)


async def _alarm_within_limit(host: ObjectAlarm, info: JsDict) -> None:
    """The alarm's handler, cut off with its instance past the wall-time limit."""
    generation = host.generation
    limit = asyncio.timeout(ALARM_WALL_LIMIT_MS / 1000)
    try:
        async with limit:
            await host.run_event(host._alarm_event(info))
    except TimeoutError:
        if not limit.expired():
            raise  # the handler's own timeout, not the limit's
        if generation == host.generation:
            host.evict(ALARM_TIME_LIMIT_MESSAGE)
        raise reset_error(ALARM_TIME_LIMIT_MESSAGE) from None


async def _call_alarm(handler: Callable[..., Any], info: JsDict) -> None:
    # workerd calls alarm() with relaxed arity: ``def alarm(self)`` works too.
    parameters: Mapping[str, object]
    try:
        parameters = inspect.signature(handler).parameters
    except (TypeError, ValueError):
        parameters = {"info": None}
    result = handler(info) if parameters else handler()
    if inspect.isawaitable(result):
        await result
