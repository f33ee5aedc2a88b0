"""A child's link to its parent in a budget tree: what it holds and heard, and what a round may hand out of it.

Lives here: ``LinkCeilings``, the state of a child holder's link to its
parent (set up here: the loans it holds, what the parent's last reply
said, and the bookkeeping of the exchanges), and the decisions that read
it: what the child owes older work waiting at other children, when it
yields a group (closed, over the parent's limit, or not heard from the
parent for too long), what each round may hand out per group, and which
idle permits go back. ``tree/parent_link.ParentLink`` adds the exchanges
that keep it. The rules themselves (what is held, what is given back) are
pure, in ``tree``. Must not know: how the exchanges are sent or timed,
how the child allocates, or SQL (the loans' rows are the store's).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from ..._common.clock import now_ms
from ..client import SemaphoreClient
from ..holder.store import HolderStore
from ..messages import Demand
from .children import WAKE_AFTER_PERIODS
from .pure.rules import Borrowed, waiting_before


class LinkCeilings:
    """What a child holder borrowed from its parent, and what each round may hand out of it.

    The base of ``ParentLink``, which registers the link's timer and
    sends the exchanges.
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
        #: ``waiting_since`` and ``_since_heard_at`` as the last round's ``decide`` read them (None: none yet)
        self._decided_line: tuple[dict[str, tuple[float, ...]], float] | None = None
        self._reading_line: tuple[dict[str, tuple[float, ...]], float] | None = None  #: the round's under way
        self.owed: dict[str, int] = {}  #: per group, permits to give back to older work: see ``decide``
        self.yielding: set[str] = set()  #: groups where this round hands out nothing: see ``decide``
        self.over_limit = False  #: the parent's last reply said its permits out exceed its limit
        #: when the exchange that brought the parent's last reply was sent (None: none yet): see ``stale``
        self._heard_at: float | None = None
        self._started_at = now_ms()  #: when this instance's link was made (see ``cut_off``)
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
        self._asked_for_demand = False  #: a request of this instance asked for something (see ``_ask_due``)
        self._unmet_asked = False  #: a request left since the round that left ``unmet``
        self._ask_each_round = False  #: that round was one of the instance's first period's: see ``_ask_due``
        #: a request failed whose lost reply may have lent permits: ask until a
        #: request gets through, even with nothing to ask for (see ``keep_alarm``)
        self._unheard = False
        self.scheduler = scheduler  #: the object's: see ``keep_alarm``

    def decide(self, waiting_here: dict[str, list[Demand]],
               charged: Callable[[], dict[str, int]] | None = None) -> None:
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
        that in a period.) ``charged``: per group, what the child's grants
        charge once the round applied its requests' reports (default: as
        they stand); read only where older work waits elsewhere."""
        self._reading_line = (self.waiting_since, self._since_heard_at)  # the round's, once it ran
        if self.over_limit or self.stale():  # nothing it lent is handed out again: see ``stale``
            self.yielding = set(waiting_here) | set(self.borrowed.by_group())
            return
        self.yielding = set(self.closed)
        # The head elsewhere moved on since the parent saw it (about as fast
        # as the clock, while the backlog's wait holds): a stale head would
        # hold back work here that is as old as what waits there now.
        moved = now_ms() - self._since_heard_at
        held, read_charged = self.borrowed.by_group(), charged or self.charged
        charged_now: dict[str, int] | None = None
        self.owed = {}
        for group, demands in waiting_here.items():
            elsewhere = self.waiting_since.get(group)
            if elsewhere:
                charged_now = read_charged() if charged_now is None else charged_now
                idle = held.get(group, 0) - charged_now.get(group, 0)
                served = waiting_before(demands, elsewhere[0] + moved + self.yield_margin_ms)
                self.owed[group] = max(0, idle - served)

    def waiting_elsewhere(self, groups: Iterable[str], at: float) -> dict[str, tuple[float, ...]]:
        """Per group of ``groups``, the oldest items the parent's last reply
        said wait at its other children, as their heads stand at ``at``
        (each moves on with the clock from when the parent's round saw it,
        as ``decide`` counts it). Read as the last round's ``decide`` read them: a
        reply heard since, whose heads had not moved (the line elsewhere
        stuck behind the very permit this holder holds), would tell its
        child a stricter line than the one its own round lent by, and the
        child would give back, round after round, the permit this holder
        lent it again for the same work, never passing it up (a tree
        holding its only permit so while older work waited elsewhere:
        campaign tree seed 3989, on a schedule moved by a change of alarms)."""
        since, heard_at = self._decided_line or (self.waiting_since, self._since_heard_at)
        return {group: tuple(t + at - heard_at for t in since[group]) for group in groups if since.get(group)}

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

    def cut_off(self) -> bool:
        """No word from the parent for ``fresh_for_ms``, since the child last
        heard from it or since this instance started: what a holder in the
        middle tells its own children as the tree being over its limit
        (``holder/tree_place._tree_limits``). Unlike ``stale``, not a new
        instance that has yet to hear: every restart of a middle would make
        its leaves give back all they hold, to have it lent again."""
        return now_ms() - (self._heard_at if self._heard_at is not None else self._started_at) > self.fresh_for_ms

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
