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
from typing import Any, NamedTuple

from ...._common.checks import is_int, is_number
from .records import Grant

#: the periods ``Rate.parse`` reads in a string: "60/min", "5/s", "1000/hour", "10/day"
PERIODS_MS = {"ms": 1.0, "s": 1_000.0, "sec": 1_000.0, "second": 1_000.0, "min": 60_000.0,
              "minute": 60_000.0, "h": 3_600_000.0, "hour": 3_600_000.0, "day": 86_400_000.0}


#: a grant under a start rate is taken up within this (or the holder's
#: grant_timeout_ms, if shorter): a grant the holder cannot place counts in
#: the window from its round to this past it, a period more than its start
#: needs; at a minute's period, one second is 1.7% of the rate at worst.
#: A client hears a grant in milliseconds (a reply, a call), and a call
#: that failed is tried again after half a second; one heard later is
#: given back.
RATE_CLAIM_MS = 1_000.0


class Rate(NamedTuple):
    """At most ``limit`` starts in any window of ``period_ms``; after a quiet
    spell, up to ``burst`` more at once, and still ``limit`` per period on
    average (see ``Pace``)."""

    limit: int
    period_ms: float
    burst: int = 0

    @property
    def most(self) -> int:
        """The most starts any window of ``period_ms`` holds."""
        return self.limit + self.burst

    @classmethod
    def parse(cls, value: Any) -> Rate:
        """A rate from a ``Rate``, a ``(limit, period_ms[, burst])`` tuple (or list), a
        ``{"limit", "period_ms", "burst"}`` dict or a string such as
        ``"60/min"`` or ``"60/min, burst 10"``; a clear ``ValueError`` otherwise."""
        if isinstance(value, str):
            return cls._from_text(value)
        if isinstance(value, dict):
            unknown = set(value) - {"limit", "period_ms", "burst"}
            if unknown:
                raise ValueError(f"a rate has limit, period_ms and burst, not {sorted(unknown)}")
            value = (value.get("limit"), value.get("period_ms"), value.get("burst", 0))
        if isinstance(value, list):  # (as JSON spells a tuple)
            value = tuple(value)
        if not isinstance(value, tuple) or len(value) not in (2, 3):
            raise ValueError(f"a rate is (limit, period_ms) or (limit, period_ms, burst), not {value!r}")
        limit, period_ms, burst = (*value, 0) if len(value) == 2 else value
        if not is_int(limit) or limit < 0:
            raise ValueError(f"a rate's limit must be a non-negative int, not {limit!r}")
        if not is_number(period_ms) or not 0 < period_ms < math.inf:
            raise ValueError(f"a rate's period_ms must be a positive number, not {period_ms!r}")
        if not is_int(burst) or burst < 0:
            raise ValueError(f"a rate's burst must be a non-negative int, not {burst!r}")
        return cls(limit, float(period_ms), burst)

    @classmethod
    def _from_text(cls, text: str) -> Rate:
        count, _, rest = text.partition("/")
        period, _, burst_text = rest.partition(",")
        burst_words = burst_text.split()
        try:
            limit = int(count.strip())
            period_ms = PERIODS_MS[period.strip().lower()]
            burst = int(burst_words[1]) if burst_words else 0
            if burst_words and (burst_words[0] != "burst" or len(burst_words) != 2):
                raise ValueError
        except (ValueError, KeyError, IndexError):
            raise ValueError(f"a rate reads like '60/min' or '60/min, burst 10' (periods: "
                             f"{', '.join(PERIODS_MS)}), not {text!r}") from None
        return cls.parse((limit, period_ms, burst))


def started_by(grant: Grant, placed: Mapping[str, float]) -> float:
    """The latest time the grant's permits may have started (see the module notes)."""
    return min(grant.claim_deadline, placed.get(grant.grant_id, math.inf), grant.placed_at or math.inf)


def stamped(grant: Grant, placed_at: float, kept_for_ms: float) -> Grant:
    """The grant with its placement kept in its row (written anyway: its
    release, say), so that a new instance of the holder counts it as this
    one does; it is kept in the book a period (``kept_for_ms``, the longest
    of the rates that count it) past it."""
    at = min(placed_at, grant.claim_deadline)
    return grant._replace(placed_at=at, kept_until=at + kept_for_ms)


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
