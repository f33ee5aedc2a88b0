"""A new instance's check of its alarm, and resuming one the runtime gave up on.

Lives here: ``AlarmResume``, the part of ``DurabilityScheduler`` that
checks the alarm once a new instance's constructor is done (``resume``,
under the runtime's ``blockConcurrencyWhile``), resumes a live instance
whose alarm is overdue (``resume_if_overdue``, for reads) or that a sweep
wakes (``resume``), and tells an alarm being delivered from one lost. Must
not know: the timers' stores or handlers, or what any participant does.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from .._common.clock import now_ms
from .._common.sql import Sql

log = logging.getLogger("durability.scheduler")

_UNKNOWN = object()
_CHECKING = object()  #: a new instance's check of the alarm, under the runtime's blockConcurrencyWhile
#: an alarm this long past its time that has not run is taken as lost (the
#: runtime gave up on it): the next sync or ``resume_if_overdue()`` sets it again. Longer
#: than the runtime's own retries take to start (6, from 2 s doubling: 2.1
#: to 2.6 min with jitter), so an alarm still being retried is left alone.
OVERDUE_MS = 180_000
#: a due alarm starts within this of its time, or was lost (production starts one within milliseconds)
DELIVERY_MS = 1_000


class AlarmResume:
    """The alarm's checks of ``DurabilityScheduler``, which sets these attributes."""

    ctx: Any
    sql: Sql
    _armed: Any
    _armed_at: float
    _alarm_runs: int
    _dispatching: bool
    _resume_task: asyncio.Task[None] | object | None
    _sync_lock: asyncio.Lock
    _earliest: Callable[[], int | None]
    _memory: Any  #: the memory timers (``timer_stores.MemoryTimers``)
    #: after a new instance's check took its alarm for one being delivered
    #: (``_delivered_now``): when that alarm's run should have started by,
    #: and the alarm runs counted then
    _delivery_by: tuple[float, int] | None
    sync: Callable[[], Awaitable[None]]

    def _start_resume(self, *, first: bool = False) -> None:
        """Once the constructor is done (participants have derived their
        timers), check the alarm: this instance may have been started by a
        read after the runtime gave up on it. Nothing runs this outside an
        event (no loop runs then, and no instance serves anything).

        ``first`` (from the constructor): the check holds the instance's
        events (``blockConcurrencyWhile``) until it has read the alarm, so
        that the first event's timers move it only if they must: a sync
        that arms without asking rewrites the alarm a hibernated object had
        left where it belonged, one row each time it wakes."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        block = getattr(self.ctx, "blockConcurrencyWhile", None) if first else None
        if block is not None:
            self._resume_task = _CHECKING  # (what block() returns need not be kept: the runtime holds it)
            block(self._resume_quietly)
        else:
            self._resume_task = loop.create_task(self._resume_quietly())  # kept: a loop holds tasks weakly

    async def _resume_quietly(self) -> None:
        try:
            await self.resume()
        except Exception as error:  # the next sync or read tries again
            log.warning("checking the alarm failed: %r", error)
        finally:
            self._resume_task = None

    async def resume(self) -> None:
        """Make sure the alarm will run the earliest timer: set it again if
        the runtime has none, or a later one, for this object.

        A new instance does this by itself once its constructor is done, so
        any call that starts one resumes its work (but for an alarm it takes
        to be under way: ``_delivered_now``, whose next sync or read sets
        it if no run came). Call it from an RPC
        method (``wake``, say) that a periodic sweep calls, to resume a live
        instance whose alarm the runtime gave up on. It reads the alarm
        (``getAlarm``, no row) and writes only when it must move.
        """
        if self._dispatching:
            return  # alarm() is running: it re-arms at its end
        starting = self._resume_task is _CHECKING  # a new instance's own check, before its first event
        async with self._sync_lock:
            if self._earliest() is None and self._armed is not _UNKNOWN:
                return  # nothing is owed; an alarm left set fires once for nothing
            runs = self._alarm_runs
            current = await self.sql.get_alarm()
            if current is None and (self._fired_not_started() or (starting and self._delivered_now())):
                return  # the alarm came due: the runtime delivers it next (it re-arms at its end)
            if runs == self._alarm_runs:  # no alarm started meanwhile (it knows better)
                self._note_armed(current)
        await self.sync()

    def resume_if_overdue(self) -> None:
        """For a synchronous read: resume in the background if the alarm this
        instance knows of is overdue (the runtime gave up on it). Costs
        nothing otherwise: a comparison in memory. (A new instance has
        checked its alarm by itself.)"""
        if not self._dispatching and self._resume_task is None and self._overdue():
            self._start_resume()

    def _fired_not_started(self) -> bool:
        """The alarm this instance set came due within the last
        ``DELIVERY_MS``: the runtime has taken it (``getAlarm`` reads none)
        and delivers it next. Setting it again cost a row and a second run
        for nothing. One due longer ago that has not run was lost: set again.
        (A new instance cannot tell the alarm an earlier one set, being
        delivered, from a timer its rows make due now that no alarm covers:
        it sets the alarm.)"""
        armed = self._armed
        return armed not in (None, _UNKNOWN) and now_ms() - DELIVERY_MS < armed <= now_ms()

    def _delivered_now(self) -> bool:
        """Is a new instance that reads no alarm the one its alarm's delivery
        started? Yes if every timer due by now came due within the last
        ``DELIVERY_MS`` and was covered by an earlier instance's alarm: a
        durable timer's row is written with the alarm that covers it, and
        a memory timer ``covered`` is one derived from the rows at a time
        an earlier instance kept the alarm for. A timer due now for what the
        new instance itself must do is not, and the alarm is set as before.
        Setting it for the alarm being delivered cost a row for nothing (its
        run re-arms at its end): 0.12 rows a job on the demo's workload,
        where a shard hibernates about once a job and its fallback alarm
        wakes it. The alarm stays unknown, so any sync arms it; and should
        no run have started within ``DELIVERY_MS`` (the alarm was lost), the
        next read through the library checks again (``resume_if_overdue``)."""
        now = math.ceil(now_ms())  # (alarm times are whole milliseconds, rounded up)
        earliest = self._earliest()
        if self._armed is not _UNKNOWN or earliest is None or not now - DELIVERY_MS < earliest <= now:
            return False
        if self._memory.uncovered_by(now):
            return False
        self._delivery_by = (now + DELIVERY_MS, self._alarm_runs)
        return True

    def _note_armed(self, at: Any) -> None:
        self._armed, self._armed_at = at, now_ms()

    def _overdue(self) -> bool:
        """The alarm this instance set (or read) should have run three minutes
        ago and has not: an alarm set anew for a timer long due is not."""
        armed = self._armed
        if armed is _UNKNOWN and self._delivery_by is not None:
            by, runs = self._delivery_by
            return runs == self._alarm_runs and now_ms() > by  # (see _delivered_now)
        return (armed is not None and armed is not _UNKNOWN
                and max(armed, self._armed_at) < now_ms() - OVERDUE_MS)
