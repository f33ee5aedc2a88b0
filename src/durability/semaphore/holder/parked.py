"""The holder's parked requests: answered at once, kept in line, served later by a call.

Lives here: ``ParkedRequests``, the holder's side of the sleeping
protocol: which requests are parked, the line they stand in
(``parked.ParkedLine``), what a round's outcomes do to it (demand taken
off the clients it served, and a call to each of them it did not answer
directly, ``holder/calls``), a client's reply to a call (its demand now,
which may let a round serve more), a client whose calls fail (kept in
line, served no more until it is heard from), the clients that hold
permits and have gone silent (woken by a call), and the scheduler's
timers of those calls. Must not know: how a round decides, SQL, or the
wire beyond the replies it is handed.

Why wake a silent holder of permits: a client whose alarm the runtime
gave up on runs again only when something calls it, and one that never
heard of a grant (its call lost, then the holder's memory of it lost
with an instance) never asks about it if no work of its waits. Either
way the permits stay counted here. A grant held ``wake_after_ms`` (and
every ``wake_after_ms`` after that: times its claim deadline fixes, so
every instance derives the same ones) calls its client unless the client
spoke meanwhile: a call per long-held grant per period, nothing for work
shorter than that.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from typing import Any

from ..._common.clock import now_ms
from ...scheduler.alarm import DurabilityScheduler
from ..messages import Request
from ..tree.pure.rules import parent_of
from .calls import DELIVER, ClientCalls
from .pure.allocation import ClientOutcome, Grant, news_for
from .pure.leases import Lease
from .pure.line import Parked, ParkedLine, Waiting

#: a call a round owes: (client id, the version of its request it answers, its object's name, the outcome)
Call = tuple[str, int, str | None, ClientOutcome]


WAKE = "wake"  #: the scheduler key of the next wake of silent holders of permits
WAKE_SLACK_MS = 1_000  #: an alarm fires a moment after the time it was set for
#: a quiet holder's wake timer comes this many ``wake_after_ms`` after its last change at the soonest
QUIET_WAKE_PERIODS = 4


class ParkedRequests:
    def __init__(self, namespace: Any, key: str, scheduler: DurabilityScheduler, participant: str, *,
                 news: Callable[[bool, bool], Awaitable[None]],
                 take_reports: Callable[[Request], bool | None], wake_after_ms: float,
                 listing: Callable[[str], dict[str, Any]],
                 first_listing: Callable[[Iterable[str]], set[str]], children: Any = None) -> None:
        """``take_reports(answer)``: apply the lease reports of a client's
        answer to a call; True if permits came back, None if they were
        refused (the answer then changes nothing, its demand included).
        ``news(more, gave_back)``: an answer changed the line or gave
        permits back (``more``: it asks for more than before, which a round
        may serve). ``first_listing``: ``HolderBooks.first_listing``;
        ``children``: a tree's parent's client, which reaches its children
        (see ``ClientCalls``)."""
        self.line = ParkedLine()
        self._scheduler, self._participant = scheduler, participant
        self._news = news
        self._take_reports = take_reports
        self.wake_after_ms = wake_after_ms
        self._heard_at: dict[str, float] = {}  #: per client, when this instance last heard from it
        self._next_check = 0.0  #: when the next pass over the grants for silent holders is due
        #: per client, the claim deadline of a grant an earlier instance made that it may never have heard of
        self._unconfirmed: dict[str, float] = {}
        self._names: dict[str, str] = {}  #: per client, the name of its object, as its requests gave it
        self.calls = ClientCalls(namespace, key, schedule=self._schedule, cancel=self._cancel,
                                 on_reply=self._on_reply, on_failed=self.line.suspend, listing=listing,
                                 first_listing=first_listing, children=children)
        self._listing = listing

    def can_park(self, request: Request) -> bool:
        return self.calls.can_call(request)

    def park(self, request: Request) -> None:
        """A client's request, answered at once: its demand now stands in line.
        Its reply says all a call owed to it would (the round's listing)."""
        self.calls.drop(request.client_id)
        self.line.park(request, now_ms())
        self._heard_of(request)

    def _heard_of(self, request: Request) -> None:
        """The client spoke: when, as which instance, and its object's name."""
        self._heard_at[request.client_id] = now_ms()
        if request.name is not None:
            self._names[request.client_id] = request.name

    def heard(self, client_id: str) -> None:
        self.line.heard(client_id, now_ms())
        self._heard_at[client_id] = now_ms()

    def requests(self, leaving_out: set[str]) -> list[Request]:
        """What a round sees of the line: each client's demand as kept (not
        suspended ones, nor those whose newer request the round has)."""
        return [r for r in self.line.requests() if r.client_id not in leaving_out]

    def stays(self, client_id: str) -> bool:
        """Is the client still in line (demand left after the round)?"""
        return client_id in self.line

    def served(self, outcomes: dict[str, ClientOutcome], asked: set[str], synced: str | None = None) -> list[Call]:
        """What a round handed out comes off each parked client's demand (before
        the round's rows are written: they carry it). Returns the calls to make
        once they are: a client it served or has news for, with the version of
        its request the call answers; not one that ``asked`` in the round (the
        reply to its request says it all), nor the client whose sync
        started it (``synced``: the sync's reply lists its grants), unless
        the round used up that client's entry. A sync says nothing of the
        client's demand: items its queue gained since its last word are in no
        entry, and would wait for its fallback; the call's answer says them."""
        answered = asked | ({synced} if synced else set())
        calls = []
        for client_id, outcome in outcomes.items():
            entry = self.line.get(client_id)
            if entry is None:
                continue
            if outcome.new_grants or outcome.new_leases:
                self.line.served(client_id, _served(outcome), max(
                    (grant.claim_deadline for grant in outcome.new_grants), default=0.0))
            elif client_id in answered or not _news(entry, outcome):
                continue
            self.line.told(client_id, ((lease.lease_id, lease.retired) for lease in outcome.listed_leases))
            if client_id not in answered or (client_id == synced and client_id not in self.line):
                calls.append((client_id, entry.version, entry.request.name, outcome))
        return calls

    def call(self, calls: list[Call],
             reply_for: Callable[[str, ClientOutcome], dict[str, Any]]) -> None:
        """Make a round's calls (its rows are written)."""
        for client_id, version, name, outcome in calls:
            self.calls.send(client_id, reply_for(client_id, outcome), version, name)

    # -- holders of permits gone silent ---------------------------------------------
    def watch(self, held: Iterable[Holding]) -> None:
        """After a change: wake the silent holders of permits now and then (at
        most every half ``wake_after_ms``, a pass over the grants), and keep
        the wake timer for when nothing else happens: at the next time a
        held grant's client is due a call, but not sooner than
        ``QUIET_WAKE_PERIODS`` periods on. A busy holder checks as its
        events come and never needs that alarm; one that goes quiet sets it
        once, not once per grant."""
        held = list(held)
        now = now_ms()
        if now >= self._next_check:
            self.wake_silent(held)
            return
        self._keep_timer(held, now)

    def wake_silent(self, held: Iterable[Holding]) -> None:
        """Call each client holding permits ``wake_after_ms`` long that has not
        spoken in as long, and each client of a grant an earlier instance
        made that has not spoken by its claim deadline (see ``restore``),
        with the listing of what it holds."""
        now = now_ms()
        held = list(held)
        self._next_check = now + self.wake_after_ms / 2
        due = {c for c, deadline in self._unconfirmed.items() if deadline <= now + WAKE_SLACK_MS}
        self._unconfirmed = {c: deadline for c, deadline in self._unconfirmed.items() if c not in due}
        unheard = sorted(c for c in due if c not in self._heard_at)  # sorted: not in hash order
        for client_id in silent_holders(held, self._heard_at, now, self.wake_after_ms) + unheard:
            if self.calls.can_reach(client_id) and not self.calls.owed(client_id):
                self._heard_at[client_id] = now  # (woken: not again before another period)
                self.calls.send(client_id, self._listing(client_id), self.line.version_of(client_id),
                                self.name_of(client_id))
        self._keep_timer(held, now)

    def _keep_timer(self, held: list[Holding], now: float) -> None:
        due = next_wake_at(held, now, self.wake_after_ms)
        if due is not None:
            due = max(due, now + QUIET_WAKE_PERIODS * self.wake_after_ms)
        if self._unconfirmed:
            due = min(self._unconfirmed.values()) if due is None else min(due, *self._unconfirmed.values())
        if due is None:
            self._scheduler.cancel(self._participant, WAKE)
        else:
            self._scheduler.schedule(self._participant, WAKE, due)

    def called_at_deadline(self) -> dict[str, float]:
        """The clients this instance calls about grants an earlier instance
        made (``restore``), not heard from since it started, with when: the
        latest claim deadline of those grants. Their answers say what they
        heard, and bring a round (``_more``)."""
        return {client_id: at for client_id, at in self._unconfirmed.items() if client_id not in self._heard_at}

    def name_of(self, client_id: str) -> str | None:
        """The name of the client's object, as its requests (or its rows) gave it."""
        return self._names.get(client_id)

    def restore(self, waiting: list[Waiting], names: dict[str, str], grants: Iterable[Grant]) -> None:
        """A new instance's line and names, as its rows left them. The rows
        do not say which grants each client knows of: one past its claim
        deadline is taken as known. Its claims are no use to a client that
        never heard of it (it would give them back), and a client holding
        one it never heard of is woken as a silent holder. A round right
        after a restart otherwise called every client in line that held
        permits, only to list them again (0.12 calls per job on the demo's
        workload, where a holder hibernates between bursts). One still
        claimable may be one whose call the old instance owed. A round claims
        a grant for the client it serves and writes it, and the client's
        line entry goes with that write: had the old instance gone before
        its call left, nothing would tell the client, which waits to be
        called, until its own request wait ran out (the example Worker's is
        4 minutes). A client that heard of its grant confirms its claims at
        once; so one not heard from by the grant's claim deadline is called
        then with its listing, gives back the claims it cannot tell from an
        older instance's, and asks again. (Called at once instead, as the
        instance starts, every client of a recent grant was called, most of
        them only to list what they knew: under the benchmark's faults the
        example's share of admissions out of oldest-first order rose from
        5.1% and 2.9% to 11.2% and 8.0% on seeds 1 and 3.) Hibernation costs
        no such call: an instance that hibernates was idle past the
        default claim deadline."""
        now = now_ms()
        known: dict[str, float] = {}
        for grant in grants:
            if grant.claim_deadline < now:  # (at its deadline a grant may still be claimed)
                known[grant.client_id] = max(known.get(grant.client_id, 0.0), grant.claim_deadline)
            elif grant.charged > 0 and parent_of(grant.client_id) is None:  # (a tree's child: its own waker)
                self._unconfirmed[grant.client_id] = max(self._unconfirmed.get(grant.client_id, 0.0),
                                                         grant.claim_deadline)
        self._names.update(names)
        self.line.restore(waiting, now, names, known)

    async def on_timer(self, key: str) -> bool:
        """Run one of this part's timers (True if ``key`` is one; the wake
        timer is the holder's, which hands in the grants and listings)."""
        if not key.startswith(DELIVER):
            return False
        self.calls.retry(key[len(DELIVER):])
        return True

    async def _on_reply(self, client_id: str, version: int, request: Request | None) -> None:
        """The client's answer to a call: its demand now (None: it said nothing of it)."""
        self.line.heard(client_id, now_ms())
        if request is None:
            return
        gave_back = self._take_reports(request)
        if gave_back is None:
            return
        self._heard_of(request)
        before = self.line.get(client_id)
        changed = self.line.refresh(client_id, version, request, now_ms())
        after = self.line.get(client_id)
        if changed or gave_back:
            more = changed and after is not None and (before is None or _more(after.request, before.request))
            await self._news(more, gave_back)

    async def _schedule(self, key: str, at: float) -> None:
        self._scheduler.schedule(self._participant, key, at)
        await self._scheduler.sync()

    def _cancel(self, key: str) -> None:
        self._scheduler.cancel(self._participant, key)


Holding = tuple[str, float]  #: a client holding permits, and the time its wakes count from


def holdings(grants: Iterable[Grant], leases: Iterable[Lease]) -> list[Holding]:
    """Who holds permits, from when: a grant still charged from its claim
    deadline; a lease not settled from its expiry (a client that knows of a
    lease renews it before then, and is heard; one that never heard of it,
    its call lost, is woken after)."""
    return ([(g.client_id, g.claim_deadline) for g in grants if g.charged > 0]
            + [(lease.client_id, lease.expires_at) for lease in leases if not lease.settled])


def next_wake_at(held: Iterable[Holding], now: float, after_ms: float) -> float | None:
    """The next time a client holding permits is due a call if silent: for each
    holding, the time it counts from plus the first multiple of ``after_ms``
    after now (a function of the rows: every instance agrees)."""
    due = None
    for _, since in held:
        at = since + after_ms * max(1, math.ceil((now - since) / after_ms))
        at = at if at > now else at + after_ms
        due = at if due is None else min(due, at)
    return due


def silent_holders(held: Iterable[Holding], heard_at: dict[str, float], now: float, after_ms: float) -> list[str]:
    """Clients holding permits at least ``after_ms`` past the time their
    holding counts from that have not spoken in ``after_ms`` (as far as this
    instance heard)."""
    found = {client_id for client_id, since in held
             if since + after_ms <= now + WAKE_SLACK_MS and heard_at.get(client_id, float("-inf")) < now - after_ms}
    return sorted(found)  # sorted: the calls' order must not follow hash order


def _news(entry: Parked, outcome: ClientOutcome) -> bool:
    """Does a round's outcome tell a parked client anything it may not know?
    (``news_for``, with the leases it knows from the line, not from reports
    its parked request no longer carries.)"""
    if any((lease.lease_id, lease.retired) not in entry.known_leases for lease in outcome.listed_leases):
        return True
    return news_for(replace(entry.request, lease_reports=()), replace(outcome, listed_leases=[]))


def _served(outcome: ClientOutcome) -> dict[str, int]:
    """Per group, the permits a round handed the client (grants and leases)."""
    served: dict[str, int] = {}
    for group, permits in [(g.group, g.permits) for g in outcome.new_grants] + [
            (lease.group, lease.permits) for lease in outcome.new_leases]:
        served[group] = served.get(group, 0) + permits
    return served


def _more(now: Request, before: Request) -> bool:
    """Does ``now`` ask for more than ``before`` did, in some group, or say
    it heard of grants made after those ``before`` said? A round counts the
    claims of grants a client may not know of as serving its demand
    (``pure.news.unheard_grants``); heard of, they served items already
    admitted, and the demand it still has waits for new permits."""
    if now.demand and now.heard_up_to > before.heard_up_to:
        # (Also when two rounds served it before its answer to the first
        # call: one round more, a period after the last.)
        return True
    counts = {d.group: d.count for d in before.demand}
    return any(d.count > counts.get(d.group, 0) for d in now.demand)
