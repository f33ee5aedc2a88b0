"""A child holder's link to its parent in a budget tree: asking for permits, and giving them back.

Lives here: ``ParentLink``, which a child holder tells after each round what
its clients still wait for (per group, with the oldest item's time); it
asks the parent for that, gives back at once what no client of the child
uses (in the request leaving at the same beat, else a sync), each at most
once per period and one at a time, and yields
to older work waiting at other children. The rules themselves (what
is held, what is given back) are pure, in ``tree``.

The child sleeps while it waits. Its requests ask to be called: the
parent parks them (answers at once) and calls the child when its round
lends it more; the child then asks at once, and that reply lists its
loans (a call lists none: a copy of it may reach a later instance).
What is due later (a refresh, a backoff, a give-back between beats)
waits on the scheduler's alarm, never in memory; a request for demand
leaves right after the round on the beat that made it.
Must not know: how the child allocates, or SQL (the loans' rows are the
store's). A loan is written when a report that gives permits of it back
is about to leave, and deleted once settled (see ``tree.Borrowed``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from .._clock import now_ms
from .._wire import ProtocolError
from .client import SemaphoreClient
from .messages import Demand, Reply, Request, Sync
from .store import HolderStore
from .tree import Borrowed, beat_phase, on_beat, parent_of, waiting_before

log = logging.getLogger("durability.semaphore")

MAX_BACKOFF_MS = 30_000  #: the longest wait between failed exchanges with the parent
#: a parent wakes a child that holds its permits and has not been heard
#: from for this many round periods while others wait (see ``Waker``)
WAKE_AFTER_PERIODS = 10
#: how long an exchange waits for the parent's reply (its round comes within
#: ``round_wait_ms``, a second by default) before it counts as failed
EXCHANGE_TIMEOUT_MS = 30_000
#: how long after a beat a child's request leaves: its round, due on the beat, has run by then
AFTER_BEAT_MS = 1
WAKER, WAKE = "durability.semaphore-tree", "wake"  #: the waker's timer, in the scheduler (kept in memory)
#: a child's timer while a give-back is unconfirmed or a request unheard (``ParentLink.keep_alarm``)
GIVER, GIVE = "durability.semaphore-tree-child", "give-back"
#: a child's timers for its next request and its next give-back, when either is due later (``ensure_exchanges``)
ASK, GIVE_LATER = "ask", "give-later"


def object_name(ctx: Any) -> str:
    """The holder object's name (``ctx.id.name``; "" for an object without one)."""
    name = getattr(getattr(ctx, "id", None), "name", None)
    return name if isinstance(name, str) else ""


def child_link(parent: SemaphoreClient | None, scheduler: Any, period_ms: float, on_lent: Callable[[], bool],
               charged: Callable[[], dict[str, int]], store: HolderStore) -> ParentLink | None:
    """The link of a holder whose object's name is a child's to its parent;
    None for the root, or for a holder outside any tree."""
    name = object_name(scheduler.ctx)
    parent_key = parent_of(name)
    if parent is None or parent_key is None:
        return None
    return ParentLink(parent, parent_key, name, period_ms, on_lent, charged, store, scheduler)


class ParentLink:
    """What a child holder borrowed from its parent, and the exchanges that keep it.

    Two exchanges, each at most one at a time and once per period: a
    ``request`` for what the child's clients wait for, answered at the
    parent's next round, and a ``sync`` that gives permits back at once.
    """

    def __init__(self, parent: SemaphoreClient, parent_key: str, child_id: str, period_ms: float,
                 on_lent: Callable[[], bool], charged: Callable[[], dict[str, int]], store: HolderStore,
                 scheduler: Any) -> None:
        self.parent = parent
        self.parent_key = parent_key
        self.child_id = child_id
        self.period_ms = period_ms
        #: the parent lent more: the child runs a round for the requests it holds (False: it holds none)
        self.on_lent = on_lent
        self.charged = charged  #: per group, the permits the child's grants charge now
        self.store = store  #: the loans' rows: what the child holds, and what it gave back
        self.borrowed = Borrowed(store.load_loans())
        self.unmet: dict[str, Demand] = {}  #: per group, what the child's clients wait for
        self._unmet_at = 0.0  #: when the round that left ``unmet`` ran
        self.contended = False  #: the parent's last reply left demand waiting for capacity
        #: per group, the oldest items the parent's last round left waiting at other children
        self.waiting_since: dict[str, tuple[float, ...]] = {}
        self._since_heard_at = 0.0  #: when the request ``waiting_since`` answered left
        self.owed: dict[str, int] = {}  #: per group, permits to give back to older work: see ``decide``
        self.yielding: set[str] = set()  #: groups where this round hands out nothing: see ``decide``
        self.over_limit = False  #: the parent's last reply said its permits out exceed its limit
        #: when the exchange that brought the parent's last reply was sent (None: none yet): see ``stale``
        self._heard_at: float | None = None
        self.closed: set[str] = set()  #: groups the parent's last reply closed (``tree.closed_groups``)
        self._asking: asyncio.Task[None] | None = None  #: the request on its way
        self._ask_leaves_at: float | None = None  #: when the next request leaves (its timer; None: none set)
        self._giving: asyncio.Task[None] | None = None  #: the give-back on its way
        self._last_ask_at: float | None = None  #: when the last request to the parent left
        self._last_give_at: float | None = None
        self._gave_back = 0  #: how many times the child gave permits back (see ``_rides_with_ask``)
        self._asked_after = 0  #: ``_gave_back`` when the last request was made
        self._failures = 0
        self._woken = False  #: the parent woke the child: ask it, even with nothing to ask for
        self._called = False  #: the parent called: it lent more, which the child's next request hears of
        self._asked_for = False  #: the last request asked for something: the parent keeps it in line
        #: a request failed whose lost reply may have lent permits: ask until a
        #: request gets through, even with nothing to ask for (see ``keep_alarm``)
        self._unheard = False
        self.scheduler = scheduler  #: the object's: see ``keep_alarm``
        scheduler.register(GIVER, self.on_timer, durable=False)

    def decide(self, waiting_here: dict[str, list[Demand]]) -> None:
        """Before a round: what the child owes older work elsewhere. The
        parent's last reply said where the line stands at other children
        (``waiting_since``); the child serves only its items waiting since
        before that line's head, or at most ``yield_margin_ms`` after it,
        and owes the rest of its idle permits to the parent, which lends
        them to the oldest work of any child. A child whose line is no
        younger than the others' owes nothing, so most permits are reused
        where they came free, and only those a younger line would take move.
        (Owing a count of the older items elsewhere instead let each
        child's younger work take what the count missed: the parent lists
        only the oldest few, and a child with many clients frees more than
        that in a period.)"""
        if self.over_limit or self.stale():  # nothing it lent is handed out again: see ``stale``
            self.yielding = set(waiting_here) | set(self.borrowed.by_group())
            return
        self.yielding = set(self.closed)
        # The head elsewhere moved on since the parent saw it (about as fast
        # as the clock, while the backlog's wait holds): a stale head would
        # hold back work here that is as old as what waits there now.
        moved = now_ms() - self._since_heard_at
        charged, held = self.charged(), self.borrowed.by_group()
        self.owed = {}
        for group, demands in waiting_here.items():
            elsewhere = self.waiting_since.get(group)
            if elsewhere:
                idle = held.get(group, 0) - charged.get(group, 0)
                served = waiting_before(demands, elsewhere[0] + moved + self.yield_margin_ms)
                self.owed[group] = max(0, idle - served)

    @property
    def fresh_for_ms(self) -> float:
        """How long a reply of the parent lets the child hand out what it holds."""
        return WAKE_AFTER_PERIODS * self.period_ms

    def stale(self) -> bool:
        """The child has not heard from its parent for ``fresh_for_ms`` (or
        not since this instance started). It then hands out nothing, and
        gives back what its clients do not use: a limit lowered at the root
        reaches a child only in a reply, so without this bound a child cut
        off, or one whose clients never wait (it has nothing to ask for),
        would reuse its permits under the old limit for good. A child with
        permits asks at least every half of it (``ensure_exchanges``), so
        one that can reach its parent never goes stale."""
        return self._heard_at is None or now_ms() - self._heard_at > self.fresh_for_ms

    def ceiling(self, group: str) -> int:
        """What the child may hand out in ``group`` this round: what it
        holds there less what it owes, or nothing while it yields."""
        return max(0, self.held_ceiling(group) - self.owed.get(group, 0))

    def held_ceiling(self, group: str) -> int:
        """What it may hand out owing nothing: what a parent in the middle
        of a tree tells its own children it is limited to (what it owes
        is no closure of theirs: see ``tree.closed_groups``)."""
        return 0 if group in self.yielding else self.borrowed.capacity(group)

    @property
    def yield_margin_ms(self) -> float:
        """Half a round period. Lower, and capacity moves between children
        for work a round would not put ahead (a quarter: a point less busy
        at ``bench_tree.py --quick``); higher, and the lines of children
        drift apart by as much (a period: three times the admissions out of
        order by a round)."""
        return self.period_ms / 2

    def after_round(self, unmet: dict[str, Demand] | None, synced_by: str | None = None) -> None:
        """What a round of the child left waiting, per group, or, after a
        sync (None) from ``synced_by``, what the last round did. A sync from
        the parent wakes the child (``Waker``): the parent counts permits
        it has not heard of for a while, perhaps a grant whose reply was
        lost, so the child asks, and reads the listing of what it holds."""
        if unmet is not None:
            self.unmet, self._unmet_at = unmet, now_ms()
        self._woken = self._woken or synced_by == self.parent_key
        self._give_back_idle()
        self.ensure_exchanges()

    def _persist(self) -> None:
        """Write what changed in the loans (in the object's current batch),
        just before a report leaves: a give-back nobody was told of yet
        needs no row (a new instance counts those permits as held, as the
        parent still does), and the give-backs of a period, made after
        many rounds and syncs, cost one row per loan, not one each."""
        written, deleted = self.borrowed.changes()
        if written or deleted:
            self.store.sql.transaction(lambda: self.store.write_loans(written, deleted))

    def _forget_stale_demand(self) -> None:
        """Demand no round of the child has confirmed for two periods is
        gone: its clients were answered and did not ask again (a client
        waiting asks once per period, or waits in a request held here)."""
        if self.unmet and now_ms() - self._unmet_at > 2 * self.period_ms:
            self.unmet = {}

    def _give_back_idle(self) -> None:
        """Permits held beyond what the child's grants charge, in a group
        nobody waits in, go back to the parent: nothing hands them out
        before the next round, and others may wait for them."""
        self._forget_stale_demand()
        charged = self.charged()
        for group, held in self.borrowed.by_group().items():
            idle = held - charged.get(group, 0)
            if idle > 0 and (group not in self.unmet or group in self.yielding):
                self.borrowed.give_back(group, idle)
                self._gave_back += 1
            elif idle > 0 and self.owed.get(group, 0) > 0:  # to older work elsewhere
                given = min(idle, self.owed[group])
                self.borrowed.give_back(group, given)
                self.owed[group] -= given
                self._gave_back += 1

    def ensure_exchanges(self) -> None:
        """Send what is due now; what is due later waits on the scheduler's
        alarm (a timer of this link's), so that the child sleeps meanwhile.
        Most requests leave at once, right after the round on the beat that
        made their demand; a timer (a row to set the alarm) is for a
        refresh, a backoff, or a give-back between beats."""
        if self._asking is None:
            due = self._ask_due()
            if due is not None and self._asks_after_rounds() and due > now_ms() + AFTER_BEAT_MS:
                # Its round on that beat sends it (``after_round``): a timer
                # would cost a row to set the alarm, for a request that
                # leaves a moment later anyway.
                self.scheduler.cancel(GIVER, ASK)
                self._ask_leaves_at = due
            else:
                self._ask_leaves_at = self._send_or_wait(ASK, due, self._ask)
        if self._giving is None:
            due = self._next_at(self._last_give_at) if self.borrowed.unconfirmed() else None
            self._send_or_wait(GIVE_LATER, due, self._give)
        self.keep_alarm()

    def _send_or_wait(self, key: str, due: float | None, send: Callable[[], Any]) -> float | None:
        """Start ``send`` if ``due`` is now (within ``AFTER_BEAT_MS``), else keep
        the timer ``key`` for ``due`` (none for None). Returns the time it waits
        for, or None. The timer moves with ``due``: a refresh asked for later
        does not hold back demand that came since."""
        if due is not None and due <= now_ms() + AFTER_BEAT_MS:
            self.scheduler.cancel(GIVER, key)
            send()
            return None
        timer = self.scheduler.timer(GIVER, key)
        if due is None:
            self.scheduler.cancel(GIVER, key)
        elif timer is None or timer.due_at != due:
            self.scheduler.schedule(GIVER, key, due)
            asyncio.ensure_future(self.scheduler.sync())
        return due

    def _ask_due(self) -> float | None:
        """When the next request to the parent should leave, or None: at
        once (a period after the last) for demand, for a first listing, or
        when woken or ``_unheard``; else, holding permits with
        nothing to ask for, now and then, which keeps the child from going
        stale (a row-free exchange; one per half ``fresh_for_ms`` per such
        child)."""
        if self._called:  # the parent lent more: at once, but for a backoff
            return self._next_at(self._last_ask_at) if self._failures else now_ms()
        # (Demand gone since the last request also asks: the parent would
        # keep it in line, and lend to it first, its items being the oldest.)
        if self.unmet or self._asked_for or not self.borrowed.heard or self._woken or self._unheard:
            return self._next_at(self._last_ask_at)
        if self.borrowed.total() > 0 and self._heard_at is not None:
            return max(self._heard_at + self.fresh_for_ms / 2, self._next_at(self._last_ask_at))
        return None

    def _asks_after_rounds(self) -> bool:
        """Is the next request one for demand alone? The child's rounds leave
        it (``after_round``), each beat while its clients wait."""
        return bool(self.unmet) and self.borrowed.heard and not (
            self._woken or self._unheard or self._failures or self._called)

    def keep_alarm(self) -> None:
        """While a give-back is unconfirmed, or a request failed and none
        has got through since (``_unheard``), a timer ``MAX_BACKOFF_MS``
        away: the exchanges are tasks in memory, and an evicted child whose
        clients are quiet would never send its give-back again, nor hear of
        a loan whose reply was lost (the parent's waker would call it, but
        not while the runtime has given up on the parent's alarm). The timer
        is the scheduler's, in memory: a new instance derives it again from
        the loans' rows, and asks for a first listing whatever started it,
        so the object's alarm brings the child back. It is set only where
        none is, so the alarm moves at most once per ``MAX_BACKOFF_MS``
        while give-backs flow or requests fail (a row, and a request when it
        fires), not once per give-back; a child whose exchanges succeed and
        are confirmed sets none. (A woken child keeps none: its parent wakes
        it again.)"""
        if not (self.borrowed.unconfirmed() or self._unheard):
            self.scheduler.cancel(GIVER, GIVE)
        elif self.scheduler.timer(GIVER, GIVE) is None:
            self.scheduler.schedule(GIVER, GIVE, now_ms() + MAX_BACKOFF_MS)
            asyncio.ensure_future(self.scheduler.sync())

    async def on_timer(self, timer: Any) -> None:
        # The timer that fired is still there while this runs (and is then
        # forgotten): cancelled, so that keep_alarm sets it again while a
        # give-back is unconfirmed or a request unheard, as a new one the scheduler keeps.
        self.scheduler.cancel(GIVER, timer.key)
        if timer.key == ASK:
            self._ask_leaves_at = None
        self.ensure_exchanges()

    def _next_at(self, last: float | None) -> float:
        """When the next exchange may leave: after failures, a backoff from
        the last failure; else a moment after the child's first beat at
        least half a period after ``last``. A request so leaves just after
        the child's round (its demand is that round's) and is at the
        parent's next round, half a period later; spaced from the last
        one instead, requests would drift off the beat by each wake-up's
        lateness."""
        if last is None:
            return now_ms()
        if self._failures:
            backoff: float = min(MAX_BACKOFF_MS, self.period_ms * 2**self._failures)
            return max(now_ms(), last + backoff)
        beat = on_beat(last + self.period_ms / 2, self.period_ms, beat_phase(self.child_id, self.period_ms))
        return max(now_ms(), beat + AFTER_BEAT_MS)

    def request(self) -> Request:
        """What the child asks its parent for: what its last round left
        waiting (nothing once it holds all it may), with every loan's count
        (``reports``). It asks to be called: a parent that can parks it
        (answers at once, and its round calls the child with what it lends),
        and neither object is awake while the child waits. The wait is its
        fallback only (it asks again each beat its clients wait anyway), and
        short: a parent that cannot call it (one made without ``parent=``, or
        an older one) holds the request as long, and answers it at its next
        round, as it answered a request that asked for no wait."""
        demand = () if self.borrowed.full() else tuple(self.unmet.values())
        return Request(self.child_id, demand, self.borrowed.reports(), self.period_ms / 2,
                       claims=True, heard_up_to=self.borrowed.heard_up_to, wake=True, name=self.child_id)

    def called(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """The parent's call: its round lent this child more. The child asks
        at once, and its request's reply lists its loans (a call lists none:
        see ``ClientCalls._call``), with who else waits as that round left
        it. The answer says nothing (None): the parent took what it lent off
        the child's demand in line."""
        try:
            Reply.parse(message, "grants")
        except ProtocolError as error:
            log.warning("budget tree: %s got a malformed call from its parent: %s", self.child_id, error)
            return error.reply()
        self._called = True
        self.ensure_exchanges()
        return None

    def _ask(self) -> None:
        self._called = False
        self._last_ask_at = now_ms()  # on the beat, requests are spaced from when they leave
        self._asked_after = self._gave_back
        request = self.request()
        self._asked_for = bool(request.demand)
        self._asking = asyncio.ensure_future(self._asked(request.to_wire()))

    async def _asked(self, message: dict[str, Any]) -> None:
        try:
            await self._exchange(message, "grants", EXCHANGE_TIMEOUT_MS)
        finally:
            if self._failures:  # a backoff counts from the failure (a timeout takes 30 s)
                self._last_ask_at = now_ms()
            self._asking = None
        self.ensure_exchanges()

    def _rides_with_ask(self) -> bool:
        """A give-back due now goes with the child's request instead, as
        that reports every loan's count: when the request leaves before the
        parent's next beat (it reaches the same round of the parent's), or
        left after the give-back was made. Gives and requests both leave
        just after the child's beat, so a child asking every period would
        otherwise send both (at
        ``bench_tree.py``'s 1,000 clients, 73 of the root's 758 requests).
        A give-back made while a request is on its way still goes as a
        sync: it reaches the parent's round that request is waiting for."""
        if self._ask_leaves_at is not None:  # waiting for its time
            return self._ask_leaves_at <= on_beat(now_ms(), self.period_ms, beat_phase(self.parent_key, self.period_ms))
        return self._asking is not None and self._asked_after >= self._gave_back

    def _give(self) -> None:
        self._giving = asyncio.ensure_future(self._given())

    async def _given(self) -> None:
        try:
            if self.borrowed.unconfirmed() and not self._rides_with_ask():
                await self._exchange(Sync(self.child_id, self.borrowed.reports()).to_wire(), "synced",
                                     EXCHANGE_TIMEOUT_MS)
        finally:
            self._last_give_at = now_ms()
            self._giving = None
        self.ensure_exchanges()

    async def _exchange(self, message: dict[str, Any], kind: str, timeout_ms: float) -> None:
        send = self.parent.request if kind == "grants" else self.parent.sync
        sent_at = now_ms()
        try:
            # What a report gives back is written before it leaves: a new
            # instance never counts on a permit its old one gave back.
            self._persist()
            await self.store.sql.flush()
            async with asyncio.timeout(timeout_ms / 1000):  # a reply that never comes
                sent = await send(self.parent_key, message)
            reply = Reply.parse(sent, kind)
        except Exception as error:  # unreachable, overloaded or refusing: ask again later
            self._failures += 1
            # A request's reply may be lost after the parent lent in it: only
            # a listing says, so the child asks until one comes, demand or not.
            self._unheard = self._unheard or (kind == "grants" and _may_have_lent(error))
            log.warning("budget tree: %s could not reach its parent %s: %r", self.child_id, self.parent_key, error)
            return
        self._failures = 0
        self._heard(reply, kind, sent_at)

    def _heard(self, reply: Reply, kind: str, sent_at: float) -> None:
        """A reply of the parent's to an exchange sent at ``sent_at``."""
        # The reply says what held at the parent some time after it was sent.
        self._heard_at = max(self._heard_at or sent_at, sent_at)
        if kind == "grants":  # its reply listed every loan the child holds
            self._woken = self._unheard = False
        self.contended = reply.contended
        self.over_limit, self.closed = reply.over_limit, set(reply.closed_groups)
        if self.over_limit:
            self.yielding |= set(self.borrowed.by_group())
        self.yielding |= self.closed
        if kind == "grants":
            # The head elsewhere moves on from when the parent's round saw
            # it (an older parent does not say: counted from when the
            # request was sent, which it answered at its round). From half a
            # period before that round instead, 3.8% of admissions were out
            # of order by a round at ``bench_tree.py --quick``'s 1,000
            # clients, against 0.7%.
            seen = sent_at if reply.waiting_since_at is None else reply.waiting_since_at
            self.waiting_since, self._since_heard_at = reply.waiting_since, seen
        if self.borrowed.take(reply.grants, reply.reports) > 0:
            self.on_lent()
        self._give_back_idle()


def _may_have_lent(error: BaseException) -> bool:
    """Whether a request that failed with ``error`` may have run at the
    parent, and lent in a reply the child never read: anything but the
    parent's refusal (a reply, and nothing changed: see ``ProtocolError``)
    or an overloaded object's answer (the call never ran). A refusal that
    stays (an older parent, say) so costs no request every backoff."""
    if isinstance(error, ProtocolError):
        return error.code == "malformed_reply"
    return not any(getattr(source, "overloaded", False) for source in (error, getattr(error, "js_error", None)))


class Waker:
    """A parent's side: children that hold its permits and have gone quiet.

    An evicted child whose clients have gone quiet never starts again by
    itself: a give-back whose report was lost with it, or permits it holds
    idle, would stay counted here for good. The parent calls such a child
    (a ``sync`` that reports nothing): the new instance reads its loans,
    asks its parent at once, and gives back what none of its clients uses.
    A child is called when it holds permits and has not been heard from for
    ``WAKE_AFTER_PERIODS`` periods: checked after each round that leaves
    others waiting, and by a timer while any child holds permits
    (``watch``). The timer is the scheduler's, kept in memory and derived
    again from the grants when an instance starts, so the object's alarm
    brings an evicted parent back to do it: nothing is written for it but
    the alarm, which moves only when it must come earlier (a row per wake
    period at most, while children hold permits), and each wake is a call
    per quiet child.
    """

    def __init__(self, children: SemaphoreClient, own_key: str, period_ms: float, scheduler: Any) -> None:
        self.children = children
        self.own_key = own_key
        self.after_ms = WAKE_AFTER_PERIODS * period_ms
        self.started_at = now_ms()
        self.heard: dict[str, float] = {}  #: child -> when it was last heard from, or woken
        self.scheduler = scheduler
        self._holding: Callable[[], list[str]] = list
        scheduler.register(WAKER, self._on_timer, durable=False)

    def watch(self, holding: Callable[[], list[str]]) -> None:
        """While ``holding()`` names children that hold permits, wake the
        quiet ones now and then (the timer, set for the first one due)."""
        self._holding = holding
        due = self._next_due()
        if due is None:
            self.scheduler.cancel(WAKER, WAKE)
        elif (timer := self.scheduler.timer(WAKER, WAKE)) is None or timer.due_at > due:
            self.scheduler.schedule(WAKER, WAKE, due)
            asyncio.ensure_future(self.scheduler.sync())

    def _children(self) -> list[str]:
        return [child for child in self._holding() if parent_of(child) == self.own_key]

    def _next_due(self) -> float | None:
        children = self._children()
        if not children:
            return None
        return min(self._last_heard(child) for child in children) + self.after_ms

    def _last_heard(self, child: str) -> float:
        """When ``child`` was last heard from. A new instance has heard from
        none: it wakes those that hold its permits at once, rather than ten
        periods on. Its rows may count permits a child has since given back
        (a partial give-back writes none: see ``holder._release_needs_row``),
        and may so exceed its limit while it lent them again: its children
        then hand out nothing (``overLimit``) until those report."""
        return self.heard.get(child, self.started_at - self.after_ms)

    async def _on_timer(self, timer: Any) -> None:
        self.wake_quiet(self._children())
        due = self._next_due()
        if due is not None:  # the alarm is set again once this run ends
            self.scheduler.schedule(WAKER, WAKE, due)

    def heard_from(self, client_id: str) -> None:
        if parent_of(client_id) == self.own_key:
            self.heard[client_id] = now_ms()

    def wake_quiet(self, holding: Iterable[str]) -> None:
        """Wake each child of ``holding`` (those the books charge) not heard from for a while."""
        now = now_ms()
        for child in sorted(set(holding)):  # sorted: the wakes' order must not follow hash order
            if parent_of(child) == self.own_key and self._last_heard(child) <= now - self.after_ms:
                self.heard[child] = now
                asyncio.ensure_future(self._wake(child))

    async def _wake(self, child: str) -> None:
        try:
            await self.children.sync(child, Sync(self.own_key, ()).to_wire())
        except Exception as error:  # tried again after as long, while others still wait
            log.warning("budget tree: %s could not wake its child %s: %r", self.own_key, child, error)
