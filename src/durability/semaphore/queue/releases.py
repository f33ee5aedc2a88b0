"""Releases: an admitted item's permit returned, its holder told, and done items purged.

Lives here: ``QueueReleases``, the part of ``DurabilitySemaphoreQueue``
that releases an admitted item (``release``, or ``release_keeping``
inside its caller's write): its new state written, with the record it
keeps, or its row deleted at once (``keep_done_ms`` 0), and how its
holder hears of it; the deletion of done items (``keep_done_ms``,
``keep_done_max``). A grant's release goes with the request of its key when the
release puts the key back in line, else in a report ``report_delay_ms``
on, or at once when its holder said it is short of permits or calls the
queue; a draw's release goes in a lease report ``lease_report_delay_ms``
on, or at once when its holder said it is short. Must not know: who
releases (``release()`` and the ``finished()`` sweep do), how a message
is spelled on the wire (``messages``), or SQL (``queue/store``).

Releasing an item writes its new state, which is also its grant's released
count (a grant's counts are its items', see grant_book), or the lease's
new count in the same transaction; the holder learns it from the next
request or a ``sync``. A drawn permit is one-shot: releasing it returns
footprint to the holder, never a permit to draw.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from ..._common.checks import compact_json
from ..._common.clock import now_ms
from .admission import Admission
from .grant_book import GrantBook
from .grants import QueueGrants
from .lease_book import LeaseBook
from .leases import QueueLeases
from .memory import OVER_MAX_WAIT_MS, QueueContext, QueueOptions
from .pure.states import ADMITTED, GONE, RELEASED, Item, QueueEvent, TimerKind, Via
from .store import QueueStore

PURGE_BATCH = 500  #: done items deleted per transaction; the purge timer comes back at once for more


class QueueReleases:
    """The releases of ``DurabilitySemaphoreQueue``, which sets these attributes."""

    ctx: QueueContext
    options: QueueOptions
    store: QueueStore
    grants: GrantBook
    lease_book: LeaseBook
    leases: QueueLeases
    claims: QueueGrants
    admission: Admission
    _emit: Callable[[QueueEvent], Awaitable[None]]
    _known: Callable[[str], Item]
    _state: Callable[[Item], str]

    async def release(self, item_id: str) -> bool:
        """Return an admitted item's permit. True if released now or before
        (while its row is kept: ``keep_done_ms``, or ``keep_records_ms`` for one
        that keeps a record; after that the id is unknown: ``KeyError``)."""
        item = self._admitted(item_id)
        if item is None:
            return True
        await self.ctx.commit(lambda: self._release(item))
        await self._after_release(item)
        return True

    def release_keeping(self, item_id: str, record: Any) -> bool:
        """Release an admitted item inside the caller's write, and keep
        ``record`` (a JSON value: what became of its work) in its row until it
        is purged (``keep_records_ms``, ``keep_done_max``); ``record(id)`` reads it.

        Synchronous, so that the record commits with the caller's own
        writes: a job's outcome, say, kept in its item's row by the release's
        one update, where a row of its own would cost one more write, and
        one more to purge. The holder is told, and listeners hear of it, in a
        task of the caller's event, as ``release`` would: call it outside any
        transaction of the caller's, whose rollback would leave the holder told
        of a release that never was (one opened through the scheduler's ``sql``
        raises ``RuntimeError``; one opened on ``ctx.storage`` directly is not
        seen). False, and
        nothing written, for an item released already, and for one whose
        row must count for its lease (``keep_done_ms`` 0, a draw whose row
        may not go at its release): kept a day, it would be reported to the
        holder by every new instance (``release`` it). ``ValueError`` for
        one not admitted, or a record that is not JSON or is None (which
        ``record`` reads as no record)."""
        if self.store.sql.depth:
            raise RuntimeError("release_keeping must not be called inside a transaction")
        item = self._admitted(item_id)
        if item is None or not self._may_keep_record(item):
            return False
        if record is None:
            raise ValueError("a released item's record must not be None")
        text = compact_json(record, "a released item's record")
        self.ctx.commit_now(lambda: self._release(item, record=text))
        # (With no event, the holder hears at the key's next report or request.)
        self.ctx.in_this_event(lambda: self._after_release(item, move_alarm=True))
        return True

    def record(self, item_id: str) -> Any:
        """The record a released item keeps (``release_keeping``), or None: for
        any other item, and any id no item has (a row read for a record only)."""
        row = self.store.rows.get(item_id) if isinstance(item_id, str) else None
        text = self.store.record(item_id) if row is not None and row.recorded else None
        return None if text is None else json.loads(text)

    def _admitted(self, item_id: str) -> Item | None:
        """The admitted item ``item_id``; None if released already."""
        item = self._known(item_id)
        if item.state == RELEASED:
            return None
        if item.state != ADMITTED:
            raise ValueError(f"item {item_id!r} is {self._state(item)}, not admitted")
        return item

    async def _after_release(self, item: Item, *, move_alarm: bool = False) -> None:
        if move_alarm:
            await self.ctx.scheduler.sync()
        await self._report_at_once_if_contended({item.key})
        await self._emit(QueueEvent("released", item.key, (item.id,)))
        await self.admission.check_finished_if_due()

    def _release(self, item: Item, record: str | None = None) -> None:
        """Release an admitted item (inside a commit) and have the holder told."""
        ctx = self.ctx
        ctx.memory.returned.pop(item.id, None)
        if not ctx.memory.returned:
            ctx.cancel(TimerKind.FINISHED)  # nothing left to ask about: no alarm for it
        grant_id = item.grant_id
        assert grant_id is not None  # an admitted item came through a grant or a lease
        grant = self.grants.grant(grant_id) if item.via == Via.GRANT else None
        lease = self.lease_book.lease(grant_id) if item.via == Via.LEASE else None
        # A row that need not count for its grant or lease goes, one write
        # instead of two; holding a record, it stays instead (the same one
        # write), naming no grant or lease: they count it as gone all the same.
        gone = GONE if record is None else RELEASED
        if not self._row_may_go(item):
            ctx.move(item, RELEASED, item.grant_id, item.via, item.draw, record)
        elif grant is not None:
            # Not kept as done: its grant counts it as a claim with no item,
            # released. An instance that starts before the holder heard counts
            # it so again: its key's row makes it ask, and the holder lists
            # the grant's claims.
            ctx.move(item, gone, None, item.via, item.draw, record)
            self.grants.keep(replace(grant, extra=grant.extra + 1))
        else:
            assert lease is not None
            # The same for a numbered draw, when the key's holder lists every
            # lease: one write instead of two. The terms keep the drawn count
            # it was part of; a new instance counts it from the other draws'
            # numbers or the holder's answer (see lease_book).
            ctx.move(item, gone, None, item.via, item.draw, record)
            self.lease_book.keep(lease)
        if self._rejoin_with(item) and item.via == Via.GRANT:
            return
        if item.via == Via.LEASE:  # its released count is its items released: report it
            self.leases.report_due(item.key, grant_id, now_ms() + self.options.lease_report_delay_ms)
            return
        # The item's released state is the release's durable report (see queue/grants).
        # A queue its holder calls reports at once: the report delayed past
        # this event would cost an alarm of its own (a row written and a
        # request), more than the call it might save.
        if item.key in ctx.memory.contended or self.options.woken:
            ctx.memory.report_now.add(item.key)  # the caller reports it at once (_report_at_once_if_contended)
        else:
            ctx.due_by(TimerKind.REPORT, item.key, now_ms() + self.options.report_delay_ms)

    def _may_keep_record(self, item: Item) -> bool:
        """With ``keep_done_ms`` 0, only an item whose row may go at its release keeps a record
        (counted as gone by its grant or lease); else any (done items count as their grant's)."""
        return self.options.keep_done_ms > 0 or self._row_may_go(item)

    def _row_may_go(self, item: Item) -> bool:
        """May the item's row go at its release, its grant or lease counting it as gone
        (``keep_done_ms`` 0, its grant or lease known here, and a draw's as below)?"""
        if item.grant_id is None:
            return False
        if item.via == Via.GRANT:
            return self.options.keep_done_ms == 0 and self.grants.grant(item.grant_id) is not None
        return self.lease_book.lease(item.grant_id) is not None and self._drawn_row_may_go(item)

    def _drawn_row_may_go(self, item: Item) -> bool:
        """May a drawn item's row go at its release (``keep_done_ms`` 0)? Only
        numbered, and when its key's holder lists every lease it counts here."""
        return self.options.keep_done_ms == 0 and item.draw is not None and item.key in self.ctx.memory.all_listed

    def _rejoin_with(self, item: Item) -> bool:
        """A release of a key out of line with work waiting puts it back in
        line now: True if it did. Its request carries the report (a grant's
        claims and releases, and its leases' reports): one call instead of a
        sync and a request. If it fails, they go on their own."""
        memory = self.ctx.memory
        if item.key not in memory.away or not self.ctx.demand(item.key):
            return False
        del memory.away[item.key]
        memory.rejoining.add(item.key)
        self.ctx.due_at(TimerKind.PUMP, item.key, now_ms())
        return True

    async def _report_at_once_if_contended(self, keys: set[str]) -> None:
        """Releases of a key whose holder said it is short of permits go out
        now, not after the channels' delay: waiting work gets them sooner."""
        for key in sorted(self.ctx.memory.report_now):
            self.ctx.memory.report_now.discard(key)
            await self.claims.report_safely(key)
        if keys & self.ctx.memory.contended:
            await self.leases.report_all()

    # -- done items: kept a while, then deleted ------------------------------------
    async def _purge(self) -> None:
        await self.ctx.commit(self._purge_due)

    def _purge_due(self) -> None:
        """Delete items done ``keep_done_ms`` ago or more, and the oldest past
        ``keep_done_max`` (inside a commit; see QueueStore.purge_done), and
        forget grants and leases long settled."""
        now = now_ms()
        held = {lease.lease_id for lease in self.lease_book.leases()}  # their counts are their items
        held |= self.claims.forget_finished(now)
        self.grants.prune(now)
        self.lease_book.prune(now)
        options = self.options
        keep_ms, most = options.keep_done_ms, options.keep_done_max
        over = 0 if most is None else max(0, self.store.done_count() - most)
        before = (now - keep_ms, now - options.keep_records_ms)
        if self.store.purge_done(before, PURGE_BATCH, held, self.ctx.memory.unheard, over,
                                 over_before=now - OVER_MAX_WAIT_MS):
            self.ctx.due_at(TimerKind.PURGE, None, now)
            return
        first = self.store.first_purge_at(*options.kept_for())
        if first is not None:
            at = options.purge_by(first, self.store.done_count(), now)
            if at <= now:
                # Held by a grant or a lease still here: look again an
                # interval on, not in a loop (a lease's settlement calls
                # the purge sooner), an hour at most while over the bound.
                at = options.purge_by(now + max(keep_ms, options.settled_horizon_ms), self.store.done_count(), now)
            self.ctx.due_at(TimerKind.PURGE, None, at)
