"""A start rate next to the limit: how many may start now, and when the next may, pure.

Lives here: ``Rate`` (at most ``limit`` starts in any window of
``period_ms``, ``burst`` more after a quiet spell) and its checks; the
starts a grant book counts in the window (``starts_in_window``), the room
that leaves (``rate_room``), when the next start may be
(``next_start_at``), and the pace that keeps ``burst`` from raising the
rate for good (``Pace``). Must not know: how a round serves demand,
storage, RPC or clocks; the holder reads the time and keeps the
confirmations.

Exact by the starts, not by the grants. A grant's permits start when its
client hears of the grant and admits on it, which may be later than the
round that made it; a client admits nothing on a grant after its claim
deadline (it gives those claims back). So each grant's starts lie between
the round that made it and its ``started_by``: its claim deadline, or the
time the holder knew the client had heard of it (a call that brought the
grant answered), whichever is first. A round lets a permit start now only
while fewer than ``limit + burst`` permits have a ``started_by`` later than
``now - period_ms``. That bounds every window: take the starts in any window
of ``period_ms``, and the grant of them that was made last; each of the
others started inside the window, so after its round's ``now - period_ms``,
and was counted when that grant was made. So no window of real starts
holds more than ``limit + burst``, wherever in their interval the starts
fell, and whatever was lost or late. A grant counts for as long as its
``started_by`` says: the holder keeps it in its book (and its client's
row) once settled, until ``started_by + period_ms``
(``Grant.kept_until``): a restarted holder counts the same window. A
placement learned in memory rides on the next write of the grant's row
(its release, most often: ``stamped``), so that a holder that hibernates
between two windows still counts by it.

The price of that exactness is the interval: a grant whose start the
holder cannot place counts until its claim deadline plus a period, where
one it placed counts until its start plus a period. Calls place their
grants (the client answers once it has admitted); a grant in a reply to a
request is placed by its claim deadline only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from ...._common.rates import Rate as Rate
from .records import Grant

#: a grant under a start rate is taken up within this (or the holder's
#: grant_timeout_ms, if shorter): a grant the holder cannot place counts in
#: the window from its round to this past it, a period more than its start
#: needs; at a minute's period, one second is 1.7% of the rate at worst.
#: A client hears a grant in milliseconds (a reply, a call), and a call
#: that failed is tried again after half a second; one heard later is
#: given back.
RATE_CLAIM_MS = 1_000.0


def started_by(grant: Grant, placed: Mapping[str, float]) -> float:
    """The latest time the grant's permits may have started (see the module notes)."""
    return min(grant.claim_deadline, placed.get(grant.grant_id, math.inf), grant.placed_at or math.inf)


def stamped(grant: Grant, placed_at: float) -> Grant:
    """The grant with its placement kept in its row (written anyway: its
    release, say), so that a new instance of the holder counts it as this
    one does. It stays in the book as long past its placement as the rates
    that counted it when it was made said past its claim deadline (the
    longest of their periods)."""
    at = min(placed_at, grant.claim_deadline)
    return grant._replace(placed_at=at, kept_until=at + (grant.kept_until - grant.claim_deadline))


def _starts(grants: Iterable[Grant], placed: Mapping[str, float], now: float, period_ms: float) -> list[float]:
    """The ``started_by`` of every permit counted in the window that ends now, one per permit."""
    since = now - period_ms
    times: list[float] = []
    for grant in grants:
        latest = started_by(grant, placed)
        if latest > since and grant.permits:
            times.extend([latest] * grant.permits)
    return times


def starts_in_window(grants: Iterable[Grant], placed: Mapping[str, float], now: float, rate: Rate) -> int:
    """The permits that may have started in the window of ``period_ms`` that ends now."""
    return len(_starts(grants, placed, now, rate.period_ms))


def rate_room(grants: Iterable[Grant], placed: Mapping[str, float], now: float, rate: Rate,
              pace: Pace | None = None) -> int:
    """How many permits may start now: the window's room, and the pace's."""
    room = max(0, rate.most - starts_in_window(grants, placed, now, rate))
    return room if pace is None else min(room, pace.room(now, rate))


def next_start_at(grants: Iterable[Grant], placed: Mapping[str, float], now: float, rate: Rate,
                  pace: Pace | None = None) -> float | None:
    """When a permit may start next: now if one may; else when enough of the
    window's starts leave it (and the pace allows); None if never (a limit of 0)."""
    if rate.limit == 0:
        return None
    times = sorted(_starts(grants, placed, now, rate.period_ms))
    over = len(times) - rate.most
    at = now if over < 0 else times[over] + rate.period_ms
    return at if pace is None else max(at, pace.next_at(now, rate))


class Pace:
    """The average the burst must not raise: a permit may start once the
    theoretical arrival time (``tat``) is at most ``(most - 1)`` intervals
    ahead, one interval being ``period_ms / limit`` (GCRA). With no burst the
    window alone bounds the average, and the pace never binds. In memory: a
    new instance starts with a full burst, which the window still bounds."""

    def __init__(self) -> None:
        self.tat = -math.inf

    def room(self, now: float, rate: Rate) -> int:
        if rate.limit == 0:
            return 0
        interval = rate.period_ms / rate.limit
        ahead = max(self.tat, now) - now
        return max(0, rate.most - math.ceil(ahead / interval - 1e-9))

    def next_at(self, now: float, rate: Rate) -> float:
        if self.room(now, rate) > 0:
            return now
        interval = rate.period_ms / rate.limit
        return self.tat - (rate.most - 1) * interval

    def started(self, count: int, now: float, rate: Rate) -> None:
        if count and rate.limit:
            self.tat = max(self.tat, now) + count * rate.period_ms / rate.limit
