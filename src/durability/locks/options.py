"""The semaphore's options and errors: durations, limits, names and keys, checked at the boundary.

Lives here: parsing ``ttl`` / ``wait`` / ``max_hold`` ("30s", "500ms", "2m",
numbers of milliseconds, ``timedelta``), checking ``limit``, names and
keys, and the exceptions user code catches. Must not know: RPC, storage,
the holder's rules or the clock.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

MIN_LIMIT = 1
MAX_LIMIT = 1_000
MAX_NAME_LENGTH = 128
MAX_KEY_LENGTH = 512
# A lease shorter than this would be renewed several times a second; a longer
# one would keep a stalled holder's place for more than a day.
MIN_TTL_MS = 100.0
MAX_TTL_MS = 24 * 3_600_000.0
MAX_DURATION_MS = 365 * 24 * 3_600_000.0  # wait and max_hold: a year stands for "no bound" well enough

_UNITS_MS = {"ms": 1.0, "s": 1_000.0, "m": 60_000.0, "h": 3_600_000.0, "d": 86_400_000.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|h|d)\s*$")


class SemaphoreError(Exception):
    """Base of every error the semaphore raises."""


class InvalidOption(SemaphoreError, ValueError):
    """An option, name or key the semaphore refuses; nothing was taken or freed."""


class WaitTimeout(SemaphoreError, TimeoutError):
    """``hold`` stood in line for ``wait`` without getting a place."""


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


def parse_duration(value: Any, what: str, *, allow_zero: bool = True, most: float = MAX_DURATION_MS) -> float:
    """Milliseconds from "30s", "500ms", "1.5m", "2h", "1d", a number of ms or a ``timedelta``."""
    if isinstance(value, timedelta):
        ms = value.total_seconds() * 1_000.0
    elif isinstance(value, bool):
        raise InvalidOption(f"{what} must be a duration such as '30s' or a number of ms, not {value!r}")
    elif isinstance(value, (int, float)):
        ms = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            raise InvalidOption(
                f"{what}: cannot read {value!r} as a duration; write a number and a unit "
                "(ms, s, m, h, d) such as '500ms' or '30s', or a number of ms"
            )
        ms = float(match.group(1)) * _UNITS_MS[match.group(2)]
    else:
        raise InvalidOption(f"{what} must be a duration such as '30s' or a number of ms, not {value!r}")
    if not math.isfinite(ms) or ms < 0:
        raise InvalidOption(f"{what} must be a finite duration of 0 or more, not {value!r}")
    if ms == 0 and not allow_zero:
        raise InvalidOption(f"{what} must be longer than 0")
    if ms > most:
        raise InvalidOption(f"{what} must be at most {most:g} ms, not {value!r}")
    return ms


def parse_ttl(value: Any) -> float:
    ms = parse_duration(value, "ttl", allow_zero=False, most=MAX_TTL_MS)
    if ms < MIN_TTL_MS:
        raise InvalidOption(f"ttl must be at least {MIN_TTL_MS:g} ms, not {value!r}")
    return ms


def parse_optional(value: Any, what: str, *, allow_zero: bool) -> float | None:
    """``None`` means no bound (wait as long as it takes, hold as long as the code runs)."""
    return None if value is None else parse_duration(value, what, allow_zero=allow_zero)


def check_limit(value: Any) -> int:
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
    """How one hold behaves; the open gives defaults and each call may override them."""

    limit: int
    ttl_ms: float
    wait_ms: float | None  #: None: stand in line as long as it takes
    max_hold_ms: float | None  #: None: keep the place while the code runs

    @classmethod
    def parse(cls, *, limit: Any, ttl: Any, wait: Any, max_hold: Any) -> "HoldOptions":
        return cls(check_limit(limit), parse_ttl(ttl), parse_optional(wait, "wait", allow_zero=True),
                   parse_optional(max_hold, "max_hold", allow_zero=False))
