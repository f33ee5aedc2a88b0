"""DurabilitySemaphore: the holder of one shared concurrency budget, inside its Durable Object.

Lives here: the runtime side of the holder: requests waiting for a round
and the round timer (in memory), the user's limit callbacks resolved once
per round (``holder/limits``) for the groups in demand and those holding
leases, each round run and committed in one transaction before anyone
hears back (none for a round with nothing to write), the reclaim timer
on the scheduler, ``usage()`` and ``migrate()``. Its functions kept out
of the class for size: ``holder/rounds`` (when a round runs, and what it
commits), ``holder/replies`` (what the holder answers, and the requests
it holds over), ``holder/between_rounds`` (a sync, a call's answer, the
reclaim) and ``holder/usage`` (what ``usage()`` reports). Its place in
a budget tree is one object, ``self.tree`` (``holder/tree_place``), told
at fixed points of a message's path; made without ``parent=``, it keeps
no beat, borrows nothing and wakes nobody. Must not know: how a round
decides (``allocation``), how messages look on the wire (``messages``),
how clients reach it (``client``), or a tree's link and waker
(``semaphore/tree``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..._common.checks import is_number
from ..._common.clock import now_ms, sleep_until
from ..._common.schema import public_migrate
from ...scheduler.alarm import DurabilityScheduler, Timer
from ..messages import BlockedReason, ProtocolError, Request, Sync, Usage, parse
from ..tree.link import object_name as _object_name
from .between_rounds import _reclaim, _sync, _take_answer_reports
from .books import HolderBooks
from .fair_options import UserFairShare, fair_share_of
from .limits import UserLimits
from .parked import WAKE, ParkedRequests, holdings
from .pure.allocation import Changes, Limits, ResolutionFailed, RoundResult, next_reclaim_at, run_round
from .pure.leases import LeasePolicy
from .replies import _answer, _answer_at_once, _grants_reply, _hold_or_answer, _listing, _parked_until, _Waiting
from .rounds import (
    PARTICIPANT,
    ROUND,
    _commit_round,
    _fair_policy,
    _later_rounds,
    _new_grant_id,
    _news,
    _parked_round_at,
    _round_time as _round_time,
    _round_when_rate_allows,
)
from .start_rate import RoundRates, StartRate
from .store import COMPONENT as HOLDER_COMPONENT, TABLES as HOLDER_TABLES, HolderStore
from .tree_place import tree_place
from .usage import _note_blocked, _usage_info

if TYPE_CHECKING:
    from ..client import SemaphoreClient, SemaphoreClientFactory

log = logging.getLogger("durability.semaphore")
MEMORY_ROUND_MS = 1_000  #: a round for parked requests due this soon waits in memory (``_round_later``)


def _positive_ms(value: Any, what: str) -> float:
    if not is_number(value) or not value >= 0:
        raise ValueError(f"{what} must be a non-negative number of milliseconds, not {value!r}")
    return float(value)


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
            one at once. A request that asks to ``wait`` and gets nothing is held for the
            following rounds (up to its wait) instead of being answered
            empty, so a blocked client costs one request per wait, not one
            per round, and is present in every round that could serve it.
        grant_timeout_ms: how long granted permits stay reserved unclaimed.
        rejoin_wait_ms: how long after it started a new instance whose books
            hold permits (it restarted while busy) holds its first round, so
            that the clients whose requests failed with the old instance are
            back in line, oldest work first, before anything is handed out.
            A first round waits ``round_wait_ms`` anyway: this matters only
            when it is longer. (A tree's parent runs an instance's first
            round off its beat instead: ``holder.rounds._round_time``.)
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
        rate: a start rate next to the limit: at most ``limit`` permits start
            in any window of ``period_ms``, as ``(limit, period_ms)``,
            ``(limit, period_ms, burst)``, a ``Rate``, or a string such as
            ``"60/min"`` or ``"60/min, burst 10"``; or a callable returning
            one (or None: no rate), read once per round. ``burst`` lets that
            many more start at once after a quiet spell, at most ``limit``
            per period on average. Demand the rate holds back waits in line
            (``rate`` is its blocked reason) and is served oldest first when
            the window allows, by a round on the alarm. Grants only: not
            with ``leases`` or ``parent`` (see ``holder/pure/rate``).
        group_rate: ``group -> rate | None``, a group's own start rate under
            the key's (read once per round for the groups in demand; if it
            raises, that group fails closed for the round).
    """

    def __init__(self, scheduler: DurabilityScheduler, *, limit: int | Callable[[], int],
                 group_limit: Callable[[str], int | None] | None = None,
                 can_grant: Callable[[str, str], bool] | None = None,
                 round_wait_ms: float = 1_000, round_period_ms: float = 2_000,
                 grant_timeout_ms: float = 10_000, leases: dict[str, Any] | None = None,
                 rejoin_wait_ms: float = 1_000, parent: SemaphoreClient | None = None,
                 fair_share: dict[str, Any] | None = None, clients: Any = None,
                 wake_after_ms: float = 60_000, rate: Any = None,
                 group_rate: Callable[[str], Any] | None = None) -> None:
        self.limits = UserLimits(limit, group_limit, can_grant)
        self.rate = StartRate(rate, group_rate)
        if self.rate.on and (leases is not None or parent is not None):
            raise ValueError("a start rate (rate=, group_rate=) counts grants only: not with leases= or parent= (yet)")
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
                                                    self.books.known_ids(), self.books.rows.waiting_rows()))
        # A tree's parent reaches its children through the tree's client
        # (``parent``): it parks their requests as other holders park queues'.
        self._parked = None if clients is None and parent is None else ParkedRequests(
            clients, _object_name(scheduler.ctx), scheduler, PARTICIPANT, news=self._line_changed,
            take_reports=lambda answer: _take_answer_reports(self, answer),
            wake_after_ms=_positive_ms(wake_after_ms, "wake_after_ms"), children=parent,
            listing=lambda client_id: _listing(self, client_id), first_listing=self.books.first_listing)
        if self._parked is not None and self.rate.on:
            self._parked.calls.placed = self.rate.placed_at
        #: its place in a budget tree (``holder/tree_place``), told of what it does at fixed points
        self.tree = tree_place(self, parent, can_grant)
        if self._parked is not None:  # a new instance's line, as its rows left it
            self._parked.restore(self.books.rows.waiting(), self.books.rows.names(), self.books.grants().values())
            self._parked.watch(holdings(self.books.grants().values(), self.books.leases().values()))
            if self.tree.keeps_beat and self._parked.line:  # its beat, which tells its parent
                self._round_later(_parked_round_at(self))
            if self._parked.line and self.rate.on:  # a round a start rate owed its line is on no row
                groups = {d.group for request in self._parked.line.requests() for d in request.demand}
                _round_when_rate_allows(self, self.rate.read_quietly(groups), None, now_ms())

    migrate = public_migrate(HOLDER_COMPONENT, HOLDER_TABLES, "the holder's tables")

    @staticmethod
    def client(**options: Any) -> SemaphoreClientFactory:
        """A factory of clients for this holder; see ``durability.semaphore.client``."""
        from ..client import SemaphoreClientFactory

        return SemaphoreClientFactory(**options)

    def _commit(self, changes: Changes) -> None:
        """Persist changes (their rows and the reclaim timer together), then update memory."""
        self.rate.stamp(changes)
        parked = self._parked
        self.books.commit(changes, parked.line if parked is not None else None, self.tree.own_key,
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
            return await self.tree.called_by_parent(message)
        try:
            parsed = parse(message)
        except ProtocolError as error:
            return error.reply()
        self.tree.heard_from(parsed.client_id)
        self.rate.heard(parsed.client_id, parsed.reports, self.books.grants())
        if isinstance(parsed, Sync):
            return await _sync(self, parsed)
        if self._parked is not None and self._parked.can_park(parsed):
            return await _answer_at_once(self, parsed)
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Waiting(parsed, waiter, now_ms() + parsed.wait_ms))
        # A parent with room serves a child without the batching wait: with
        # nothing contended there is no order to keep (rounds stay a period
        # apart). A parent on a tree's beat waits for it all the same: a
        # round off the beat serves the first child to ask, not the oldest
        # work of all (a point and a half of the busy share at bench_tree.py).
        self._ensure_round(soon=not self._contended and self.tree.is_child(parsed.client_id)
                           and not self.tree.keeps_beat)
        return await waiter

    async def _line_changed(self, more: bool, gave_back: bool) -> None:
        """A client's answer to a call (its lease reports applied already):
        its line entry's row if that matters to a new instance, and a round
        if it asks for more or gave permits back."""
        if gave_back or (more and (not self._full or self.tree.has_parent)):
            await _news(self)
        else:
            self._commit(Changes())
        await self.scheduler.sync()

    def _round_later(self, at: float, backstop_ms: float | None = None) -> None:
        """A round for the parked requests at ``at``. One due within
        ``MEMORY_ROUND_MS`` waits in memory: the holder is awake meanwhile
        (a tenth of a second in the example: $0.16 per million such
        waits), where the alarm would cost a row to set it, another to set
        it back, and the run ($2.15 per million). A later one waits on the
        alarm, and the holder sleeps. In a tree every round waits on the
        alarm: its holders run one each beat while work waits, and one
        waiting in memory would keep each awake half of every period.
        ``backstop_ms``: at ``at`` exactly, and on the alarm that much later (``rounds`` says why)."""
        if at - now_ms() <= MEMORY_ROUND_MS and not self.tree.keeps_beat:
            self._ensure_round(soon=True, at=at if backstop_ms is not None else None)
        else:
            self.scheduler.schedule(PARTICIPANT, ROUND, at)
        if backstop_ms is not None:
            self.scheduler.schedule_by(PARTICIPANT, ROUND, at + backstop_ms)

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

    # -- rounds -----------------------------------------------------------------
    def _ensure_round(self, soon: bool = False, spacing: float | None = None, at: float | None = None) -> None:
        """The next round, at ``_round_time`` (or ``at``); an earlier one replaces a later one still asleep."""
        at = _round_time(self, soon, spacing) if at is None else at
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
        self.tree.before_round(requests + parked)
        limits = self._resolve_limits(requests + parked)
        rates = self.rate.read(d.group for request in requests + parked for d in request.demand)
        if isinstance(rates, ResolutionFailed):  # fails closed, as a limit that did not resolve
            limits, rates = replace(limits, total=rates), RoundRates()
        elif rates.failed:  # so does a group whose rate did not resolve
            limits = replace(limits, groups={**limits.groups, **rates.failed})
        timeout_ms = self.rate.grant_timeout_ms(rates, self.grant_timeout_ms)
        result: RoundResult = run_round(
            self.books.grants(), requests + parked, limits, now, timeout_ms, _new_grant_id,
            leases=self.books.leases(), policy=self.lease_policy, lease_ids=self.books.lease_ids(),
            held_over=[index for index, waiting in enumerate(batch) if not waiting.heartbeat]
            + list(range(len(requests), len(requests) + len(parked))),
            fair=_fair_policy(self.fair_share, requests + parked, self.books.grants()),
            **self.rate.round_options(rates, now),
        )
        calls = _commit_round(self, result, asked, answered)
        self.rate.after_round(rates, result, now, self.books.grants())
        self._contended = result.contended
        self._full = any(reason == BlockedReason.LIMIT for outcome in result.outcomes.values()
                         for reason, _ in outcome.blocked.values())
        _note_blocked(self._blocked, now, result.outcomes)
        self.tree.after_round(requests + parked, result.outcomes, result.contended, now)
        if self._parked is not None and calls:
            ttl_ms = self.lease_policy.ttl_ms if self.lease_policy is not None else 0
            self._parked.call(calls, lambda client_id, outcome: _grants_reply(
                outcome, _parked_until(self, client_id, now) or now, result.contended, ttl_ms).to_wire())
        held, replies = _hold_or_answer(batch, result, now + self.round_period_ms)
        _answer(self, replies, held, result, limits, now)
        self._waiting = held + self._waiting
        if self.tree.keeps_beat and self._parked is not None and result.contended and (
                self._parked.requests(set())):
            # A tree's holder runs a round each beat while work waits in its
            # line for capacity: a child's tells its parent what is left, a
            # parent's lends. (Not for a client whose calls fail, nor for
            # demand its rules refuse: no beat would serve those.)
            self._round_later(_parked_round_at(self))
        _later_rounds(self, rates, result, now)

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
            await _reclaim(self)

    # -- usage -------------------------------------------------------------------
    def usage(self) -> dict[str, Any]:
        """``usage_info()`` as the wire spells it (camelCase): what an RPC method returns."""
        return self.usage_info().to_wire()

    def usage_info(self) -> Usage:
        """The limit, permits outstanding (grants and lease footprint), and
        per-group usage, as the holder's books say."""
        self.scheduler.resume_if_overdue()  # a read resumes an object whose alarm was lost
        return _usage_info(self)
