"""The semaphore's wire format: parsing and checking messages, building replies.

Lives here: the camelCase messages clients send (``request``, ``sync``), their
validation into typed values (grant reports, lease reports, the lease
support flag), and the error reply. Must not know: storage, time, allocation.

Every bound below is part of the protocol: a message beyond one is refused
whole with an ``error`` reply and changes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

VERSION = 1
MAX_ID_LENGTH = 256  # clientId, group, grantId
MAX_DEMAND_ENTRIES = 64  # groups in one request
MAX_REPORTS = 256  # grant reports, and lease reports, in one message
MAX_COUNT = 1_000_000  # demand in one group, permits claimed or released on one grant
MAX_WAIT_MS = 60_000  # how long a request may ask to be held for a grant

# Blocked reasons, in the order they are checked.
LIMIT_RESOLUTION_ERROR = "limit_resolution_error"
NOT_PERMITTED = "not_permitted"
GROUP_LIMIT = "group_limit"
LIMIT = "limit"

# Report statuses.
OK = "ok"
EXPIRED = "expired"
NOT_FOUND = "not_found"
RETIRED = "retired"  #: a lease that must not be drawn from any more; keep reporting it
SETTLED = "settled"  #: a lease the holder no longer counts; forget it


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


@dataclass(frozen=True)
class Sync:
    client_id: str
    reports: tuple[Report, ...]
    lease_reports: tuple[LeaseReport, ...] = ()


def _field(message: dict, name: str, where: str) -> Any:
    if name not in message:
        raise ProtocolError("invalid_message", f"{where}: missing field {name!r}")
    return message[name]


def _identifier(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH:
        raise ProtocolError("invalid_message", f"{what} must be a string of 1 to {MAX_ID_LENGTH} characters")
    return value


def _count(value: Any, what: str) -> int:
    # RPC turns whole numbers into ints; a float here was never whole.
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise ProtocolError("invalid_message", f"{what} must be an integer from 0 to {MAX_COUNT}")
    return value


def _time(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ProtocolError("invalid_message", f"{what} must be a finite, non-negative epoch time in ms")
    return float(value)


def _list(value: Any, what: str, most: int) -> list:
    if not isinstance(value, list):
        raise ProtocolError("invalid_message", f"{what} must be a list")
    if len(value) > most:
        raise ProtocolError("too_large", f"{what} holds {len(value)} entries; at most {most} are allowed")
    return value


def _object(value: Any, what: str) -> dict:
    if not isinstance(value, dict):
        raise ProtocolError("invalid_message", f"{what} must be an object")
    return value


def _reports(message: dict) -> tuple[Report, ...]:
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


def _lease_reports(message: dict) -> tuple[LeaseReport, ...]:
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


def _demand(message: dict) -> tuple[Demand, ...]:
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
        raise ProtocolError("unsupported", f"protocol version {version!r} is not supported (this holder speaks {VERSION})")
    client_id = _identifier(_field(message, "clientId", "message"), "clientId")
    reports = _reports(message)
    lease_reports = _lease_reports(message)
    if kind == "sync":
        return Sync(client_id, reports, lease_reports)
    wait = message.get("wait", 0)
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= MAX_WAIT_MS:
        raise ProtocolError("invalid_message", f"wait must be a number of ms from 0 to {MAX_WAIT_MS}")
    leases = message.get("leases", False)
    if not isinstance(leases, bool):
        raise ProtocolError("invalid_message", "leases must be true or false")
    return Request(client_id, _demand(message), reports, float(wait), leases, lease_reports)
