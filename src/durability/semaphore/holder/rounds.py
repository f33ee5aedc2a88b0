"""When a holder's rounds run, and what one commits: functions of the holder, kept out of its class for size.

Lives here: when the next round runs (``round_wait_ms`` from now, a
period after the last, on a tree's beat, and, for a new instance
restarted while busy, not before the clients whose requests failed with
the old one are back: ``rejoin_wait_ms``; a tree instance's first period
off the beat), a round when the start rate allows more to start, a round
when claims counted for a parked client's demand lapse, a round for the parked line
now or later, a round for a tree's child its parent just lent more, a
round's rows written with what it took off the parked line (put back if
the write fails), the round's fair-share policy, its demand by group,
and new grant ids. Must not know: how a round decides (``allocation``),
what a reply holds (``holder/replies``), or how messages look on the
wire (``messages``).
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING

from ..._common.clock import now_ms
from ..messages import BlockedReason, Demand, Request
from .fair_options import UserFairShare
from .parked import Call
from .pure.allocation import Grant, RoundResult, usage
from .pure.fairness import FairPolicy
from .pure.news import claims_lapse_at

PARTICIPANT = "durability.semaphore"
ROUND = "round"  #: a round for parked requests, on the scheduler's alarm (see ``_news``)
#: a grant counts for its client's demand up to its claim deadline, inclusive: the round for its lapse comes this after
CLAIM_LAPSED_MS = 1
#: how long after its window's time a round the start rate owes waits, on the alarm, for an evicted holder
RATE_BACKSTOP_MS = 30_000

if TYPE_CHECKING:
    from .shell import DurabilitySemaphore
    from .start_rate import RoundRates


async def _news(holder: DurabilitySemaphore, answered: str | None = None) -> None:
    """Something changed that a round for the parked requests may serve
    (permits came back, demand grew): that round now, or when the period
    since the last one is over, on the alarm. ``answered``: a client
    whose reply to its own message lists what the round grants it."""
    if holder._parked is None or not holder._parked.line:
        return
    at = _parked_round_at(holder)
    if at <= now_ms():
        holder._round_now([], answered)
    else:
        holder._round_later(at)
    await holder.scheduler.sync()


def _parked_round_at(holder: DurabilitySemaphore, off_beat: bool = False, spacing: float | None = None) -> float:
    """When a round for the parked line runs: at once, a period after the
    last (or ``spacing``); in a tree, on the holder's beat unless ``off_beat``."""
    return _round_time(holder, soon=off_beat or not holder.tree.keeps_beat, spacing=spacing)


async def _parked_round(holder: DurabilitySemaphore, off_beat: bool = False, spacing: float | None = None) -> None:
    """A round for the parked line as soon as ``_parked_round_at`` allows."""
    at = _parked_round_at(holder, off_beat, spacing)
    if at <= now_ms():
        holder._round_now([])
    else:
        holder._round_later(at)
    await holder.scheduler.sync()


def _round_if_waiting(holder: DurabilitySemaphore) -> bool:
    """In a tree, permits released where requests wait: a round on the
    next beat (a root made without ``parent=`` keeps no beat: one
    ``round_wait_ms`` after its last round)."""
    if holder._waiting:
        holder._ensure_round(soon=not holder.tree.keeps_beat, spacing=holder.round_wait_ms)
    return bool(holder._waiting)


def _round_for_lent(holder: DurabilitySemaphore) -> bool:
    """A child its parent just lent more, where requests wait: a round at
    once, off the beat. On one level the parent lends half a period after
    the child's beat, and those permits would idle that long (a point of
    the busy share at ``bench_tree.py``, for a round and its grants more
    where the parent lent). Two levels down a leaf keeps its root's beat,
    and its parent lends right after it: spaced ``round_wait_ms`` from the
    leaf's round on the beat, what it lent idled a second (``bench_tree.py
    --scales 2000 --limit 2000 --fan-out 4 --depth 2``: 94.2% busy against
    92.9%)."""
    parked = holder._parked is not None and bool(holder._parked.line)
    if parked:  # a round over both (out of the exchange that lent: it is still reading the reply)
        asyncio.ensure_future(_parked_round(holder, off_beat=True, spacing=0))
    elif holder._waiting:
        holder._ensure_round(soon=True, spacing=0)
    return bool(holder._waiting) or parked


def _commit_round(holder: DurabilitySemaphore, result: RoundResult, asked: set[str],
                  synced: str | None) -> list[Call]:
    """Write a round's rows, with what it took off the parked line (the same
    rows carry both); the calls to make now that they are written. If the
    write fails, the line is as it was."""
    if holder._parked is None:
        holder._commit(result.changes)
        return []
    before = holder._parked.line.snapshot()
    calls = holder._parked.served(result.outcomes, asked, synced)
    try:
        holder._commit(result.changes)
    except BaseException:
        holder._parked.line.restore_snapshot(before)
        raise
    return calls


def _fair_policy(fair_share: UserFairShare | None, requests: list[Request],
                 grants: dict[str, Grant]) -> FairPolicy | None:
    """The round's fair-share policy, over the groups in demand and those holding permits."""
    if fair_share is None:
        return None
    return fair_share.for_round([d.group for r in requests for d in r.demand] + list(usage(grants.values())[1]))


def _demands_by_group(requests: list[Request]) -> dict[str, list[Demand]]:
    demands: dict[str, list[Demand]] = {}
    for request in requests:
        for demand in request.demand:
            demands.setdefault(demand.group, []).append(demand)
    return demands


def _new_grant_id() -> str:
    # Drawn from `random` so that seeded test runs replay; 80 bits make a
    # collision between two grants of one holder negligible.
    return f"g{random.getrandbits(80):020x}"


def _round_time(holder: DurabilitySemaphore, soon: bool, spacing: float | None) -> float:
    """When the next round runs: ``round_wait_ms`` from now (none if
    ``soon``), and ``spacing`` (a round period unless given) after the last
    one; in a tree, unless ``soon``, on the holder's next beat instead: the
    beats space its rounds a period apart, and every holder of the tree
    keeps the same ones, so the children's lines move together and each
    hears its parent just before its round (see ``tree.beat_phase``)."""
    # A tree's holder runs an instance's first round with demand off the
    # beat, a quarter period (or ``round_wait_ms``, if shorter) after the
    # first request with demand in its line (a child's, or a client's),
    # however soon after a round that served none, once it has its parent's
    # word (``TreePlace.hears_parent``: before it, a round hands out nothing,
    # and a leaf restarted with its line in rows keeps its beat). For a parent: the
    # children it woke as it started ask again at once, and those on the
    # same beat a moment apart; restarted between their requests and its
    # beat, again and again, it never ran one with their demand in it (its
    # line is not in rows; a leaf's is). For a new tree's leaves: a burst's
    # first items wait a quarter period, not up to a period for the beat,
    # and the request each leaf then sends at once (``ParentLink._ask_due``)
    # meets its parent's own first round: at bench_tree.py's 10,000 clients
    # on one level, the first loans came at 1 s instead of 2.5 s, 96.5% busy
    # instead of 96.05%.
    # For a round period after that first round (``TreePlace.ramping``) its
    # rounds with demand keep coming off the beat, a quarter period apart,
    # and a child asks after each: a burst's later items (those its clients
    # tell of only in answers to the calls that serve their first) reach the
    # root and come back lent within a period, where the beats took two to
    # three (a level each). Two levels deep at 10,000 clients, the limit
    # was full 4 s into a burst instead of 7 s: 95.7% busy instead of 95.2%.
    tree, now = holder.tree, now_ms()
    may_ramp = tree.keeps_beat and tree.ramping(now) and tree.hears_parent()
    demand_since = _first_demand_since(holder) if may_ramp else None
    first = demand_since is not None and not tree.served_demand
    if demand_since is not None and not soon:
        at = _ramp_round_at(holder, demand_since, first)
        if tree.ramping(at):  # (a round that would fall past the first period keeps the beat)
            return at
    beat = tree.keeps_beat and not soon
    at = now + (0 if soon or beat else holder.round_wait_ms)
    if holder._last_round_at is not None and not first:
        # (A first round with demand waits for no round that served none.)
        # On the beat, a beat within a quarter period of the last round (one
        # for a loan, off the beat) is skipped: two rounds a moment apart
        # would split what comes free between them.
        at = max(at, holder._last_round_at + (holder.round_period_ms / 4 if beat else
                                              holder.round_period_ms if spacing is None else spacing))
    elif holder._parked is None and holder._holds_permits():
        # This instance restarted while busy: the requests its old one
        # held failed, and their clients ask again at once (a request
        # that reached the holder is retried without backoff). Serving
        # before they are back would serve whoever asked first.
        at = max(at, holder._started_at + holder.rejoin_wait_ms)
    return holder.tree.next_beat(at) if beat else at


def _ramp_round_at(holder: DurabilitySemaphore, demand_since: float, first: bool) -> float:
    """A tree holder's round off the beat, in its instance's first period: a
    quarter period (or ``round_wait_ms``, if shorter) after the first request
    with demand in its line joined it, and a quarter period after its last
    round (but for its first round with demand: see ``_round_time``)."""
    quarter = holder.round_period_ms / 4
    at = max(now_ms(), demand_since + min(holder.round_wait_ms, quarter))
    if holder._last_round_at is not None and not first:
        at = max(at, holder._last_round_at + quarter)
    return at


def _first_demand_since(holder: DurabilitySemaphore) -> float | None:
    """When the first request with demand waiting in the holder's parked line joined it (None: none waits)."""
    if holder._parked is None:
        return None
    line = holder._parked.line
    joined = [entry.since for r in line.requests() if any(d.count > 0 for d in r.demand)
              for entry in [line.get(r.client_id)] if entry is not None]
    return min(joined, default=None)


def _round_when_rate_allows(holder: DurabilitySemaphore, rates: RoundRates, result: RoundResult | None,
                            now: float) -> None:
    """Demand a start rate held back (``result``; None: a new instance,
    whose line may be) is served by a round when the window allows."""
    if not rates or holder._parked is None or not holder._parked.line:
        return
    if result is None:
        held_back = {d.group for request in holder._parked.line.requests() for d in request.demand}
    else:
        held_back = {group for outcome in result.outcomes.values()
                     for group, (reason, _) in outcome.blocked.items() if reason == BlockedReason.RATE}
    at = holder.rate.next_at(rates, held_back, holder.books.grants().values(), now) if held_back else None
    if at is None:
        return
    # At the window's time (in memory if within a second), and on the alarm
    # RATE_BACKSTOP_MS later: a round in memory dies with an evicted
    # instance, and nothing else calls a holder whose line waits (its
    # clients sleep until their fallback). The backstop moves the alarm
    # only when it must come sooner: a write and a run per backstop, not
    # one per round (on every round, the flood of bench_rate.py cost 1.3
    # rows a job more; with the backstop, 0.5).
    holder._round_later(max(at, now, _round_time(holder, soon=True, spacing=None)), backstop_ms=RATE_BACKSTOP_MS)


def _later_rounds(holder: DurabilitySemaphore, rates: RoundRates, result: RoundResult, now: float) -> None:
    """The rounds a round just run (``result``, at ``now``) owes later: when
    the start rate allows what it held back, and when claims it counted as
    serving a parked client's demand lapse."""
    _round_when_rate_allows(holder, rates, result, now)
    _round_when_claims_lapse(holder, now)


def _round_when_claims_lapse(holder: DurabilitySemaphore, now: float) -> None:
    """A round just after the first claim deadline of a grant that served a
    parked client's demand unheard of (``pure.news.claims_lapse_at``), on the
    alarm (never later than a round already due). Without it that demand
    waited for anything else to start a round: tree seed 9610, a leaf
    restarted between serving a shard and hearing its answer took the
    shard's next item as served by the grant it held, past its deadline,
    with nothing due at the leaf; its shard waited 17 s, until the sweep.
    A row to set the alarm, only where a client's demand rests on such a
    grant (a reply lost, or an instance restarted since the grant)."""
    if holder._parked is None:
        return
    # (A tree's child asks again by itself until a reply lists what it holds,
    # as the restarted holder's own listing calls leave it to: see ``ParentLink``.
    # A client those calls reach answers with what it heard, which brings a
    # round: one at the same deadline too would hand its demand new permits
    # beside a grant it may be using. Grants whose deadlines come before
    # that call still get theirs.)
    called = holder._parked.called_at_deadline()
    requests = [r for r in holder._parked.line.requests() if not holder.tree.is_child(r.client_id)]
    grants = [g for g in holder.books.grants().values()
              if g.client_id not in called or g.claim_deadline < called[g.client_id]]
    at = claims_lapse_at(requests, grants, now)
    if at is not None:
        holder.scheduler.schedule_by(PARTICIPANT, ROUND, at + CLAIM_LAPSED_MS)

