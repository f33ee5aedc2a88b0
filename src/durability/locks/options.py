"""The semaphore's options and errors: durations, limits, names and keys, checked at the boundary.

Lives here: reading ``ttl`` / ``wait`` / ``max_hold`` as Python code writes
them (a number of seconds, "30s", "500ms", "2m", a ``timedelta``) into the
milliseconds the holder's messages carry, checking ``limit``, names and
keys, and the exceptions user code catches. Must not know: RPC, storage,
the holder's rules or the clock.

Durations are seconds, as asyncio, anyio and redis-py take them. Bare
numbers used to be milliseconds; until the next release a bare number that
was probably written that way is refused rather than read as a thousand
times longer (see ``LIKELY_MILLISECONDS_FROM_S``).
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .._common.checks import is_int
from .._common.rates import Rate

#: What a duration may be written as: seconds (an int or a float), a string
#: with a unit ("500ms", "30s", "2m", "1.5h", "1d") or a ``timedelta``.
Duration = str | float | timedelta

MIN_LIMIT = 1
MAX_LIMIT = 1_000
MAX_NAME_LENGTH = 128
MAX_KEY_LENGTH = 512
# A lease shorter than this would be renewed several times a second; a longer
# one would keep a stalled holder's place for more than a day.
MIN_TTL_MS = 100.0
MAX_TTL_MS = 24 * 3_600_000.0
MAX_DURATION_MS = 365 * 24 * 3_600_000.0  # wait and max_hold: a year stands for "no bound" well enough
#: Every ttl written as a bare number under the old unit was at least 100 (ms),
#: and so are most waits and max holds. Read as seconds, such a number would
#: silently mean a thousand times longer, so for one release a bare number
#: from here up is refused with the spelling to use instead; a unit string or
#: a timedelta says the same length without doubt.
LIKELY_MILLISECONDS_FROM_S = 100

_UNITS_MS = {"ms": 1.0, "s": 1_000.0, "m": 60_000.0, "h": 3_600_000.0, "d": 86_400_000.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|h|d)\s*$")
_HOW_TO_WRITE = "a number of seconds, a string such as '30s' or '500ms', or a timedelta"


class SemaphoreError(Exception):
    """Base of every error the semaphore raises."""


class InvalidOption(SemaphoreError, ValueError):
    """An option, name or key the semaphore refuses; nothing was taken or freed."""


class WaitTimeout(SemaphoreError, TimeoutError):
    """``hold`` stood in line for ``wait`` without getting a place."""


class WouldBlock(SemaphoreError):
    """``try_hold`` found every place of its key taken (or someone in line before it)."""


class PlaceLost(SemaphoreError):
    """The place was lost while its holder ran: its lease expired, or it reached ``max_hold``."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class HolderRefused(SemaphoreError):
    """The holder object refused a message; ``code`` is machine-readable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


# -- durations ------------------------------------------------------------------------

def _seconds_text(ms: float) -> str:
    """A length for an error message, in the unit a reader takes in at once."""
    for unit, size in (("d", 86_400_000.0), ("h", 3_600_000.0), ("min", 60_000.0)):
        if ms >= size:
            return f"{ms / size:.3g} {unit}"
    return f"{ms / 1_000:g} s"


def _read_ms(value: Any, what: str, *, bare_unit_ms: float) -> float:
    """The length ``value`` names, in ms; a bare number counts ``bare_unit_ms`` each."""
    if isinstance(value, timedelta):
        ms = value.total_seconds() * 1_000.0
    elif is_int(value) or isinstance(value, float):
        # An int too large for float() is longer than any bound: refused below as not finite.
        ms = math.inf if is_int(value) and abs(value) > MAX_DURATION_MS else float(value) * bare_unit_ms
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            raise InvalidOption(f"{what}: cannot read {value!r} as a duration; write {_HOW_TO_WRITE}")
        ms = float(match.group(1)) * _UNITS_MS[match.group(2)]
    else:
        raise InvalidOption(f"{what} must be {_HOW_TO_WRITE}, not {value!r}")
    if not math.isfinite(ms) or ms < 0:
        raise InvalidOption(f"{what} must be a finite duration of 0 or more, not {value!r}")
    return ms


def _refuse_likely_milliseconds(value: Any, what: str) -> None:
    if is_int(value) or isinstance(value, float):
        if value >= LIKELY_MILLISECONDS_FROM_S:
            raise InvalidOption(
                f"{what}={value!r} would be {value!r} seconds ({_seconds_text(value * 1_000.0)}): "
                f"a bare number is seconds now, and one of {LIKELY_MILLISECONDS_FROM_S} or more is "
                "refused in this release because bare numbers used to be milliseconds. "
                f"Write '{value!r}ms' (or {value / 1_000:g}) for milliseconds, or '{value!r}s' or "
                f"timedelta(seconds={value!r}) if you mean seconds"
            )


def _bounded(ms: float, value: Any, what: str, *, allow_zero: bool, most_ms: float) -> float:
    if ms == 0 and not allow_zero:
        raise InvalidOption(f"{what} must be longer than 0")
    if ms > most_ms:
        raise InvalidOption(f"{what} must be at most {_seconds_text(most_ms)}, not {value!r}")
    return ms


def parse_duration_ms(value: Any, what: str, *, allow_zero: bool = True, most_ms: float = MAX_DURATION_MS) -> float:
    """The milliseconds the wire carries, from a duration as the Python API takes it (seconds)."""
    ms = _read_ms(value, what, bare_unit_ms=1_000.0)
    _refuse_likely_milliseconds(value, what)
    return _bounded(ms, value, what, allow_zero=allow_zero, most_ms=most_ms)


def parse_seconds(value: Any, what: str = "duration", *, allow_zero: bool = True) -> float:
    """Seconds from 30, 0.5, "30s", "500ms", "1.5m", "2h", "1d" or a ``timedelta``."""
    return parse_duration_ms(value, what, allow_zero=allow_zero) / 1_000.0


def parse_duration(value: Any, what: str, *, allow_zero: bool = True, most: float = MAX_DURATION_MS) -> float:
    """Deprecated: milliseconds, reading a bare number as milliseconds. Use ``parse_seconds``."""
    warnings.warn("parse_duration (bare numbers in ms, ms returned) is deprecated and goes in the next "
                  "release; use parse_seconds (bare numbers in seconds, seconds returned)",
                  DeprecationWarning, stacklevel=2)
    ms = _read_ms(value, what, bare_unit_ms=1.0)
    return _bounded(ms, value, what, allow_zero=allow_zero, most_ms=most)


def parse_ttl_ms(value: Any) -> float:
    ms = parse_duration_ms(value, "ttl", allow_zero=False, most_ms=MAX_TTL_MS)
    if ms < MIN_TTL_MS:
        raise InvalidOption(f"ttl must be at least {MIN_TTL_MS / 1_000:g} s, not {value!r}")
    return ms


def parse_optional_ms(value: Any, what: str, *, allow_zero: bool) -> float | None:
    """``None`` means no bound (wait as long as it takes, hold as long as the code runs)."""
    return None if value is None else parse_duration_ms(value, what, allow_zero=allow_zero)


# -- limits, names, keys ------------------------------------------------------------------

def check_limit(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_LIMIT <= value <= MAX_LIMIT:
        raise InvalidOption(f"limit must be an integer from {MIN_LIMIT} to {MAX_LIMIT:,}, not {value!r}")
    return value


def check_name(value: Any) -> str:
    # ":" separates the name from the key in the holder object's name.
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_LENGTH or ":" in value:
        raise InvalidOption(
            f"a semaphore's name must be a string of 1 to {MAX_NAME_LENGTH} characters without ':', not {value!r}"
        )
    return value


def check_key(value: Any) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_KEY_LENGTH:
        raise InvalidOption(f"a key must be a non-empty string of at most {MAX_KEY_LENGTH} characters, not {value!r}")
    return value


@dataclass(frozen=True)
class HoldOptions:
    """How one hold behaves, in the wire's milliseconds; the open gives defaults and each call may override them."""

    limit: int
    ttl_ms: float
    wait_ms: float | None  #: None: stand in line as long as it takes
    max_hold_ms: float | None  #: None: keep the place while the code runs
    rate: Rate | None = None  #: at most rate.limit (+ burst) holds start per period (None: no rate)

    @classmethod
    def parse(cls, *, limit: Any, ttl: Any, wait: Any, max_hold: Any, rate: Any = None) -> HoldOptions:
        return cls(check_limit(limit), parse_ttl_ms(ttl), parse_optional_ms(wait, "wait", allow_zero=True),
                   parse_optional_ms(max_hold, "max_hold", allow_zero=False), check_rate(rate))


def check_rate(value: Any) -> Rate | None:
    """A hold's start rate: ``"60/min"``, ``(60, 60_000)`` and the forms ``Rate.parse`` reads, or None."""
    if value is None:
        return None
    try:
        rate = Rate.parse(value)
    except ValueError as error:
        raise InvalidOption(str(error)) from None
    if not 1 <= rate.limit <= MAX_LIMIT or rate.burst > MAX_LIMIT or rate.period_ms > MAX_DURATION_MS:
        raise InvalidOption(f"a rate's limit must be from 1 to {MAX_LIMIT:,}, its burst at most that, "
                            f"and its period at most {MAX_DURATION_MS / 3_600_000:g} h, not {value!r}")
    return rate
