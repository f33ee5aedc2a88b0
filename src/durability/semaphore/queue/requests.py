"""Each key's pump: draw, claim, then ask the holder; the request, and what its reply does.

Lives here: ``KeyRequests``: a key's pump (draws and claims first, then a
request when there is demand and the holder's pacing allows), how long
the holder may hold it, asking again at once or under the backoff when it
fails, the request with its claims and lease reports on board, and the
reply's application in one commit (grants and leases learned, pacing
kept, when to ask again or whether to leave the line). Must not know:
how a message is spelled (``messages``), SQL, or the public API.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..._common.calls import retryable
from ..._common.clock import now_ms
from ..messages import MAX_DEMAND_ENTRIES, MAX_REPORTS, Reply, Report, Request
from .admission import Admission
from .grants import QueueGrants
from .leases import QueueLeases
from .memory import QueueContext
from .old_outbox import OldOutboxDrain
from .pure.core import FALLBACK_SLACK_MS, Wanted, ask_again_at_once, may_leave_line, oldest_of, pacing_interval
from .pure.lease_rules import lease_report
from .pure.states import LocalLease, TimerKind

log = logging.getLogger("durability.semaphore.queue")
#: a request is not sent, or held, closer than this to the end of the alarm's
#: starts (scheduler.starts_left_ms): its reply's work must start in time
REQUEST_MARGIN_MS = 5_000


class KeyRequests:
    def __init__(self, ctx: QueueContext, claims: QueueGrants, leases: QueueLeases, admission: Admission,
                 old_outbox: OldOutboxDrain,
                 on_blocked: Callable[[str, dict[str, dict[str, Any]]], Awaitable[None]]) -> None:
        self.ctx = ctx
        self.claims = claims
        self.leases = leases
        self.admission = admission
        self.old_outbox = old_outbox
        self._on_blocked = on_blocked

    async def pump(self, key: str) -> None:
        memory = self.ctx.memory
        memory.away.pop(key, None)
        rejoining = key in memory.rejoining
        memory.rejoining.discard(key)
        await self.ctx.commit(lambda: self.claim_local(key, now_ms()))
        demand = self.ctx.demand(key)[:MAX_DEMAND_ENTRIES]
        wait = await self._request_wait(key, demand)
        if wait is None:
            if not demand:
                self.ctx.memory.failures.pop(key, None)  # nothing to ask for: no failures in a row any more
            await self.claims.report_safely(key)  # claims get confirmed by a sync at once
            if rejoining:  # the lease reports that waited for this request go on their own
                await self.leases.report_safely(key)
            return
        await self._ask_or_retry(key, demand, wait)

    def ask_in_this_event(self, key: str) -> None:
        """Run the key's pump now, in a task of the caller's event, if it is
        due (an enqueue's ask: its timer's alarm was not moved for it)."""
        self.ctx.run_in_this_event(TimerKind.PUMP, key)

    async def hear_idle_keys(self) -> None:
        """The sweep's ask (``DurabilitySemaphoreQueue.resume``): each key that
        may hold grants with nothing waiting asks its holder, in this event,
        what it holds, and its row goes if it holds nothing (as a new
        instance's keys do at its first ask). A grant this object never
        heard of (a copy of its request answered after it went on, say) is
        then listed, and given back: otherwise only the holder's call
        returns it, and that call is on an alarm the runtime may have given
        up on. Keys have rows only with ``keep_done_ms`` 0. A request (and
        its row's delete) at the first sweep after a key's last use, none
        after until it is used again (a key holding grants asks each sweep);
        none on a new instance, whose keys ask by themselves."""
        ctx, memory = self.ctx, self.ctx.memory
        # (An unheard key with nothing waiting asks by itself, at once: see _derive_timers.)
        keys = [key for key in ctx.store.registered_keys()
                if not ctx.demand(key) and key not in memory.asking and key not in memory.unheard]
        if not keys:
            return

        def mark() -> None:
            for key in keys:
                memory.unheard.add(key)
                memory.first_ask.add(key)
                ctx.server.ask_now(key)
                ctx.pump_at(key, now_ms(), earlier_only=True, in_this_event=True)

        await ctx.update(mark)  # (memory and timers only)
        for key in keys:
            self.ask_in_this_event(key)

    def claim_local(self, key: str, now: float, *, admits_after: bool = False) -> None:
        """Draw, for queued items, from this object's leases, then claim
        permits it already holds unclaimed (``admits_after``: as for
        ``QueueLeases.draw``)."""
        self.leases.draw(key, now, admits_after=admits_after)
        self.claims.claim(key, now)

    async def _request_wait(self, key: str, demand: Wanted) -> float | None:
        """How long the holder may hold the key's request now, or None: no
        request now (nothing to ask for, or not yet: the pump is due again)."""
        ctx = self.ctx
        if not demand and key not in ctx.memory.unheard:  # (an unheard key asks, to hear its grants)
            return None
        now = now_ms()
        next_at = self.ctx.server.next_request_at(key)
        if next_at is not None and next_at > now:
            ctx.pump_at(key, next_at)
            return None
        left = self.ctx.scheduler.starts_left_ms()
        if left is not None and left < REQUEST_MARGIN_MS:
            # This alarm stops starting timers before a reply could start its
            # work: permits granted now would idle until a fresh alarm. Ask
            # from that one instead, and let other clients have them.
            at = now_ms() + left  # not due before then: this alarm does not run it again
            await ctx.commit(lambda: ctx.due_at(TimerKind.PUMP, key, at))
            return None
        # An instance's first request for a key is answered at its round,
        # not held: the answer's listing is what the key waits for. (A
        # request the holder may park is answered at once anyway.)
        woken = self.ctx.options.woken
        wait = 0 if key in ctx.memory.first_ask and not woken else self.ctx.options.request_wait_ms
        if left is not None and not woken:
            wait = min(wait, left - REQUEST_MARGIN_MS)  # the reply comes back while timers still start
        return wait

    async def _ask_or_retry(self, key: str, demand: Wanted, wait: float) -> None:
        """Ask; if the request fails, ask again now or leave it to the pump's
        backoff (``queue/pure/core.ask_again_at_once``)."""
        sent_at = now_ms()
        try:
            await self._ask(key, demand, wait)
        except Exception as error:
            failures = self.ctx.memory.failures.get(key, 0)
            self.ctx.memory.failures[key] = failures + 1
            timed_out = isinstance(error, TimeoutError)
            if not ask_again_at_once(retryable(error), now_ms() - sent_at, timed_out, failures):
                raise  # the pump's timer retries it, under ``retries``
            log.info("a request for %s failed: %r; asking again now", key, error)
            await self.ctx.commit(lambda: self.ctx.due_at(TimerKind.PUMP, key, now_ms()))
            return
        self.ctx.memory.failures.pop(key, None)

    async def _ask(self, key: str, demand: Wanted, wait: float) -> None:
        """Send the key's request, with its claims and a report of each of its
        leases (current counts, releases and stops, and a heartbeat), and apply
        the reply."""
        ctx = self.ctx
        claims = self.claims.due_reports(key)
        leases = self.ctx.lease_book.leases(key)[:MAX_REPORTS]
        reported = {lease.lease_id for lease in leases}
        lease_piggybacked = self.old_outbox.lease_messages(reported)
        lease_versions = {i: ctx.memory.lease_due[i][1] for i in reported if i in ctx.memory.lease_due}
        message = self._request_message(key, demand, claims, leases, wait, fallback=self._falls_back(key))
        ctx.memory.gave_back.discard(key)
        # Until its reply is applied, the request's round may have granted
        # (claimed) permits this object has not heard of: if it fails, the key
        # asks again even with no demand left, to hear of them.
        ctx.memory.unheard.add(key)
        if self.ctx.options.keep_done_ms == 0:
            await ctx.commit(lambda: self.ctx.store.register_key(key))
        ctx.memory.asking.add(key)
        try:
            reply = await self._sent_with_lease_reports(key, lease_versions, message)
        finally:
            ctx.memory.asking.discard(key)

        def apply() -> None:
            self.leases.reports_heard(lease_versions)
            self.old_outbox.acknowledge(lease_piggybacked)
            self.apply_grants_reply(key, reply, claims, asked=demand)
            ctx.memory.unheard.discard(key)  # a round answered: it had heard whatever an older instance sent
            if key in ctx.memory.first_ask:
                # A key's row is dropped here, at an instance's first ask, if the
                # key holds nothing: the rows are the keys used since the last
                # start, and a key busy again and again costs no row each time.
                ctx.memory.first_ask.discard(key)
                self._unregister_if_idle(key)

        await ctx.commit(apply)
        await self._after_reply(key, reply)

    async def _sent_with_lease_reports(self, key: str, versions: dict[str, int], message: Request) -> Reply:
        """The grants reply to a request carrying these lease reports. While it
        is in flight (held, perhaps for minutes) no ``sync`` repeats them; if it
        fails, they go on their own at once."""
        in_flight = self.ctx.memory.leases_in_flight
        in_flight.update(versions)
        limit_s = (self.ctx.options.attempt_timeout_ms + self.ctx.options.request_wait_ms) / 1000
        try:
            wire = await asyncio.wait_for(self.ctx.server.request(key, message.to_wire()), limit_s)
            return Reply.parse(wire, "grants")
        except BaseException:
            # (No alarm move here, as before: a cancelled run may end after its alarm did.)
            self.ctx.commit_now(lambda: self._report_on_their_own(key, bool(versions)))
            raise
        finally:
            in_flight = self.ctx.memory.leases_in_flight
            for lease_id, version in versions.items():
                if in_flight.get(lease_id) == version:
                    del in_flight[lease_id]

    def _report_on_their_own(self, key: str, leases: bool) -> None:
        """A request that carried the key's reports failed: a sync sends them
        now (a release's report must not wait for the pump's backoff)."""
        self.ctx.due_by(TimerKind.REPORT, key, now_ms())
        if leases:
            self.ctx.due_by(TimerKind.LEASE_REPORT, key, now_ms())

    def _falls_back(self, key: str) -> bool:
        """Is this request a woken key's fallback: not asked for at once, and
        nothing heard from the holder for a whole wait (or ever, in this
        instance), or a grant's call came too late to use? The holder then
        answers after its round: calls to this object may be failing (a
        holder restarted since has forgotten it), and a grant that comes in
        the reply is new there, where one a call brings may be lost again."""
        options = self.ctx.options
        if key in self.ctx.memory.gave_back:
            return True
        if not options.woken or self.ctx.server.next_request_at(key) is None:  # (None: asked for at once)
            return False
        heard_at = self.ctx.memory.heard_at.get(key)
        return heard_at is None or now_ms() - heard_at >= options.request_wait_ms - FALLBACK_SLACK_MS

    def _request_message(self, key: str, demand: Wanted, claims: dict[str, Report], leases: list[LocalLease],
                         wait: float, fallback: bool = False) -> Request:
        return Request(self.ctx.client_id, tuple(demand),
                       tuple(claims.values()), wait, leases=True,
                       lease_reports=tuple(lease_report(lease) for lease in leases), claims=True,
                       heard_up_to=self.ctx.memory.heard_up_to.get(key, 0.0),
                       wake=self.ctx.options.woken and wait > 0, name=self.ctx.object_name,
                       fallback=fallback and wait > 0)

    async def hear(self, key: str, reply: Reply) -> Request:
        """A reply the holder called with (what a round had for the key's
        parked request): applied as a request's reply is, with no report of
        its own on board. Returns what the key waits for now, which the
        holder keeps in line in place of what it had, with the key's lease
        reports, which it applies: a request nobody answers."""

        def apply() -> None:
            self.apply_grants_reply(key, reply, {})
            if not self.ctx.memory.deferred.get(key):  # the holder listed every grant it counts here
                self.ctx.memory.unheard.discard(key)

        known = {grant.grant_id for grant in self.ctx.grants.grants(key)}
        news = any(entry.grant_id not in known for entry in reply.grants) or any(e.new for e in reply.leases)
        await self.ctx.commit(apply)
        await self._after_reply(key, reply)
        if not news:
            # A wake: the holder heard nothing from this object for a while
            # as it held permits. Its alarm may be one the runtime gave up on.
            await self.ctx.scheduler.resume()
        wait = self.ctx.options.request_wait_ms
        # The key's lease reports ride along: the holder learns what was drawn
        # from the leases the call brought (nothing answers them; a report
        # still due goes on its own as before).
        leases = self.ctx.lease_book.leases(key)[:MAX_REPORTS]
        return self._request_message(key, self.ctx.demand(key)[:MAX_DEMAND_ENTRIES], {}, leases, wait)

    def apply_grants_reply(self, key: str, reply: Reply, sent: dict[str, Report],
                           asked: Wanted | None = None) -> None:
        """What a request's reply does (inside its commit): outcomes, leases
        and grants learned, pacing kept, local claims, and when to ask again
        (``asked``: the demand the request said, if this replies to one)."""
        ctx, now = self.ctx, now_ms()
        ctx.memory.heard_at[key] = now
        self.claims.apply_outcomes(reply.reports, sent)
        self.leases.apply_outcomes(reply.lease_reports, now)
        self.leases.learn(key, reply.leases, now, reply.all_leases_listed)
        if reply.all_leases_listed:  # a new instance will hear of every lease: a drawn item need not be kept
            ctx.memory.all_listed.add(key)
        else:
            ctx.memory.all_listed.discard(key)
        if reply.contended:
            self.leases.return_idle(key)  # _after_reply reports them
        gave_back = self.claims.learn(key, reply.grants, admits_after=True)
        if key not in ctx.memory.asking:  # (a request's reply: its own was cleared before)
            gave_back = self.claims.decide_deferred(key) or gave_back
        interval = pacing_interval((reply.next_request_at or now) - now)
        if interval > 0 and not ctx.options.woken:  # (a woken key's pacing is a fallback its items fix)
            self.ctx.store.set_pacing(key, interval)
        self.claim_local(key, now, admits_after=True)  # (_after_reply hands on what it admits)
        left = ctx.demand(key)
        if left:
            ctx.pump_at(key, self._next_ask_at(key, reply, left, now, gave_back, asked))

    def _next_ask_at(self, key: str, reply: Reply, left: Wanted, now: float, gave_back: bool,
                     asked: Wanted | None) -> float:
        """When a key with demand ``left`` after a reply asks again: when
        the reply says (a woken key's: its fallback), at once for news the
        holder's line lacks, later if the key leaves the line."""
        ctx = self.ctx
        at = max(now, reply.next_request_at or now)
        # A grant heard of too late (given back: ask for a fresh one), or a
        # group whose first item joined while the request was on its way
        # (the enqueue's own ask waited for this one: see
        # DurabilitySemaphoreQueue._enqueued).
        news = gave_back or (asked is not None and bool(_groups(left[:MAX_DEMAND_ENTRIES]) - _groups(asked)))
        if gave_back and ctx.options.woken:
            ctx.memory.gave_back.add(key)
        if news and ctx.options.woken:
            ctx.server.ask_now(key)
            at = now
        if reply.contended and may_leave_line(reply.line, oldest_of(left)):
            # Back in line with its next release, or after a long poll's
            # length if none comes: a held request would wait that long.
            ctx.memory.away[key] = reply.line
            at = max(at, now + ctx.options.request_wait_ms)
        return at

    async def _after_reply(self, key: str, reply: Reply) -> None:
        memory = self.ctx.memory
        memory.heard(key, reply)
        blocked = {b.group: (b.reason, b.waiting) for b in reply.blocked}
        for (k, group) in [k for k in memory.blocked if k[0] == key]:
            if group not in blocked:
                del memory.blocked[(k, group)]
        for group, value in blocked.items():
            memory.blocked[(key, group)] = value
        if blocked:
            await self._on_blocked(key, {g: {"reason": r, "waiting": w} for g, (r, w) in blocked.items()})
        # What the reply admitted starts before any further call (its admit
        # timer moved no alarm: QueueContext.admit_in_this_event).
        await self.admission.admit_pending_safely()
        await self.claims.report_safely(key)  # claims made from new grants get confirmed (and admitted) now
        if reply.contended or self.leases.stops_heard(reply):
            await self.leases.report_all()  # the holder is short, or must hear a stop: now

    def _unregister_if_idle(self, key: str) -> None:
        """Drop the key's row if it holds nothing here (see register_key)."""
        if (key not in self.ctx.memory.unheard and not self.ctx.grants.grants(key)
                and not self.ctx.lease_book.leases(key) and not self.ctx.store.has_items(key)):
            self.ctx.store.unregister_key(key)


def _groups(demand: Wanted) -> set[str]:
    return {d.group for d in demand}
