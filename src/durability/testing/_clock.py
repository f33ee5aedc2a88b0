"""The runtime's clocks: an asyncio event loop whose time jumps to the next
timer (virtual time, for tests), and one on real time (for local serving).

Lives here: the loops, and the patch that makes ``time.time()`` read them.
Must not know: Durable Objects, SQL, RPC. It is a clock and nothing more.

When every task is waiting and a timer is due later, the loop moves its
clock straight to that timer instead of sleeping, so an hour of simulated
traffic costs only the CPU it takes. A loop with nothing ready and no timer
can never make progress; that is a deadlock and it is reported as one.

Like Pyodide's event loop, it runs a callback due within 2 ms at once,
with the clock unmoved: code that waits a millisecond for time to pass
spins here as it would in production, instead of passing.

On virtual time, real I/O (an outbound HTTP request made in a thread)
takes real time, which no jump can skip. While any is in flight (``loop.real_time()``), the clock
follows the real one: it moves on by the real time that passes, whether the
loop waits or runs callbacks, and a timer fires when real time reaches it,
while the loop waits on its self-pipe for the I/O to finish (the thread
wakes it). Once no I/O is in flight, the clock jumps again. A request of
50 ms thus takes 50 ms of virtual time, timers due meanwhile fire in order
at their times, and a timeout on virtual time bounds a real request. A run
that makes real requests is not replayed exactly by its seed: what runs
while a request is in flight depends on how long it takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import Context
from typing import TYPE_CHECKING, Any, Protocol, TypeVarTuple, Unpack

if TYPE_CHECKING:
    from _typeshed import FileDescriptorLike

_Ts = TypeVarTuple("_Ts")  # a callback's arguments, as asyncio's call_at types them

# 2026-01-01T00:00:00Z: a fixed epoch so that every run sees the same dates.
DEFAULT_EPOCH_MS = 1_767_225_600_000
PYODIDE_IMMEDIATE_S = 0.002


class TimerOwner(Protocol):
    """Who is told of the timers code sets (an object: a pending timer keeps it awake)."""

    def timer_set(self, handle: asyncio.TimerHandle) -> None: ...

    def timer_done(self, handle: asyncio.TimerHandle) -> None: ...


class Deadlock(RuntimeError):
    """Every task waits on something that no timer or event will ever bring."""


class _VirtualSelector(selectors.BaseSelector):
    """A selector whose waits advance the clock; only while real I/O is in
    flight does it wait, on the file descriptors registered (the loop's
    self-pipe, which a thread finishing its I/O writes to)."""

    def __init__(self) -> None:
        self._real = selectors.DefaultSelector()
        self.loop: VirtualClockLoop | None = None

    def register(self, fileobj: FileDescriptorLike, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: FileDescriptorLike) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        loop = self.loop
        assert loop is not None
        if loop._real_io:
            return self._wait_real(loop, timeout)
        if timeout is None:
            raise Deadlock(
                "every task is waiting and no timer is scheduled: nothing can happen"
            )
        if timeout > 0:
            # Jump exactly to the earliest timer (its handle is at the heap head).
            # (``_scheduled`` is asyncio's private heap of TimerHandles: typeshed leaves it out.)
            earliest: asyncio.TimerHandle = loop._scheduled[0]  # type: ignore[attr-defined]
            loop._virtual_now = max(loop._virtual_now, earliest.when())
        return []

    def _wait_real(self, loop: VirtualClockLoop, timeout: float | None) -> list[tuple[selectors.SelectorKey, int]]:
        # The time spent running callbacks since the last wait passed too.
        caught_up = loop._follow_real_time()
        if timeout is not None:
            timeout = max(0.0, timeout - caught_up)
        events = self._real.select(timeout)
        loop._follow_real_time()
        if not events and timeout and loop._scheduled:  # type: ignore[attr-defined]
            # A wait that ran out: its timer is due, however the real clock rounded.
            # (A wait of 0 polls only: callbacks are ready, no timer may be skipped to.)
            earliest: asyncio.TimerHandle = loop._scheduled[0]  # type: ignore[attr-defined]
            loop._virtual_now = max(loop._virtual_now, earliest.when())
        return events

    def get_map(self) -> Mapping[FileDescriptorLike, selectors.SelectorKey]:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()


class RuntimeLoop(asyncio.SelectorEventLoop):
    """What both clocks share: Pyodide's timers, the runtime's exact timers,
    the wall clock as ``epoch_ms`` plus the loop's time, and CPU metering."""

    epoch_ms: float  #: the wall-clock milliseconds at loop time 0
    #: Set by whoever runs the loop: for a callback scheduled in ``context``,
    #: what to add its CPU seconds to (None: nothing). Every step of a task
    #: is such a callback, in the task's own context.
    meter_for: Callable[[Context], Callable[[float], None] | None] | None = None
    #: Set by whoever runs the loop: who owns a timer that code sets in
    #: ``context`` (None: the current one), told when it is set and when it
    #: fires or is cancelled (``TimerOwner``); None: nobody.
    timer_owner: Callable[[Context | None], TimerOwner | None] | None = None

    def __init__(self, selector: selectors.BaseSelector | None = None) -> None:
        super().__init__(selector=selector)
        #: code's timers whose owner is told, by id until each fires or is
        #: cancelled (handles compare by their contents, not as themselves)
        self._owned_timers: dict[int, TimerOwner] = {}

    def call_soon(
        self, callback: Callable[[Unpack[_Ts]], object], *args: Unpack[_Ts], context: Context | None = None,
    ) -> asyncio.Handle:
        meter = self.meter_for(context) if self.meter_for is not None and context is not None else None
        if meter is None:
            return super().call_soon(callback, *args, context=context)
        return super().call_soon(_metered, meter, callback, args, context=context)

    # A callback run at once gets a plain Handle, not the TimerHandle the base
    # class promises; asyncio's own callers (call_later, timeouts) only cancel it.
    def call_at(  # type: ignore[override]
        self, when: float, callback: Callable[[Unpack[_Ts]], object], *args: Unpack[_Ts],
        context: Context | None = None,
    ) -> asyncio.Handle:
        # Pyodide's scheduleCallback runs a callback due within 2 ms at once.
        # (call_later goes through here; so do asyncio.timeout and wait_for.)
        if when - self.time() <= PYODIDE_IMMEDIATE_S:
            return self.call_soon(callback, *args, context=context)
        owner = self.timer_owner(context) if self.timer_owner is not None else None
        if owner is None:
            return super().call_at(when, callback, *args, context=context)
        cell: list[asyncio.TimerHandle] = []  # the handle, for the callback to name itself
        handle = super().call_at(when, self._fire_owned, cell, callback, args, context=context)
        cell.append(handle)
        self._owned_timers[id(handle)] = owner
        owner.timer_set(handle)
        return handle

    def _fire_owned(self, cell: list[asyncio.TimerHandle], callback: Callable[..., object],
                    args: tuple[Any, ...]) -> None:
        self._release_owned(cell[0])
        callback(*args)

    def _release_owned(self, handle: asyncio.TimerHandle) -> None:
        owner = self._owned_timers.pop(id(handle), None)
        if owner is not None:
            owner.timer_done(handle)

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        super()._timer_handle_cancelled(handle)  # type: ignore[misc]  # asyncio's own hook, untyped
        self._release_owned(handle)

    # The runtime's own timers (an alarm's delivery, a call's time on the
    # network, an eviction) are workerd's, not Pyodide's: they fire at their time.
    def call_at_exact(self, when: float, callback: Callable[[Unpack[_Ts]], object], *args: Unpack[_Ts],
                      context: Context | None = None) -> asyncio.TimerHandle:
        return super().call_at(when, callback, *args, context=context)

    def call_later_exact(self, delay: float, callback: Callable[[Unpack[_Ts]], object], *args: Unpack[_Ts],
                         context: Context | None = None) -> asyncio.TimerHandle:
        return super().call_at(self.time() + delay, callback, *args, context=context)

    async def sleep_exact(self, seconds: float) -> None:
        done: asyncio.Future[None] = self.create_future()

        def wake() -> None:
            if not done.done():
                done.set_result(None)

        handle = self.call_later_exact(seconds, wake)
        try:
            await done
        finally:
            handle.cancel()

    def now_ms(self) -> float:
        """Wall-clock milliseconds since the Unix epoch, as ``Date.now()`` gives."""
        return self.epoch_ms + self.time() * 1000.0

    def loop_time_for(self, epoch_ms: float) -> float:
        """The loop time at which wall-clock ``epoch_ms`` is reached."""
        return (epoch_ms - self.epoch_ms) / 1000.0


def _metered(meter: Callable[[float], None], callback: Callable[..., object], args: tuple[Any, ...]) -> None:
    start = time.process_time()
    try:
        callback(*args)
    finally:
        meter(time.process_time() - start)


class VirtualClockLoop(RuntimeLoop):
    """An event loop on virtual time. ``loop.time()`` starts at 0 seconds."""

    def __init__(self, epoch_ms: int = DEFAULT_EPOCH_MS) -> None:
        selector = _VirtualSelector()
        self._virtual_now = 0.0
        self.epoch_ms = epoch_ms
        self._real_io = 0  # real operations in flight: the clock follows the real one
        self._real_mark = 0.0  # time.monotonic() when the clock last caught up with it
        super().__init__(selector=selector)
        selector.loop = self

    def time(self) -> float:
        return self._virtual_now

    @contextlib.contextmanager
    def real_time(self) -> Iterator[None]:
        """Around real I/O: while inside, the clock follows real time (see the module's docstring)."""
        if not self._real_io:
            self._real_mark = time.monotonic()
        self._real_io += 1
        try:
            yield
        finally:
            self._follow_real_time()
            self._real_io -= 1

    def _follow_real_time(self) -> float:
        """Move the clock on by the real time since it last did; return that time."""
        now = time.monotonic()
        passed = max(0.0, now - self._real_mark)
        self._real_mark = now
        self._virtual_now += passed
        return passed


class RealClockLoop(RuntimeLoop):
    """An event loop on real time, with real sockets: for serving a Worker
    locally. The wall clock it gives is read once, at its start, and then
    advanced by the monotonic clock, so ``time.time()`` never steps back."""

    def __init__(self) -> None:
        super().__init__()
        self.epoch_ms = time.time() * 1000.0 - self.time() * 1000.0


@contextlib.contextmanager
def patched_wall_clock(loop: RuntimeLoop) -> Iterator[None]:
    """Make ``time.time()`` and ``time.time_ns()`` read the loop's clock.

    Code that bound ``from time import time`` before the patch keeps the real
    clock; the library and the example Worker always call ``time.time()``.
    """
    real_time, real_time_ns = time.time, time.time_ns
    time.time = lambda: loop.now_ms() / 1000.0
    time.time_ns = lambda: int(loop.now_ms() * 1_000_000)
    try:
        yield
    finally:
        time.time, time.time_ns = real_time, real_time_ns
