"""The ``usage`` reply: the holder's books as ``usage()`` answers them over RPC, written and read.

Lives here: ``Usage`` and what it holds (``GroupUsage`` per group,
``WaitingUsage`` per group and reason, ``ShareUsage`` per key under a
fair-share policy, ``RateUsage`` under a start rate), each with ``to_wire`` and a ``parse`` that refuses
a fault as ``malformed_reply``. Its counts are sums over the books, so
they are checked against 2**53, not against a message's bounds. Must
not know: how the books are kept or summed, storage, time, how a reply
travels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..._common.checks import MAX_SAFE_INTEGER, int_in, number_in, storable_text
from ..._common.wire import ProtocolError
from .checks import MAX_ID_LENGTH, MAX_REPLY_ENTRIES, _entries
from .replies import _blocked

# -- the usage reply: the holder's books, as ``usage()`` answers over RPC -------------------

@dataclass(frozen=True)
class GroupUsage:
    """One group's permits in the holder's books."""

    outstanding: int  #: granted or leased and not released: in use plus reserved
    in_use: int  #: claimed on grants and drawn from leases, not released
    reserved: int  #: granted and not claimed yet, or leased and not drawn yet
    lease_footprint: int  #: what the group's leases charge
    limit: int | None  #: the group's own ceiling (None: none, or its callback failed)
    rate: RateUsage | None = None  #: the group's own start rate (None: none)

    def to_wire(self) -> dict[str, Any]:
        return {"outstanding": self.outstanding, "inUse": self.in_use, "reserved": self.reserved,
                "leaseFootprint": self.lease_footprint, "limit": self.limit,
                "rate": None if self.rate is None else self.rate.to_wire()}

    @classmethod
    def parse(cls, wire: Any, where: str = "group") -> GroupUsage:
        entry = _reply_object(wire, where)
        return cls(_tally(entry, "outstanding", where), _tally(entry, "inUse", where),
                   _tally(entry, "reserved", where), _tally(entry, "leaseFootprint", where),
                   _optional_count(entry, "limit", where),
                   None if entry.get("rate") is None else RateUsage.parse(entry["rate"], f"{where}.rate"))


@dataclass(frozen=True)
class WaitingUsage:
    """Demand the latest rounds left waiting in one group for one reason, over the clients that told it."""

    group: str
    reason: str  #: a ``BlockedReason``
    waiting: int  #: items waiting
    clients: int  #: clients they wait in

    def to_wire(self) -> dict[str, Any]:
        return {"group": self.group, "reason": self.reason, "waiting": self.waiting, "clients": self.clients}

    @classmethod
    def parse(cls, wire: Any, where: str = "waiting") -> WaitingUsage:
        entry = _reply_object(wire, where)
        blocked = _blocked(entry, where)
        return cls(blocked.group, blocked.reason, blocked.waiting, _tally(entry, "clients", where))


@dataclass(frozen=True)
class ShareUsage:
    """One key's part of the limit under a fair-share policy: what it holds
    against its weight, floor and priority, and what it has waiting."""

    held: int  #: permits its groups hold
    weight: float
    floor: int
    priority: int
    waiting: int  #: items its clients last said wait

    def to_wire(self) -> dict[str, Any]:
        return {"held": self.held, "weight": self.weight, "floor": self.floor, "priority": self.priority,
                "waiting": self.waiting}

    @classmethod
    def parse(cls, wire: Any, where: str = "share") -> ShareUsage:
        entry = _reply_object(wire, where)
        weight, priority = entry.get("weight"), entry.get("priority")
        if (not number_in(weight, 0, MAX_SAFE_INTEGER) or weight == 0
                or not int_in(priority, -MAX_SAFE_INTEGER, MAX_SAFE_INTEGER)):
            raise ProtocolError("malformed_reply", f"{where} must carry a positive weight and a priority")
        return cls(_tally(entry, "held", where), float(weight), _tally(entry, "floor", where), priority,
                   _tally(entry, "waiting", where))


@dataclass(frozen=True)
class RateUsage:
    """The key's start rate as the latest round read it, and its window now."""

    limit: int
    period_ms: float
    burst: int
    starts_in_window: int  #: permits that may have started in the window ending now
    room: int  #: how many may start now
    next_start_at: float | None  #: when the next may start (epoch ms; None: never, a limit of 0)

    def to_wire(self) -> dict[str, Any]:
        return {"limit": self.limit, "periodMs": self.period_ms, "burst": self.burst,
                "startsInWindow": self.starts_in_window, "room": self.room, "nextStartAt": self.next_start_at}

    @classmethod
    def parse(cls, wire: Any, where: str = "usage.rate") -> RateUsage:
        entry = _reply_object(wire, where)
        period, next_at = entry.get("periodMs"), entry.get("nextStartAt")
        if not number_in(period, 0, MAX_SAFE_INTEGER) or period == 0 or not (
                next_at is None or number_in(next_at, 0, MAX_SAFE_INTEGER)):
            raise ProtocolError("malformed_reply", f"{where} must carry a positive periodMs and a nextStartAt")
        return cls(_tally(entry, "limit", where), float(period), _tally(entry, "burst", where),
                   _tally(entry, "startsInWindow", where), _tally(entry, "room", where),
                   None if next_at is None else float(next_at))


@dataclass(frozen=True)
class Usage:
    """What ``DurabilitySemaphore.usage_info()`` returns: the limit, and the permits the books count."""

    limit: int | None  #: the limit as resolved now (None: its callback failed)
    ceiling: int | None  #: what leases may reach: the limit, or more when leases are provisioned over it
    outstanding: int  #: permits charged: grants and lease footprint
    lease_footprint: int
    retired_footprint: int  #: the footprint of leases retired, or past their ttl
    grants: int  #: grants not settled
    leases: int  #: leases not settled
    groups: dict[str, GroupUsage] = field(default_factory=dict)
    #: what waits and why, as clients heard in the last minute told it (older holders: none)
    waiting: tuple[WaitingUsage, ...] = ()
    #: how the last round shared the limit: oldest_first, fair_share, or
    #: oldest_first_fallback (a fair-share callback raised)
    policy: str = "oldest_first"
    shares: dict[str, ShareUsage] = field(default_factory=dict)  #: per key, under a fair-share policy
    rate: RateUsage | None = None  #: the start rate (None: none)

    def to_wire(self) -> dict[str, Any]:
        return {
            "limit": self.limit,
            "ceiling": self.ceiling,
            "outstanding": self.outstanding,
            "leaseFootprint": self.lease_footprint,
            "retiredFootprint": self.retired_footprint,
            "grants": self.grants,
            "leases": self.leases,
            "groups": {group: usage.to_wire() for group, usage in self.groups.items()},
            "waiting": [entry.to_wire() for entry in self.waiting],
            "policy": self.policy,
            "shares": {key: share.to_wire() for key, share in self.shares.items()},
            "rate": None if self.rate is None else self.rate.to_wire(),
        }

    @classmethod
    def parse(cls, wire: Any) -> Usage:
        """A ``usage()`` reply, checked (``malformed_reply`` on a fault)."""
        reply = _reply_object(wire, "usage")
        groups = _reply_object(reply.get("groups", {}), "usage.groups")
        if len(groups) > MAX_REPLY_ENTRIES or not all(storable_text(g, MAX_ID_LENGTH) for g in groups):
            raise ProtocolError("malformed_reply", "usage.groups must map groups to their usage")
        return cls(_optional_count(reply, "limit", "usage"), _optional_count(reply, "ceiling", "usage"),
                   _tally(reply, "outstanding", "usage"), _tally(reply, "leaseFootprint", "usage"),
                   _tally(reply, "retiredFootprint", "usage"), _tally(reply, "grants", "usage"),
                   _tally(reply, "leases", "usage"),
                   {group: GroupUsage.parse(entry, f"usage.groups.{group}") for group, entry in groups.items()},
                   _entries(reply, "waiting", WaitingUsage.parse) if "waiting" in reply else (),
                   *_sharing(reply), None if reply.get("rate") is None else RateUsage.parse(reply["rate"]))


def _sharing(reply: dict[str, Any]) -> tuple[str, dict[str, ShareUsage]]:
    """A usage reply's policy and shares (older holders send neither)."""
    policy = reply.get("policy", "oldest_first")
    shares = _reply_object(reply.get("shares", {}), "usage.shares")
    if not storable_text(policy, MAX_ID_LENGTH) or len(shares) > MAX_REPLY_ENTRIES or not all(
            storable_text(key, MAX_ID_LENGTH) for key in shares):
        raise ProtocolError("malformed_reply", "usage.policy must be a name, usage.shares map keys to shares")
    return policy, {key: ShareUsage.parse(entry, f"usage.shares.{key}") for key, entry in shares.items()}


def _reply_object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError("malformed_reply", f"{what} must be an object")
    return value


def _optional_count(entry: dict[str, Any], name: str, where: str) -> int | None:
    value = entry.get(name)
    return None if value is None else _tally(entry, name, where)


def _tally(entry: dict[str, Any], name: str, where: str) -> int:
    """A count of the usage reply: a sum over the books, so beyond a message's bounds."""
    value = entry.get(name)
    if not int_in(value, 0, MAX_SAFE_INTEGER):
        raise ProtocolError("malformed_reply", f"{where}.{name} must be an integer from 0 to 2**53")
    return value
