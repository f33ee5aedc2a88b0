"""DurabilityScheduler: named durable timers sharing the object's one alarm.

Lives here: registration of participants (the outbox, the
semaphore's holder and queue, user code), ``alarm()``, which runs due
timers with retries (by ``scheduler/dispatch``) and then re-arms, and keeping
the physical alarm on the earliest timer. Must not know: what any
participant does when its timer fires.

A Durable Object has one alarm. Every helper in the object that needs to
wake up later registers as a participant and keeps named timers here; the
scheduler alone calls ``setAlarm``. A durable participant's timers are rows,
so a timer set in the same transaction as the state change that needs it
survives any crash, and ``alarm()`` runs every due timer at least once.

A participant registered with ``durable=False`` keeps its timers in memory
instead: it promises that its own durable state already says when each of
its timers is due, and it schedules them again from that state when the
object starts (in its constructor). Such a timer costs no row at all, where
a durable one costs two (the upsert, then the delete once it ran); the alarm
still covers it, so an evicted object wakes up, derives it again and runs
it. What is lost on eviction is only a failing timer's backoff: it is
retried at once by the new instance.

The alarm itself can be lost: the runtime drops an alarm whose run failed
seven times in a row. So every new instance, whichever call started it (a
read included), checks the alarm once its constructor is done and sets it
again for the earliest timer if it is missing or later (``resume``); a live
instance does so at its next sync, or its next ``resume_if_overdue()``, once the alarm it
set is overdue. Neither writes anything while the alarm is where it belongs.
One missing alarm a new instance leaves unset: while every timer due came
due within the last second and an earlier instance's alarm covered it
(``schedule_by``'s ``covered``), it is the alarm being delivered to this
instance, which re-arms at its end; should no run come, the instance's
next sync arms it, and its next read checks again (``resume_if_overdue``).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import Any, TypeVar

from .._common.checks import is_number
from .._common.clock import now_ms
from .._common.schema import public_migrate
from .._common.sql import Sql
from ..retry import Backoff
from .dispatch import BUDGET_SPREAD as BUDGET_SPREAD, AlarmDispatch, Timer as Timer, TimerHandler
from .resume import _UNKNOWN, DELIVERY_MS as DELIVERY_MS, OVERDUE_MS as OVERDUE_MS, AlarmResume
from .timer_stores import _SCHEMA as _SCHEMA, COMPONENT, TABLES, MemoryTimers, SqlTimers

T = TypeVar("T")
log = logging.getLogger("durability.scheduler")

BACKSTOP_MS = 60_000

def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, not {value!r}")
    return value


def _time(value: Any) -> float:
    if not is_number(value) or value != value:
        raise ValueError(f"a timer's time must be epoch milliseconds, not {value!r}")
    return float(value)


class DurabilityScheduler(AlarmDispatch, AlarmResume):
    """The single owner of a Durable Object's alarm. Create one per object.

    Args:
        ctx: the Durable Object's ``ctx``.
        backoff: retry policy for a failing timer, unless its participant
            gives its own. Timers never give up unless the policy says so.
        max_concurrency: how many due timers one alarm runs at once.
        alarm_budget_ms: after this long in one alarm, timers not yet started
            are left for a fresh alarm, well before the handler's wall-time
            limit. Each alarm draws its own budget from the last quarter below
            this, so that objects whose alarms started together do not all
            stop starting timers at once (see ``starts_left_ms``).
    """

    def __init__(self, ctx: Any, *, backoff: Backoff = Backoff(),
                 max_concurrency: int = 32, alarm_budget_ms: float = 10 * 60_000) -> None:
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self.ctx = ctx
        self.sql = Sql(ctx)
        self.backoff = backoff
        self.max_concurrency = max_concurrency
        self.alarm_budget_ms = alarm_budget_ms
        self._participants: dict[str, tuple[TimerHandler, Backoff]] = {}
        # Timers of participants registered with durable=False:
        # (participant, key) -> a row shaped as _due returns it.
        self._volatile: set[str] = set()
        self._memory = MemoryTimers()
        self._armed: Any = _UNKNOWN
        self._armed_at = 0.0  #: when ``_armed`` was set or read: an alarm set anew is not overdue yet
        self._alarm_runs = 0  #: alarm() calls in this instance, so that resume() never undoes one
        self._resume_task: asyncio.Task[None] | object | None = None  #: a check of the alarm under way
        self._delivery_by: tuple[float, int] | None = None  #: see ``AlarmResume._delivered_now``
        self._sync_lock = asyncio.Lock()
        # Timers whose handler is running now: scheduling one of them always
        # moves its version, or the run's end would delete the new request.
        self._running: dict[tuple[str, str], None] = {}
        self.outbox: Any = None  # the object's one DurabilityOutbox, if any (DurabilityOutbox.of)
        # While alarm() dispatches, newly scheduled timers wake it instead of
        # moving the alarm: it runs them itself and re-arms when it ends.
        self._dispatching = False
        self._starts_until: float | None = None  #: while dispatching: when this alarm stops starting timers
        self._wake = asyncio.Event()
        self._rows = SqlTimers(self.sql)
        self._start_resume(first=True)

    migrate = public_migrate(COMPONENT, TABLES, "the scheduler's tables")

    # -- registration ------------------------------------------------------
    def register(self, participant: str, handler: TimerHandler, *,
                 backoff: Backoff | None = None, durable: bool = True) -> None:
        """Route due timers of ``participant`` to ``handler(timer)``.

        ``durable=False`` keeps its timers in memory (see the module's
        docstring): register before scheduling, and schedule them again from
        durable state in the constructor.
        """
        _name(participant, "participant")
        if participant in self._participants:
            raise ValueError(f"participant {participant!r} is already registered")
        self._participants[participant] = (handler, backoff or self.backoff)
        if durable:
            self._rows.make()
        else:
            self._volatile.add(participant)

    # -- timers (synchronous: call them inside the transaction that needs them)
    def schedule(self, participant: str, key: str, at_ms: float, *, alarm_by: float | None = None) -> None:
        """Set the timer ``(participant, key)`` to fire at ``at_ms``, replacing any time it had
        (``alarm_by``: as for ``schedule_by``)."""
        self._upsert(participant, key, at_ms, earlier_only=False, alarm_by=alarm_by)

    def schedule_by(self, participant: str, key: str, at_ms: float, *, alarm_by: float | None = None,
                    covered: bool = False) -> None:
        """Make sure the timer fires no later than ``at_ms``; an earlier time is kept.

        ``alarm_by`` (a ``durable=False`` participant's timer only): the timer
        is due at ``at_ms`` for any alarm run that comes, and for its
        participant to run itself in another event, but the alarm need not
        move for it before ``alarm_by``: an alarm the object has set for
        something else already costs no row.

        ``covered`` (the same, derived in a constructor): an earlier instance
        with the same rows kept the object's alarm at or before this time
        for it (a time the participant derives from its rows and the clock
        alone, as it did then), so that a new instance that finds no alarm
        while such a timer has just come due is the one that alarm's
        delivery started (``resume``). A timer due now for what the new
        instance itself must do is not covered: no alarm need ever have
        been set for it."""
        self._upsert(participant, key, at_ms, earlier_only=True, alarm_by=alarm_by, covered=covered)

    def _upsert(self, participant: str, key: str, at_ms: float, *, earlier_only: bool,
                alarm_by: float | None = None, covered: bool = False) -> None:
        _name(participant, "participant")
        _name(key, "timer key")
        if participant not in self._participants:
            # (Registration says where its timers live, and makes the table a
            # durable one needs, outside any transaction.)
            raise ValueError(f"participant {participant!r} is not registered: register it before scheduling")
        at_ms = _time(at_ms)
        self._wake.set()
        # A running timer's due time is being consumed: any request is a new one.
        always = (participant, key) in self._running
        if participant in self._volatile:
            alarm_at = at_ms if alarm_by is None else max(at_ms, _time(alarm_by))
            self._memory.upsert(participant, key, at_ms, earlier_only=earlier_only, always=always, alarm_at=alarm_at,
                                covered=covered)
        else:
            self._rows.upsert(participant, key, at_ms, earlier_only=earlier_only, always=always)

    def _store_of(self, participant: str) -> SqlTimers | MemoryTimers:
        return self._memory if participant in self._volatile else self._rows

    def cancel(self, participant: str, key: str) -> None:
        self._store_of(participant).cancel(participant, key)

    def timer(self, participant: str, key: str) -> Timer | None:
        row = self._store_of(participant).get(participant, key)
        return None if row is None else Timer(participant, key, row["due_at"], row["attempt"])

    def timers(self, participant: str) -> list[Timer]:
        """Every timer ``participant`` has set, soonest first."""
        rows = self._store_of(participant).of(participant)
        return sorted((Timer(participant, r["key"], r["due_at"], r["attempt"]) for r in rows),
                      key=lambda t: t.due_at)

    def transaction(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` atomically (no awaits inside); then ``await sync()``.

        If it fails, its writes roll back and so do the timers it set in
        memory: a timer never stands for a write that did not happen."""
        memory = self.memory_snapshot()
        try:
            return self.sql.transaction(fn)
        except BaseException:
            self.memory_restore(memory)
            raise

    def memory_snapshot(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The timers kept in memory, for ``memory_restore`` to put back."""
        return self._memory.snapshot()

    def memory_restore(self, snapshot: dict[tuple[str, str], dict[str, Any]]) -> None:
        self._memory.restore(snapshot)

    # -- the physical alarm ------------------------------------------------
    def _earliest(self) -> int | None:
        # (A timer ``run_now`` runs asks for no alarm: one would find it running, and re-arm at once.)
        due = self._rows.earliest() + self._memory.earliest(self._running)
        # Alarms hold whole milliseconds; round up so the timer is due when it fires.
        return math.ceil(min(due)) if due else None

    async def sync(self) -> None:
        """Keep the alarm on the earliest timer.

        Call it right after any transaction that scheduled or cancelled
        timers, with no other await in between: ``setAlarm`` is a synchronous
        write on SQLite-backed objects, so the alarm then commits in the same
        batch as the timers. Each ``setAlarm`` is billed as a row written,
        so it writes only when the alarm must move *earlier*: an alarm set
        before the earliest timer, or when no timer is left, is left to fire
        early, run nothing, and re-arm. That wake-up is billed as a request,
        a seventh of the price of a write, and it replaces every move later
        made until then: a holder whose grants are claimed one after another
        pushed its reclaim alarm later once per grant, about one row per
        admitted job, where it now re-arms about once per claim deadline.
        In a new instance that has not read its alarm yet, the call arms
        without asking: an await there would split the batch. A new
        instance's own check (``resume``) holds the lock while it reads the
        alarm, so a sync made meanwhile sets the alarm a batch later; should
        the instance crash in between, the next one checks again.
        An alarm overdue by ``OVERDUE_MS`` is set again without asking.
        """
        if self._dispatching:
            return  # alarm() is running: it starts due timers itself and re-arms at its end
        async with self._sync_lock:
            if self._overdue():
                self._armed = _UNKNOWN  # it should have run long ago: the runtime gave up on it
            while True:
                if self._dispatching:
                    # An alarm started while this waited for the lock: it
                    # re-arms at its end. (Arming here set an alarm to fire
                    # at once for the timers that alarm was running: a new
                    # instance's check, say, overtaken by the alarm the
                    # call that started the instance had set, cost a row
                    # and a second alarm run for about a third of the jobs
                    # of the example Worker.)
                    return
                earliest = self._earliest()
                if earliest is None or (self._armed not in (None, _UNKNOWN) and self._armed <= earliest):
                    return
                # Recorded before the await: an alarm that fires meanwhile
                # resets it to None (but for one set later than it in a new
                # instance: _armed_since_delivery), which the next pass sees.
                self._note_armed(earliest)
                try:
                    await self.sql.set_alarm(earliest)
                except BaseException:
                    self._armed = _UNKNOWN
                    raise

    def _armed_since_delivery(self, now: float) -> bool:
        """Did this new instance set the alarm for a later timer after the
        alarm now running was taken for delivery? A new instance that an
        alarm's delivery starts reads no alarm (``getAlarm`` is null while
        one runs) and, when its rows' earliest timer is later (put off since
        that alarm was set), sets it before the run starts (``resume``); an
        alarm set while one runs stays set after it. Were ``_armed`` reset,
        the run's end would set the same alarm again: a row for nothing
        (0.01 rows a job on the demo's workload). Only on an instance's first
        run: after a run that failed once the scheduler's part was done (the
        object's own code raising), the runtime retries sooner in place of
        the alarm that run set, and a retry that kept it left its timer with
        no alarm. ``DELIVERY_MS`` of slack: an alarm starts within it of its
        time, so one set further ahead is not the one that fired."""
        armed = self._armed
        return self._alarm_runs == 0 and armed not in (None, _UNKNOWN) and armed > now + DELIVERY_MS

    async def alarm(self, alarm_info: Any = None) -> None:
        """The object's ``alarm()`` delegates here: run due timers, then re-arm.

        While timers run, the alarm keeps dispatching: a timer that comes due
        meanwhile, or that a call schedules for now, starts as soon as one of
        the ``max_concurrency`` slots is free, instead of waiting for the
        slowest handler and a fresh alarm.
        """
        started = now_ms()
        if not self._armed_since_delivery(started):
            self._armed = None  # the alarm that fired is spent
        self._alarm_runs += 1
        self._dispatching = True  # from here: no sync and no resume() moves the alarm under this run
        try:
            if getattr(alarm_info, "retryCount", 0):
                # Earlier runs of this alarm failed, and the runtime gives up
                # after six retries: keep an alarm set while this run works, so
                # that the timers are not stranded if it fails too. (Each run
                # that follows a failure pays this one write; a healthy object
                # never does.)
                self._note_armed(math.ceil(started + BACKSTOP_MS))
                await self.sql.set_alarm(self._armed)
            await self._dispatch(started)
        except BaseException:
            # The runtime retries a run that fails: an alarm is owed from now
            # on, and a read notices if the runtime gives up on it as well.
            self._note_armed(math.ceil(started))
            raise
        finally:
            self._dispatching = False
            self._starts_until = None
        await self.sync()
