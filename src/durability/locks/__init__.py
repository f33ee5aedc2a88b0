"""durability.locks: lock-style semaphores, at most ``limit`` holders per key, on Durable Objects.

Lives here: the public names. ``semaphore(env.UPLOADS, "uploads", limit=3)``
opens one; ``SemaphoreHolder`` is the Durable Object class a Worker
subclasses and exports to hold its places (imported on first use, since it
is the one name that needs the ``workers`` SDK).
"""

from typing import Any

from .client import EXPIRED, MAX_HOLD, RENEWAL_FAILED, REVOKED, Permit, Semaphore, Tried, semaphore
from .holder import PlaceKeeper
from .options import (
    MAX_LIMIT,
    HolderRefused,
    InvalidOption,
    PlaceLost,
    SemaphoreError,
    WaitTimeout,
    parse_duration,
)

__all__ = [
    "EXPIRED", "MAX_HOLD", "MAX_LIMIT", "RENEWAL_FAILED", "REVOKED", "HolderRefused", "InvalidOption",
    "Permit", "PlaceKeeper", "PlaceLost", "Semaphore", "SemaphoreError", "SemaphoreHolder", "Tried",
    "WaitTimeout", "parse_duration", "semaphore",
]


def __getattr__(name: str) -> Any:
    if name == "SemaphoreHolder":
        from .holder_object import SemaphoreHolder

        return SemaphoreHolder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
