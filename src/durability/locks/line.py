"""The holder's admission rules for one key: places, the line of waiters, leases and expiry.

Lives here: ``Line``, a small state machine over plain values: who holds a
place and until when, who waits and until when, first come first served
admission by each waiter's own limit, renewal, release and cancellation.
Every method takes ``now`` (epoch ms) and returns what changed, so the
caller can write it. Must not know: storage, RPC, futures or the clock.

Rules:

- A place is free at the moment its lease expires, not before: ``expires_at``
  only moves later (renewal), and only the holder's own token moves it.
- The line is strictly first come first served. The waiter at its head is
  admitted when fewer places are held than *its* limit (the limit of the
  open it came through); nobody behind it is admitted before it, even one
  whose larger limit would let it in. A smaller limit therefore never
  starves, and never sends a holder away: it only lets fewer in.
- A waiter whose open has a start rate is admitted only while fewer than
  the rate's ``limit + burst`` places, held or gone, were granted within
  its period before now (each counted from ``RATE_START_MS`` past its
  grant, the latest its work may start); the line waits for the window
  as it waits for a place, first come first served.
- The table keeps a lease end at least as late as the one in memory
  (``stored_until``), written half a lease ahead so that only about every
  other renewal costs a write. A restarted holder reads that later end: it
  may keep a dead place a little longer, never free a live one early.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .._common.rates import Rate

#: a hold under a start rate starts within this of its grant, on the holder's
#: clock, or gives its place back (its client checks, counting from the time
#: it sent the call): a place counts in its window that much past its grant
RATE_START_MS = 1_000.0


@dataclass
class Place:
    token: str  #: the holder's secret for this place: renewals and release must show it
    request_id: str  #: the client's id of the acquire that got it (found again on a retry)
    limit: int  #: the limit of the open that admitted it
    ttl_ms: float
    granted_at: float
    expires_at: float  #: the lease's end; the place is free from this moment
    hold_until: float | None  #: granted_at + max_hold: renewals never go past it
    stored_until: float  #: the lease end the table holds, never earlier than expires_at
    #: under a start rate: the work starts by then or gives the place back
    #: (``RATE_START_MS`` past its grant), and it counts in its rate's window
    #: until ``start_by + period_ms``, gone or not; None: no rate
    start_by: float | None = None
    period_ms: float = 0.0

    @property
    def final(self) -> bool:
        """True once the lease cannot be renewed any further (it reached ``max_hold``)."""
        return self.hold_until is not None and self.expires_at >= self.hold_until


@dataclass
class Waiter:
    request_id: str
    limit: int
    ttl_ms: float
    max_hold_ms: float | None
    arrived_at: float
    leave_at: float  #: it leaves the line at this time unless admitted first
    rate: Rate | None = None  #: its open's start rate


def lease_end(now: float, ttl_ms: float, hold_until: float | None) -> float:
    end = now + ttl_ms
    return end if hold_until is None else min(end, hold_until)


def stored_end(now: float, ttl_ms: float, hold_until: float | None) -> float:
    """The end written to the table: half a lease beyond the real one (see the module notes)."""
    return lease_end(now, ttl_ms * 1.5, hold_until)


@dataclass
class Settled:
    """What one ``settle`` changed."""

    expired: list[Place]
    granted: list[Place]
    left: list[Waiter]


class NotHolder(LookupError):
    """No live place has this token: it expired, was released, or was never issued."""


class Line:
    """The places and the waiting line of one key."""

    def __init__(self, places: Iterable[Place] = (), gone: Iterable[Place] = ()) -> None:
        self.places: dict[str, Place] = {}
        self._tokens: dict[str, str] = {}  # request id -> token
        self.waiters: list[Waiter] = []
        #: places granted under a start rate and gone (released, expired), kept
        #: while they count in its window; past it, their rows are reused
        self.gone: dict[str, Place] = {p.token: p for p in gone}
        #: the longest period of a rate this line has seen (a gone place counts in every such window)
        self.longest_period = 0.0
        for place in sorted(places, key=lambda p: (p.granted_at, p.token)):
            self._add(place)

    # -- reading -------------------------------------------------------------
    def held(self) -> int:
        return len(self.places)

    def place_of(self, request_id: str) -> Place | None:
        token = self._tokens.get(request_id)
        return None if token is None else self.places[token]

    def waiter(self, request_id: str) -> Waiter | None:
        return next((w for w in self.waiters if w.request_id == request_id), None)

    def next_wakeup(self, now: float | None = None) -> float | None:
        """When something can next change for a waiter: a lease ending, a waiter
        leaving, or (given ``now``) the head's start rate letting it in.

        With nobody waiting there is nothing to wake for: an expired place is
        noticed by the next call, which is the first that could care.
        """
        if not self.waiters:
            return None
        times = [w.leave_at for w in self.waiters]
        times += [p.expires_at for p in self.places.values()]
        rate = self.waiters[0].rate
        if rate is not None and now is not None and not self.rate_allows(rate, now):
            times.append(self._rate_allows_at(rate, now))  # the head waits for its window
        return min(times)

    # -- the start rate ---------------------------------------------------------
    def _counted(self, rate: Rate, now: float) -> list[float]:
        """The start_by of every place (held or gone) in the window of ``rate`` that ends now."""
        since = now - rate.period_ms
        return sorted(p.start_by for p in [*self.places.values(), *self.gone.values()]
                      if p.start_by is not None and p.start_by > since)

    def rate_allows(self, rate: Rate | None, now: float) -> bool:
        """May a hold under ``rate`` start now? (See ``holder/pure/rate`` for why
        counting each place until its start_by leaves the window is exact.)"""
        return rate is None or len(self._counted(rate, now)) < rate.most

    def _rate_allows_at(self, rate: Rate, now: float) -> float:
        counted = self._counted(rate, now)
        over = len(counted) - rate.most
        return now if over < 0 else counted[over] + rate.period_ms

    def reusable(self, now: float) -> Place | None:
        """A gone place out of every window now, that of every open with a rate
        it has seen (the longest period): its row may hold a new place."""
        longest = max([p.period_ms for p in [*self.places.values(), *self.gone.values()]]
                      + [w.rate.period_ms for w in self.waiters if w.rate is not None] + [self.longest_period])
        self.longest_period = longest
        return next((p for p in self.gone.values() if p.start_by is not None and p.start_by + longest <= now), None)

    # -- changes ---------------------------------------------------------------
    def expire(self, now: float) -> list[Place]:
        """Remove every place whose lease has ended by ``now``."""
        gone = [p for p in self.places.values() if p.expires_at <= now]
        for place in gone:
            self._remove(place)
        return gone

    def join(self, request_id: str, *, limit: int, ttl_ms: float, max_hold_ms: float | None,
             now: float, leave_at: float, rate: Rate | None = None) -> Waiter:
        """Stand in line, or, for a request already in line, stay in place and wait longer."""
        waiter = self.waiter(request_id)
        if waiter is not None:
            waiter.leave_at = max(waiter.leave_at, leave_at)
            return waiter
        waiter = Waiter(request_id, limit, ttl_ms, max_hold_ms, now, leave_at, rate)
        self.waiters.append(waiter)
        return waiter

    def settle(self, now: float, new_token: Callable[[], str]) -> Settled:
        """Bring the key up to ``now``: end expired leases, admit from the head, let waiters go.

        Waiters whose time ran out before ``now`` leave first; then the head
        is admitted while fewer places are held than its limit; then those
        whose time ends at ``now`` leave (a ``try_hold`` has no time but now).
        """
        expired = self.expire(now)
        left = self._leave(lambda w: w.leave_at < now)
        granted: list[Place] = []
        while (self.waiters and self.held() < self.waiters[0].limit
               and self.rate_allows(self.waiters[0].rate, now)):
            waiter = self.waiters.pop(0)
            granted.append(self._grant(waiter, now, new_token()))
        left += self._leave(lambda w: w.leave_at <= now)
        return Settled(expired, granted, left)

    def renew(self, token: str, now: float) -> tuple[Place, bool]:
        """Extend a live place's lease; return it and whether the table must be written."""
        place = self.places.get(token)
        if place is None or place.expires_at <= now:
            raise NotHolder(token)
        place.expires_at = max(place.expires_at, lease_end(now, place.ttl_ms, place.hold_until))
        if place.expires_at <= place.stored_until:
            return place, False
        place.stored_until = stored_end(now, place.ttl_ms, place.hold_until)
        return place, True

    def release(self, token: str) -> Place | None:
        """Free a place; None if no place has this token (already freed: nothing to do)."""
        place = self.places.get(token)
        if place is not None:
            self._remove(place)
        return place

    def cancel(self, request_id: str) -> tuple[Waiter | None, Place | None]:
        """Withdraw a request: leave the line, and free a place granted to it whose reply was lost."""
        waiter = self.waiter(request_id)
        if waiter is not None:
            self.waiters.remove(waiter)
        place = self.place_of(request_id)
        if place is not None:
            self._remove(place)
        return waiter, place

    # -- internals ---------------------------------------------------------------
    def _grant(self, waiter: Waiter, now: float, token: str) -> Place:
        hold_until = None if waiter.max_hold_ms is None else now + waiter.max_hold_ms
        rate = waiter.rate
        place = Place(token, waiter.request_id, waiter.limit, waiter.ttl_ms, now,
                      lease_end(now, waiter.ttl_ms, hold_until), hold_until,
                      stored_end(now, waiter.ttl_ms, hold_until),
                      None if rate is None else now + RATE_START_MS, 0.0 if rate is None else rate.period_ms)
        self._add(place)
        return place

    def _leave(self, due: Callable[[Waiter], bool]) -> list[Waiter]:
        leaving = [w for w in self.waiters if due(w)]
        if leaving:
            self.waiters = [w for w in self.waiters if not due(w)]
        return leaving

    def _add(self, place: Place) -> None:
        self.places[place.token] = place
        self._tokens[place.request_id] = place.token

    def _remove(self, place: Place) -> None:
        del self.places[place.token]
        self._tokens.pop(place.request_id, None)
        if place.start_by is not None:
            self.gone[place.token] = place
