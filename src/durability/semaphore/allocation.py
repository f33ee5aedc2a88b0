"""The holder's protocol logic: reports, reclaim and allocation rounds, as pure functions.

Lives here: the grant book (``Grant``), applying cumulative reports,
reclaiming unclaimed permits past their deadline, and one allocation round
from (book of grants and leases, requests, resolved limits, now) to
(changes, per-client outcome): grants first, then leases from what is left
(the lease rules themselves live in ``leases``).
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
grant whose permits are all released is settled and removed, except one
that was reclaimed after some of its permits were claimed: it stays,
settled, for ``SETTLED_MEMORY_MS`` past its deadline, so that a claim
arriving late is answered ``expired`` with the clamped count (``not_found``
is kept for grants on which nothing was claimed).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable

from .leases import (
    SETTLED_MEMORY_MS,
    Lease,
    LeaseIds,
    LeasePolicy,
    apply_lease_report,
    forget_settled,
    lease_usage,
    no_leases,
    retire_expired,
    retire_ineligible,
    share,
    tally,
)
from .messages import (
    EXPIRED,
    GROUP_LIMIT,
    LIMIT,
    LIMIT_RESOLUTION_ERROR,
    MAX_REPORTS,
    NOT_FOUND,
    NOT_PERMITTED,
    OK,
    LeaseOutcome,
    LeaseReport,
    ProtocolError,
    Report,
    ReportOutcome,
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

    @property
    def remembered(self) -> bool:
        """Kept in the book once settled: reclaimed after claims (see the module notes)."""
        return self.reclaimed and self.claimed > 0

    @property
    def forget_at(self) -> float:
        return self.claim_deadline + SETTLED_MEMORY_MS


@dataclass
class Changes:
    """Grants and leases to write and to delete, in the order they were decided,
    and the new count of lease ids issued (None: unchanged)."""

    written: dict[str, Grant] = field(default_factory=dict)
    deleted: dict[str, None] = field(default_factory=dict)
    leases_written: dict[str, Lease] = field(default_factory=dict)
    leases_deleted: dict[str, None] = field(default_factory=dict)
    issued: int | None = None

    def put(self, grant: Grant) -> None:
        self.deleted.pop(grant.grant_id, None)
        self.written[grant.grant_id] = grant

    def delete(self, grant_id: str) -> None:
        self.written.pop(grant_id, None)
        self.deleted[grant_id] = None

    def put_lease(self, lease: Lease) -> None:
        self.leases_deleted.pop(lease.lease_id, None)
        self.leases_written[lease.lease_id] = lease

    def delete_lease(self, lease_id: str) -> None:
        self.leases_written.pop(lease_id, None)
        self.leases_deleted[lease_id] = None

    def apply_to(self, book: dict[str, Grant], leases: dict[str, Lease] | None = None) -> None:
        for grant_id in self.deleted:
            book.pop(grant_id, None)
        book.update(self.written)
        if leases is not None:
            for lease_id in self.leases_deleted:
                leases.pop(lease_id, None)
            leases.update(self.leases_written)

    def __bool__(self) -> bool:
        return bool(self.written or self.deleted or self.leases_written or self.leases_deleted
                    or self.issued is not None)


class Working:
    """A copy-on-write view of the book while a round or a report decides changes."""

    def __init__(self, book: dict[str, Grant], leases: dict[str, Lease] | None = None) -> None:
        self.book = book
        self.lease_book = leases if leases is not None else {}
        self.changes = Changes()

    def get(self, grant_id: str) -> Grant | None:
        if grant_id in self.changes.deleted:
            return None
        return self.changes.written.get(grant_id) or self.book.get(grant_id)

    def put(self, grant: Grant) -> None:
        if grant.settled and not grant.remembered:
            self.changes.delete(grant.grant_id)
        else:
            self.changes.put(grant)

    def grants(self) -> Iterable[Grant]:
        for grant_id, grant in self.book.items():
            if grant_id not in self.changes.deleted and grant_id not in self.changes.written:
                yield grant
        yield from self.changes.written.values()

    def get_lease(self, lease_id: str) -> Lease | None:
        if lease_id in self.changes.leases_deleted:
            return None
        return self.changes.leases_written.get(lease_id) or self.lease_book.get(lease_id)

    def put_lease(self, lease: Lease) -> None:
        if lease.settled:
            self.changes.delete_lease(lease.lease_id)
        else:
            self.changes.put_lease(lease)

    def leases(self) -> Iterable[Lease]:
        changes = self.changes
        for lease_id, lease in self.lease_book.items():
            if lease_id not in changes.leases_deleted and lease_id not in changes.leases_written:
                yield lease
        yield from changes.leases_written.values()


def check_ownership(working: Working, client_id: str, reports: Iterable[Report],
                    lease_reports: Iterable[LeaseReport] = (), ids: LeaseIds | None = None) -> None:
    """A client may report only on its own grants and leases, and on no lease
    id of this holder's that it never issued: refuse the whole message otherwise."""
    for report in reports:
        grant = working.get(report.grant_id)
        if grant is not None and grant.client_id != client_id:
            raise ProtocolError("forbidden", f"grant {report.grant_id!r} belongs to another client")
    for lease_report in lease_reports:
        lease = working.get_lease(lease_report.lease_id)
        if lease is not None and lease.client_id != client_id:
            raise ProtocolError("forbidden", f"lease {lease_report.lease_id!r} belongs to another client")
        if lease is None and ids is not None and ids.owns(lease_report.lease_id) and not ids.was_issued(
                lease_report.lease_id):
            # Charging it could collide with an id this holder issues later.
            raise ProtocolError("forbidden", f"lease {lease_report.lease_id!r} was never issued by this holder")


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


def apply_all_reports(working: Working, client_id: str, reports: Iterable[Report],
                      lease_reports: Iterable[LeaseReport], ids: LeaseIds, now: float,
                      ttl_ms: float | None) -> tuple[list[ReportOutcome], list[LeaseOutcome]]:
    """Grant and lease reports of one message: all of them, or none if any is not the client's."""
    reports, lease_reports = list(reports), list(lease_reports)
    check_ownership(working, client_id, reports, lease_reports, ids)
    return ([apply_report(working, report) for report in reports],
            [apply_lease_report(working, client_id, report, ids, now, ttl_ms) for report in lease_reports])


def reclaim(working: Working, now: float) -> None:
    """Take back permits not claimed by their deadline; drop grants left empty,
    and settled ones remembered long enough; forget settled leases likewise."""
    for grant in list(working.grants()):
        if grant.unclaimed > 0 and grant.claim_deadline <= now:
            working.put(replace(grant, permits=grant.claimed, reclaimed=True))
        elif grant.settled and grant.forget_at <= now:
            working.changes.delete(grant.grant_id)
    forget_settled(working, now)


def merged(book: dict[str, Grant], changes: Changes) -> list[Grant]:
    """The grants as they stand once ``changes`` apply to ``book``."""
    working = Working(book)
    working.changes = changes
    return list(working.grants())


def merged_leases(leases: dict[str, Lease], changes: Changes) -> list[Lease]:
    """The leases as they stand once ``changes`` apply to ``leases``."""
    working = Working({}, leases)
    working.changes = changes
    return list(working.leases())


def next_reclaim_at(grants: Iterable[Grant], leases: Iterable[Lease] = ()) -> float | None:
    """When the reclaim timer must next run: unclaimed permits due back, or a
    settled grant or lease to forget."""
    due = [g.claim_deadline for g in grants if g.unclaimed > 0]
    due += [g.forget_at for g in grants if g.settled]
    due += [lease.expires_at for lease in leases if lease.settled]
    return min(due) if due else None


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
    #: grants with claims not all released: listed so that a client that lost
    #: its record of a claim (a crash after the holder confirmed it) learns it
    held_grants: list[Grant] = field(default_factory=list)
    blocked: dict[str, tuple[str, int]] = field(default_factory=dict)  #: group -> (reason, waiting)
    lease_reports: list[LeaseOutcome] = field(default_factory=list)
    new_leases: list[Lease] = field(default_factory=list)
    #: the client's leases not settled, new or not: a lease in a lost reply
    #: reaches it with the next one, and a new instance hears of leases an
    #: older one drew from and kept no item of (it takes them as stopped)
    listed_leases: list[Lease] = field(default_factory=list)


def held_grants(working: "Working", client_id: str) -> list[Grant]:
    """The client's grants fully claimed and not all released, newest first (at
    most ``MAX_REPORTS``). Listing them costs the holder no row; a client that
    knows them ignores them (they are never news), and one that lost its
    record of a confirmed claim admits on it or gives it back."""
    held = [g for g in working.grants() if g.client_id == client_id and g.unclaimed == 0 and not g.settled]
    held.sort(key=lambda g: (-g.claim_deadline, g.grant_id))
    return held[:MAX_REPORTS]


def unheard_grants(working: "Working", request: Request) -> list[Grant]:
    """The requesting client's claimed grants made after the last it says it
    heard of (a reply lost, or an instance gone since): the reply lists them,
    and they serve its demand already. Only a client that takes what it is
    granted says what it heard."""
    if not request.claims:
        return []
    return [g for g in held_grants(working, request.client_id) if g.claim_deadline > request.heard_up_to]


def news_for(request: Request, outcome: ClientOutcome) -> bool:
    """Does the reply tell the client something it may not know? New permits;
    a lease it did not report (a client reports every lease of the key it
    knows); or a grant with unclaimed permits in a group it asks for (a
    client claims what it knows of before it asks). Such a reply goes out at
    once: held over by the long poll, it would leave those permits idle."""
    if outcome.new_grants or outcome.new_leases:
        return True
    reported = {report.lease_id for report in request.lease_reports}
    if any(lease.lease_id not in reported for lease in outcome.listed_leases):
        return True
    if any(grant.claim_deadline > request.heard_up_to for grant in outcome.held_grants) and request.claims:
        return True
    asked = {demand.group for demand in request.demand}
    return any(grant.group in asked for grant in outcome.open_grants)


@dataclass
class RoundResult:
    changes: Changes
    outcomes: dict[str, ClientOutcome]
    errors: dict[int, ProtocolError]  #: request index -> why it was refused
    contended: bool = False  #: demand was left waiting for capacity


def usage(grants: Iterable[Grant]) -> tuple[int, dict[str, int]]:
    return tally((grant.group, grant.charged) for grant in grants)


def run_round(book: dict[str, Grant], requests: list[Request], limits: Limits, now: float,
              grant_timeout_ms: float, new_grant_id: Callable[[], str], *,
              leases: dict[str, Lease] | None = None, policy: LeasePolicy | None = None,
              lease_ids: LeaseIds | None = None) -> RoundResult:
    """One allocation round over every request that arrived for it.

    Reports are applied first (a request whose reports touch another
    client's grant or lease is refused alone), then expired permits are
    reclaimed and leases past their ttl, under a lowered limit or no longer
    eligible are retired, then demand is served oldest first across all
    clients: grants for demand that cannot lease, then leases from what is
    left. A client that sent several requests in the round is served once,
    by its latest. Its demand is net of the permits it already holds
    unclaimed in that group, so a request repeated after a lost reply is not
    served twice; every reply lists all of the client's open grants and the
    leases it may not know of, so the client learns of what a lost reply
    carried.
    """
    working = Working(book, leases)
    lease_ids = lease_ids if lease_ids is not None else LeaseIds("", 0)
    issued = lease_ids.issued  # the ids this round hands out follow; ``lease_ids`` is left as it was
    ttl_ms = policy.ttl_ms if policy is not None else None
    outcomes: dict[str, ClientOutcome] = {}
    errors: dict[int, ProtocolError] = {}
    latest: dict[str, Request] = {}
    arrival: dict[str, int] = {}
    for index, request in enumerate(requests):
        try:
            reported, lease_reported = apply_all_reports(
                working, request.client_id, request.reports, request.lease_reports, lease_ids, now,
                ttl_ms if request.heartbeat else None)
        except ProtocolError as error:
            errors[index] = error
            continue
        outcome = outcomes.setdefault(request.client_id, ClientOutcome())
        outcome.reports.extend(reported)
        outcome.lease_reports.extend(lease_reported)
        latest[request.client_id] = request
        arrival.setdefault(request.client_id, index)
    reclaim(working, now)
    retire_expired(working, now)
    retire_ineligible(working, policy, limits.total, limits.groups, limits.permitted)

    granted, granted_groups = usage(working.grants())
    leased, leased_groups = lease_usage(working.leases())
    # What each (client, group) holds that its demand already counts on:
    # permits unclaimed, and claims made for it that it has not heard of yet.
    unclaimed: dict[tuple[str, str], int] = {}
    for grant in working.grants():
        key = (grant.client_id, grant.group)
        unclaimed[key] = unclaimed.get(key, 0) + grant.unclaimed
    for client_id, request in latest.items():
        for grant in unheard_grants(working, request):
            key = (client_id, grant.group)
            unclaimed[key] = unclaimed.get(key, 0) + grant.claimed - grant.released
    drawable = {(lease.client_id, lease.group) for lease in working.leases() if lease.drawable > 0}
    total = limits.total
    budgets = None
    if isinstance(total, int):
        budgets = policy.budgets(total) if policy is not None else no_leases(total)

    def group_room(group: str, ceiling: int | None, room_total: int) -> int:
        if ceiling is None:
            return room_total
        return ceiling - granted_groups.get(group, 0) - leased_groups.get(group, 0)

    def grant(client_id: str, demand: Any, want: int, ceiling: int | None) -> None:
        nonlocal granted
        room_total = budgets.grant_room(granted, leased)
        room_group = group_room(demand.group, ceiling, room_total)
        give = max(0, min(want, room_total, room_group))
        outcome = outcomes[client_id]
        if give:
            # A client that takes what it is granted gets it claimed: the
            # reply is the confirmation, and no permit waits for a claim.
            claimed = give if latest[client_id].claims else 0
            new = Grant(new_grant_id(), client_id, demand.group, give, claimed, 0, now + grant_timeout_ms)
            working.put(new)
            outcome.new_grants.append(new)
            granted += give
            granted_groups[demand.group] = granted_groups.get(demand.group, 0) + give
        if give < want:
            # The group's own ceiling holds it back whenever it leaves no more
            # room than the total does (a total below usage leaves none).
            reason = GROUP_LIMIT if ceiling is not None and room_group <= max(room_total, 0) else LIMIT
            outcome.blocked[demand.group] = (reason, want - give)

    entries = sorted(
        (demand.oldest_at, arrival[client_id], position, client_id, demand)
        for client_id, request in latest.items()
        for position, demand in enumerate(request.demand)
    )
    # Demand that can only take grants goes first; then leases, from what is
    # left, to the (client, group)s that can draw them; then grants for what
    # those leases leave uncovered (in "over", from the limit the leases do
    # not use).
    candidates: list[tuple[str, Any, int, int | None]] = []
    for _, _, _, client_id, demand in entries:
        want = demand.count - unclaimed.get((client_id, demand.group), 0)
        if want <= 0:
            continue
        outcome = outcomes[client_id]
        ceiling = limits.groups.get(demand.group)
        if budgets is None or isinstance(ceiling, ResolutionFailed):
            outcome.blocked[demand.group] = (LIMIT_RESOLUTION_ERROR, want)
            continue
        if not limits.permitted.get((client_id, demand.group), True):
            outcome.blocked[demand.group] = (NOT_PERMITTED, want)
            continue
        if policy is not None and latest[client_id].leases and policy.group_eligible(ceiling):
            if (client_id, demand.group) not in drawable:  # it draws what it holds first
                candidates.append((client_id, demand, want, ceiling))
            continue
        grant(client_id, demand, want, ceiling)

    if candidates:
        budget = max(0, budgets.lease_room(granted, leased))
        sizes = share(budget, len(candidates), policy.permits_per_lease)
        for (client_id, demand, want, ceiling), size in zip(candidates, sizes):
            give = max(0, min(size, group_room(demand.group, ceiling, size)))
            if give:
                issued += 1
                lease = Lease(lease_ids.nth(issued), client_id, demand.group, give, 0, 0,
                              now + policy.ttl_ms, False, total)
                working.put_lease(lease)
                outcomes[client_id].new_leases.append(lease)
                leased += give
                leased_groups[demand.group] = leased_groups.get(demand.group, 0) + give
        for (client_id, demand, want, ceiling), lease in zip(candidates, sizes):
            covered = sum(x.permits for x in outcomes[client_id].new_leases if x.group == demand.group)
            if want > covered:
                grant(client_id, demand, want - covered, ceiling)
    if issued != lease_ids.issued:
        working.changes.issued = issued

    contended = any(reason in (LIMIT, GROUP_LIMIT)
                    for outcome in outcomes.values() for reason, _ in outcome.blocked.values())
    for grant in working.grants():
        outcome = outcomes.get(grant.client_id)
        if outcome is not None and grant.unclaimed > 0:
            outcome.open_grants.append(grant)
    for client_id, outcome in outcomes.items():
        outcome.held_grants = held_grants(working, client_id)
    for lease in sorted(working.leases(), key=lambda lease: lease.drawn > 0):  # undrawn ones first
        outcome = outcomes.get(lease.client_id)
        if outcome is not None and not lease.settled and len(outcome.listed_leases) < MAX_REPORTS:
            outcome.listed_leases.append(lease)
    return RoundResult(working.changes, outcomes, errors, contended)
