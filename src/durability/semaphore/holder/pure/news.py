"""What a reply tells a client of the grants it holds, and whether it is news, pure.

Lives here: the held grants a reply lists (``held_of``, for one client or
for each client a round serves), those a client has not heard of yet
(``unheard_grants``) and when the first of those stops counting for its
demand (``claims_lapse_at``), and whether a reply tells the client something it
may not know, so that it goes out at once (``news_for``). Must not know:
how a round serves demand, storage, RPC or clocks.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...messages import MAX_REPORTS, Request
from .records import ClientOutcome, Grant, Working


def held_of(grants: Iterable[Grant]) -> list[Grant]:
    """Of one client's grants, those fully claimed and not all released,
    newest first (at most ``MAX_REPORTS``). Listing them costs the holder no
    row; a client that knows them ignores them (they are never news), and
    one that lost its record of a confirmed claim admits on it or gives it
    back."""
    held = [g for g in grants if g.unclaimed == 0 and not g.settled]
    held.sort(key=lambda g: (-g.claim_deadline, g.grant_id))
    return held[:MAX_REPORTS]


def held_grants(working: Working, client_id: str) -> list[Grant]:
    """``held_of`` one client's grants, for a message that concerns it alone."""
    return held_of(g for g in working.grants() if g.client_id == client_id)


def held_by_client(grants: Iterable[Grant], clients: Iterable[str]) -> dict[str, list[Grant]]:
    """``held_of`` for each of ``clients``, in one pass over ``grants``: a
    round lists them for every client it serves, and a pass per client would
    make the round quadratic in its clients."""
    mine: dict[str, list[Grant]] = {client_id: [] for client_id in clients}
    for grant in grants:
        if grant.client_id in mine:
            mine[grant.client_id].append(grant)
    return {client_id: held_of(grants) for client_id, grants in mine.items()}


def unheard_grants(request: Request, held: list[Grant]) -> list[Grant]:
    """Of the requesting client's held grants (``held_of``), those made after
    the last it says it heard of (a reply lost, or an instance gone since):
    the reply lists them, and they serve its demand already. Only a client
    that takes what it is granted says what it heard."""
    if not request.claims:
        return []
    return [g for g in held if g.claim_deadline > request.heard_up_to]


def claims_lapse_at(requests: Iterable[Request], grants: Iterable[Grant], now: float) -> float | None:
    """When the first grant a round counts as serving a request's demand
    stops counting: claims made for a client that may not have heard of them
    (``unheard_grants``: a reply lost, or an instance restarted since) serve
    its demand in that group until the grant's claim deadline. Past it, that
    demand waits for new permits, and only a round sees so (a parked client
    waits to be called; a tree's child asks its parent only for what a round
    left waiting). None: no grant serves a request's demand so."""
    requests = list(requests)
    held = held_by_client(grants, [request.client_id for request in requests])
    deadlines = [grant.claim_deadline for request in requests
                 for grant in unheard_grants(request, held[request.client_id])
                 if grant.claim_deadline >= now and grant.claimed > grant.released
                 and any(d.group == grant.group and d.count > 0 for d in request.demand)]
    return min(deadlines, default=None)


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
