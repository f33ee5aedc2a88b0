"""DurabilitySemaphore: the holder of one shared concurrency budget, inside its Durable Object.

Lives here: the runtime side of the holder: requests waiting for a round
and the round timer (in memory), the user's limit callbacks resolved once
per round (``holder_limits``) for the groups in demand and those holding
leases, committing each round in one transaction before anyone hears back
(none for a round with nothing to write), the wait of a new instance
restarted while busy before its first round, the reclaim timer on the
scheduler, each request held for a later round with whether it still
counts as a heartbeat, ``usage()`` and ``migrate()``. It hands its
replies to ``messages`` as typed values. Must not know: how a round
decides (``allocation``), how messages look on the wire (``messages``),
or how clients reach it (``client``).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .._checks import is_number
from .._clock import now_ms, sleep_until
from .._schema import public_migrate
from ..scheduler import DurabilityScheduler, Timer
from .allocation import (
    Changes,
    ClientOutcome,
    Grant,
    Limits,
    ResolutionFailed,
    RoundResult,
    Working,
    apply_all_reports,
    apply_reports,
    held_grants,
    news_for,
    next_reclaim_at,
    reclaim,
    run_round,
    usage,
)
from .fairness import FairPolicy
from .holder_books import HolderBooks
from .holder_fairness import OLDEST_FIRST, UserFairShare, fair_share_of
from .holder_limits import UserLimits
from .holder_line import Line
from .holder_parked import WAKE, Call, ParkedRequests, holdings
from .holder_tree import ParentLink, Waker, child_link, object_name as _object_name
from .leases import (
    Lease,
    LeasePolicy,
    lease_usage,
    retire_expired,
    retire_ineligible,
)
from .messages import (
    MAX_REPORTS,
    Blocked,
    BlockedReason,
    Demand,
    GrantEntry,
    GroupUsage,
    LeaseEntry,
    LeaseOutcome,
    ProtocolError,
    Reply,
    ReportOutcome,
    Request,
    Sync,
    Usage,
    WaitingUsage,
    parse,
)
from .store import COMPONENT as HOLDER_COMPONENT, TABLES as HOLDER_TABLES, HolderStore
from .tree import OldestWaiting, beat_phase, closed_groups, on_beat, over_limit, parent_of, unmet_demand

if TYPE_CHECKING:
    from .client import SemaphoreClient, SemaphoreClientFactory

log = logging.getLogger("durability.semaphore")
PARTICIPANT = "durability.semaphore"
#: usage() reports a client's waiting demand for this long after the last round that heard it
WAITING_HEARD_MS = 60_000
ROUND = "round"  #: a round for parked requests, on the scheduler's alarm (see ``_news``)
MEMORY_ROUND_MS = 1_000  #: a round for parked requests due this soon waits in memory (``_round_later``)


def _positive_ms(value: Any, what: str) -> float:
    if not is_number(value) or not value >= 0:
        raise ValueError(f"{what} must be a non-negative number of milliseconds, not {value!r}")
    return float(value)


@dataclass
class _Waiting:
    """A request waiting for a round, and what the holder knows of it beyond the message."""

    request: Request
    reply: asyncio.Future[dict[str, Any]] = field(compare=False)
    hold_until: float  #: epoch ms: answered by then, granted or not
    #: False once the request was held over to a later round, where its
    #: (old) reports must not count as a heartbeat
    heartbeat: bool = True


class DurabilitySemaphore:
    """The holder-side authority for one shared concurrency budget.

    Args:
        scheduler: the object's ``DurabilityScheduler``.
        limit: the budget, an int or a callable returning one (read once per round).
        group_limit: ``group -> int | None``, a ceiling under the limit for
            one group (None: no ceiling of its own). If it raises, that group
            fails closed for the round (``limit_resolution_error``).
        can_grant: ``(client_id, group) -> bool``; False blocks that demand
            (``not_permitted``).
        round_wait_ms: how long a request waits so that concurrent requests
            are allocated together (a parent with room outside a tree's
            beat serves a child at once: nothing is contended).
        round_period_ms: the least time between two rounds. A tree's
            holders run theirs on a beat this far apart that they all keep
            (``tree.beat_phase``); a child its parent just lent more runs
            one ``round_wait_ms`` after its last.
            A request that asks to ``wait`` and gets nothing is held for the
            following rounds (up to its wait) instead of being answered
            empty, so a blocked client costs one request per wait, not one
            per round, and is present in every round that could serve it.
        grant_timeout_ms: how long granted permits stay reserved unclaimed.
        rejoin_wait_ms: how long after it started a new instance whose books
            hold permits (it restarted while busy) holds its first round, so
            that the clients whose requests failed with the old instance are
            back in line, oldest work first, before anything is handed out.
            A first round waits ``round_wait_ms`` anyway: this matters only
            when it is longer.
        leases: None (no leases), or the lease options: ``provisioning``
            (``{"mode": "strict"}``, ``{"mode": "under", "reserve": n}``,
            ``{"mode": "over", "extra": {"ratio": r} | {"count": n}}``),
            ``permits_per_lease`` (64), ``ttl_ms`` (30 minutes),
            ``limited_groups`` (None or ``"withinGroupLimit"``); see
            ``leases.LeasePolicy``. Turning leases off retires live leases
            at the next round.
        parent: a client of this holder class (``DurabilitySemaphore.client(
            binding=...).bind(env)``), to make this holder part of a budget
            tree. An object whose name is a child's (``<key>~child-<n>``, the
            names a client with ``fan_out`` reaches) then borrows its budget
            from its parent instead of having ``limit`` and ``group_limit``
            of its own (the root applies those; ``can_grant`` applies at the
            child, which knows the clients); the object named ``<key>`` is
            the root. A tree hands out grants only (no ``leases``). A parent
            parks its children's requests and calls a child it lends to
            through this client (the call reaches the child's holder
            method, which reads it in ``handle``); every round of a tree
            runs on its beat, on the scheduler's alarm, so that no holder
            of a tree is awake while work waits.
        fair_share: None (oldest first across the key), or how keys share
            the limit: ``{"key": group -> key, "weight": key -> number,
            "floor": key -> int, "priority": key -> int}``, each a constant
            or a callable read once per round (see ``fairness``). Grants
            only (no ``leases``); in a tree the root applies it.
        clients: the Durable Object namespace of the objects whose queues
            ask this holder (``env.JOB_SHARD``, say). A request from a
            queue made with ``woken=True`` is then answered at once and
            parked: its demand stays in line, and the round that has
            permits for it calls the client's ``semaphore_reply(key,
            reply)`` with them; no request is held open, and neither
            object is awake while the client waits. Rounds for parked
            requests run when something changes (a release, a reclaim, new
            demand), at most one per ``round_period_ms``, on the
            scheduler's alarm when not at once. Without it, or for a
            client that cannot be called, requests are held as before. In a
            budget tree, give it to every holder: the leaves call the
            queues, and the clients are theirs.
        wake_after_ms: with ``clients``, a client holding permits on a grant
            this old that has not spoken for as long is called (and again
            each time as long passes): an object whose alarm the runtime
            gave up on, or that never heard of a grant whose call was lost,
            runs again and reports. Work shorter than this costs no call.
    """

    def __init__(self, scheduler: DurabilityScheduler, *, limit: int | Callable[[], int],
                 group_limit: Callable[[str], int | None] | None = None,
                 can_grant: Callable[[str, str], bool] | None = None,
                 round_wait_ms: float = 1_000, round_period_ms: float = 2_000,
                 grant_timeout_ms: float = 10_000, leases: dict[str, Any] | None = None,
                 rejoin_wait_ms: float = 1_000, parent: SemaphoreClient | None = None,
                 fair_share: dict[str, Any] | None = None, clients: Any = None,
                 wake_after_ms: float = 60_000) -> None:
        self.limits = UserLimits(limit, group_limit, can_grant)
        self.fair_share: UserFairShare | None = fair_share_of(fair_share, leases)
        self.scheduler = scheduler
        self.round_wait_ms = _positive_ms(round_wait_ms, "round_wait_ms")
        self.round_period_ms = _positive_ms(round_period_ms, "round_period_ms")
        self.grant_timeout_ms = _positive_ms(grant_timeout_ms, "grant_timeout_ms")
        self.rejoin_wait_ms = _positive_ms(rejoin_wait_ms, "rejoin_wait_ms")
        self._started_at = now_ms()
        self.lease_policy = None if leases is None else LeasePolicy.from_options(leases)
        if parent is not None and self.lease_policy is not None:
            raise ValueError("a budget tree hands out grants only: give parent= or leases=, not both")
        self.store = HolderStore(scheduler.sql)
        # The reclaim timer is due when the books say (next_reclaim_at): it
        # lives in memory, costs no row, and is derived again right here.
        scheduler.register(PARTICIPANT, self._on_timer, durable=False)
        self.books = HolderBooks(self.store, scheduler, PARTICIPANT, self.lease_policy)
        self._waiting: list[_Waiting] = []  #: requests waiting for a round
        self._round: asyncio.Task[None] | None = None
        self._round_due = 0.0  #: when the pending round (``_round``) runs
        self._last_round_at: float | None = None
        self._contended = False  #: the last round left demand waiting for capacity
        #: the last round left demand waiting for the limit itself: nothing new
        #: can be granted before permits come back (new demand needs no round)
        self._full = False
        #: per client, its demand the latest round it was in left waiting: (round ms, group -> (reason, count))
        self._blocked: dict[str, tuple[float, dict[str, tuple[str, int]]]] = {}
        self.books.schedule_reclaim(next_reclaim_at(self.books.grants().values(), self.books.leases().values(),
                                                    self.books.known_ids()))
        #: a tree's holder runs its rounds on a beat (``tree.on_beat``); None outside a tree
        self._beat_phase_ms = None if parent is None else beat_phase(_object_name(scheduler.ctx),
                                                                     self.round_period_ms)
        #: a parent of a tree: the oldest items its last round left waiting, per
        #: child (what a reply between rounds tells a child), and when it ran
        self._oldest: tuple[OldestWaiting, float] | None = None
        # A tree's parent reaches its children through the tree's client
        # (``parent``): it parks their requests as other holders park queues'.
        self._parked = None if clients is None and parent is None else ParkedRequests(
            clients, _object_name(scheduler.ctx), scheduler, PARTICIPANT, news=self._line_changed,
            take_reports=lambda answer: _take_answer_reports(self, answer),
            wake_after_ms=_positive_ms(wake_after_ms, "wake_after_ms"),
            listing=lambda client_id: _listing(self, client_id), first_listing=self.books.first_listing,
            children=parent)
        self._link, self._waker = _tree_parts(self, parent, can_grant)
        if self._parked is not None:  # a new instance's line, as its rows left it
            self._parked.restore(self.books.rows.waiting(), self.books.rows.names(), self.books.grants().values())
            self._parked.watch(holdings(self.books.grants().values(), self.books.leases().values()))
            if self._beat_phase_ms is not None and self._parked.line:  # its beat, which tells its parent
                self._round_later(_parked_round_at(self))

    def _tell_parent(self, requests: list[Request], outcomes: dict[str, ClientOutcome] | None,
                     synced_by: str | None = None) -> None:
        """A child, after a round (what it left waiting) or a sync (None, from ``synced_by``)."""
        if self._link is not None:
            self._link.after_round(unmet_demand(requests, outcomes) if outcomes is not None else None, synced_by)

    migrate = public_migrate(HOLDER_COMPONENT, HOLDER_TABLES, "the holder's tables")

    @staticmethod
    def client(**options: Any) -> SemaphoreClientFactory:
        """A factory of clients for this holder; see ``durability.semaphore.client``."""
        from .client import SemaphoreClientFactory

        return SemaphoreClientFactory(**options)

    def _commit(self, changes: Changes) -> None:
        """Persist changes (their rows and the reclaim timer together), then update memory."""
        parked = self._parked
        self.books.commit(changes, parked.line if parked is not None else None,
                          self._waker.own_key if self._waker is not None else None,
                          parked.name_of if parked is not None else lambda _: None)
        if self._parked is not None:
            self._parked.watch(holdings(self.books.grants().values(), self.books.leases().values()))

    # -- messages ---------------------------------------------------------------
    async def handle(self, message: Any) -> dict[str, Any] | None:
        """Answer one client message; the holder class's RPC method returns this.
        In a budget tree it also takes a parent's call to its child (a
        ``grants`` reply: what the parent's round had for it; answered with
        None, see ``ParentLink.called``)."""
        if isinstance(message, dict) and message.get("type") == "grants":
            return await _called_by_parent(self, message)
        try:
            parsed = parse(message)
        except ProtocolError as error:
            return error.reply()
        if self._waker is not None:
            self._waker.heard_from(parsed.client_id)
        if isinstance(parsed, Sync):
            return await self._sync(parsed)
        if self._parked is not None and self._parked.can_park(parsed):
            return await self._answer_at_once(parsed)
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Waiting(parsed, waiter, now_ms() + parsed.wait_ms))
        # A parent with room serves a child without the batching wait: with
        # nothing contended there is no order to keep (rounds stay a period
        # apart). A parent on a tree's beat waits for it all the same: a
        # round off the beat serves the first child to ask, not the oldest
        # work of all (a point and a half of the busy share at bench_tree.py).
        self._ensure_round(soon=not self._contended and parent_of(parsed.client_id) is not None
                           and self._beat_phase_ms is None)
        return await waiter

    async def _answer_at_once(self, request: Request) -> dict[str, Any]:
        """A request that is parked: answered now with what a round hands out
        now, or between rounds with what its reports did (its demand waits
        for the next round, which calls the client if it serves it)."""
        assert self._parked is not None
        unreachable = self._parked.calls.failing(request.client_id)
        self._parked.park(request)
        waiting = _Waiting(request, asyncio.get_running_loop().create_future(), now_ms())
        at = _parked_round_at(self)
        if at <= now_ms():
            self._round_now([waiting])
        elif unreachable:  # calls to it fail: it hears what that round has for it in this reply
            self._waiting.append(replace(waiting, hold_until=at))
            self._ensure_round(soon=self._beat_phase_ms is None)
        else:
            _reports_only(self, waiting)
            # A full limit waits for permits to come back, which start a
            # round; a tree's child runs it all the same: it tells its
            # parent what waits, and is lent more.
            if self._parked.line and (not self._full or self._link is not None):
                self._round_later(at)
        await self.scheduler.sync()
        return await waiting.reply

    async def _line_changed(self, more: bool, gave_back: bool) -> None:
        """A client's answer to a call (its lease reports applied already):
        its line entry's row if that matters to a new instance, and a round
        if it asks for more or gave permits back."""
        if gave_back or (more and (not self._full or self._link is not None)):
            await self._news()
        else:
            self._commit(Changes())
        await self.scheduler.sync()

    async def _news(self, answered: str | None = None) -> None:
        """Something changed that a round for the parked requests may serve
        (permits came back, demand grew): that round now, or when the period
        since the last one is over, on the alarm. ``answered``: a client
        whose reply to its own message lists what the round grants it."""
        if self._parked is None or not self._parked.line:
            return
        at = _parked_round_at(self)
        if at <= now_ms():
            self._round_now([], answered)
        else:
            self._round_later(at)
        await self.scheduler.sync()

    def _round_later(self, at: float) -> None:
        """A round for the parked requests at ``at``. One due within
        ``MEMORY_ROUND_MS`` waits in memory: the holder is awake meanwhile
        (a tenth of a second in the example: $0.16 per million such
        waits), where the alarm would cost a row to set it, another to set
        it back, and the run ($2.15 per million). A later one waits on the
        alarm, and the holder sleeps. In a tree every round waits on the
        alarm: its holders run one each beat while work waits, and one
        waiting in memory would keep each awake half of every period."""
        if at - now_ms() <= MEMORY_ROUND_MS and self._beat_phase_ms is None:
            self._ensure_round(soon=True)
        else:
            self.scheduler.schedule(PARTICIPANT, ROUND, at)

    def _round_now(self, extra: list[_Waiting], answered: str | None = None) -> None:
        """A round now, over the requests held (and ``extra``) and the parked ones."""
        batch, self._waiting = self._waiting + extra, []
        try:
            self._run_round(batch, answered)
        except Exception as error:  # storage failed: nobody is told anything was granted
            log.exception("semaphore round failed")
            for waiting in batch:
                if not waiting.reply.done():
                    waiting.reply.set_exception(error)

    async def _sync(self, sync: Sync) -> dict[str, Any]:
        working = Working(self.books.grants(), self.books.leases())
        now = now_ms()
        ids = self.books.lease_ids()
        try:
            outcomes, lease_outcomes = apply_all_reports(
                working, sync.client_id, sync.reports, sync.lease_reports, ids, now, ids.ttl_ms)
        except ProtocolError as error:
            return error.reply()
        _retire_leases(self, working, now)
        if working.changes:
            self._commit(working.changes)
            await self.scheduler.sync()
        self._tell_parent([], None, sync.client_id)  # a child gives back what its clients released, or wakes
        if working.changes and (self._link is not None or parent_of(sync.client_id) is not None):
            _round_if_waiting(self)
        if self._waker is not None:
            self._waker.watch(lambda: _holding(self.books.grants()))
        if self._parked is not None:
            self._parked.heard(sync.client_id)
            if working.changes:  # permits may have come back: the reply lists what the round grants the client
                await self._news(None if self.lease_policy is not None else sync.client_id)
        return _synced_reply(self, sync.client_id, outcomes, lease_outcomes)

    # -- rounds -----------------------------------------------------------------
    def _ensure_round(self, soon: bool = False, spacing: float | None = None) -> None:
        """The next round, at ``_round_time``; an earlier one replaces a later one still asleep."""
        at = _round_time(self, soon, spacing)
        if self._round is not None:
            if self._round_due <= at:
                return
            self._round.cancel()  # still asleep: it has taken no request yet
        self._round_due = at
        self._round = asyncio.ensure_future(self._round_at(at))

    def _holds_permits(self) -> bool:
        return any(grant.charged > 0 for grant in self.books.grants().values()) or any(
            not lease.settled for lease in self.books.leases().values())

    async def _round_at(self, at: float) -> None:
        await sleep_until(at)
        self._round = None
        self._round_now([])
        await self.scheduler.sync()
        if self._waiting:
            self._ensure_round()

    def _run_round(self, batch: list[_Waiting], answered: str | None = None) -> None:
        now = now_ms()
        self._last_round_at = now
        self.scheduler.cancel(PARTICIPANT, ROUND)  # this is the round it waited for
        requests = [waiting.request for waiting in batch]
        asked = {request.client_id for request in requests}
        parked = self._parked.requests(asked) if self._parked is not None else []
        if self._link is not None:
            self._link.decide(_demands_by_group(requests + parked))
        limits = self._resolve_limits(requests + parked)
        result: RoundResult = run_round(
            self.books.grants(), requests + parked, limits, now, self.grant_timeout_ms, _new_grant_id,
            leases=self.books.leases(), policy=self.lease_policy, lease_ids=self.books.lease_ids(),
            held_over=[index for index, waiting in enumerate(batch) if not waiting.heartbeat]
            + list(range(len(requests), len(requests) + len(parked))),
            fair=_fair_policy(self.fair_share, requests + parked, self.books.grants()),
        )
        calls = _commit_round(self, result, asked, answered)
        self._contended = result.contended
        self._full = any(reason == BlockedReason.LIMIT for outcome in result.outcomes.values()
                         for reason, _ in outcome.blocked.values())
        _note_blocked(self._blocked, now, result.outcomes)
        self._tell_parent(requests + parked, result.outcomes)
        self._oldest = (OldestWaiting(requests + parked, result.outcomes), now) if any(
            parent_of(request.client_id) is not None for request in requests + parked) else None
        if self._waker is not None:
            if result.contended:
                self._waker.wake_quiet(_holding(self.books.grants()))
            self._waker.watch(lambda: _holding(self.books.grants()))
        if self._parked is not None and calls:
            ttl_ms = self.lease_policy.ttl_ms if self.lease_policy is not None else 0
            self._parked.call(calls, lambda client_id, outcome: _grants_reply(
                outcome, _parked_until(self, client_id, now) or now, result.contended, ttl_ms).to_wire())
        held, replies = _hold_or_answer(batch, result, now + self.round_period_ms)
        _answer(self, replies, held, result, limits, now)
        self._waiting = held + self._waiting
        if self._beat_phase_ms is not None and self._parked is not None and result.contended and (
                self._parked.requests(set())):
            # A tree's holder runs a round each beat while work waits in its
            # line for capacity: a child's tells its parent what is left, a
            # parent's lends. (Not for a client whose calls fail, nor for
            # demand its rules refuse: no beat would serve those.)
            self._round_later(_parked_round_at(self))

    def _resolve_limits(self, requests: list[Request]) -> Limits:
        """The user's callbacks, once per round: for every group in demand, and
        for every live lease, whose eligibility the round checks again."""
        wanted = [(r.client_id, d.group) for r in requests for d in r.demand]
        wanted += [(lease.client_id, lease.group) for lease in self.books.leases().values() if not lease.retired]
        return self.limits.for_round(wanted)

    # -- reclaim on the alarm ------------------------------------------------------
    async def _on_timer(self, timer: Timer) -> None:
        if timer.key == ROUND:
            self._round_now([])
            await self.scheduler.sync()
        elif timer.key == WAKE and self._parked is not None:
            self._parked.wake_silent(holdings(self.books.grants().values(), self.books.leases().values()))
        elif self._parked is None or not await self._parked.on_timer(timer.key):
            await self._reclaim()

    async def _reclaim(self) -> None:
        working = Working(self.books.grants(), self.books.leases())
        # A claim that reached the holder before the deadline counts, even if
        # its request still waits for a round: apply those claims first.
        for waiting in self._waiting:
            try:
                apply_reports(working, waiting.request.client_id, waiting.request.reports)
            except ProtocolError:
                pass  # refused to its sender when its round runs
        reclaim(working, now_ms(), self.books.lease_ids())
        self._commit(working.changes)
        if working.changes:
            await self._news()  # permits came back

    # -- usage -------------------------------------------------------------------
    def usage(self) -> dict[str, Any]:
        """``usage_info()`` as the wire spells it (camelCase): what an RPC method returns."""
        return self.usage_info().to_wire()

    def usage_info(self) -> Usage:
        """The limit, permits outstanding (grants and lease footprint), and
        per-group usage, as the holder's books say."""
        self.scheduler.resume_if_overdue()  # a read resumes an object whose alarm was lost
        return _usage_info(self)



def _usage_info(holder: DurabilitySemaphore) -> Usage:
    """``usage_info()``'s figures. Settled grants and leases kept only to
    answer late reports charge nothing."""
    grants = [grant for grant in holder.books.grants().values() if not grant.settled]
    leases = [lease for lease in holder.books.leases().values() if not lease.settled]
    granted, leased = usage(grants)[0], lease_usage(leases)[0]
    limit = holder.limits.total()
    policy = holder.lease_policy
    resolved = None if isinstance(limit, ResolutionFailed) else limit
    return Usage(
        limit=resolved,
        ceiling=resolved if policy is None or resolved is None else policy.budgets(resolved).ceiling,
        outstanding=granted + leased,
        lease_footprint=leased,
        # Past its ttl a lease is retired at the next round or report; say so already.
        retired_footprint=sum(lease.footprint for lease in leases if lease.retired or lease.expires_at <= now_ms()),
        grants=len(grants),
        leases=len(leases),
        groups=_group_usages(grants, leases, holder.limits),
        waiting=_waiting_by_reason(holder._blocked, now_ms()),
        **_sharing(holder.fair_share, grants, holder._blocked),
    )


def _parked_round_at(holder: DurabilitySemaphore, off_beat: bool = False, spacing: float | None = None) -> float:
    """When a round for the parked line runs: at once, a period after the
    last (or ``spacing``); in a tree, on the holder's beat unless ``off_beat``."""
    return _round_time(holder, soon=off_beat or holder._beat_phase_ms is None, spacing=spacing)


async def _parked_round(holder: DurabilitySemaphore, off_beat: bool = False, spacing: float | None = None) -> None:
    """A round for the parked line as soon as ``_parked_round_at`` allows."""
    at = _parked_round_at(holder, off_beat, spacing)
    if at <= now_ms():
        holder._round_now([])
    else:
        holder._round_later(at)
    await holder.scheduler.sync()


async def _called_by_parent(holder: DurabilitySemaphore, message: dict[str, Any]) -> dict[str, Any] | None:
    """A tree's parent calls its child with what its round had for it."""
    if holder._link is None:
        return ProtocolError("invalid_message", "only a budget tree's child takes its parent's replies").reply()
    answer = holder._link.called(message)
    await holder.scheduler.sync()
    return answer


def _round_if_waiting(holder: DurabilitySemaphore) -> bool:
    """In a tree, permits released where requests wait: a round on the
    next beat (a root made without ``parent=`` keeps no beat: one
    ``round_wait_ms`` after its last round)."""
    if holder._waiting:
        holder._ensure_round(soon=holder._beat_phase_ms is None, spacing=holder.round_wait_ms)
    return bool(holder._waiting)


def _round_for_lent(holder: DurabilitySemaphore) -> bool:
    """A child its parent just lent more, where requests wait: a round as
    soon as ``round_wait_ms`` after the last, off the beat. The parent
    lends half a period after the child's beat: those permits would idle
    that long (a point of the busy share at ``bench_tree.py``, for a
    round and its grants more where the parent lent)."""
    parked = holder._parked is not None and bool(holder._parked.line)
    if parked:  # a round over both (out of the exchange that lent: it is still reading the reply)
        asyncio.ensure_future(_parked_round(holder, off_beat=True, spacing=holder.round_wait_ms))
    elif holder._waiting:
        holder._ensure_round(soon=True, spacing=holder.round_wait_ms)
    return bool(holder._waiting) or parked


def _answer(holder: DurabilitySemaphore, answered: list[tuple[_Waiting, ClientOutcome]], held: list[_Waiting],
            result: RoundResult, limits: Limits, now: float) -> None:
    """A round's replies: each with the line ahead of its client and, to a
    tree's child, the parent's limits and who else waits (a function of
    the holder, kept out of its class for size)."""
    ttl_ms = holder.lease_policy.ttl_ms if holder.lease_policy is not None else 0
    line: Line | None = None
    for waiting, outcome in answered:
        request = waiting.request
        tree = _tree_fields(holder, request.client_id, limits.groups, request)
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
    waiting.reply.set_result(replace(reply, **_tree_fields(holder, request.client_id, request=request)).to_wire())


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


def _parked_until(holder: DurabilitySemaphore, client_id: str, now: float) -> float | None:
    """When a client in the parked line asks again by itself (once its wait
    is over with nothing heard), or None: it is not in that line."""
    entry = holder._parked.line.get(client_id) if holder._parked is not None else None
    return None if entry is None else now + entry.request.wait_ms


def _synced_reply(holder: DurabilitySemaphore, client_id: str, outcomes: list[ReportOutcome],
                  lease_outcomes: list[LeaseOutcome]) -> dict[str, Any]:
    """A sync's reply: its reports' outcomes, the client's leases to stop
    drawing from, and its grants (new ones a round just made included)."""
    working = Working(holder.books.grants(), holder.books.leases())
    ttl_ms = holder.lease_policy.ttl_ms if holder.lease_policy is not None else 0
    stopping = [lease for lease in working.leases()
                if lease.client_id == client_id and lease.retired and not lease.settled]
    listed = [g for g in working.grants() if g.client_id == client_id and g.unclaimed > 0]
    listed += held_grants(working, client_id)
    if holder._parked is not None:  # (see _uncarried)
        carried = holder._parked.calls.carried(client_id)
        listed = [g for g in listed if g.grant_id not in carried]
    listed = listed[:MAX_REPORTS]
    first = holder.books.first_listing(g.grant_id for g in listed)
    return Reply("synced", tuple(outcomes), tuple(lease_outcomes),
                 tuple(_lease_entry(lease, ttl_ms) for lease in stopping[:MAX_REPORTS]), holder._contended,
                 grants=tuple(_grant_entry(g, first) for g in listed),
                 **(_tree_limits(holder.limits, holder.books.grants(), holder._link) if parent_of(client_id) else {}),
                 ).to_wire()


def _group_usages(grants: list[Grant], leases: list[Lease], limits: UserLimits) -> dict[str, GroupUsage]:
    """Per group: permits outstanding, in use, idle, leased, and its own ceiling."""
    _, groups = usage(grants)
    _, leased_groups = lease_usage(leases)
    in_use: dict[str, int] = {}
    for grant in grants:
        in_use[grant.group] = in_use.get(grant.group, 0) + grant.claimed - grant.released
    for lease in leases:
        in_use[lease.group] = in_use.get(lease.group, 0) + lease.drawn - lease.released
    per_group = {}
    for group in sorted(set(groups) | set(leased_groups)):
        outstanding = groups.get(group, 0) + leased_groups.get(group, 0)
        ceiling = limits.ceiling(group)
        per_group[group] = GroupUsage(outstanding, in_use[group], outstanding - in_use[group],
                                      leased_groups.get(group, 0),
                                      None if isinstance(ceiling, ResolutionFailed) else ceiling)
    return per_group


def _fair_policy(fair_share: UserFairShare | None, requests: list[Request],
                 grants: dict[str, Grant]) -> FairPolicy | None:
    """The round's fair-share policy, over the groups in demand and those holding permits."""
    if fair_share is None:
        return None
    return fair_share.for_round([d.group for r in requests for d in r.demand] + list(usage(grants.values())[1]))


def _sharing(fair_share: UserFairShare | None, grants: list[Grant],
             blocked: dict[str, tuple[float, dict[str, tuple[str, int]]]]) -> dict[str, Any]:
    """``usage()``'s policy and per-key shares."""
    if fair_share is None:
        return {"policy": OLDEST_FIRST}
    waiting: dict[str, int] = {}
    for entry in _waiting_by_reason(blocked, now_ms()):
        waiting[entry.group] = waiting.get(entry.group, 0) + entry.waiting
    return {"policy": fair_share.status, "shares": fair_share.usage(usage(grants)[1], waiting)}


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

def _waiting_by_reason(blocked: dict[str, tuple[float, dict[str, tuple[str, int]]]],
                       now: float) -> tuple[WaitingUsage, ...]:
    """Demand left waiting, by group and reason, as clients last told it."""
    totals: dict[tuple[str, str], list[int]] = {}
    since = now - WAITING_HEARD_MS
    for at, by_group in blocked.values():
        if at < since:
            continue  # a client not heard of for this long has stopped asking
        for group, (reason, count) in by_group.items():
            total = totals.setdefault((group, reason), [0, 0])
            total[0] += count
            total[1] += 1
    return tuple(WaitingUsage(group, str(reason), count, clients)
                 for (group, reason), (count, clients) in sorted(totals.items()))


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


def _demands_by_group(requests: list[Request]) -> dict[str, list[Demand]]:
    demands: dict[str, list[Demand]] = {}
    for request in requests:
        for demand in request.demand:
            demands.setdefault(demand.group, []).append(demand)
    return demands


def _note_blocked(blocked: dict[str, tuple[float, dict[str, tuple[str, int]]]], now: float,
                  outcomes: dict[str, ClientOutcome]) -> None:
    """What each client of the round still waits for, for ``usage()``. Kept
    in memory: a client that waits asks again, and is heard again, soon."""
    for client_id, outcome in outcomes.items():
        if outcome.blocked:
            blocked[client_id] = (now, dict(outcome.blocked))
        else:
            blocked.pop(client_id, None)
    for client_id in [c for c, (at, _) in blocked.items() if at < now - WAITING_HEARD_MS]:
        del blocked[client_id]


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
    beat = holder._beat_phase_ms is not None and not soon
    at = now_ms() + (0 if soon or beat else holder.round_wait_ms)
    if holder._last_round_at is not None:
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
    return on_beat(at, holder.round_period_ms, holder._beat_phase_ms or 0.0) if beat else at


def _tree_parts(holder: DurabilitySemaphore, parent: SemaphoreClient | None,
                can_grant: Callable[[str, str], bool] | None) -> tuple[ParentLink | None, Waker | None]:
    """A holder's place in a budget tree: its link to its parent (a child),
    and the waker of its quiet children (a parent)."""
    if parent is None:
        return None, None
    ctx = holder.scheduler.ctx
    link = child_link(parent, holder.scheduler, holder.round_period_ms, lambda: _round_for_lent(holder),
                      lambda: usage(holder.books.grants().values())[1], holder.store)
    if link is not None:  # a child borrows its limit: every group's ceiling is what it holds there
        holder.limits = UserLimits(link.borrowed.total, link.ceiling, can_grant)
        holder.fair_share = None  # the root shares the limit: a child passes its demand up, groups and all
        link.ensure_exchanges()  # a new instance hears at once what it holds
    waker = Waker(parent, _object_name(ctx), holder.round_period_ms, holder.scheduler)
    waker.watch(lambda: _holding(holder.books.grants()))
    return link, waker


def _holding(grants: dict[str, Grant]) -> list[str]:
    """The clients the books charge permits to."""
    return [grant.client_id for grant in grants.values() if grant.charged > 0]


def _tree_limits(limits: UserLimits, grants: dict[str, Grant], link: ParentLink | None,
                 resolved: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a parent tells its children of its own limits (see
    ``tree.over_limit`` and ``tree.closed_groups``): the ceilings a round
    already read (``resolved``) are not read again; a parent that is a
    child itself is limited by what it holds, not by what it owes."""
    total, by_group = usage(grants.values())
    if link is not None:
        return {"over_limit": over_limit(link.borrowed.total(), total),
                "closed_groups": closed_groups(by_group, link.held_ceiling)}
    known = resolved or {}
    return {"over_limit": over_limit(limits.total(), total),
            "closed_groups": closed_groups(by_group, lambda g: known[g] if g in known else limits.ceiling(g))}


def _tree_fields(holder: DurabilitySemaphore, client_id: str, resolved: dict[str, Any] | None = None,
                 request: Request | None = None) -> dict[str, Any]:
    """What a reply tells a tree's child beyond what other clients hear: the
    parent's limits, and, per group it waits in (``request``'s, else its
    parked demand's), the oldest items the parent's last round left waiting
    at other children, with when that round ran. Nothing for other clients."""
    if parent_of(client_id) is None:
        return {}
    fields = _tree_limits(holder.limits, holder.books.grants(), holder._link, resolved)
    if request is None and holder._parked is not None:
        request = entry.request if (entry := holder._parked.line.get(client_id)) is not None else None
    if holder._oldest is not None and request is not None:
        oldest, seen_at = holder._oldest
        fields.update(waiting_since=oldest.others(client_id, (d.group for d in request.demand)),
                      waiting_since_at=seen_at)
    return fields


def _retire_leases(holder: DurabilitySemaphore, working: Working, now: float) -> None:
    """On a sync, the leases past their ttl, and those a lowered limit or a
    lost eligibility retires: the client hears on its next exchange of any
    kind, not only on its next request."""
    retire_expired(working, now)
    if any(not lease.retired for lease in working.leases()):
        limits = holder._resolve_limits([])
        retire_ineligible(working, holder.lease_policy, limits.total, limits.groups, limits.permitted)


def _take_answer_reports(holder: DurabilitySemaphore, answer: Request) -> bool | None:
    """The lease reports on a client's answer to a call (what it drew from
    the leases the call brought, and released since), applied as a sync's
    are, with nobody to tell the outcome (a later listing says what
    changed). Without them the books would show a lease drawn at once as
    drawable still, and the client's older work would wait out of the
    rounds until its next report. True if permits came back; None if the
    reports were refused (a lease not the client's, say): the answer then
    changes nothing."""
    if not answer.lease_reports or holder.lease_policy is None:
        return False
    working = Working(holder.books.grants(), holder.books.leases())
    ids = holder.books.lease_ids()
    before = lease_usage(holder.books.leases().values())[0]
    try:
        apply_all_reports(working, answer.client_id, (), answer.lease_reports, ids, now_ms(), ids.ttl_ms)
    except ProtocolError as error:
        log.warning("semaphore: %s answered a call with reports refused: %s", answer.client_id, error)
        return None
    if not working.changes:
        return False
    holder._commit(working.changes)
    return lease_usage(holder.books.leases().values())[0] < before
