"""A start rate as users spell it: at most ``limit`` starts in any window of ``period_ms``, and a burst.

Lives here: ``Rate`` and ``Rate.parse``, shared by the semaphore's holder
(``rate=``, ``group_rate=``) and the lock semaphore (``rate=``), pure.
Must not know: how anything counts starts.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from .checks import is_int, is_number

#: the periods ``Rate.parse`` reads in a string: "60/min", "5/s", "1000/hour", "10/day"
PERIODS_MS = {"ms": 1.0, "s": 1_000.0, "sec": 1_000.0, "second": 1_000.0, "min": 60_000.0,
              "minute": 60_000.0, "h": 3_600_000.0, "hour": 3_600_000.0, "day": 86_400_000.0}


class Rate(NamedTuple):
    """At most ``limit`` starts in any window of ``period_ms``; after a quiet
    spell, up to ``burst`` more at once, and still ``limit`` per period on
    average (the holder paces a burst: ``semaphore/holder/pure/rate.Pace``)."""

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


