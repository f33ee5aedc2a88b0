"""What the semaphore's calls hand back to Python code: ``Tried``, ``Usage`` and ``PlaceUsage``.

Lives here: frozen dataclasses in the Python API's units (seconds), and
reading the holder's usage reply into them. Must not know: RPC, the
holder's rules or storage; the reply keeps the wire shape the holder sends
(``heldMs``, ``leaseMs``), and only this module turns it into attributes.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Tried(Generic[T]):
    """What ``await sem.try_run(key, fn)`` returns: whether a place was free, and ``fn``'s result."""

    acquired: bool
    value: T | None = None  #: what ``fn`` returned; None when no place was free


@dataclass(frozen=True)
class PlaceUsage:
    """One place held, as the key's holder object counts it."""

    limit: int  #: the limit of the open that admitted it
    held_for: float  #: seconds since the holder granted it
    lease_left: float  #: seconds until its lease ends, unless it is renewed first


@dataclass(frozen=True)
class Usage:
    """What ``await sem.usage(key)`` returns: places held and calls waiting in line."""

    held: int
    waiting: int
    places: tuple[PlaceUsage, ...] = ()
    _reply: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_reply(cls, reply: Any) -> Usage:
        """From the holder's ``semaphore_usage`` reply (ms on the wire, seconds here)."""
        reply = dict(reply)
        places = tuple(PlaceUsage(int(p["limit"]), float(p["heldMs"]) / 1_000, float(p["leaseMs"]) / 1_000)
                       for p in map(dict, reply["places"]))
        return cls(int(reply["held"]), int(reply["waiting"]), places, reply)

    def __getitem__(self, name: str) -> Any:
        # ``usage()`` returned the reply as a dict before: keep ``usage["held"]``
        # working for one release, in the wire's shape it had then.
        warnings.warn("usage(key) returns a Usage now: read usage.held, usage.waiting and usage.places "
                      "(seconds) instead of usage[...] (ms), which goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return self._reply[name]
