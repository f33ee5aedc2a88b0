"""What a holder answers: a round's replies, a parked request's at once, the listing that wakes a client.

Lives here: ``_Waiting``, a request waiting for a round with when it
must be answered and whether it still counts as a heartbeat; the
requests a round holds over for the next one (a long poll: only a
client's latest, with nothing new to tell) and those it answers now;
each grants reply, with the line ahead of a client it served, when a
parked client asks again by itself, and less what a call on its way to
the client lists; a parked request answered at once (by a round due
now, else with what its reports did, its demand left for the next
round); and what a client holds, for the call that wakes it. Functions
of the holder, kept out of its class for size; they hand its replies to
``messages`` as typed values. Must not know: how a round decides
(``allocation``), or how messages look on the wire (``messages``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..._common.clock import now_ms
from ..messages import Blocked, GrantEntry, LeaseEntry, Reply, Request
from .pure.allocation import ClientOutcome, Grant, Limits, RoundResult, Working, held_grants, news_for, run_round
from .pure.leases import Lease
from .pure.line_mark import Line
from .rounds import _new_grant_id, _parked_round_at

if TYPE_CHECKING:
    from .shell import DurabilitySemaphore


@dataclass
class _Waiting:
    """A request waiting for a round, and what the holder knows of it beyond the message."""

    request: Request
    reply: asyncio.Future[dict[str, Any]] = field(compare=False)
    hold_until: float  #: epoch ms: answered by then, granted or not
    #: False once the request was held over to a later round, where its
    #: (old) reports must not count as a heartbeat
    heartbeat: bool = True


async def _answer_at_once(holder: DurabilitySemaphore, request: Request) -> dict[str, Any]:
    """A request that is parked: answered now with what a round hands out
    now, or between rounds with what its reports did (its demand waits
    for the next round, which calls the client if it serves it)."""
    assert holder._parked is not None
    # A client whose calls fail, or that says it heard nothing for a whole
    # wait (the failures may be an instance ago), hears what the round has
    # for it in this reply: another call could fail again.
    unreachable = holder._parked.calls.failing(request.client_id) or request.fallback
    holder._parked.park(request)
    waiting = _Waiting(request, asyncio.get_running_loop().create_future(), now_ms())
    at = _parked_round_at(holder)
    if at <= now_ms():
        holder._round_now([waiting])
    elif unreachable:
        holder._waiting.append(replace(waiting, hold_until=at))
        holder._ensure_round(soon=not holder.tree.keeps_beat)
    else:
        _reports_only(holder, waiting)
        # A full limit waits for permits to come back, which start a
        # round; a tree's child runs it all the same: it tells its
        # parent what waits, and is lent more.
        if holder._parked.line and (not holder._full or holder.tree.has_parent):
            holder._round_later(at)
    await holder.scheduler.sync()
    return await waiting.reply


def _answer(holder: DurabilitySemaphore, answered: list[tuple[_Waiting, ClientOutcome]], held: list[_Waiting],
            result: RoundResult, limits: Limits, now: float) -> None:
    """A round's replies: each with the line ahead of its client and, to a
    tree's child, the parent's limits and who else waits (a function of
    the holder, kept out of its class for size)."""
    ttl_ms = holder.lease_policy.ttl_ms if holder.lease_policy is not None else 0
    line: Line | None = None
    for waiting, outcome in answered:
        request = waiting.request
        tree = holder.tree.reply_fields(request.client_id, request, limits.groups)
        # A client handed permits may ask again at once: its request is
        # held for the next round anyway, and is then present in it,
        # instead of arriving just after it and waiting a period more.
        served = bool(outcome.new_grants or outcome.new_leases)
        parked_until = _parked_until(holder, request.client_id, now)
        ahead: dict[str, float] = {}
        if served and parked_until is None:  # (a parked client never leaves the line: it costs nothing there)
            if line is None:  # once per round: the held requests are the same for every reply
                line = Line.of((h.request for h in held), limits, holder.lease_policy)
            ahead = line.ahead_of(waiting.request.client_id, (d.group for d in waiting.request.demand))
        ask_at = parked_until if parked_until is not None else now if served else now + holder.round_period_ms
        reply = _grants_reply(_uncarried(holder, request.client_id, outcome), ask_at, result.contended, ttl_ms,
                              ahead, holder.books.first_listing)
        waiting.reply.set_result(replace(reply, **tree).to_wire())


def _reports_only(holder: DurabilitySemaphore, waiting: _Waiting) -> None:
    """A parked request between rounds: its reports are heard now and its
    reply says so, with the line as the last round left it; its demand
    waits for the next round."""
    request = waiting.request
    now = now_ms()
    result = run_round(holder.books.grants(), [replace(request, demand=())], holder._resolve_limits([]), now,
                       holder.grant_timeout_ms, _new_grant_id, leases=holder.books.leases(),
                       policy=holder.lease_policy, lease_ids=holder.books.lease_ids())
    if 0 in result.errors:
        waiting.reply.set_result(result.errors[0].reply())
        return
    holder._commit(result.changes)
    outcome = result.outcomes[request.client_id]
    last = holder._blocked.get(request.client_id)
    if last is not None:
        outcome.blocked.update(last[1])
    ttl_ms = holder.lease_policy.ttl_ms if holder.lease_policy is not None else 0
    reply = _grants_reply(_uncarried(holder, request.client_id, outcome), _parked_until(holder, request.client_id, now)
                          or now, holder._contended, ttl_ms, first=holder.books.first_listing)
    waiting.reply.set_result(replace(reply, **holder.tree.reply_fields(request.client_id, request)).to_wire())


def _listing(holder: DurabilitySemaphore, client_id: str) -> dict[str, Any]:
    """What a client holds here, as a grants reply with nothing new in it:
    the call that wakes it (it learns of any grant or lease it missed)."""
    working = Working(holder.books.grants(), holder.books.leases())
    grants = [g for g in working.grants() if g.client_id == client_id]
    outcome = ClientOutcome(open_grants=[g for g in grants if g.unclaimed > 0], held_grants=held_grants(
        working, client_id), listed_leases=[lease for lease in working.leases()
                                            if lease.client_id == client_id and not lease.settled])
    ttl_ms = holder.lease_policy.ttl_ms if holder.lease_policy is not None else 0
    now = now_ms()
    return _grants_reply(outcome, _parked_until(holder, client_id, now) or now, holder._contended, ttl_ms).to_wire()


def _parked_until(holder: DurabilitySemaphore, client_id: str, now: float) -> float | None:
    """When a client in the parked line asks again by itself (once its wait
    is over with nothing heard), or None: it is not in that line."""
    entry = holder._parked.line.get(client_id) if holder._parked is not None else None
    return None if entry is None else now + entry.request.wait_ms


def _lease_entry(lease: Lease, ttl_ms: float, new: bool = False) -> LeaseEntry:
    return LeaseEntry(lease.lease_id, lease.group, lease.permits, lease.drawn, ttl_ms, lease.expires_at,
                      lease.retired, new)


def _grant_entry(grant: Grant, new: frozenset[str] | set[str] = frozenset()) -> GrantEntry:
    return GrantEntry(grant.grant_id, grant.group, grant.permits, grant.claimed, grant.claim_deadline,
                      grant.released, grant.grant_id in new)


def _uncarried(holder: DurabilitySemaphore, client_id: str, outcome: ClientOutcome) -> ClientOutcome:
    """``outcome`` less what a call on its way to the client lists (``ClientCalls.carried``)."""
    carried = holder._parked.calls.carried(client_id) if holder._parked is not None else frozenset()
    if not carried:
        return outcome
    leases = [lease for lease in outcome.listed_leases if lease.lease_id not in carried]
    return replace(outcome, open_grants=[g for g in outcome.open_grants if g.grant_id not in carried],
                   held_grants=[g for g in outcome.held_grants if g.grant_id not in carried], listed_leases=leases,
                   some_leases_unlisted=len(leases) < len(outcome.listed_leases))


def _grants_reply(outcome: ClientOutcome, next_request_at: float, contended: bool = False,
                  ttl_ms: float = 0, line: dict[str, float] | None = None,
                  first: Callable[[Iterable[str]], set[str]] | None = None) -> Reply:
    """A grants reply. ``first``: ``HolderBooks.first_listing``, for a reply
    that leaves now (a call's are marked as it leaves: ``ClientCalls``)."""
    grants = [*outcome.open_grants, *outcome.held_grants]
    new = first([g.grant_id for g in grants] + [lease.lease_id for lease in outcome.listed_leases]) if first else set()
    return Reply(
        "grants",
        tuple(outcome.reports),
        tuple(outcome.lease_reports),
        tuple(_lease_entry(lease, ttl_ms, lease.lease_id in new) for lease in outcome.listed_leases),
        contended,
        grants=tuple(_grant_entry(g, new) for g in grants),
        blocked=tuple(Blocked(group, reason, waiting) for group, (reason, waiting) in outcome.blocked.items()),
        next_request_at=next_request_at,
        all_leases_listed=not outcome.some_leases_unlisted,
        line=line or {},
    )


def _hold_or_answer(batch: list[_Waiting], result: RoundResult, next_request_at: float,
                    ) -> tuple[list[_Waiting], list[tuple[_Waiting, ClientOutcome]]]:
    """The requests held over for the next round (a long poll), and those
    answered now with their outcome; refused and abandoned ones are done here."""
    # Only a client's latest request may be held over: an older one may be
    # from an instance that is gone, and held, it would be served later
    # with permits claimed for nobody. (A copy of the latest, the same
    # message delivered twice, waits with it: one of them is answered to
    # the client.)
    latest = {waiting.request.client_id: waiting.request for waiting in batch}
    held: list[_Waiting] = []
    answered: list[tuple[_Waiting, ClientOutcome]] = []
    for index, waiting in enumerate(batch):
        request = waiting.request
        if waiting.reply.done():
            continue  # its caller is gone
        if index in result.errors:
            waiting.reply.set_result(result.errors[index].reply())
            continue
        outcome = result.outcomes[request.client_id]
        superseded = latest[request.client_id] != request
        if (not superseded and not news_for(request, outcome) and outcome.blocked
                and waiting.hold_until > next_request_at):
            # Nothing new to tell: keep the request for the next round
            # instead of having the client ask again. Its reports were
            # heard once: a lease must not stay alive on a request whose
            # client may be gone since.
            held.append(replace(waiting, heartbeat=False))
        else:
            answered.append((waiting, outcome))
    return held, answered
