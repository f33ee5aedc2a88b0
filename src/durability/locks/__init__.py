"""durability.locks: lock-style semaphores, at most ``limit`` holders per key, on Durable Objects.

Lives here: the public names. ``semaphore(env.UPLOADS, "uploads", limit=3)``
opens one; ``async with sem.hold(key) as permit:`` holds a place of a key;
``await sem.run(key, fn)`` runs a function in one. ``SemaphoreHolder`` is
the Durable Object class a Worker subclasses and exports to hold its
places (imported on first use, since it is the one name that needs the
``workers`` SDK, and left out of ``__all__`` so that ``import *`` does not
export the base class as a Durable Object).
Must not know: anything beyond re-exporting; the modules hold the logic.
"""

from typing import TYPE_CHECKING, Any

from .client import (
    EXPIRED,
    FROM_OPEN,
    MAX_HOLD,
    RENEWAL_FAILED,
    REVOKED,
    CallDuration,
    Hold,
    LossReason,
    Permit,
    Semaphore,
    semaphore,
)
from .holder import PlaceKeeper
from .options import (
    MAX_LIMIT,
    Duration,
    HolderRefused,
    InvalidOption,
    PlaceLost,
    SemaphoreError,
    WaitTimeout,
    WouldBlock,
    parse_duration,
    parse_seconds,
)
from .results import PlaceUsage, Tried, Usage

if TYPE_CHECKING:  # type checkers see the class; at run time __getattr__ imports it on first use
    from .holder_object import SemaphoreHolder as SemaphoreHolder

__all__ = [
    "EXPIRED", "FROM_OPEN", "MAX_HOLD", "MAX_LIMIT", "RENEWAL_FAILED", "REVOKED", "CallDuration", "Duration",
    "Hold", "HolderRefused", "InvalidOption", "LossReason", "Permit", "PlaceKeeper", "PlaceLost", "PlaceUsage",
    "Semaphore", "SemaphoreError", "Tried", "Usage", "WaitTimeout", "WouldBlock", "parse_duration",
    "parse_seconds", "semaphore",
]


def __getattr__(name: str) -> Any:
    if name == "SemaphoreHolder":
        from .holder_object import SemaphoreHolder

        return SemaphoreHolder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
