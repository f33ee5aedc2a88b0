"""The queue's hand-off to the user's code: ``admit()`` until it returns, and the ``finished()`` sweep.

Lives here: ``Admission``: calling ``admit(items)`` for admitted items
once their admission is durable, again (under the timer's backoff) until
it returns, and asking ``finished(ids)`` about each item
``finished_check_ms`` after its ``admit()`` returned, releasing those it
names. Must not know: grants, leases or the holder (a release is the
queue's, handed in), or SQL.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..._common.clock import now_ms
from .memory import QueueContext
from .pure.states import ADMITTED, Item, TimerKind, Via

log = logging.getLogger("durability.semaphore.queue")
FINISHED_BATCH = 100  #: ids asked about in one finished() call
PASSES = 10  #: passes of admit() one call makes at most; what is left waits for its timer
#: the queues whose admit() this task runs (tasks started from it inherit
#: it). Per queue: a call that reaches another object's queue from inside
#: admit() (a runtime may carry the caller's context into it) admits there.
_IN_ADMIT: ContextVar[tuple[Admission, ...]] = ContextVar("durability_in_admit", default=())


@dataclass(frozen=True)
class AdmittedItem:
    id: str
    key: str
    group: str
    body: Any
    via: str  #: a ``Via``: "grant" (a claim the holder confirmed) or "lease" (drawn with no round trip)
    #: admitted by an earlier instance of the object: admit() may have been
    #: handed it before, and work it started then was cut short with that
    #: instance (``DurabilityJobs``'s ``run.kept`` counts that attempt)
    resumed: bool = False
    #: when it was admitted (epoch ms), as its row says in every instance:
    #: work sent elsewhere counts from it (``run.kept``'s ``since``)
    admitted_at: float | None = None


class Admission:
    def __init__(self, ctx: QueueContext, admit: Callable[[list[AdmittedItem]], Any],
                 finished: Callable[[list[str]], Any] | None, *,
                 release: Callable[[Item], None], after_releases: Callable[[set[str]], Awaitable[None]],
                 admitted: Callable[[str, tuple[str, ...]], Awaitable[None]]) -> None:
        """``release(item)`` releases inside a commit; ``after_releases(keys)``
        follows a commit of releases; ``admitted(key, ids)`` tells listeners."""
        self.ctx = ctx
        self.admit = admit
        self.finished = finished
        self._release = release
        self._after_releases = after_releases
        self._admitted = admitted
        self._admitting = asyncio.Lock()

    async def admit_pending_safely(self) -> None:
        if self in _IN_ADMIT.get() and self._admitting.locked():
            # Called from inside admit() (one that releases an item reaches
            # here through its report's answer): waiting for the pass that
            # called admit() would wait for ever. That pass hands on what
            # came meanwhile once admit() returns (below; a pass the admit
            # timer runs leaves the timer due, and the alarm runs it again).
            # A task admit() started and left running carries its context:
            # once no pass runs, it admits here, not at the timer's backstop.
            return
        try:
            for _ in range(PASSES):  # what was admitted while a pass ran: the next one, not its timer
                await self.admit_pending()
                if not self.to_admit():
                    break
        except Exception as error:  # the admit timer retries, from an alarm set for it now
            log.warning("admit() failed: %r; it will be retried", error)
            try:
                await self.ctx.update(lambda: self.ctx.due_by(TimerKind.ADMIT, None, now_ms()))
            except Exception as sync_error:  # its timer is due all the same: the next alarm or sync retries
                log.warning("setting the alarm for admit() failed: %r", sync_error)

    async def admit_pending(self) -> None:
        ctx = self.ctx
        async with self._admitting:
            # The admissions (and a lease draw with them) must be durable before
            # any work starts: work started on an admission that is then lost
            # would run on a permit nobody counts. The flush makes durable what
            # was written before it began, so only the admissions read then are
            # handed on: one another call writes while it waits (a holder's
            # call taking up a lease, say) waits for the next pass, which its
            # timer brings.
            before = self.to_admit()
            if not before:
                return
            await ctx.scheduler.sql.flush()
            still = {item.id for item in self.to_admit()}
            items = [item for item in before if item.id in still]
            if not items:
                return
            here = ctx.store.admitted_here
            inside = _IN_ADMIT.set((*_IN_ADMIT.get(), self))
            try:
                result = self.admit([AdmittedItem(i.id, i.key, i.group, i.body, i.via or Via.GRANT,
                                                  i.id not in here, i.admitted_at) for i in items])
                if inspect.isawaitable(result):
                    await result
            finally:
                _IN_ADMIT.reset(inside)
            await ctx.update(lambda: self._returned(items))
        for key in sorted({i.key for i in items}):
            await self._admitted(key, tuple(i.id for i in items if i.key == key))

    def _returned(self, items: list[Item]) -> None:
        """admit() returned for ``items``: the finished() sweep may ask about them."""
        now = now_ms()
        for item in items:
            self.ctx.memory.returned[item.id] = now
        if not self.to_admit():  # items admitted meanwhile still need the timer
            self.ctx.cancel(TimerKind.ADMIT)
        if self.finished is not None:
            # Due then, and run within any event the object has from then on
            # (a release, an alarm); its own alarm may wait ``checks_wait_ms``
            # more. An object whose work runs elsewhere has no alarm running
            # while it waits: moving it for every check cost the example
            # Worker 2.7 alarm runs and as many rows per job.
            at = now + self.ctx.options.finished_check_ms
            self.ctx.due_by(TimerKind.FINISHED, None, at, alarm_by=at + self.ctx.options.checks_wait_ms)

    def to_admit(self) -> list[Item]:
        """Admitted items whose admit() has not returned in this instance."""
        return [item for item in self.ctx.store.admitted() if item.id not in self.ctx.memory.returned]

    async def check_finished(self) -> None:
        if self.finished is None:
            return
        ctx = self.ctx
        cutoff = now_ms() - ctx.options.finished_check_ms
        due = sorted((at, item_id) for item_id, at in ctx.memory.returned.items() if at <= cutoff)
        await self.ask_finished([item_id for _, item_id in due])
        await ctx.update(lambda: self._schedule_finished(cutoff))

    async def ask_finished(self, ids: list[str]) -> None:
        """Ask ``finished()`` about those of ``ids`` still admitted, now, and release the ones it names."""
        if self.finished is None:
            return
        ctx = self.ctx
        candidates = [item for item in (ctx.store.item(item_id) for item_id in ids)
                      if item is not None and item.state == ADMITTED]
        for start in range(0, len(candidates), FINISHED_BATCH):
            asked = {item.id: item for item in candidates[start:start + FINISHED_BATCH]}
            result = self.finished(list(asked))
            done = await result if inspect.isawaitable(result) else result
            finished_items = [asked[i] for i in done if i in asked]
            if finished_items:
                await ctx.commit(partial(self._release_all, finished_items))
                await self._after_releases({item.key for item in finished_items})

    def _release_all(self, items: list[Item]) -> None:
        for item in items:
            current = self.ctx.store.item(item.id)
            if current is not None and current.state == ADMITTED:
                self._release(current)

    def _schedule_finished(self, asked_up_to: float) -> None:
        """Ask ``finished()`` about each item ``finished_check_ms`` after its
        ``admit()`` returned, and again at that interval.

        ``asked_up_to``: the sweep that just ran asked about items whose
        admit() returned by then; the next sweep is due for the first item
        not asked yet, or one interval on for the ones asked.
        """
        returned = self.ctx.memory.returned
        not_asked = [at for at in returned.values() if at > asked_up_to]
        due = [min(not_asked) + self.ctx.options.finished_check_ms] if not_asked else []
        if len(not_asked) < len(returned):
            due.append(now_ms() + self.ctx.options.finished_check_ms)
        if due:
            self.ctx.due_at(TimerKind.FINISHED, None, min(due), alarm_by=min(due) + self.ctx.options.checks_wait_ms)
        else:
            self.ctx.cancel(TimerKind.FINISHED)

    async def check_finished_if_due(self) -> None:
        """The sweep, if it is due: within an event the object has anyway."""
        if self.finished is not None and self.ctx.is_due(TimerKind.FINISHED):
            try:
                await self.check_finished()
            except Exception as error:  # its timer runs it again
                log.warning("finished() failed: %r", error)
