"""The semaphore as user code meets it: ``semaphore(...)``, ``hold``, ``try_hold`` and the permit.

Lives here: opening a semaphore (options checked before any call is made),
acquiring a place from the key's holder object (long waits in bounded
calls, retries under the same request id), the permit with its renewal
task and its ``lost`` signal, and releasing. Must not know: the holder's
rules or storage; it speaks only the messages of ``messages``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import secrets
from dataclasses import dataclass, replace
from typing import Any, Callable

from .._clock import now_ms, sleep_until
from . import messages as m
from .options import (
    HoldOptions,
    HolderRefused,
    InvalidOption,
    PlaceLost,
    WaitTimeout,
    check_key,
    check_name,
    parse_optional,
)

log = logging.getLogger("durability.locks")

# A call may take this much longer than it asked to wait before the client
# stops waiting for its reply and calls again under the same request id.
CALL_SLACK_MS = 10_000
# Retries after a lost call: quick at first, never slower than this.
RETRY_FIRST_MS = 100
RETRY_MAX_MS = 2_000
# Even a try, or a wait that has run out, retries a lost call this many times:
# a lost reply says nothing about whether a place was free.
MIN_ATTEMPTS = 3
RELEASE_ATTEMPTS = 3

_SAME: Any = object()

# Why a permit was lost.
EXPIRED = "expired"  #: its lease ended with no renewal tried in time (the holder's code stalled)
RENEWAL_FAILED = "renewal_failed"  #: renewals were tried and failed until the lease ended
MAX_HOLD = "max_hold"  #: it reached max_hold
REVOKED = "revoked"  #: the holder object no longer knows the place


def _retryable(error: BaseException) -> bool:
    """A call that may not have run, or whose reply was lost: call again."""
    if isinstance(error, asyncio.TimeoutError):
        return True
    for source in (error, getattr(error, "js_error", None)):
        if source is not None and (getattr(source, "retryable", False) or getattr(source, "durableObjectReset", False)):
            return True
    return False


def _backoff(attempt: int) -> float:
    return min(RETRY_MAX_MS, RETRY_FIRST_MS * 2 ** attempt)


@dataclass(frozen=True)
class Tried:
    """What ``await sem.try_hold(key, fn)`` returns: whether a place was free, and ``fn``'s result."""

    acquired: bool
    value: Any = None


def semaphore(namespace: Any, name: str, *, limit: int, ttl: Any = "30s", wait: Any = None,
              max_hold: Any = None) -> "Semaphore":
    """Open the semaphore ``name`` over the holder objects of ``namespace`` (e.g. ``env.UPLOADS``).

    Args:
        limit: how many may hold a key at once through this open, 1 to 1,000.
        ttl: the lease of a place, renewed while its holder's code runs; a
            holder that stops renewing loses its place this long after its
            last renewal. "30s", "500ms", "2m", a number of ms or a timedelta.
        wait: the longest time ``hold`` stands in line (None: as long as it takes).
        max_hold: the longest time a place is kept (None: while the code runs).
    """
    return Semaphore(namespace, name, limit=limit, ttl=ttl, wait=wait, max_hold=max_hold)


class Semaphore:
    def __init__(self, namespace: Any, name: str, *, limit: int, ttl: Any = "30s", wait: Any = None,
                 max_hold: Any = None) -> None:
        if not callable(getattr(namespace, "getByName", None)):
            raise InvalidOption(f"a semaphore needs a Durable Object namespace such as env.UPLOADS, not {namespace!r}")
        self.namespace = namespace
        self.name = check_name(name)
        self.options = HoldOptions.parse(limit=limit, ttl=ttl, wait=wait, max_hold=max_hold)

    def __repr__(self) -> str:
        return f"semaphore({self.name!r}, limit={self.options.limit})"

    # -- the public calls --------------------------------------------------------
    def hold(self, key: str, fn: Callable[..., Any] | None = None, *, wait: Any = _SAME,
             max_hold: Any = _SAME) -> Any:
        """``async with sem.hold(key) as permit:`` or ``await sem.hold(key, fn)``.

        Stands in line for a place of ``key`` (``WaitTimeout`` after ``wait``),
        holds it while the block or ``fn`` runs, and frees it after. ``fn`` is
        called with the permit if it takes an argument. If the place is lost
        meanwhile, the permit says so at once and ``PlaceLost`` is raised
        when the block ends (unless it raised something else).
        """
        hold = _Hold(self, check_key(key), self._options(wait, max_hold), trying=False)
        return hold if fn is None else hold.run(fn)

    def try_hold(self, key: str, fn: Callable[..., Any] | None = None, *, max_hold: Any = _SAME) -> Any:
        """Like ``hold`` without standing in line: the permit is None when every place is taken.

        ``await sem.try_hold(key, fn)`` returns a ``Tried(acquired, value)``.
        """
        hold = _Hold(self, check_key(key), self._options(0, max_hold), trying=True)
        return hold if fn is None else hold.run(fn)

    async def usage(self, key: str) -> dict[str, Any]:
        """What the key's holder object says: places held, calls waiting."""
        return dict(await self._stub(check_key(key)).semaphore_usage())

    # -- internals -------------------------------------------------------------------
    def _options(self, wait: Any, max_hold: Any) -> HoldOptions:
        options = self.options
        if wait is not _SAME:
            options = replace(options, wait_ms=parse_optional(wait, "wait", allow_zero=True))
        if max_hold is not _SAME:
            options = replace(options, max_hold_ms=parse_optional(max_hold, "max_hold", allow_zero=False))
        return options

    def _stub(self, key: str) -> Any:
        # A fresh stub per call: a stub is broken once a call on it fails.
        return self.namespace.getByName(f"{self.name}:{key}")

    async def _call(self, key: str, method: str, message: dict, timeout_ms: float | None) -> dict:
        call = getattr(self._stub(key), method)(message)
        reply = await (call if timeout_ms is None else asyncio.wait_for(call, timeout_ms / 1000))
        return dict(reply)

    async def _acquire(self, key: str, options: HoldOptions) -> "Permit | None":
        """A place, or None when the wait ran out; raises ``HolderRefused`` on a refused message."""
        request_id = secrets.token_hex(16)
        deadline = None if options.wait_ms is None else now_ms() + options.wait_ms
        failures = 0
        try:
            while True:
                sent = now_ms()
                remaining = math.inf if deadline is None else max(0.0, deadline - sent)
                message = {
                    "v": m.VERSION, "requestId": request_id, "limit": options.limit, "ttlMs": options.ttl_ms,
                    "waitMs": min(remaining, m.MAX_CALL_WAIT_MS), "more": remaining > m.MAX_CALL_WAIT_MS,
                    "maxHoldMs": options.max_hold_ms,
                }
                try:
                    reply = await self._call(key, "semaphore_acquire", message,
                                             message["waitMs"] + CALL_SLACK_MS)
                except Exception as error:
                    if not _retryable(error):
                        raise
                    failures += 1
                    if failures >= MIN_ATTEMPTS and deadline is not None and now_ms() >= deadline:
                        await self._cancel(key, request_id)
                        return None
                    await asyncio.sleep(_backoff(failures - 1) / 1000)
                    continue
                failures = 0
                status = reply.get("status")
                if status == m.GRANTED:
                    # The holder counts the lease from the call's arrival, which is no
                    # earlier than ``sent``: counted from ``sent``, it ends no later.
                    return Permit(self, key, reply["token"], sent + reply["leaseMs"], bool(reply["final"]), options)
                if status == m.TIMEOUT:
                    return None
                if status == m.PENDING:
                    continue
                raise HolderRefused(reply.get("code", "unknown"), reply.get("message", repr(reply)))
        except asyncio.CancelledError:
            # The caller gave up: leave the line, and free a place granted meanwhile.
            asyncio.ensure_future(self._cancel(key, request_id))
            raise

    async def _cancel(self, key: str, request_id: str) -> None:
        try:
            await self._call(key, "semaphore_cancel", {"v": m.VERSION, "requestId": request_id}, CALL_SLACK_MS)
        except Exception as error:  # the lease ends any place it leaves behind
            log.warning("semaphore %s: cancel of %s failed: %r", self.name, key, error)

    async def _release(self, key: str, token: str) -> None:
        for attempt in range(RELEASE_ATTEMPTS):
            try:
                await self._call(key, "semaphore_release", {"v": m.VERSION, "token": token}, CALL_SLACK_MS)
                return
            except Exception as error:
                if not _retryable(error) or attempt == RELEASE_ATTEMPTS - 1:
                    # Not fatal: the place is freed when its lease ends.
                    log.warning("semaphore %s: release of %s failed: %r", self.name, key, error)
                    return
                await asyncio.sleep(_backoff(attempt) / 1000)


class Permit:
    """A place held. ``lost()`` / ``signal`` tell its code when the place is no longer its own.

    Attributes:
        key: the key it holds a place of.
        signal: an ``asyncio.Event`` set when the place is lost.
        reason: why it was lost (``expired``, ``renewal_failed``, ``max_hold``,
            ``revoked``), None while it holds.
        valid_until: epoch ms until which the place is surely this permit's;
            renewals move it later.
    """

    def __init__(self, semaphore: Semaphore, key: str, token: str, valid_until: float, final: bool,
                 options: HoldOptions) -> None:
        self.key = key
        self.signal = asyncio.Event()
        self.reason: str | None = None
        self.valid_until = valid_until
        self._semaphore = semaphore
        self._token = token
        self._final = final
        self._options = options
        self._ended = False
        self._renewal_failed = False  #: the last renewal did not go through
        self._renewals = asyncio.ensure_future(self._renew_until_lost())

    def __repr__(self) -> str:
        state = f"lost ({self.reason})" if self.reason else "held"
        return f"<Permit {self._semaphore.name}:{self.key} {state}>"

    def lost(self) -> bool:
        """True once the place may be someone else's. Reads the clock, so a stall is seen at once."""
        if not self._ended and self.reason is None and now_ms() >= self.valid_until:
            self._lose(MAX_HOLD if self._final else RENEWAL_FAILED if self._renewal_failed else EXPIRED)
        return self.reason is not None

    def check(self) -> None:
        """Raise ``PlaceLost`` if the place is lost: call it before an effect that needs the place."""
        if self.lost():
            raise PlaceLost(f"the place of {self._semaphore.name}:{self.key} was lost ({self.reason})", self.reason)

    def _lose(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            self.signal.set()

    async def _renew_until_lost(self) -> None:
        interval = self._options.ttl_ms / 3  # two more chances before the lease ends
        retry = min(RETRY_MAX_MS, interval / 3)
        next_at = now_ms() + interval
        while True:
            if self._final:  # max_hold reached: nothing to renew, the lease runs out
                await sleep_until(self.valid_until)
                self.lost()
                return
            await sleep_until(min(next_at, self.valid_until))
            sent = now_ms()
            if sent >= self.valid_until:  # renewals failed, or this code did not run in time
                self._lose(RENEWAL_FAILED if self._renewal_failed else EXPIRED)
                return
            try:
                reply = await self._semaphore._call(
                    self.key, "semaphore_renew", {"v": m.VERSION, "token": self._token}, self.valid_until - sent
                )
            except Exception as error:  # lost, late or failing: try again soon, until the lease ends
                log.info("semaphore %s: renewal of %s failed: %r", self._semaphore.name, self.key, error)
                self._renewal_failed, next_at = True, now_ms() + retry
                continue
            if reply.get("status") == m.RENEWED:
                self._renewal_failed, next_at = False, sent + interval
                self.valid_until = max(self.valid_until, sent + reply["leaseMs"])
                self._final = bool(reply["final"])
            elif reply.get("code") == m.NOT_HOLDER:
                self._lose(REVOKED)
                return
            else:
                self._renewal_failed, next_at = True, now_ms() + retry

    async def _end(self) -> bool:
        """Stop renewing and free the place; return whether it was lost before."""
        lost = self.lost()
        self._ended = True
        self._renewals.cancel()
        await asyncio.gather(self._renewals, return_exceptions=True)
        # Even a lost place is released: the holder may still count it (a
        # renewal whose reply was lost moved its lease), and this frees it now.
        await self._semaphore._release(self.key, self._token)
        return lost


class _Hold:
    """The object ``hold`` / ``try_hold`` return: an async context manager, or ``run(fn)``."""

    def __init__(self, semaphore: Semaphore, key: str, options: HoldOptions, trying: bool) -> None:
        self._semaphore = semaphore
        self._key = key
        self._options = options
        self._trying = trying
        self._permit: Permit | None = None

    async def __aenter__(self) -> Permit | None:
        if self._permit is not None:
            raise RuntimeError("this hold is already in use; call hold() again for another place")
        self._permit = await self._semaphore._acquire(self._key, self._options)
        if self._permit is None and not self._trying:
            raise WaitTimeout(f"no place of {self._semaphore.name}:{self._key} within "
                              f"{self._options.wait_ms:g} ms")
        return self._permit

    async def __aexit__(self, kind: Any, error: Any, traceback: Any) -> bool:
        permit = self._permit
        if permit is None:
            return False
        lost = await permit._end()
        if lost and kind is None:
            raise PlaceLost(f"the place of {self._semaphore.name}:{self._key} was lost while held "
                            f"({permit.reason})", permit.reason)
        return False

    async def run(self, fn: Callable[..., Any]) -> Any:
        async with self as permit:
            if permit is None:
                return Tried(False)
            result = fn(permit) if _takes_argument(fn) else fn()
            if inspect.isawaitable(result):
                result = await result
        return Tried(True, result) if self._trying else result


def _takes_argument(fn: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in parameters)
