"""The holder's protocol logic: reports, reclaim and allocation rounds, as pure functions.

Lives here: applying a client's cumulative reports, all of them or none
if any is not the client's, and one allocation round (``run_round``) from
(book of grants and leases, requests, resolved limits, now) to (changes,
per-client outcome): grants first, then leases from what is left (the
lease rules themselves live in ``leases``); oldest first, or each key's
allotment first under a fair-share policy (the rule lives in
``fairness``). A round runs in named phases over one ``RoundState``:
reports, retirement, grants, leases, listing. It changes nothing it is
given, the books and the ``LeaseIds`` included: the new count of lease
ids issued is in its changes.
Must not know: storage, RPC, clocks or the user's callbacks; the holder
reads the time, resolves the limits and persists the changes.

The parts it is made of (the rest of the library imports what it uses
of them from here): ``holder/pure/records`` (the grant book and its
accounting, the changes, and the records a round reads and returns),
``holder/pure/reclaim`` (permits and settled rows taken back as time
passes, and when to look next), ``holder/pure/round_terms`` (a round's terms
and state), ``holder/pure/round`` (its phases after the reports),
``holder/pure/shares`` (how its room goes to the demand it grants) and
``holder/pure/news`` (the grants a reply lists, and whether it is
news). The reports are applied here, the round's first phase included,
so that every report goes through this module's ``apply_report`` (the
campaign's ``double_report`` defect replaces it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from ...messages import EXPIRED, NOT_FOUND, OK, LeaseOutcome, LeaseReport, ProtocolError, Report, ReportOutcome, Request
from .fairness import FairPolicy
from .leases import Lease, LeaseIds, LeasePolicy, apply_lease_report
from .news import held_grants as held_grants, news_for as news_for
from .rate import Rate
from .reclaim import (
    merged as merged,
    merged_leases as merged_leases,
    next_reclaim_at as next_reclaim_at,
    reclaim as reclaim,
)
from .records import (
    Changes as Changes,
    ClientOutcome as ClientOutcome,
    Grant as Grant,
    Limits as Limits,
    ResolutionFailed as ResolutionFailed,
    RoundResult as RoundResult,
    Working as Working,
    usage as usage,
)
from .round import list_for_replies, result_of, retire, serve_grants, serve_leases
from .round_terms import RoundState, RoundTerms, budgets_for as budgets_for


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
    if claimed != grant.claimed or released != grant.released:
        working.put(grant.counted(claimed, released))
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


def run_round(book: dict[str, Grant], requests: list[Request], limits: Limits, now: float,
              grant_timeout_ms: float, new_grant_id: Callable[[], str], *,
              leases: dict[str, Lease] | None = None, policy: LeasePolicy | None = None,
              lease_ids: LeaseIds | None = None, held_over: Iterable[int] = (),
              fair: FairPolicy | None = None, rate: Rate | None = None,
              placed: Mapping[str, float] | None = None, pace_room: int | None = None,
              group_rates: Mapping[str, Rate] | None = None,
              group_pace_room: Mapping[str, int] | None = None) -> RoundResult:
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
    carried. Nothing given is changed: the result says what the holder
    must apply. ``held_over``: the indexes of requests the holder held
    over from an earlier round, whose reports heartbeat no lease.
    ``fair``: how keys share the room (``fairness``); grants only.
    ``rate``: the key's start rate, with ``placed`` (grant id -> when its
    client had heard of it) and ``pace_room`` (``rate.Pace``);
    ``group_rates`` and ``group_pace_room``: the groups' own; grants only.
    """
    lease_ids = lease_ids if lease_ids is not None else LeaseIds("", 0)
    terms = RoundTerms(limits, now, grant_timeout_ms, new_grant_id, policy, lease_ids,
                       budgets_for(policy, limits.total), frozenset(held_over), fair, rate, group_rates or {},
                       placed or {}, pace_room, group_pace_room or {})
    state = RoundState(Working(book, leases), issued=lease_ids.issued)
    apply_request_reports(state, terms, requests)
    retire(state, terms)
    candidates = serve_grants(state, terms)
    serve_leases(state, terms, candidates)
    list_for_replies(state)
    return result_of(state, terms)


def apply_request_reports(state: RoundState, terms: RoundTerms, requests: list[Request]) -> None:
    """Phase 1, reports: each request's, in arrival order; a request that
    reports on another client's grant or lease is refused alone."""
    for index, request in enumerate(requests):
        try:
            reported, lease_reported = apply_all_reports(
                state.working, request.client_id, request.reports, request.lease_reports, terms.lease_ids,
                terms.now, None if index in terms.held_over else terms.ttl_ms)
        except ProtocolError as error:
            state.errors[index] = error
            continue
        outcome = state.outcomes.get(request.client_id)
        if outcome is None:
            outcome = state.outcomes[request.client_id] = ClientOutcome()
        outcome.reports.extend(reported)
        outcome.lease_reports.extend(lease_reported)
        state.latest[request.client_id] = request
        state.arrival.setdefault(request.client_id, index)
