"""durability.locks: lock-style semaphores, at most ``limit`` holders per key, on Durable Objects.

Lives here: the public names. ``semaphore(env.UPLOADS, "uploads", limit=3)``
opens one; ``SemaphoreHolder`` is the Durable Object class a Worker
subclasses and exports to hold its places (imported on first use, since it
is the one name that needs the ``workers`` SDK, and left out of ``__all__``
so that ``import *`` does not export the base class as a Durable Object).
Must not know: anything beyond re-exporting; the modules hold the logic.
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
    "Permit", "PlaceKeeper", "PlaceLost", "Semaphore", "SemaphoreError", "Tried",
    "WaitTimeout", "parse_duration", "semaphore",
]


def __getattr__(name: str) -> Any:
    if name == "SemaphoreHolder":
        from .holder_object import SemaphoreHolder

        return SemaphoreHolder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
