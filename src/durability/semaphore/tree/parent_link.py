"""A child holder's link to its parent in a budget tree: asking for permits, and giving them back.

Lives here: ``ParentLink``, which a child holder tells after each round what
its clients still wait for (per group, with the oldest item's time); it
asks the parent for that, gives back at once what no client of the child
uses (in the request leaving at the same beat, else a sync), each one at
a time and on its beat (once per period, but for one its parent's call
asks for, and in an instance's first period one after each round), and yields
to older work waiting at other children. What a round may hand out of
what the child holds is decided in its base, ``tree/link_ceilings``; the
rules themselves (what is held, what is given back) are pure, in ``tree``.

The child sleeps while it waits. Its requests ask to be called: the
parent parks them (answers at once) and calls the child when its round
lends it more; the child then asks at once, and that reply lists its
loans (a call lists none: a copy of it may reach a later instance).
What is due later (a refresh, a backoff, a give-back between beats)
waits on the scheduler's alarm, never in memory; a request for demand
leaves right after the round on the beat that made it (in an instance's
first period, right after each round: ``TreePlace.ramping``).
Must not know: how the child allocates, or SQL (the loans' rows are the
store's). A loan is written when a report that gives permits of it back
is about to leave, and deleted once settled (see ``tree.Borrowed``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ..._common.clock import now_ms
from ..._common.wire import ProtocolError
from ..client import SemaphoreClient
from ..holder.store import HolderStore
from ..messages import Demand, Reply, Request, Sync
from .link_ceilings import LinkCeilings
from .pure.rules import beat_phase, on_beat

log = logging.getLogger("durability.semaphore")

MAX_BACKOFF_MS = 30_000  #: the longest wait between failed exchanges with the parent
#: how long an exchange waits for the parent's reply (its round comes within
#: ``round_wait_ms``, a second by default) before it counts as failed
EXCHANGE_TIMEOUT_MS = 30_000
#: how long after a beat a child's request leaves: its round, due on the beat, has run by then
AFTER_BEAT_MS = 1
#: a child's timer while a give-back is unconfirmed or a request unheard (``ParentLink.keep_alarm``)
GIVER, GIVE = "durability.semaphore-tree-child", "give-back"
#: a child's timers for its next request and its next give-back, when either is due later (``ensure_exchanges``)
ASK, GIVE_LATER = "ask", "give-later"


class ParentLink(LinkCeilings):
    """What a child holder borrowed from its parent, and the exchanges that keep it.

    Two exchanges, each one at a time and on the child's beat (see
    ``_ask_due`` for the requests that leave off it): a
    ``request`` for what the child's clients wait for, answered at the
    parent's next round, and a ``sync`` that gives permits back at once.
    """

    def __init__(self, parent: SemaphoreClient, parent_key: str, child_id: str, period_ms: float,
                 on_lent: Callable[[], bool], charged: Callable[[], dict[str, int]], store: HolderStore,
                 scheduler: Any) -> None:
        super().__init__(parent, parent_key, child_id, period_ms, on_lent, charged, store, scheduler)
        scheduler.register(GIVER, self.on_timer, durable=False)

    def after_round(self, unmet: dict[str, Demand] | None, synced_by: str | None = None,
                    ask_at_once: bool = False) -> None:
        """What a round of the child left waiting, per group, or, after a
        sync (None) from ``synced_by``, what the last round did. A sync from
        the parent wakes the child (``Waker``): the parent counts permits
        it has not heard of for a while, perhaps a grant whose reply was
        lost, so the child asks, and reads the listing of what it holds.
        ``ask_at_once``: the round's demand leaves now, not on the beat (an
        instance's first rounds: see ``TreePlace.ramping``)."""
        if unmet is not None:
            self.unmet, self._unmet_at = unmet, now_ms()
            self._unmet_asked, self._ask_each_round = False, ask_at_once
            self._decided_line = self._reading_line  # what its children hear of the line elsewhere
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
        once when the parent called or woke the child, and for the demand
        of the instance's first round with demand and of each round in the
        period after it (``TreePlace.ramping``); at its next beat
        (``_next_at``) for other demand, for a first listing, or when
        ``_unheard``; else, holding permits with
        nothing to ask for, now and then, which keeps the child from going
        stale (a row-free exchange; one per half ``fresh_for_ms`` per such
        child)."""
        if self._called or self._woken:  # the parent lent more, or restarted: at once, but for a backoff
            return self._next_at(self._last_ask_at) if self._failures else now_ms()
        # (Demand gone since the last request also asks: the parent would
        # keep it in line, and lend to it first, its items being the oldest.)
        each_round = self._ask_each_round and not self.borrowed.full()  # (a full child asks for nothing)
        if self.unmet and not self._unmet_asked and (each_round or not self._asked_for_demand) \
                and self.borrowed.heard and not self._failures:
            # An instance's first demand leaves with the round that found it,
            # off the beat (``holder.rounds._round_time``): its first listing,
            # sent as it started, would put it off to the next beat. So does
            # the demand of each round of its first period (one request per
            # round: its rounds then come a quarter period apart).
            return now_ms()
        if self.unmet or self._asked_for or not self.borrowed.heard or self._woken or self._unheard:
            return self._next_at(self._last_ask_at)
        if self.borrowed.total() > 0 and self._heard_at is not None:
            return max(self._heard_at + self.fresh_for_ms / 2, self._next_at(self._last_ask_at))
        return None

    def _asks_after_rounds(self) -> bool:
        """Is the next request one for demand alone? The child's rounds leave
        it (``after_round``), each beat while its clients wait (each round,
        in the instance's first period)."""
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
        least a quarter period after ``last``. A request so leaves just after
        the child's round (its demand is that round's) and is at the
        parent's next round, half a period later; spaced from the last
        one instead, requests would drift off the beat by each wake-up's
        lateness. Half a period instead, and one that left off the beat
        put the next off by a whole period: a new instance's first
        listing, asked as it starts, held back the demand of its first
        round on the beat (a tree two levels deep lent its first permits a
        period late), and a child called a few milliseconds after its
        parent's beat asked for its demand a period later."""
        if last is None:
            return now_ms()
        if self._failures:
            backoff: float = min(MAX_BACKOFF_MS, self.period_ms * 2**self._failures)
            return max(now_ms(), last + backoff)
        beat = on_beat(last + self.period_ms / 4, self.period_ms, beat_phase(self.child_id, self.period_ms))
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
        self._unmet_asked = True  # what the last round left waiting is asked for
        self._last_ask_at = now_ms()  # on the beat, requests are spaced from when they leave
        self._asked_after = self._gave_back
        request = self.request()
        self._asked_for = bool(request.demand)
        # (With demand waiting, even a request that asks for none, as one
        # holding as many loans as it may: that one too leaves on the beat.)
        self._asked_for_demand = self._asked_for_demand or bool(self.unmet)
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
