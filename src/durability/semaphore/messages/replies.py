"""What the holder answers: the ``grants`` and ``synced`` replies, written and read.

Lives here: ``Reply`` and the entries it lists (``GrantEntry``,
``ReportOutcome``, ``LeaseEntry``, ``LeaseOutcome``, ``Blocked``), each
with ``to_wire``; ``parse_reply``, which checks a reply completely and
raises the refusal of ``durability._wire`` a holder sent instead; the
pacing and the line a grants reply carries (``pacing_in``,
``Reply.line``), and what only a budget tree's child is told. Must not
know: the messages clients send, storage, time, allocation, how a reply
travels.

A client checks every field of a reply it will act on before it acts, so
that a malformed reply (a holder of another version, a bug, a hostile
stand-in) fails that one exchange and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from ..._common.checks import MAX_SAFE_INTEGER, number_in, storable_text
from ..._common.wire import ProtocolError
from .checks import (
    EXPIRED,
    GROUP_LIMIT,
    LIMIT,
    LIMIT_RESOLUTION_ERROR,
    MAX_ID_LENGTH,
    MAX_REPLY_ENTRIES,
    MAX_TREE_DEMAND_TIMES,
    NOT_FOUND,
    NOT_PERMITTED,
    OK,
    RATE,
    RETIRED,
    SETTLED,
    VERSION,
    _count,
    _entries,
    _flag,
    _identifier,
    _one_of,
    _reply_field,
    _time,
)

# -- replies: the holder builds them, a client checks them before it acts -------------

REPORT_STATUSES = (OK, EXPIRED, NOT_FOUND)
LEASE_STATUSES = (OK, RETIRED, SETTLED)
BLOCKED_REASONS = (LIMIT_RESOLUTION_ERROR, NOT_PERMITTED, GROUP_LIMIT, LIMIT, RATE)


@dataclass(frozen=True)
class GrantEntry:
    """A grant of the client not settled yet (unclaimed permits, or claims
    not all released), as a reply lists it. ``claimed`` is what the holder
    confirmed."""

    grant_id: str
    group: str
    permits: int
    claimed: int
    claim_deadline: float
    released: int = 0  #: the releases the holder heard (older holders do not say)
    #: first listed here, by the round that made it (None: an older holder,
    #: which does not say); see ``queue/grants.usable_claims``
    new: bool | None = None

    def to_wire(self) -> dict[str, Any]:
        wire = {"grantId": self.grant_id, "group": self.group, "permits": self.permits, "claimed": self.claimed,
                "released": self.released, "claimDeadline": self.claim_deadline}
        if self.new is not None:
            wire["new"] = self.new
        return wire


class ReportOutcome(NamedTuple):
    """The holder's answer to one grant report (a named tuple: a round makes
    one per report, and builds it in a third of a frozen dataclass's time)."""

    grant_id: str
    status: str  #: ok, expired (reclaimed: counts clamped), not_found (gone)
    claimed: int  #: the claims the holder confirms
    released: int
    permits: int

    def to_wire(self) -> dict[str, Any]:
        return {"grantId": self.grant_id, "status": self.status, "claimed": self.claimed,
                "released": self.released, "permits": self.permits}


@dataclass(frozen=True)
class LeaseEntry:
    """A lease the client may not know of yet, or one it must stop drawing from."""

    lease_id: str
    group: str
    permits: int
    drawn: int
    ttl_ms: float
    expires_at: float
    retired: bool
    new: bool = False  #: issued by the round that answers this very request

    def to_wire(self) -> dict[str, Any]:
        return {"leaseId": self.lease_id, "group": self.group, "permits": self.permits, "drawn": self.drawn,
                "ttlMs": self.ttl_ms, "expiresAt": self.expires_at, "retired": self.retired, "new": self.new}


@dataclass(frozen=True)
class LeaseOutcome:
    """The holder's answer to one lease report."""

    lease_id: str
    status: str  #: ok (live), retired (stop drawing, keep reporting), settled (forget it)
    drawn: int
    released: int
    permits: int

    def to_wire(self) -> dict[str, Any]:
        return {"leaseId": self.lease_id, "status": self.status, "drawn": self.drawn,
                "released": self.released, "permits": self.permits}


@dataclass(frozen=True)
class Blocked:
    """A group of the request's demand that got no permit, why, and how many items wait."""

    group: str
    reason: str  #: a ``BlockedReason``
    waiting: int

    def to_wire(self) -> dict[str, Any]:
        return {"group": self.group, "reason": self.reason, "waiting": self.waiting}


@dataclass(frozen=True)
class Reply:
    """A ``grants`` reply to a request, or a ``synced`` reply to a sync."""

    type: str
    reports: tuple[ReportOutcome, ...]
    lease_reports: tuple[LeaseOutcome, ...]
    leases: tuple[LeaseEntry, ...]
    contended: bool
    grants: tuple[GrantEntry, ...] = ()
    blocked: tuple[Blocked, ...] = ()
    next_request_at: float | None = None
    #: ``leases`` names every lease of the client not settled, drawn from or
    #: not, and marks those new (older holders list only undrawn ones)
    all_leases_listed: bool = False
    #: per group, the oldest-item time at which the holder's line stands
    #: behind a client it just served (``holder/pure/line_mark.Line``)
    line: dict[str, float] = field(default_factory=dict)
    #: to a child of a budget tree: per group it asked for, the enqueue times
    #: of the oldest items (at most ``MAX_DEMAND_TIMES``, oldest first) of
    #: other clients the round left waiting for capacity (``tree``)
    waiting_since: dict[str, tuple[float, ...]] = field(default_factory=dict)
    #: when the parent's round that saw ``waiting_since`` ran (None: from an
    #: older parent, which answered a child's request at that round)
    waiting_since_at: float | None = None
    #: to a child of a budget tree: the parent's permits out exceed its limit
    #: (it was lowered): hand out nothing of what it lent, give it back
    over_limit: bool = False
    #: to a child of a budget tree: groups where it hands out nothing it
    #: holds (the parent's ceiling there failed, or was lowered below what is out)
    closed_groups: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        """A ``grants`` reply carries every field; a ``synced`` one its own five, in its own order."""
        if self.type != "grants":
            return {"type": self.type, "v": VERSION, "reports": [o.to_wire() for o in self.reports],
                    "leaseReports": [o.to_wire() for o in self.lease_reports], "contended": self.contended,
                    "leases": [e.to_wire() for e in self.leases], "grants": [e.to_wire() for e in self.grants],
                    **self._tree_fields(False)}
        return {
            "type": "grants",
            "v": VERSION,
            "grants": [e.to_wire() for e in self.grants],
            "reports": [o.to_wire() for o in self.reports],
            "leases": [e.to_wire() for e in self.leases],
            "allLeasesListed": self.all_leases_listed,
            "leaseReports": [o.to_wire() for o in self.lease_reports],
            "blocked": [b.to_wire() for b in self.blocked],
            "contended": self.contended,
            "nextRequestAt": self.next_request_at,
            "line": self.line,
            **self._tree_fields(True),
        }

    def _tree_fields(self, grants: bool) -> dict[str, Any]:
        """What only a tree's child is told (none of it to other clients)."""
        waiting = {group: list(times) for group, times in self.waiting_since.items()}
        seen_at = self.waiting_since_at if grants and waiting else None
        return {**({"waitingSince": waiting} if grants and waiting else {}),
                **({"waitingSinceAt": seen_at} if seen_at is not None else {}),
                **({"overLimit": True} if self.over_limit else {}),
                **({"closedGroups": list(self.closed_groups)} if self.closed_groups else {})}

    @classmethod
    def parse(cls, reply: Any, kind: str) -> Reply:
        """See ``parse_reply``."""
        return parse_reply(reply, kind)


def _grant_entry(entry: dict[str, Any], where: str) -> GrantEntry:
    released = _reply_field(entry, "released", where, _count) if "released" in entry else 0
    return GrantEntry(_reply_field(entry, "grantId", where, _identifier),
                      _reply_field(entry, "group", where, _identifier), _reply_field(entry, "permits", where, _count),
                      _reply_field(entry, "claimed", where, _count), _reply_field(entry, "claimDeadline", where, _time),
                      released, _flag(entry, "new", where) if "new" in entry else None)


def _report_outcome(entry: dict[str, Any], where: str) -> ReportOutcome:
    return ReportOutcome(_reply_field(entry, "grantId", where, _identifier),
                         _one_of(entry.get("status"), REPORT_STATUSES, f"{where}.status"),
                         _reply_field(entry, "claimed", where, _count), _reply_field(entry, "released", where, _count),
                         _reply_field(entry, "permits", where, _count))


def _lease_entry(entry: dict[str, Any], where: str) -> LeaseEntry:
    ttl = entry.get("ttlMs") or 0
    if not number_in(ttl, 0, MAX_SAFE_INTEGER):
        raise ProtocolError("malformed_reply", f"{where}.ttlMs must be a number of ms")
    return LeaseEntry(_reply_field(entry, "leaseId", where, _identifier),
                      _reply_field(entry, "group", where, _identifier), _reply_field(entry, "permits", where, _count),
                      _count(entry.get("drawn", 0), f"{where}.drawn"), float(ttl),
                      _reply_field(entry, "expiresAt", where, _time), _flag(entry, "retired", where),
                      _flag(entry, "new", where))


def _lease_outcome(entry: dict[str, Any], where: str) -> LeaseOutcome:
    return LeaseOutcome(_reply_field(entry, "leaseId", where, _identifier),
                        _one_of(entry.get("status"), LEASE_STATUSES, f"{where}.status"),
                        _reply_field(entry, "drawn", where, _count), _reply_field(entry, "released", where, _count),
                        _reply_field(entry, "permits", where, _count))


def _blocked(entry: dict[str, Any], where: str) -> Blocked:
    return Blocked(_reply_field(entry, "group", where, _identifier),
                   _one_of(entry.get("reason"), BLOCKED_REASONS, f"{where}.reason"),
                   _reply_field(entry, "waiting", where, _count))


def parse_reply(reply: Any, kind: str) -> Reply:
    """Check a holder's reply of ``kind`` ("grants" or "synced") completely.

    Raises ``ProtocolError``: with the holder's own code when it refused the
    message, ``malformed_reply`` when the reply breaks the format.
    """
    if not isinstance(reply, dict) or reply.get("v") != VERSION or isinstance(reply.get("v"), bool):
        raise ProtocolError("malformed_reply", f"holder reply of an unknown version: {reply!r}"[:300])
    refusal = ProtocolError.parse(reply)
    if refusal is not None:
        raise refusal
    if reply.get("type") != kind:
        raise ProtocolError("malformed_reply", f"expected a {kind!r} reply, got {reply.get('type')!r}"[:300])
    if not isinstance(reply.get("reports"), list):
        raise ProtocolError("malformed_reply", "a reply needs a reports list")
    # A synced reply lists the client's grants too (optional: older holders
    # do not), so that a client learns of claims it made and then forgot.
    parsed = Reply(kind, _entries(reply, "reports", _report_outcome),
                   _entries(reply, "leaseReports", _lease_outcome), _entries(reply, "leases", _lease_entry),
                   _flag(reply, "contended", "reply"), grants=_entries(reply, "grants", _grant_entry),
                   over_limit=_flag(reply, "overLimit", "reply"), closed_groups=_groups(reply.get("closedGroups", [])))
    if kind != "grants":
        return parsed
    for name in ("grants", "blocked"):
        if not isinstance(reply.get(name), list):
            raise ProtocolError("malformed_reply", f"a grants reply needs a {name} list")
    return replace(parsed, grants=_entries(reply, "grants", _grant_entry), blocked=_entries(reply, "blocked", _blocked),
                   next_request_at=_epoch_or_none(reply.get("nextRequestAt"), "nextRequestAt"),
                   all_leases_listed=_flag(reply, "allLeasesListed", "reply"),
                   line=_times_by_group(reply.get("line", {}), "line"),
                   waiting_since=_waiting_since(reply.get("waitingSince", {})),
                   waiting_since_at=_epoch_or_none(reply.get("waitingSinceAt"), "waitingSinceAt"))


def _epoch_or_none(value: Any, name: str) -> float | None:
    if value is not None and not number_in(value, 0, MAX_SAFE_INTEGER):
        raise ProtocolError("malformed_reply", f"{name} must be an epoch time in ms")
    return None if value is None else float(value)


def _groups(groups: Any) -> tuple[str, ...]:
    """A reply's ``closedGroups`` (optional: older holders send none)."""
    if not isinstance(groups, list) or len(groups) > MAX_REPLY_ENTRIES or not all(
            storable_text(group, MAX_ID_LENGTH) for group in groups):
        raise ProtocolError("malformed_reply", "closedGroups must be a list of group names")
    return tuple(groups)


def _waiting_since(waiting: Any) -> dict[str, tuple[float, ...]]:
    """A grants reply's ``waitingSince`` (optional: only a tree's parent sends it to a child)."""
    if not isinstance(waiting, dict) or len(waiting) > MAX_REPLY_ENTRIES:
        raise ProtocolError("malformed_reply", "waitingSince must be an object of groups to lists of times")
    parsed = {}
    for group, times in waiting.items():
        if number_in(times, 0, MAX_SAFE_INTEGER):  # a parent of the tree's first version: the oldest alone
            times = [times]
        if (not storable_text(group, MAX_ID_LENGTH) or not isinstance(times, list) or not times
                or len(times) > MAX_TREE_DEMAND_TIMES or not all(number_in(at, 0, MAX_SAFE_INTEGER) for at in times)
                or any(b < a for a, b in zip(times, times[1:]))):
            raise ProtocolError("malformed_reply", "waitingSince must be an object of groups to times, oldest first")
        parsed[group] = tuple(float(at) for at in times)
    return parsed


def _times_by_group(times: Any, name: str) -> dict[str, float]:
    """A grants reply's ``line`` (optional: older holders send none)."""
    if not isinstance(times, dict) or len(times) > MAX_REPLY_ENTRIES:
        raise ProtocolError("malformed_reply", f"{name} must be an object of groups to epoch times in ms")
    for group, at in times.items():
        if not storable_text(group, MAX_ID_LENGTH) or not number_in(at, 0, MAX_SAFE_INTEGER):
            raise ProtocolError("malformed_reply", f"{name} must be an object of groups to epoch times in ms")
    return {group: float(at) for group, at in times.items()}


def pacing_in(reply: Any) -> float | None:
    """The ``nextRequestAt`` of a holder's ``grants`` reply, read before it is
    checked (a client keeps it whatever the queue makes of the reply); None
    for any other reply, or a time that is none."""
    if not isinstance(reply, dict) or reply.get("type") != "grants":
        return None
    next_at = reply.get("nextRequestAt")
    return float(next_at) if number_in(next_at, 0, MAX_SAFE_INTEGER) else None
