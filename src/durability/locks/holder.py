"""PlaceKeeper: the runtime side of a semaphore's holder object, one per (name, key).

Lives here: the line and its places in memory, loaded from the table once per
instance; each change written in one transaction before anyone hears of it;
the calls waiting in line (futures) and the one in-memory timer that wakes
the line when a lease ends or a waiter's time is up. Must not know: the
line's rules (``line``), the wire format (``messages``), how clients call.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .._common.clock import now_ms, sleep_until
from .._common.schema import public_migrate
from .._common.sql import Sql
from . import messages as m
from .line import Line, NotHolder, Place
from .store import COMPONENT, TABLES, PlaceStore

T = TypeVar("T")
log = logging.getLogger("durability.locks")

# A request whose client said it will call again (``more``) keeps its place in
# line this long after its call's time is up; after that it is dropped. It
# covers a client whose reply was lost: it waits its call's time plus 10 s
# of slack, then backs off up to 2 s per retry before calling again.
REJOIN_GRACE_MS = 30_000


def _new_token() -> str:
    # A capability: whoever shows it renews or frees the place. Unguessable.
    return secrets.token_hex(16)


class PlaceKeeper:
    """Answers the four semaphore messages for the key its object stands for.

    No alarm is needed: a place is free the moment its lease ends, which only
    a call can observe; while calls wait in line, an in-memory timer wakes
    the line at the next lease end. A holder restart drops that timer with
    the calls themselves, and their clients call again.
    """

    def __init__(self, ctx: Any) -> None:
        self.sql = Sql(ctx)
        self.store = PlaceStore(self.sql)
        self._line: Line | None = None
        self._calls: dict[str, list[asyncio.Future[Place | None]]] = {}  # request id -> calls waiting for it
        self._timer: asyncio.Task[None] | None = None
        self._timer_at: float | None = None

    migrate = public_migrate(COMPONENT, TABLES, "the places table")

    @property
    def line(self) -> Line:
        if self._line is None:
            held, gone = self.store.load()
            self._line = Line(held, gone)
        return self._line

    # -- messages -----------------------------------------------------------------
    async def acquire(self, message: Any) -> dict[str, Any]:
        try:
            request = m.parse_acquire(message)
        except m.ProtocolError as error:
            return error.reply()
        arrived = now_ms()
        self._settle(arrived)
        place = self.line.place_of(request.request_id)
        if place is None:  # not granted yet (a retry whose grant was lost finds its place above)
            leave_at = arrived + request.wait_ms + (REJOIN_GRACE_MS if request.more else 0)
            self.line.join(request.request_id, limit=request.limit, ttl_ms=request.ttl_ms,
                           max_hold_ms=request.max_hold_ms, now=arrived, leave_at=leave_at, rate=request.rate)
            waited = await self._wait_for_place(request, arrived)
            if isinstance(waited, dict):
                return waited
            place = waited
        start_by = None if place.start_by is None else place.start_by - arrived
        return m.granted(place.token, place.expires_at - arrived, place.final, start_by)

    async def renew(self, message: Any) -> dict[str, Any]:
        try:
            token = m.parse_token(message)
        except m.ProtocolError as error:
            return error.reply()
        now = now_ms()
        self._settle(now)
        try:
            place, write = self.line.renew(token, now)
        except NotHolder:
            return m.ProtocolError(
                m.NOT_HOLDER, "no live place holds this token: it expired, was released or was never issued"
            ).reply()
        if write:
            self._write(lambda: self.store.extend(place))
        return m.renewed(place.expires_at - now, place.final)

    async def release(self, message: Any) -> dict[str, Any]:
        try:
            token = m.parse_token(message)
        except m.ProtocolError as error:
            return error.reply()
        place = self.line.release(token)
        self._settle(now_ms(), freed=[place] if place else [])
        return m.status(m.RELEASED if place else m.NOT_HELD)

    async def cancel(self, message: Any) -> dict[str, Any]:
        try:
            request_id = m.parse_cancel(message)
        except m.ProtocolError as error:
            return error.reply()
        waiter, place = self.line.cancel(request_id)
        if waiter is not None:
            self._resolve(request_id, None)
        self._settle(now_ms(), freed=[place] if place else [])
        return m.status(m.CANCELLED, left=waiter is not None, freed=place is not None)

    def usage(self) -> dict[str, Any]:
        """Places held and calls waiting, as this holder's books say now."""
        now = now_ms()
        self._settle(now)
        return {
            "held": self.line.held(),
            "waiting": len(self.line.waiters),
            "places": [{"limit": p.limit, "heldMs": now - p.granted_at, "leaseMs": p.expires_at - now}
                       for p in self.line.places.values()],
        }

    # -- the line -------------------------------------------------------------------
    async def _wait_for_place(self, request: m.Acquire, arrived: float) -> Place | dict[str, Any]:
        future: asyncio.Future[Place | None] = asyncio.get_running_loop().create_future()
        self._calls.setdefault(request.request_id, []).append(future)
        try:
            self._settle(arrived)  # admits it now if it is first and a place is free
            if request.more:
                # This call's time ends before the request's: answer "pending" then,
                # and keep the request in line for the client's next call.
                place = await asyncio.wait_for(asyncio.shield(future), request.wait_ms / 1000)
            else:
                place = await future  # the line lets it go at its time, if not admitted before
        except TimeoutError:
            return m.status(m.PENDING)
        finally:
            calls = self._calls.get(request.request_id, [])
            if future in calls:
                calls.remove(future)
            if not calls:
                self._calls.pop(request.request_id, None)
        if place is None:
            return m.status(m.TIMEOUT, held=self.line.held(), waiting=len(self.line.waiters))
        return place

    def _settle(self, now: float, freed: Sequence[Place] = ()) -> None:
        """Bring the line to ``now``, write what changed in one transaction, then tell the calls."""
        settled = self.line.settle(now, _new_token)
        gone = [*freed, *settled.expired]
        if gone or settled.granted:
            reused = self._rows_to_reuse(settled.granted, now)

            def write() -> None:
                for place in gone:
                    self.store.delete(place)
                for place in settled.granted:
                    self.store.insert(place, over=reused.get(place.token))

            self._write(write)
        for place in settled.granted:
            self._resolve(place.request_id, place)
        for waiter in settled.left:
            self._resolve(waiter.request_id, None)
        self._arm(self.line.next_wakeup(now))

    def _rows_to_reuse(self, granted: list[Place], now: float) -> dict[str, Place]:
        """Per place granted under a start rate, a gone place out of every
        window whose row it takes over (``PlaceStore.insert``)."""
        reused: dict[str, Place] = {}
        for place in granted:
            old = self.line.reusable(now) if place.start_by is not None else None
            if old is not None:
                del self.line.gone[old.token]
                reused[place.token] = old
        return reused

    def _write(self, fn: Callable[[], T]) -> T:
        try:
            return self.sql.transaction(fn)
        except Exception as error:
            # Memory ran ahead of storage: forget it, reload on the next call, and
            # fail every waiting call (its client calls again).
            log.exception("semaphore places: write failed")
            self._line = None
            for calls in self._calls.values():
                for future in calls:
                    if not future.done():
                        future.set_exception(error)
            raise

    def _resolve(self, request_id: str, place: Place | None) -> None:
        for future in self._calls.get(request_id, []):
            if not future.done():
                future.set_result(place)

    def _arm(self, at: float | None) -> None:
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = None if at is None else asyncio.ensure_future(self._wake_at(at))

    async def _wake_at(self, at: float) -> None:
        await sleep_until(at)
        self._timer = self._timer_at = None
        self._settle(now_ms())
