"""The gates of one Durable Object: the input gate, the implicit write batch and the output gate.

Lives here: the input gate (no other event is delivered while a storage
operation is under way), the storage transactions (their SQL and the alarm
they stage roll back together), and the implicit write batch, which
commits on the next turn of the event loop and which the output gate waits
for, so that no reply is seen before the writes it reports are durable.
``ObjectHost`` takes all of this from ``ObjectGates``.
Must not know: events, RPC calls, or how the alarm runs; a batch that
commits hands the alarm it staged to the alarm's timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ._alarms import _UNSET
from ._errors import reset_error

if TYPE_CHECKING:
    from ._clock import RuntimeLoop
    from ._host import HostServices
    from ._sql import SqlDatabase


class ObjectGates:
    """The gates and the write batch of an ``ObjectHost``."""

    if TYPE_CHECKING:  # what these methods use of the host they are part of
        _services: HostServices
        db: SqlDatabase
        class_name: str
        generation: int
        reset_reason: str
        _gate_depth: int
        _gate_waiters: list[asyncio.Future[None]]
        _commit_handle: asyncio.Handle | None
        _batches_opened: int
        _last_lost_batch: int
        _commit_waiters: list[asyncio.Future[None]]
        alarm_at: float | None
        _staged_alarm: Any
        _alarm_retry: int

        @property
        def loop(self) -> RuntimeLoop: ...

        def evict(self, reason: str = ..., counted: bool = ...) -> None: ...

        def _arm_alarm_timer(self) -> None: ...

    # -- input gate -----------------------------------------------------
    async def wait_gate_open(self) -> None:
        while self._gate_depth > 0:
            waiter = self.loop.create_future()
            self._gate_waiters.append(waiter)
            await waiter

    def close_gate(self) -> None:
        self._gate_depth += 1

    def open_gate(self, generation: int) -> None:
        if generation == self.generation and self._gate_depth > 0:
            self._gate_depth -= 1
            if self._gate_depth == 0:
                self._wake_gate_waiters()

    def _wake_gate_waiters(self) -> None:
        waiters, self._gate_waiters = self._gate_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    @contextlib.asynccontextmanager
    async def input_gate_closed(self) -> AsyncIterator[None]:
        """A storage operation: no other event is delivered until it is done."""
        generation = self.generation
        self.close_gate()
        try:
            await asyncio.sleep(0)
            yield
        finally:
            self.open_gate(generation)

    async def storage_round_trip(self) -> None:
        async with self.input_gate_closed():
            pass

    def run_transaction_sync(self, fn: Callable[[], Any]) -> Any:
        """``transactionSync``: SQL and the staged alarm roll back together."""
        staged = self._staged_alarm
        try:
            return self.db.run_in_savepoint(fn)
        except BaseException:
            self._staged_alarm = staged
            raise

    async def run_transaction(self, fn: Callable[[Any], Awaitable[Any]], txn: Any) -> Any:
        """``storage.transaction(fn)``: the savepoint stays open across fn's awaits,
        and the batch does not commit before it closes."""
        staged = self._staged_alarm
        name = self.db.begin_savepoint()
        try:
            result = fn(txn)
            if inspect.isawaitable(result):
                result = await result
        except BaseException:
            if self.db.in_batch:
                self.db.end_savepoint(name, rollback=True)
                self._staged_alarm = staged
            raise
        self.db.end_savepoint(name, rollback=False)
        return result

    # -- implicit write batch and output gate ---------------------------
    def _batch_opened(self) -> None:
        self._batches_opened += 1
        # Production commits the implicit transaction on the next turn of
        # the event loop: every await that suspends ends the batch.
        self._commit_handle = self.loop.call_soon(self._commit)

    def _commit(self) -> None:
        self._commit_handle = None
        if not self.db.in_batch:
            return
        if self._services.faults.crash_before_commit(self.class_name):
            self.evict("Durable Object reset: the instance crashed before its writes committed.")
            return
        self.db.commit_batch()
        if self.db.in_batch:  # a savepoint is still open: try again next turn
            self._commit_handle = self.loop.call_soon(self._commit)
            return
        if self._staged_alarm is not _UNSET:
            self.alarm_at, self._staged_alarm = self._staged_alarm, _UNSET
            self._alarm_retry = 0
            self._arm_alarm_timer()
        waiters, self._commit_waiters = self._commit_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def batch_mark(self) -> int:
        return self._batches_opened

    async def flushed(self, since: int | None = None) -> None:
        """Wait until every write made so far is durable (the output gate).

        With ``since`` (a ``batch_mark()`` taken before an event ran), fail
        if any write batch opened after it was lost: the event's effects are
        gone, so its reply must not be seen.
        """
        if self.db.in_batch:
            waiter = self.loop.create_future()
            self._commit_waiters.append(waiter)
            await waiter
        if since is not None and self._last_lost_batch > since:
            raise reset_error(self.reset_reason)
