"""What clients send the holder: the ``request`` and ``sync`` messages, written and read.

Lives here: the camelCase messages clients send, each as a typed class
with ``to_wire`` (the dict the wire carries) and ``parse`` (the dict
checked completely into the class): ``Request`` and ``Sync``, and what
they carry (``Demand``, ``Report``, ``LeaseReport``); ``parse``, which
checks a message of either type; and the bodies older queues put in
their outbox (``queued_grant_report``, ``queued_lease_id``). Must not
know: the replies, storage, time, allocation, how a message travels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from ..._common.checks import number_in
from ..._common.wire import ErrorCode, ProtocolError
from .checks import (
    MAX_DEMAND_ENTRIES,
    MAX_REPORTS,
    MAX_TREE_DEMAND_TIMES,
    MAX_WAIT_MS,
    VERSION,
    _count,
    _field,
    _identifier,
    _list,
    _object,
    _time,
)


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
    #: (with ``wake``) the client asks by itself, having heard nothing for a
    #: whole wait: calls to it may be failing, so the holder answers after
    #: its next round, with what that round has for the client
    fallback: bool = False

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
            if self.fallback:
                wire["fallback"] = True
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
    leases, claims, wake, fallback = (message.get(name, False) for name in ("leases", "claims", "wake", "fallback"))
    if not all(isinstance(flag, bool) for flag in (leases, claims, wake, fallback)):
        raise ProtocolError("invalid_message", "leases, claims, wake and fallback must be true or false")
    heard = _time(message.get("heardUpTo", 0), "heardUpTo")
    name = message.get("name")
    if name is not None:
        name = _identifier(name, "name")
    return Request(client_id, _demand(message), reports, float(wait), leases, lease_reports, claims=claims,
                   heard_up_to=heard, wake=wake, name=name, fallback=fallback)


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
