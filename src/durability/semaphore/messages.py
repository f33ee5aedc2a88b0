"""The semaphore's wire format, both directions: every message and reply, written and read.

Lives here: the camelCase messages clients send (``request``, ``sync``) and
the replies the holder sends (``grants``, ``synced``, the refusal of
``durability._wire``), each as a typed class with ``to_wire`` (the dict the
wire carries) and ``parse`` (the dict checked completely into the class);
the bounds and the vocabularies (report statuses, blocked reasons); the
``usage`` reply; the pacing and the line a grants reply carries
(``pacing_in``, ``Reply.line``); and the bodies older queues put in their
outbox (``queued_grant_report``, ``queued_lease_id``). Every field name of
the protocol is spelled here and nowhere else. Must not know: storage, time, allocation, how a message
travels.

Every bound below is part of the protocol: a message beyond one is refused
whole with an ``error`` reply and changes nothing. A client checks every
field of a reply it will act on before it acts, so that a malformed reply
(a holder of another version, a bug, a hostile stand-in) fails that one
exchange and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, NamedTuple, TypeVar

from .._checks import MAX_SAFE_INTEGER, int_in, number_in, storable_text
from .._wire import ErrorCode as ErrorCode, ProtocolError as ProtocolError

# (ErrorCode and ProtocolError are shared with the locks: re-exported here, where callers found them.)
E = TypeVar("E")  # an entry of a reply, as parsed
V = TypeVar("V")  # a field of an entry, as checked

VERSION = 1
MAX_ID_LENGTH = 256  # clientId, group, grantId
MAX_DEMAND_ENTRIES = 64  # groups in one request
MAX_DEMAND_TIMES = 32  # item times a queue sends in one demand entry (``Demand.times``)
#: item times one demand entry may carry: a tree's child sends up to this many of
#: what its round left waiting, so that its parent lends to the oldest of them
MAX_TREE_DEMAND_TIMES = 256
MAX_REPORTS = 256  # grant reports, and lease reports, in one message
MAX_COUNT = 1_000_000  # demand in one group, permits claimed or released on one grant
MAX_WAIT_MS = 300_000  # how long a request may ask to be held for a grant

class BlockedReason(StrEnum):
    """Why a group's demand got no permit, in the order they are checked."""

    LIMIT_RESOLUTION_ERROR = "limit_resolution_error"
    NOT_PERMITTED = "not_permitted"
    GROUP_LIMIT = "group_limit"
    LIMIT = "limit"


class ReportStatus(StrEnum):
    """The holder's answer to a report on a grant or a lease."""

    OK = "ok"
    EXPIRED = "expired"  #: a grant's unclaimed permits were reclaimed before the claim
    NOT_FOUND = "not_found"  #: no such grant (reclaimed with nothing claimed, or settled)
    RETIRED = "retired"  #: a lease that must not be drawn from any more; keep reporting it
    SETTLED = "settled"  #: a lease the holder no longer counts; forget it


# The members by their old names.
LIMIT_RESOLUTION_ERROR, NOT_PERMITTED, GROUP_LIMIT, LIMIT = BlockedReason
OK, EXPIRED, NOT_FOUND, RETIRED, SETTLED = ReportStatus


@dataclass(frozen=True)
class Demand:
    """Queued items of one group that no claim covers yet, and the oldest one's age.

    ``times``: the enqueue times of the oldest of them, oldest first (at
    most ``MAX_TREE_DEMAND_TIMES``, a queue sends ``MAX_DEMAND_TIMES``; the first is ``oldest_at``), so that a round
    serves items oldest first across clients, not a client's whole demand
    at its oldest item's turn. Optional: without it, all ``count`` items
    stand in line at ``oldest_at``; past the last time given, the rest
    stand at that time.
    """

    group: str
    count: int
    oldest_at: float
    times: tuple[float, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"group": self.group, "count": self.count, "oldestAt": self.oldest_at}
        if self.times:
            wire["times"] = list(self.times)
        return wire


@dataclass(frozen=True)
class Report:
    """Cumulative counts a client reports for one grant (high-water marks)."""

    grant_id: str
    claimed: int
    released: int

    def to_wire(self) -> dict[str, Any]:
        return {"grantId": self.grant_id, "claimed": self.claimed, "released": self.released}


@dataclass(frozen=True)
class LeaseReport:
    """Cumulative counts a client reports for one lease (high-water marks).

    ``group`` and ``permits`` repeat what the lease was issued with, so a
    holder that never knew the lease can still charge its footprint.
    ``stopped``: the client draws no more from it, so ``drawn`` is final.
    """

    lease_id: str
    group: str
    permits: int
    drawn: int
    released: int
    stopped: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {"leaseId": self.lease_id, "group": self.group, "permits": self.permits, "drawn": self.drawn,
                "released": self.released, "stopped": self.stopped}


@dataclass(frozen=True)
class Request:
    """A client asks for permits for its demand, reporting on its grants and leases."""

    client_id: str
    demand: tuple[Demand, ...]
    reports: tuple[Report, ...]
    wait_ms: float = 0.0  #: hold the reply up to this long while nothing can be granted
    leases: bool = False  #: the client can draw from leases
    lease_reports: tuple[LeaseReport, ...] = ()
    #: the client takes every permit granted for its demand: grants come
    #: claimed, so it admits on the reply with no claim of its own
    claims: bool = False
    #: the latest claim deadline of the grants the client knows; grants made
    #: later, it will learn from the reply's listing (see allocation)
    heard_up_to: float = 0.0
    #: the client can be called (``semaphore_reply``): a holder that can
    #: reach it answers at once and calls with what a later round has for
    #: it, instead of holding the request open; the client asks again by
    #: itself only when ``wait_ms`` is over with nothing heard
    wake: bool = False
    #: the client object's name, if it has one: a holder reaches it by that
    #: name (an object reached by its id alone has no ``ctx.id.name``)
    name: str | None = None

    def to_wire(self) -> dict[str, Any]:
        wire = {
            "type": "request", "v": VERSION, "clientId": self.client_id,
            "demand": [demand.to_wire() for demand in self.demand],
            "grants": [report.to_wire() for report in self.reports],
            "wait": self.wait_ms,
            "leases": self.leases,
            "claims": self.claims,
            "heardUpTo": self.heard_up_to,
            "leaseReports": [report.to_wire() for report in self.lease_reports],
        }
        if self.wake:  # left out otherwise: a client that cannot be called sends what it always sent
            wire["wake"] = True
            if self.name is not None:
                wire["name"] = self.name
        return wire

    @classmethod
    def parse(cls, message: Any) -> Request:
        return _parse_as(cls, message)


@dataclass(frozen=True)
class Sync:
    """A client reports on its grants and leases, asking for nothing."""

    client_id: str
    reports: tuple[Report, ...]
    lease_reports: tuple[LeaseReport, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        """A list with nothing to report is left out (a sync carries grant reports, lease reports or both)."""
        wire: dict[str, Any] = {"type": "sync", "v": VERSION, "clientId": self.client_id}
        if self.reports:
            wire["grants"] = [report.to_wire() for report in self.reports]
        if self.lease_reports:
            wire["leaseReports"] = [report.to_wire() for report in self.lease_reports]
        return wire

    @classmethod
    def parse(cls, message: Any) -> Sync:
        return _parse_as(cls, message)


def _field(message: dict[str, Any], name: str, where: str) -> Any:
    if name not in message:
        raise ProtocolError("invalid_message", f"{where}: missing field {name!r}")
    return message[name]


def _identifier(value: Any, what: str) -> str:
    if not storable_text(value, MAX_ID_LENGTH):
        raise ProtocolError("invalid_message",
                            f"{what} must be a string of 1 to {MAX_ID_LENGTH} characters with a UTF-8 form")
    return value


def _count(value: Any, what: str) -> int:
    # RPC turns whole numbers into ints; a float here was never whole.
    if not int_in(value, 0, MAX_COUNT):
        raise ProtocolError("invalid_message", f"{what} must be an integer from 0 to {MAX_COUNT}")
    return value


def _time(value: Any, what: str) -> float:
    if not number_in(value, 0, MAX_SAFE_INTEGER):
        raise ProtocolError("invalid_message", f"{what} must be an epoch time in ms from 0 to 2**53")
    return float(value)


def _list(value: Any, what: str, most: int) -> list[Any]:
    if not isinstance(value, list):
        raise ProtocolError("invalid_message", f"{what} must be a list")
    if len(value) > most:
        raise ProtocolError("too_large", f"{what} holds {len(value)} entries; at most {most} are allowed")
    return value


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError("invalid_message", f"{what} must be an object")
    return value


def _reports(message: dict[str, Any]) -> tuple[Report, ...]:
    reports, seen = [], set()
    for i, raw in enumerate(_list(message.get("grants", []), "grants", MAX_REPORTS)):
        entry = _object(raw, f"grants[{i}]")
        grant_id = _identifier(_field(entry, "grantId", f"grants[{i}]"), f"grants[{i}].grantId")
        claimed = _count(_field(entry, "claimed", f"grants[{i}]"), f"grants[{i}].claimed")
        released = _count(_field(entry, "released", f"grants[{i}]"), f"grants[{i}].released")
        if released > claimed:
            raise ProtocolError("invalid_message", f"grants[{i}]: released {released} exceeds claimed {claimed}")
        if grant_id in seen:
            raise ProtocolError("invalid_message", f"grants[{i}]: grant {grant_id!r} is reported twice")
        seen.add(grant_id)
        reports.append(Report(grant_id, claimed, released))
    return tuple(reports)


def _lease_reports(message: dict[str, Any]) -> tuple[LeaseReport, ...]:
    reports, seen = [], set()
    for i, raw in enumerate(_list(message.get("leaseReports", []), "leaseReports", MAX_REPORTS)):
        where = f"leaseReports[{i}]"
        entry = _object(raw, where)
        lease_id = _identifier(_field(entry, "leaseId", where), f"{where}.leaseId")
        group = _identifier(_field(entry, "group", where), f"{where}.group")
        permits = _count(_field(entry, "permits", where), f"{where}.permits")
        drawn = _count(_field(entry, "drawn", where), f"{where}.drawn")
        released = _count(_field(entry, "released", where), f"{where}.released")
        stopped = entry.get("stopped", False)
        if not isinstance(stopped, bool):
            raise ProtocolError("invalid_message", f"{where}.stopped must be true or false")
        if not released <= drawn <= permits:
            raise ProtocolError("invalid_message", f"{where}: needs released <= drawn <= permits")
        if lease_id in seen:
            raise ProtocolError("invalid_message", f"{where}: lease {lease_id!r} is reported twice")
        seen.add(lease_id)
        reports.append(LeaseReport(lease_id, group, permits, drawn, released, stopped))
    return tuple(reports)


def _demand(message: dict[str, Any]) -> tuple[Demand, ...]:
    demand, seen = [], set()
    for i, raw in enumerate(_list(message.get("demand", []), "demand", MAX_DEMAND_ENTRIES)):
        entry = _object(raw, f"demand[{i}]")
        group = _identifier(_field(entry, "group", f"demand[{i}]"), f"demand[{i}].group")
        if group in seen:
            raise ProtocolError("invalid_message", f"demand[{i}]: group {group!r} appears twice")
        seen.add(group)
        count = _count(_field(entry, "count", f"demand[{i}]"), f"demand[{i}].count")
        oldest_at = _time(_field(entry, "oldestAt", f"demand[{i}]"), f"demand[{i}].oldestAt")
        demand.append(Demand(group, count, oldest_at, _demand_times(entry, count, oldest_at, f"demand[{i}]")))
    return tuple(demand)


def _demand_times(entry: dict[str, Any], count: int, oldest_at: float, where: str) -> tuple[float, ...]:
    """A demand's ``times``: at most ``count`` of them, oldest first, the first ``oldestAt``."""
    if "times" not in entry:
        return ()
    times = [_time(at, f"{where}.times") for at in _list(entry["times"], f"{where}.times", MAX_TREE_DEMAND_TIMES)]
    if len(times) > count or (times and times[0] != oldest_at) or any(b < a for a, b in zip(times, times[1:])):
        raise ProtocolError("invalid_message",
                            f"{where}.times must be at most count times, oldest first, the first oldestAt")
    return tuple(times)


M = TypeVar("M", Request, Sync)


def _parse_as(kind: type[M], message: Any) -> M:
    parsed = parse(message)
    if not isinstance(parsed, kind):
        raise ProtocolError(ErrorCode.UNSUPPORTED, f"expected a {kind.__name__.lower()} message")
    return parsed


def parse(message: Any) -> Request | Sync:
    """Check a message completely; raise ``ProtocolError`` on the first fault."""
    message = _object(message, "message")
    kind = message.get("type")
    if kind not in ("request", "sync"):
        raise ProtocolError("unsupported", f"unknown message type {kind!r}")
    version = message.get("v")
    if version != VERSION or isinstance(version, bool):
        raise ProtocolError("unsupported",
                            f"protocol version {version!r} is not supported (this holder speaks {VERSION})")
    client_id = _identifier(_field(message, "clientId", "message"), "clientId")
    reports = _reports(message)
    lease_reports = _lease_reports(message)
    if kind == "sync":
        return Sync(client_id, reports, lease_reports)
    wait = message.get("wait", 0)
    if not number_in(wait, 0, MAX_WAIT_MS):
        raise ProtocolError("invalid_message", f"wait must be a number of ms from 0 to {MAX_WAIT_MS}")
    leases, claims, wake = (message.get(name, False) for name in ("leases", "claims", "wake"))
    if not all(isinstance(flag, bool) for flag in (leases, claims, wake)):
        raise ProtocolError("invalid_message", "leases, claims and wake must be true or false")
    heard = _time(message.get("heardUpTo", 0), "heardUpTo")
    name = message.get("name")
    if name is not None:
        name = _identifier(name, "name")
    return Request(client_id, _demand(message), reports, float(wait), leases, lease_reports, claims=claims,
                   heard_up_to=heard, wake=wake, name=name)


# -- replies: the holder builds them, a client checks them before it acts -------------

REPORT_STATUSES = (OK, EXPIRED, NOT_FOUND)
LEASE_STATUSES = (OK, RETIRED, SETTLED)
BLOCKED_REASONS = (LIMIT_RESOLUTION_ERROR, NOT_PERMITTED, GROUP_LIMIT, LIMIT)


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
    #: which does not say); see ``queue_grants.usable_claims``
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
    #: behind a client it just served (``holder_line.Line``)
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


def _flag(entry: dict[str, Any], name: str, where: str, default: bool = False) -> bool:
    value = entry.get(name, default)
    if not isinstance(value, bool):
        raise ProtocolError("malformed_reply", f"{where}.{name} must be true or false")
    return value


def _one_of(value: Any, allowed: tuple[str, ...], what: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ProtocolError("malformed_reply", f"{what} must be one of {list(allowed)}")
    return value


MAX_REPLY_ENTRIES = 10_000  # a sanity bound: a reply lists what one client holds and reported


def _entries(reply: dict[str, Any], name: str, parse_entry: Callable[[dict[str, Any], str], E]) -> tuple[E, ...]:
    raw = reply.get(name, [])
    if not isinstance(raw, list) or len(raw) > MAX_REPLY_ENTRIES:
        raise ProtocolError("malformed_reply", f"{name} must be a list of at most {MAX_REPLY_ENTRIES} entries")
    entries = []
    for i, entry in enumerate(raw):
        where = f"{name}[{i}]"
        if not isinstance(entry, dict):
            raise ProtocolError("malformed_reply", f"{where} must be an object")
        entries.append(parse_entry(entry, where))
    return tuple(entries)


def _reply_field(entry: dict[str, Any], name: str, where: str, check: Callable[[Any, str], V]) -> V:
    try:
        return check(_field(entry, name, where), f"{where}.{name}")
    except ProtocolError as error:
        raise ProtocolError("malformed_reply", str(error)) from None


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


# -- what older versions of the queue left in its outbox ----------------------------------
# Each body is the report as the wire spelled it, with the key it was for.

def queued_grant_report(body: dict[str, Any]) -> Report | None:
    """A grant report an older version queued, or None if the body holds none."""
    if "grantId" not in body:
        return None
    return Report(body["grantId"], body["claimed"], body["released"])


def queued_lease_id(body: dict[str, Any]) -> str | None:
    """The lease a lease report an older version queued is about, or None."""
    lease_id: str | None = body.get("leaseId")
    return lease_id


# -- the usage reply: the holder's books, as ``usage()`` answers over RPC -------------------

@dataclass(frozen=True)
class GroupUsage:
    """One group's permits in the holder's books."""

    outstanding: int  #: granted or leased and not released: in use plus reserved
    in_use: int  #: claimed on grants and drawn from leases, not released
    reserved: int  #: granted and not claimed yet, or leased and not drawn yet
    lease_footprint: int  #: what the group's leases charge
    limit: int | None  #: the group's own ceiling (None: none, or its callback failed)

    def to_wire(self) -> dict[str, Any]:
        return {"outstanding": self.outstanding, "inUse": self.in_use, "reserved": self.reserved,
                "leaseFootprint": self.lease_footprint, "limit": self.limit}

    @classmethod
    def parse(cls, wire: Any, where: str = "group") -> GroupUsage:
        entry = _reply_object(wire, where)
        return cls(_tally(entry, "outstanding", where), _tally(entry, "inUse", where),
                   _tally(entry, "reserved", where), _tally(entry, "leaseFootprint", where),
                   _optional_count(entry, "limit", where))


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
                   *_sharing(reply))


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
