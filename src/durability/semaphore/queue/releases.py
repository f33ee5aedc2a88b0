"""Releases: an admitted item's permit returned, and its holder told.

Lives here: ``QueueReleases``, the part of ``DurabilitySemaphoreQueue``
that releases an admitted item (inside a commit): its new state written,
or its row deleted at once (``keep_done_ms`` 0), and how its holder hears
of it. A grant's release goes with the request of its key when the
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

from dataclasses import replace

from ..._common.clock import now_ms
from .grant_book import GrantBook
from .grants import QueueGrants
from .lease_book import LeaseBook
from .leases import QueueLeases
from .memory import QueueContext, QueueOptions
from .pure.states import GONE, RELEASED, Item, TimerKind, Via


class QueueReleases:
    """The releases of ``DurabilitySemaphoreQueue``, which sets these attributes."""

    ctx: QueueContext
    options: QueueOptions
    grants: GrantBook
    lease_book: LeaseBook
    leases: QueueLeases
    claims: QueueGrants

    def _release(self, item: Item) -> None:
        """Release an admitted item (inside a commit) and have the holder told."""
        ctx = self.ctx
        ctx.memory.returned.pop(item.id, None)
        if not ctx.memory.returned:
            ctx.cancel(TimerKind.FINISHED)  # nothing left to ask about: no alarm for it
        grant_id = item.grant_id
        assert grant_id is not None  # an admitted item came through a grant or a lease
        grant = self.grants.grant(grant_id) if item.via == Via.GRANT else None
        lease = self.lease_book.lease(grant_id) if item.via == Via.LEASE else None
        if self.options.keep_done_ms == 0 and grant is not None:
            # Not kept: its row goes now, one write instead of two, and its
            # grant counts it as a claim with no item, released. An instance
            # that starts before the holder heard counts it so again: its
            # key's row makes it ask, and the holder lists the grant's claims.
            ctx.move(item, GONE)
            self.grants.keep(replace(grant, extra=grant.extra + 1))
        elif lease is not None and self._drawn_row_may_go(item):
            # The same for a numbered draw, when the key's holder lists every
            # lease: one write instead of two. The terms keep the drawn count
            # it was part of; a new instance counts it from the other draws'
            # numbers or the holder's answer (see lease_book).
            ctx.move(item, GONE)
            self.lease_book.keep(lease)
        else:
            ctx.move(item, RELEASED, item.grant_id, item.via, item.draw)
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
