"""The semaphore's wire format: parsing and checking messages, building replies.

Lives here: the camelCase messages clients send (``request``, ``sync``), their
validation into typed values (grant reports, lease reports, the lease
support flag), and the error reply. Must not know: storage, time, allocation.

Every bound below is part of the protocol: a message beyond one is refused
whole with an ``error`` reply and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, TypeVar

from .._checks import MAX_SAFE_INTEGER, int_in, number_in, storable_text

E = TypeVar("E")  # an entry of a reply, as parsed
V = TypeVar("V")  # a field of an entry, as checked

VERSION = 1
MAX_ID_LENGTH = 256  # clientId, group, grantId
MAX_DEMAND_ENTRIES = 64  # groups in one request
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


class ErrorCode(StrEnum):
    """Why a message was refused (``ProtocolError.code``)."""

    INVALID_MESSAGE = "invalid_message"
    UNSUPPORTED = "unsupported"
    FORBIDDEN = "forbidden"
    MALFORMED_REPLY = "malformed_reply"  #: raised on the client: the holder's reply breaks the format


# The members by their old names.
LIMIT_RESOLUTION_ERROR, NOT_PERMITTED, GROUP_LIMIT, LIMIT = BlockedReason
OK, EXPIRED, NOT_FOUND, RETIRED, SETTLED = ReportStatus


class ProtocolError(ValueError):
    """A message the holder refuses; ``code`` is machine-readable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code

    def reply(self) -> dict[str, Any]:
        return {"type": "error", "v": VERSION, "code": self.code, "message": str(self)}


@dataclass(frozen=True)
class Demand:
    """Queued items of one group that no claim covers yet, and the oldest one's age."""

    group: str
    count: int
    oldest_at: float


@dataclass(frozen=True)
class Report:
    """Cumulative counts a client reports for one grant (high-water marks)."""

    grant_id: str
    claimed: int
    released: int


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


@dataclass(frozen=True)
class Request:
    client_id: str
    demand: tuple[Demand, ...]
    reports: tuple[Report, ...]
    wait_ms: float = 0.0  #: hold the reply up to this long while nothing can be granted
    leases: bool = False  #: the client can draw from leases
    lease_reports: tuple[LeaseReport, ...] = ()
    #: not on the wire: False once the holder holds the request over to a
    #: later round, where its (old) reports must not count as a heartbeat
    heartbeat: bool = True
    #: the client takes every permit granted for its demand: grants come
    #: claimed, so it admits on the reply with no claim of its own
    claims: bool = False
    #: the latest claim deadline of the grants the client knows; grants made
    #: later, it will learn from the reply's listing (see allocation)
    heard_up_to: float = 0.0


@dataclass(frozen=True)
class Sync:
    client_id: str
    reports: tuple[Report, ...]
    lease_reports: tuple[LeaseReport, ...] = ()


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
        demand.append(Demand(group, count, oldest_at))
    return tuple(demand)


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
    leases, claims = message.get("leases", False), message.get("claims", False)
    if not isinstance(leases, bool) or not isinstance(claims, bool):
        raise ProtocolError("invalid_message", "leases and claims must be true or false")
    heard = _time(message.get("heardUpTo", 0), "heardUpTo")
    return Request(client_id, _demand(message), reports, float(wait), leases, lease_reports, claims=claims,
                   heard_up_to=heard)


# -- replies, as the queue reads them ------------------------------------------------
# The holder builds these replies; a client checks every field it will act
# on before it acts, so that a malformed reply (a holder of another version,
# a bug, a hostile stand-in) fails that one exchange and changes nothing.

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


@dataclass(frozen=True)
class ReportOutcome:
    """The holder's answer to one grant report."""

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
    group: str
    reason: str
    waiting: int


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
    #: behind a client it just served (``allocation.line_ahead``)
    line: dict[str, float] = field(default_factory=dict)


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
                      released)


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
    if reply.get("type") == "error":
        code = reply.get("code")
        code = code if storable_text(code, MAX_ID_LENGTH) else "malformed_reply"
        raise ProtocolError(code, f"holder refused the message: {reply.get('message')!r}"[:300])
    if reply.get("type") != kind:
        raise ProtocolError("malformed_reply", f"expected a {kind!r} reply, got {reply.get('type')!r}"[:300])
    if not isinstance(reply.get("reports"), list):
        raise ProtocolError("malformed_reply", "a reply needs a reports list")
    # A synced reply lists the client's grants too (optional: older holders
    # do not), so that a client learns of claims it made and then forgot.
    parsed = Reply(kind, _entries(reply, "reports", _report_outcome),
                   _entries(reply, "leaseReports", _lease_outcome), _entries(reply, "leases", _lease_entry),
                   _flag(reply, "contended", "reply"), grants=_entries(reply, "grants", _grant_entry))
    if kind != "grants":
        return parsed
    for name in ("grants", "blocked"):
        if not isinstance(reply.get(name), list):
            raise ProtocolError("malformed_reply", f"a grants reply needs a {name} list")
    next_at = reply.get("nextRequestAt")
    if next_at is not None and not number_in(next_at, 0, MAX_SAFE_INTEGER):
        raise ProtocolError("malformed_reply", "nextRequestAt must be an epoch time in ms")
    return replace(parsed, grants=_entries(reply, "grants", _grant_entry), blocked=_entries(reply, "blocked", _blocked),
                   next_request_at=None if next_at is None else float(next_at),
                   all_leases_listed=_flag(reply, "allLeasesListed", "reply"), line=_line(reply.get("line", {})))


def _line(line: Any) -> dict[str, float]:
    """A grants reply's ``line`` (optional: older holders send none)."""
    if not isinstance(line, dict) or len(line) > MAX_REPLY_ENTRIES:
        raise ProtocolError("malformed_reply", "line must be an object of groups to epoch times in ms")
    for group, at in line.items():
        if not storable_text(group, MAX_ID_LENGTH) or not number_in(at, 0, MAX_SAFE_INTEGER):
            raise ProtocolError("malformed_reply", "line must be an object of groups to epoch times in ms")
    return {group: float(at) for group, at in line.items()}
