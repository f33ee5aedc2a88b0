"""A parent's side of a budget tree: waking the children that hold its permits and have gone quiet.

Lives here: ``Waker``, told by a parent holder which children it heard
from and which ones its books charge, that calls a child holding its
permits once it has not been heard from for ``WAKE_AFTER_PERIODS`` round
periods, and keeps the scheduler's timer that does so while any child
holds permits. Must not know: how the parent allocates, what a child
borrowed beyond its name, or SQL.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from ..._common.clock import now_ms
from ..client import SemaphoreClient
from ..messages import Sync
from .pure.rules import parent_of

log = logging.getLogger("durability.semaphore")

#: a parent wakes a child that holds its permits and has not been heard
#: from for this many round periods while others wait (see ``Waker``)
WAKE_AFTER_PERIODS = 10
WAKER, WAKE = "durability.semaphore-tree", "wake"  #: the waker's timer, in the scheduler (kept in memory)


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
