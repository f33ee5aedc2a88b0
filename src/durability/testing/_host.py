"""One Durable Object in the embedded runtime: durable storage, live instance, events.

Lives here: the object's life (instance created on the first event, dropped
on eviction or hibernation while its storage stays), its limits (the CPU
left since the last request, the requests it takes per second), when it is
awake (its tasks and its code's timers, counted by ``_meters``), and how an
event (an RPC call, an alarm) runs against the live instance. Its gates and
write batch are in ``_gates``, its alarm in ``_alarms``, what it is billed
for in ``_stats`` and the errors its callers see in ``_errors``.
``HostServices`` lists all a host needs from around it;
``ObjectFaultPolicy`` is the part of fault injection it asks about.
Must not know: the runtime itself, how calls travel between objects or how
faults are chosen; the host asks ``HostServices`` for what it needs, and the
runtime asks the host to act.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ._alarms import (
    _UNSET,
    ALARM_MAX_RETRIES as ALARM_MAX_RETRIES,
    ObjectAlarm,
)
from ._clock import RuntimeLoop
from ._errors import (
    RESET_MESSAGE as RESET_MESSAGE,
    overloaded_error,
    python_error as python_error,
    reset_error as reset_error,
)
from ._gates import ObjectGates
from ._meters import AwakeMeter, LoadMeter
from ._sql import SqlDatabase
from ._stats import OBJECT_GB as OBJECT_GB, ObjectStats as ObjectStats
from ._storage import DurableObjectAbort, DurableObjectId, DurableObjectState
from ._values import JsException, rpc_copy

# Production's CPU limit: every request (an RPC call or an alarm) tops the
# object's CPU time up to the limit, and an object whose code runs past it
# is reset (Cloudflare's Durable Objects limits page; `[limits] cpu_ms`).
DEFAULT_CPU_LIMIT_MS = 30_000
CPU_LIMIT_MESSAGE = "Durable Object exceeded its CPU time limit and was reset."

# Production removes an object from memory after 10 s with nothing pending but
# its alarm (Cloudflare's Durable Object lifecycle page: "hibernateable").
HIBERNATE_AFTER_MS = 10_000
HIBERNATED_MESSAGE = "Durable Object hibernated: nothing was pending for 10 s."

# The soft limit on one object's requests (RPC calls and alarms), per second.
DEFAULT_MAX_REQUESTS_PER_S = 1_000

# The object whose code is running now (None for the test driving the runtime).
current_host: contextvars.ContextVar[ObjectHost | None] = contextvars.ContextVar(
    "durability_current_host", default=None
)

# The instance generation that code running now belongs to.
current_generation: contextvars.ContextVar[int] = contextvars.ContextVar(
    "durability_current_generation", default=-1
)


def current_object() -> ObjectHost | None:
    """The object whose code is running now (None outside every object): for
    tests and benchmarks that attribute what happens to the object it happens in."""
    return current_host.get()


class ObjectFaultPolicy(Protocol):
    """The faults an object may suffer in its own life, asked by its class name."""

    def crash_before_commit(self, class_name: str) -> bool: ...

    def alarm_eviction(self, class_name: str) -> float | None: ...

    def alarm_fails(self, class_name: str) -> bool: ...

    def out_of_order(self, class_name: str, name: str, what: str, from_object: bool = True) -> bool: ...

    def duplicate_alarm(self, class_name: str) -> bool: ...


@dataclass(frozen=True)
class HostServices:
    """What a host needs from the runtime around it, and nothing more."""

    loop: RuntimeLoop
    rng: random.Random  #: the runtime's one seeded source, so a seed replays alarm jitter too
    env: Any  #: handed to each new instance's constructor
    faults: ObjectFaultPolicy
    #: the rate past which calls are refused as overloaded (None: never)
    max_requests_per_s: float | None
    #: the CPU an object may run for after each request before it is reset (None: no limit)
    cpu_limit_ms: float | None
    #: how long an object with nothing pending keeps its instance (None: for good)
    hibernate_after_ms: float | None
    spawn_system: Callable[[Awaitable[Any]], asyncio.Task[Any]]  #: work outside any instance
    log_event: Callable[[ObjectHost, str, str], None]
    report_background_error: Callable[[ObjectHost, BaseException], None]


class ObjectHost(ObjectGates, ObjectAlarm):
    """One Durable Object: its storage, its live instance and the events it runs."""

    def __init__(self, services: HostServices, cls: type, class_name: str,
                 object_id: DurableObjectId) -> None:
        self._services = services
        self.cls = cls
        self.class_name = class_name
        self.object_id = object_id
        self.db = SqlDatabase(on_batch_open=self._batch_opened)
        self.stats = ObjectStats()
        self.generation = 0
        self.reset_reason = RESET_MESSAGE
        self.instance: Any = None
        # A dict, not a set: eviction cancels in creation order, so a seed
        # replays the same run whatever the tasks' addresses in memory.
        self._tasks: dict[asyncio.Task[Any], None] = {}
        self._gate_depth = 0
        self._gate_waiters: list[asyncio.Future[None]] = []
        self._commit_handle: asyncio.Handle | None = None
        self._batches_opened = 0
        self._last_lost_batch = 0
        self._commit_waiters: list[asyncio.Future[None]] = []
        # The alarm: committed value, the value staged in the open batch, and
        # the timer that will deliver it.
        self.alarm_at: float | None = None
        self._staged_alarm: Any = _UNSET
        self._alarm_timer: asyncio.TimerHandle | None = None
        self._alarm_retry = 0
        self._alarm_running = False
        self._load = LoadMeter(self.stats, services.loop.time, services.max_requests_per_s, services.cpu_limit_ms)
        # Pending timers the instance's code set, by id (handles compare by contents).
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._awake = AwakeMeter(self.stats, services.loop.time)

    @property
    def name(self) -> str:
        """The object's name, or its id when it has none (as the trace names it)."""
        return self.object_id.name or self.object_id.toString()

    @property
    def loop(self) -> RuntimeLoop:
        return self._services.loop

    @property
    def rng(self) -> random.Random:
        return self._services.rng

    # -- tasks that belong to the live instance ------------------------
    def spawn(self, awaitable: Awaitable[Any], *, background: bool = True,
              event: bool = False) -> asyncio.Task[Any]:
        """Run ``awaitable`` as this instance's work: eviction cancels it.

        A background task's failure (``waitUntil``) is reported to the
        runtime; an event's failure goes to whoever delivered the event.
        An ``event`` (a call, an alarm, a batch) starts from an empty
        context, as in workerd, where each reaches its object on its own:
        a copy of the caller's carried its ``contextvars`` into the callee
        (a queue's "admit() is running" among them).
        """
        context = contextvars.Context() if event else contextvars.copy_context()
        context.run(current_host.set, self)
        context.run(current_generation.set, self.generation)
        coroutine = awaitable if inspect.iscoroutine(awaitable) else _as_coroutine(awaitable)
        task = self.loop.create_task(coroutine, context=context)
        self._tasks[task] = None
        self._note_awake()
        task.add_done_callback(self._forget)
        task.add_done_callback(self._report if background else _silence)
        return task

    def adopt(self, task: asyncio.Task[Any], generation: int) -> None:
        """A task the instance's own code created: it dies with the instance."""
        if generation == self.generation:
            self._tasks[task] = None
            self._note_awake()
            task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._tasks.pop(task, None)
        self._note_awake()

    # -- awake time, as duration is billed -------------------------------
    def timer_set(self, handle: asyncio.TimerHandle) -> None:
        self._timers[id(handle)] = handle
        self._note_awake()

    def timer_done(self, handle: asyncio.TimerHandle) -> None:
        self._timers.pop(id(handle), None)
        self._note_awake()

    def _note_awake(self) -> None:
        limit = self._services.hibernate_after_ms
        if self._awake.note(bool(self._tasks or self._timers)) and limit is not None and self.instance is not None:
            self.loop.call_later_exact(limit / 1000, _hibernate_if_asleep, self, self.generation,
                                       self._awake.asleep_since)

    def awake_s(self) -> float:
        """Seconds awake so far, the period still open included."""
        return self._awake.seconds()

    def awake_periods(self) -> list[tuple[float, float]]:
        """The periods awake so far, (start, end) in loop seconds, the one still open included."""
        return self._awake.periods()

    def _report(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled():
            error = task.exception()
            if error is not None:
                self._services.report_background_error(self, error)

    async def run_event(self, awaitable: Awaitable[Any]) -> Any:
        """Run one event's code on the instance; eviction fails it with a reset."""
        task = self.spawn(awaitable, background=False, event=True)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # the caller itself is going away
            raise reset_error(self.reset_reason) from None

    # -- instance -------------------------------------------------------
    def ensure_instance(self, named: bool = True) -> Any:
        """The live instance, made now if there is none. As in production, an
        instance made for a call through an id without a name (``idFromString``)
        has no ``ctx.id.name`` for as long as it lives."""
        if self.instance is None:
            object_id = self.object_id if named else DurableObjectId(self.class_name, None, self.object_id.toString())
            ctx = DurableObjectState(self, self.generation, object_id)
            token = current_host.set(self)
            generation_token = current_generation.set(self.generation)
            try:
                self.instance = self.cls(ctx, self._services.env)
            finally:
                current_host.reset(token)
                current_generation.reset(generation_token)
            self.stats.instances_created += 1
        return self.instance

    def evict_if_current(self, generation: int) -> None:
        """Evict, unless the instance that was meant is already gone."""
        if generation == self.generation:
            self.evict()

    def evict(self, reason: str = RESET_MESSAGE, counted: bool = True) -> None:
        """Drop the live instance at whatever await it is in; keep storage.

        Writes not yet committed are lost with it, as in a crash; the calls
        it was serving fail with a reset error. ``counted=False``: a
        hibernation, not an eviction (it has nothing in progress to lose).
        """
        if counted:
            self.stats.evictions += 1
        self._services.log_event(self, "evicted" if counted else "hibernated", reason)
        self.reset_reason = reason
        self.generation += 1
        self.instance = None
        if self.db.in_batch:
            self._last_lost_batch = self._batches_opened
        self.db.rollback_batch()
        self._staged_alarm = _UNSET
        if self._commit_handle is not None:
            self._commit_handle.cancel()
            self._commit_handle = None
        for waiter in self._commit_waiters:
            if not waiter.done():
                waiter.set_exception(reset_error(reason))
        self._commit_waiters.clear()
        for task in list(self._tasks):
            task.cancel()
        self._tasks.clear()
        for handle in list(self._timers.values()):  # nothing of the instance outlives it
            handle.cancel()
        self._timers.clear()
        self._note_awake()
        self._gate_depth = 0
        self._wake_gate_waiters()


    # -- an RPC call --------------------------------------------------------
    async def call(self, method: str, args: list[Any], named: bool = True) -> Any:
        """Deliver one RPC call and return the reply as the caller receives it,
        or refuse it as overloaded past the requests per second it may take."""
        if self._load.over_rate():
            self.stats.overloaded += 1
            self._services.log_event(self, "overloaded", method)
            raise overloaded_error()
        self._load.count_request()

        async def event() -> Any:
            instance = await self.admit_event(named)
            target = None if method.startswith("_") else getattr(type(instance), method, None)
            if target is None or not callable(target):
                raise JsException(f"Method {method} does not exist", name="TypeError")
            result = getattr(instance, method)(*args)
            if inspect.isawaitable(result):
                result = await result
            return rpc_copy(result)  # production converts the reply in the callee

        mark = self.batch_mark()
        try:
            reply = await self.run_event(event())
        except JsException:
            raise
        except DurableObjectAbort as abort:
            raise reset_error(str(abort)) from None
        except Exception as error:
            raise python_error(error) from None
        await self.flushed(since=mark)
        return reply

    def charge_cpu(self, seconds: float) -> None:
        """A step of the object's code ran for ``seconds``: past the CPU left
        since its last request, the instance is reset (at the step's end:
        production stops the code mid-step)."""
        if self._load.charge_cpu(seconds) and self.instance is not None:
            self._services.log_event(self, "cpu limit", f"{self._services.cpu_limit_ms:g} ms")
            self.evict(CPU_LIMIT_MESSAGE)

    async def admit_event(self, named: bool = True) -> Any:
        """Wait for the input gate, then hand the event the live instance.

        This runs inside the event's own task, so an event that passes the
        gate starts at once: nothing else runs before its first await.
        """
        await self.wait_gate_open()
        instance = self.ensure_instance(named)
        await self.wait_gate_open()  # the constructor may have closed it
        return instance


def _hibernate_if_asleep(host: ObjectHost, generation: int, since: float | None) -> None:
    """Production hibernates an object that had nothing pending but its alarm
    for 10 s: its instance goes, its memory with it, and its storage stays."""
    if generation == host.generation and host.instance is not None and host._awake.asleep_since == since:
        host.stats.hibernations += 1
        host.evict(HIBERNATED_MESSAGE, counted=False)


async def _as_coroutine(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _silence(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
