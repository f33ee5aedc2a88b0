"""The semaphore as user code meets it: ``semaphore(...)``, ``hold``, ``try_hold``, ``run``, ``try_run``.

Lives here: opening a semaphore (options checked before any call is made),
``Hold``, the async context manager that acquires a place from the key's
holder object (long waits in bounded calls, retries under the same request
id) and frees it, and the function form of the previous release
(``hold(key, fn)``), kept for one more. The permit it gives, with its
renewal task and its ``lost`` signal, lives in ``permit``; how calls are
timed and retried, in ``timing``. Must not know: the holder's rules or
storage; it speaks only the messages of ``messages``, in their
milliseconds, and takes seconds from its callers (``options`` converts
them).
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import math
import secrets
import warnings
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from types import TracebackType
from typing import Any, Literal, TypeVar, TypeVarTuple, Unpack, overload

from .._common.calls import retryable
from .._common.clock import now_ms
from . import messages as m
from .options import (
    Duration,
    HolderRefused,
    HoldOptions,
    InvalidOption,
    PlaceLost,
    SemaphoreError,
    WaitTimeout,
    WouldBlock,
    check_key,
    check_name,
    parse_optional_ms,
)
from .permit import (
    EXPIRED as EXPIRED,
    MAX_HOLD as MAX_HOLD,
    RENEWAL_FAILED as RENEWAL_FAILED,
    REVOKED as REVOKED,
    LossReason as LossReason,
    Permit as Permit,
)
from .results import Tried, Usage
from .timing import CALL_SLACK_MS, MIN_ATTEMPTS, RELEASE_ATTEMPTS, _backoff

log = logging.getLogger("durability.locks")

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class _FromOpen(enum.Enum):
    FROM_OPEN = "as the open says"


#: The default of a call's ``wait`` and ``max_hold``: the value given to ``semaphore(...)``.
FROM_OPEN = _FromOpen.FROM_OPEN
#: A call's ``wait`` or ``max_hold``: a duration, None for no bound, or ``FROM_OPEN``.
CallDuration = Duration | None | Literal[_FromOpen.FROM_OPEN]


def semaphore(namespace: Any, name: str, *, limit: int, ttl: Duration = 30.0, wait: Duration | None = None,
              max_hold: Duration | None = None, rate: Any = None) -> Semaphore:
    """Open the semaphore ``name`` over the holder objects of ``namespace`` (e.g. ``env.UPLOADS``).

    Durations are seconds (``30``, ``0.5``), a string with a unit (``"30s"``,
    ``"500ms"``, ``"2m"``) or a ``timedelta``.

    Args:
        limit: how many may hold a key at once through this open, 1 to 1,000.
        ttl: the lease of a place, 0.1 s to 24 h, renewed while its holder's
            code runs; a holder that stops renewing loses its place this long
            after its last renewal.
        wait: the longest time ``hold`` stands in line (None: as long as it takes).
        max_hold: the longest time a place is kept (None: while the code runs).
        rate: at most this many holds of a key start per period, next to
            ``limit``: ``"60/min"``, ``"5/s, burst 10"``, ``(60, 60_000)``
            (None: no rate). A hold waits in line for the window as it waits
            for a place; exact in every window (see docs/locks.md).
    """
    return Semaphore(namespace, name, limit=limit, ttl=ttl, wait=wait, max_hold=max_hold, rate=rate)


class Semaphore:
    """The places of one semaphore name, per key, by this open's limit, ttl, wait and max_hold."""

    def __init__(self, namespace: Any, name: str, *, limit: int, ttl: Duration = 30.0,
                 wait: Duration | None = None, max_hold: Duration | None = None, rate: Any = None) -> None:
        if not callable(getattr(namespace, "getByName", None)):
            raise InvalidOption(f"a semaphore needs a Durable Object namespace such as env.UPLOADS, not {namespace!r}")
        self.namespace = namespace
        self.name = check_name(name)
        self.options = HoldOptions.parse(limit=limit, ttl=ttl, wait=wait, max_hold=max_hold, rate=rate)

    def __repr__(self) -> str:
        return f"semaphore({self.name!r}, limit={self.options.limit})"

    # -- the public calls --------------------------------------------------------
    @overload
    def hold(self, key: str, *, wait: CallDuration = FROM_OPEN, max_hold: CallDuration = FROM_OPEN) -> Hold: ...

    @overload
    def hold(self, key: str, fn: Callable[..., Any], *, wait: CallDuration = FROM_OPEN,
             max_hold: CallDuration = FROM_OPEN) -> Coroutine[Any, Any, Any]: ...

    def hold(self, key: str, fn: Callable[..., Any] | None = None, *, wait: CallDuration = FROM_OPEN,
             max_hold: CallDuration = FROM_OPEN) -> Hold | Coroutine[Any, Any, Any]:
        """``async with sem.hold(key) as permit:`` holds a place of ``key`` while the block runs.

        Entering stands in line for the place (``WaitTimeout`` after
        ``wait``); leaving frees it. If the place is lost meanwhile, the
        permit says so at once and ``PlaceLost`` is raised when the block
        ends (unless it raised something else). The key and options are
        checked here, before any call. ``hold(key, fn)`` is the previous
        release's function form, deprecated: use ``await sem.run(key, fn)``.
        """
        hold = Hold(self, check_key(key), self._options(wait, max_hold), trying=False)
        return hold if fn is None else _function_form(hold, fn, "hold", "run")

    @overload
    def try_hold(self, key: str, *, max_hold: CallDuration = FROM_OPEN) -> Hold: ...

    @overload
    def try_hold(self, key: str, fn: Callable[..., Any], *,
                 max_hold: CallDuration = FROM_OPEN) -> Coroutine[Any, Any, Tried[Any]]: ...

    def try_hold(self, key: str, fn: Callable[..., Any] | None = None, *,
                 max_hold: CallDuration = FROM_OPEN) -> Hold | Coroutine[Any, Any, Tried[Any]]:
        """``async with sem.try_hold(key) as permit:`` like ``hold``, without standing in line.

        Entering raises ``WouldBlock`` when no place is free at once (every
        place is taken, or a waiter stands in line first), so the block runs
        only with a place. ``await sem.try_run(key, fn)`` says so by its
        value instead. ``try_hold(key, fn)`` is deprecated: use ``try_run``.
        """
        hold = Hold(self, check_key(key), self._options(0, max_hold), trying=True)
        return hold if fn is None else _function_form(hold, fn, "try_hold", "try_run")

    @overload
    async def run(self, key: str, fn: Callable[[Unpack[Ts]], Awaitable[T]], *args: Unpack[Ts],
                  wait: CallDuration = FROM_OPEN, max_hold: CallDuration = FROM_OPEN) -> T: ...

    @overload
    async def run(self, key: str, fn: Callable[[Unpack[Ts]], T], *args: Unpack[Ts],
                  wait: CallDuration = FROM_OPEN, max_hold: CallDuration = FROM_OPEN) -> T: ...

    async def run(self, key: str, fn: Callable[[Unpack[Ts]], Any], *args: Unpack[Ts],
                  wait: CallDuration = FROM_OPEN, max_hold: CallDuration = FROM_OPEN) -> Any:
        """``await sem.run(key, fn, *args)``: ``fn(*args)`` inside a place of ``key``; returns its result.

        As ``async with sem.hold(key)`` around the call, and awaits what
        ``fn`` returns if it is awaitable. Code that needs the permit (to
        check ``lost()`` before an effect) holds the place with ``hold``.
        """
        return await self.hold(key, wait=wait, max_hold=max_hold)._run(lambda _permit: fn(*args))

    @overload
    async def try_run(self, key: str, fn: Callable[[Unpack[Ts]], Awaitable[T]], *args: Unpack[Ts],
                      max_hold: CallDuration = FROM_OPEN) -> Tried[T]: ...

    @overload
    async def try_run(self, key: str, fn: Callable[[Unpack[Ts]], T], *args: Unpack[Ts],
                      max_hold: CallDuration = FROM_OPEN) -> Tried[T]: ...

    async def try_run(self, key: str, fn: Callable[[Unpack[Ts]], Any], *args: Unpack[Ts],
                      max_hold: CallDuration = FROM_OPEN) -> Tried[Any]:
        """``await sem.try_run(key, fn, *args)``: ``Tried(True, result)``, or ``Tried(False)``
        without calling ``fn`` when no place is free at once."""
        return await self.try_hold(key, max_hold=max_hold)._try_run(lambda _permit: fn(*args))

    async def usage(self, key: str) -> Usage:
        """What the key's holder object says: places held (with seconds held and left), calls waiting."""
        return Usage.from_reply(await self._stub(check_key(key)).semaphore_usage())

    # -- internals -------------------------------------------------------------------
    def _options(self, wait: CallDuration, max_hold: CallDuration) -> HoldOptions:
        options = self.options
        if wait is not FROM_OPEN:
            options = replace(options, wait_ms=parse_optional_ms(wait, "wait", allow_zero=True))
        if max_hold is not FROM_OPEN:
            options = replace(options, max_hold_ms=parse_optional_ms(max_hold, "max_hold", allow_zero=False))
        return options

    def _stub(self, key: str) -> Any:
        # A fresh stub per call: a stub is broken once a call on it fails.
        return self.namespace.getByName(f"{self.name}:{key}")

    async def _call(self, key: str, method: str, message: dict[str, Any], timeout_ms: float | None) -> m.HolderReply:
        """The holder's reply, read; a reply that is not well formed reads as a refusal."""
        call = getattr(self._stub(key), method)(message)
        reply = await (call if timeout_ms is None else asyncio.wait_for(call, timeout_ms / 1000))
        try:
            return m.HolderReply.parse(reply)
        except m.ProtocolError as error:
            return m.HolderReply(m.ERROR, refused=error)

    async def _acquire(self, key: str, options: HoldOptions) -> Permit | None:
        """A place, or None when the wait ran out; raises ``HolderRefused`` on a refused message."""
        request_id = secrets.token_hex(16)
        deadline = None if options.wait_ms is None else now_ms() + options.wait_ms
        failures = 0
        try:
            while True:
                sent = now_ms()
                remaining = math.inf if deadline is None else max(0.0, deadline - sent)
                call_wait_ms = min(remaining, m.MAX_CALL_WAIT_MS)
                message = m.Acquire(request_id, options.limit, options.ttl_ms, call_wait_ms,
                                    remaining > m.MAX_CALL_WAIT_MS, options.max_hold_ms, options.rate).to_wire()
                try:
                    reply = await self._call(key, "semaphore_acquire", message, call_wait_ms + CALL_SLACK_MS)
                except Exception as error:
                    if not retryable(error):
                        raise
                    failures += 1
                    if failures >= MIN_ATTEMPTS and deadline is not None and now_ms() >= deadline:
                        await self._cancel(key, request_id)
                        return None
                    await asyncio.sleep(_backoff(failures - 1) / 1000)
                    continue
                failures = 0
                if reply.status == m.GRANTED and reply.token is not None:
                    if reply.start_by_ms is not None and now_ms() > sent + reply.start_by_ms:
                        # Under a start rate, a place that came too late to start
                        # within its window is given back (counted from ``sent``, as
                        # the lease is); the hold stands in line again.
                        await self._release(key, reply.token)
                        request_id = secrets.token_hex(16)
                        continue
                    # The holder counts the lease from the call's arrival, which is no
                    # earlier than ``sent``: counted from ``sent``, it ends no later.
                    return Permit(self, key, reply.token, sent + reply.lease_ms, reply.final, options)
                if reply.status == m.TIMEOUT:
                    return None
                if reply.status == m.PENDING:
                    continue
                refused = reply.refused or m.ProtocolError(m.INVALID_MESSAGE, f"{reply.status} is no answer to acquire")
                raise HolderRefused(refused.code, str(refused))
        except asyncio.CancelledError:
            # The caller gave up: leave the line, and free a place granted meanwhile.
            asyncio.ensure_future(self._cancel(key, request_id))
            raise

    async def _cancel(self, key: str, request_id: str) -> None:
        try:
            await self._call(key, "semaphore_cancel", m.cancel_message(request_id), CALL_SLACK_MS)
        except Exception as error:  # the lease ends any place it leaves behind
            log.warning("semaphore %s: cancel of %s failed: %r", self.name, key, error)

    async def _release(self, key: str, token: str) -> None:
        for attempt in range(RELEASE_ATTEMPTS):
            try:
                await self._call(key, "semaphore_release", m.token_message(token), CALL_SLACK_MS)
                return
            except Exception as error:
                if not retryable(error) or attempt == RELEASE_ATTEMPTS - 1:
                    # Not fatal: the place is freed when its lease ends.
                    log.warning("semaphore %s: release of %s failed: %r", self.name, key, error)
                    return
                await asyncio.sleep(_backoff(attempt) / 1000)


class Hold:
    """A place of one key, held around a block: ``async with sem.hold(key) as permit:``.

    ``hold`` and ``try_hold`` make it, with the key and options checked.
    Entering stands in line (``WaitTimeout`` after ``wait``) or, made by
    ``try_hold``, takes a place free at once or raises ``WouldBlock``;
    either way the block runs only with a place. Leaving frees the place,
    and raises ``PlaceLost`` if it was lost meanwhile and the block raised
    nothing else. One place at a time: enter it again only after leaving.
    """

    def __init__(self, semaphore: Semaphore, key: str, options: HoldOptions, *, trying: bool) -> None:
        self._semaphore = semaphore
        self._key = key
        self._options = options
        self._trying = trying
        self._in_use = False
        self._permit: Permit | None = None

    def __repr__(self) -> str:
        kind = "try_hold" if self._trying else "hold"
        return f"<{kind} {self._semaphore.name}:{self._key}>"

    async def __aenter__(self) -> Permit:
        if self._in_use:
            raise RuntimeError("this hold is already in use; call hold() again for another place")
        self._in_use = True
        try:
            permit = await self._semaphore._acquire(self._key, self._options)
        except BaseException:
            self._in_use = False
            raise
        if permit is None:
            self._in_use = False
            raise self._no_place()
        self._permit = permit
        return permit

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        permit, self._permit = self._permit, None
        self._in_use = False
        if permit is None:
            return
        lost = await permit._end()
        if lost and kind is None:
            raise PlaceLost(f"the place of {self._semaphore.name}:{self._key} was lost while held "
                            f"({permit.reason})", str(permit.reason))

    def _no_place(self) -> SemaphoreError:
        where = f"{self._semaphore.name}:{self._key}"
        if self._trying:
            return WouldBlock(f"no place of {where} is free now: every place is taken, or a call stands "
                              "in line for one first")
        return WaitTimeout(f"no place of {where} within {(self._options.wait_ms or 0) / 1_000:g} s")

    async def _run(self, fn: Callable[[Permit], Any]) -> Any:
        """``fn(permit)`` inside the place, its result awaited if it is awaitable."""
        async with self as permit:
            result = fn(permit)
            if inspect.isawaitable(result):
                result = await result
        return result

    async def _try_run(self, fn: Callable[[Permit], Any]) -> Tried[Any]:
        entered = False

        def inside(permit: Permit) -> Any:
            nonlocal entered
            entered = True
            return fn(permit)

        try:
            value = await self._run(inside)
        except WouldBlock:
            if entered:  # raised by fn itself (a try_hold of its own): not this place's answer
                raise
            return Tried(False)
        return Tried(True, value)


def _function_form(hold: Hold, fn: Callable[..., Any], old: str, new: str) -> Coroutine[Any, Any, Any]:
    """The previous release's ``hold(key, fn)`` / ``try_hold(key, fn)``, as they behaved then:
    ``fn`` gets the permit if it takes an argument. Kept for one release."""
    warnings.warn(f"sem.{old}(key, fn) is deprecated and goes in the next release: use await sem.{new}(key, fn, "
                  f"*args), whose fn gets no permit; for the permit, use async with sem.{old}(key) as permit",
                  DeprecationWarning, stacklevel=3)
    with_permit = _takes_argument(fn)

    def call(permit: Permit) -> Any:
        return fn(permit) if with_permit else fn()

    return hold._try_run(call) if hold._trying else hold._run(call)


def _takes_argument(fn: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in parameters)
