"""The holder's protocol logic: reports, reclaim and allocation rounds, as pure functions.

Lives here: the grant book (``Grant``), applying cumulative reports,
reclaiming unclaimed permits past their deadline, and one allocation round
from (book, requests, resolved limits, now) to (changes, per-client outcome).
Must not know: storage, RPC, clocks or the user's callbacks; the holder
reads the time, resolves the limits and persists the changes.

Accounting. A grant holds ``permits`` for one (client, group). The client
reports ``claimed`` (permits it used) and ``released`` (claimed permits it
gave back) as cumulative high-water marks. The holder keeps each count at the
highest value it was told, clamped to the grant (``released <= claimed <=
permits``), so a lost, repeated or reordered report never frees capacity
twice. A grant charges ``permits - released`` against the limit: its permits
in use plus those still reserved for claiming. At its claim deadline the
unclaimed rest returns to the pool (``permits`` shrinks to ``claimed``); a
grant whose permits are all released is settled and removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Iterable

from .messages import (
    EXPIRED,
    GROUP_LIMIT,
    LIMIT,
    LIMIT_RESOLUTION_ERROR,
    NOT_FOUND,
    NOT_PERMITTED,
    OK,
    ProtocolError,
    Report,
    Request,
)


@dataclass(frozen=True)
class Grant:
    grant_id: str
    client_id: str
    group: str
    permits: int
    claimed: int
    released: int
    claim_deadline: float  #: epoch ms when unclaimed permits return to the pool
    reclaimed: bool = False  #: the unclaimed rest was taken back

    @property
    def unclaimed(self) -> int:
        return self.permits - self.claimed

    @property
    def charged(self) -> int:
        return self.permits - self.released

    @property
    def settled(self) -> bool:
        return self.released == self.permits


@dataclass
class Changes:
    """Grants to write and grants to delete, in the order they were decided."""

    written: dict[str, Grant] = field(default_factory=dict)
    deleted: dict[str, None] = field(default_factory=dict)

    def put(self, grant: Grant) -> None:
        self.deleted.pop(grant.grant_id, None)
        self.written[grant.grant_id] = grant

    def delete(self, grant_id: str) -> None:
        self.written.pop(grant_id, None)
        self.deleted[grant_id] = None

    def apply_to(self, book: dict[str, Grant]) -> None:
        for grant_id in self.deleted:
            book.pop(grant_id, None)
        book.update(self.written)

    def __bool__(self) -> bool:
        return bool(self.written or self.deleted)


@dataclass(frozen=True)
class ReportOutcome:
    grant_id: str
    status: str  #: ok, expired (reclaimed: counts clamped), not_found (gone)
    claimed: int  #: the claims the holder confirms
    released: int
    permits: int


class Working:
    """A copy-on-write view of the book while a round or a report decides changes."""

    def __init__(self, book: dict[str, Grant]) -> None:
        self.book = book
        self.changes = Changes()

    def get(self, grant_id: str) -> Grant | None:
        if grant_id in self.changes.deleted:
            return None
        return self.changes.written.get(grant_id) or self.book.get(grant_id)

    def put(self, grant: Grant) -> None:
        if grant.settled:
            self.changes.delete(grant.grant_id)
        else:
            self.changes.put(grant)

    def grants(self) -> Iterable[Grant]:
        for grant_id, grant in self.book.items():
            if grant_id not in self.changes.deleted and grant_id not in self.changes.written:
                yield grant
        yield from self.changes.written.values()


def check_ownership(working: Working, client_id: str, reports: Iterable[Report]) -> None:
    """A client may report only on its own grants: refuse the whole message otherwise."""
    for report in reports:
        grant = working.get(report.grant_id)
        if grant is not None and grant.client_id != client_id:
            raise ProtocolError("forbidden", f"grant {report.grant_id!r} belongs to another client")


def apply_report(working: Working, report: Report) -> ReportOutcome:
    grant = working.get(report.grant_id)
    if grant is None:
        return ReportOutcome(report.grant_id, NOT_FOUND, 0, 0, 0)
    claimed = max(grant.claimed, min(report.claimed, grant.permits))
    released = max(grant.released, min(report.released, claimed))
    if (claimed, released) != (grant.claimed, grant.released):
        working.put(replace(grant, claimed=claimed, released=released))
    status = EXPIRED if grant.reclaimed and report.claimed > claimed else OK
    return ReportOutcome(report.grant_id, status, claimed, released, grant.permits)


def apply_reports(working: Working, client_id: str, reports: Iterable[Report]) -> list[ReportOutcome]:
    reports = list(reports)
    check_ownership(working, client_id, reports)
    return [apply_report(working, report) for report in reports]


def reclaim(working: Working, now: float) -> None:
    """Take back permits not claimed by their deadline; drop grants left empty."""
    for grant in list(working.grants()):
        if grant.unclaimed > 0 and grant.claim_deadline <= now:
            working.put(replace(grant, permits=grant.claimed, reclaimed=True))


def merged(book: dict[str, Grant], changes: Changes) -> list[Grant]:
    """The grants as they stand once ``changes`` apply to ``book``."""
    working = Working(book)
    working.changes = changes
    return list(working.grants())


def earliest_claim_deadline(book: Iterable[Grant]) -> float | None:
    """When the next unclaimed permits are due back (the reclaim timer)."""
    deadlines = [g.claim_deadline for g in book if g.unclaimed > 0]
    return min(deadlines) if deadlines else None


class ResolutionFailed:
    """A limit callback raised: the groups it governs fail closed."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __repr__(self) -> str:
        return f"ResolutionFailed({self.error!r})"


@dataclass(frozen=True)
class Limits:
    """Everything the user's callbacks said for one round, resolved in advance."""

    total: int | ResolutionFailed
    groups: dict[str, int | None | ResolutionFailed]  #: None: no limit of its own
    permitted: dict[tuple[str, str], bool]  #: can_grant per (client, group)


@dataclass
class ClientOutcome:
    """What one client learns from a round."""

    reports: list[ReportOutcome] = field(default_factory=list)
    new_grants: list[Grant] = field(default_factory=list)
    open_grants: list[Grant] = field(default_factory=list)  #: every grant with unclaimed permits
    blocked: dict[str, tuple[str, int]] = field(default_factory=dict)  #: group -> (reason, waiting)


@dataclass
class RoundResult:
    changes: Changes
    outcomes: dict[str, ClientOutcome]
    errors: dict[int, ProtocolError]  #: request index -> why it was refused


def usage(grants: Iterable[Grant]) -> tuple[int, dict[str, int]]:
    total, groups = 0, {}
    for grant in grants:
        total += grant.charged
        groups[grant.group] = groups.get(grant.group, 0) + grant.charged
    return total, groups


def run_round(book: dict[str, Grant], requests: list[Request], limits: Limits, now: float,
              grant_timeout_ms: float, new_grant_id: Callable[[], str]) -> RoundResult:
    """One allocation round over every request that arrived for it.

    Reports are applied first (a request whose reports touch another
    client's grant is refused alone), then expired permits are reclaimed,
    then demand is served oldest first across all clients. A client that
    sent several requests in the round is served once, by its latest. Its
    demand is net of the permits it already holds unclaimed in that group,
    so a request repeated after a lost reply is not served twice; every
    reply lists all of the client's open grants, so the client learns of
    grants whose reply it missed.
    """
    working = Working(book)
    outcomes: dict[str, ClientOutcome] = {}
    errors: dict[int, ProtocolError] = {}
    latest: dict[str, Request] = {}
    arrival: dict[str, int] = {}
    for index, request in enumerate(requests):
        try:
            reported = apply_reports(working, request.client_id, request.reports)
        except ProtocolError as error:
            errors[index] = error
            continue
        outcome = outcomes.setdefault(request.client_id, ClientOutcome())
        outcome.reports.extend(reported)
        latest[request.client_id] = request
        arrival.setdefault(request.client_id, index)
    reclaim(working, now)

    used_total, used_groups = usage(working.grants())
    unclaimed: dict[tuple[str, str], int] = {}
    for grant in working.grants():
        key = (grant.client_id, grant.group)
        unclaimed[key] = unclaimed.get(key, 0) + grant.unclaimed

    entries = sorted(
        (demand.oldest_at, arrival[client_id], position, client_id, demand)
        for client_id, request in latest.items()
        for position, demand in enumerate(request.demand)
    )
    for _, _, _, client_id, demand in entries:
        want = demand.count - unclaimed.get((client_id, demand.group), 0)
        if want <= 0:
            continue
        outcome = outcomes[client_id]
        ceiling = limits.groups.get(demand.group)
        if isinstance(limits.total, ResolutionFailed) or isinstance(ceiling, ResolutionFailed):
            outcome.blocked[demand.group] = (LIMIT_RESOLUTION_ERROR, want)
            continue
        if not limits.permitted.get((client_id, demand.group), True):
            outcome.blocked[demand.group] = (NOT_PERMITTED, want)
            continue
        room_total = limits.total - used_total
        room_group = room_total if ceiling is None else ceiling - used_groups.get(demand.group, 0)
        give = max(0, min(want, room_total, room_group))
        if give:
            grant = Grant(new_grant_id(), client_id, demand.group, give, 0, 0, now + grant_timeout_ms)
            working.put(grant)
            outcome.new_grants.append(grant)
            used_total += give
            used_groups[demand.group] = used_groups.get(demand.group, 0) + give
        if give < want:
            # The group's own ceiling holds it back whenever it leaves no more
            # room than the total does (a total below usage leaves none).
            reason = GROUP_LIMIT if ceiling is not None and room_group <= max(room_total, 0) else LIMIT
            outcome.blocked[demand.group] = (reason, want - give)

    for grant in working.grants():
        outcome = outcomes.get(grant.client_id)
        if outcome is not None and grant.unclaimed > 0:
            outcome.open_grants.append(grant)
    return RoundResult(working.changes, outcomes, errors)
