"""``ctx`` and ``ctx.storage`` as one live instance of a Durable Object sees them.

Lives here: the surface user code calls (``sql.exec``, ``transactionSync``,
the alarm methods, ``waitUntil``, ``blockConcurrencyWhile``, ``ctx.id``),
each checking that its instance is still the live one, and ``StorageHost``,
the few operations it asks of the object that holds the instance.
Must not know: the host behind ``StorageHost``, how events are scheduled or
faults chosen; the host does that.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from .._common.checks import is_number
from ._sql import SqlCursor, SqlDatabase
from ._values import JsException, number_from_js


class DurableObjectId:
    """``DurableObjectId``: 64 hex digits derived from the namespace and name."""

    def __init__(self, namespace: str, name: str | None, hex_id: str | None = None) -> None:
        self.name = name
        self._hex = hex_id or hashlib.sha256(f"{namespace}\0{name}".encode()).hexdigest()

    def toString(self) -> str:
        return self._hex

    def equals(self, other: DurableObjectId) -> bool:
        return isinstance(other, DurableObjectId) and other._hex == self._hex

    def __str__(self) -> str:
        return self._hex

    def __repr__(self) -> str:
        return f"DurableObjectId({self.name or self._hex!r})"


class StorageHost(Protocol):
    """What ``ctx`` and ``ctx.storage`` ask of the object their instance lives in."""

    generation: int  #: which instance is live; a handle of an older one is dead
    object_id: DurableObjectId
    db: SqlDatabase

    def run_transaction_sync(self, fn: Callable[[], Any]) -> Any: ...

    async def run_transaction(self, fn: Callable[[Any], Awaitable[Any]], txn: Any) -> Any: ...

    def input_gate_closed(self) -> AbstractAsyncContextManager[None]: ...

    def alarm_for_reading(self) -> float | None: ...

    def stage_alarm(self, at_ms: float | None) -> None: ...

    async def storage_round_trip(self) -> None: ...

    async def flushed(self, since: int | None = None) -> None: ...

    def spawn(self, awaitable: Awaitable[Any], *, background: bool = True) -> asyncio.Task[Any]: ...

    def close_gate(self) -> None: ...

    def open_gate(self, generation: int) -> None: ...

    def evict(self, reason: str = ...) -> None: ...


def _alarm_ms(when: Any) -> float:
    if isinstance(when, datetime.datetime):
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        return float(int(when.timestamp() * 1000))
    if not is_number(when):
        raise JsException(
            "setAlarm() takes a number of milliseconds since the epoch or a datetime",
            name="TypeError",
        )
    return float(when)


class SqlStorage:
    """``ctx.storage.sql``."""

    def __init__(self, storage: DurableObjectStorage) -> None:
        self._storage = storage

    def exec(self, query: str, *bindings: Any) -> SqlCursor:
        host = self._storage._live_host()
        return host.db.exec(query, bindings)

    @property
    def databaseSize(self) -> int:
        return self._storage._live_host().db.database_size()


class DurableObjectStorage:
    """``ctx.storage`` of a SQLite-backed Durable Object."""

    def __init__(self, host: StorageHost, generation: int) -> None:
        self._host = host
        self._generation = generation
        self.sql = SqlStorage(self)

    def _live_host(self) -> StorageHost:
        host = self._host
        if host.generation != self._generation:
            raise JsException(
                "This Durable Object instance was reset; its storage handle is gone."
            )
        return host

    def transactionSync(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` (synchronous) atomically: an exception rolls it back and is re-raised."""
        return self._live_host().run_transaction_sync(fn)

    async def transaction(self, fn: Callable[[Any], Awaitable[Any]]) -> Any:
        """The async form; like production, ``fn`` must not await other I/O inside."""
        host = self._live_host()
        return await host.run_transaction(fn, self)

    async def getAlarm(self, options: Any = None) -> int | float | None:
        host = self._live_host()
        async with host.input_gate_closed():
            at = host.alarm_for_reading()
        return None if at is None else number_from_js(at)

    def setAlarm(self, scheduled_time: Any, options: Any = None) -> Awaitable[None]:
        # Like production's SQLite-backed storage, the write happens at the
        # call, in the current write batch; awaiting only waits for it.
        host = self._live_host()
        host.stage_alarm(_alarm_ms(scheduled_time))
        return host.storage_round_trip()

    def deleteAlarm(self, options: Any = None) -> Awaitable[None]:
        host = self._live_host()
        host.stage_alarm(None)
        return host.storage_round_trip()

    async def sync(self) -> None:
        host = self._live_host()
        await host.flushed()


class ExecutionContext:
    """``ctx`` of a Worker entrypoint: ``waitUntil`` and nothing durable."""

    def __init__(self, spawn: Callable[[Awaitable[Any]], Any]) -> None:
        self._spawn = spawn

    def waitUntil(self, awaitable: Awaitable[Any]) -> None:
        self._spawn(awaitable)

    def passThroughOnException(self) -> None:
        return None


class DurableObjectState:
    """``ctx`` of a Durable Object instance (``DurableObjectState``)."""

    def __init__(self, host: StorageHost, generation: int, object_id: DurableObjectId | None = None) -> None:
        self._host = host
        self._generation = generation
        self.id = host.object_id if object_id is None else object_id
        self.storage = DurableObjectStorage(host, generation)

    def waitUntil(self, awaitable: Awaitable[Any]) -> None:
        self.storage._live_host().spawn(awaitable)

    def blockConcurrencyWhile(self, fn: Callable[[], Awaitable[Any]]) -> Awaitable[Any]:
        """Hold every other event until ``fn`` finishes; the gate closes at once,
        so it works from a constructor too (where nothing can be awaited)."""
        host = self.storage._live_host()
        generation = host.generation
        host.close_gate()

        async def run() -> Any:
            try:
                return await fn()
            finally:
                host.open_gate(generation)

        return host.spawn(run(), background=False)

    def abort(self, reason: str | None = None) -> None:
        """Reset the object now, as production's ``ctx.abort()``; the calling code stops here."""
        message = reason or "Application called abort() to reset Durable Object."
        self.storage._live_host().evict(message)
        raise DurableObjectAbort(message)


class DurableObjectAbort(BaseException):
    """Raised by ``ctx.abort()``: a BaseException, so ``except Exception`` does not swallow it."""
