"""DurabilitySemaphoreQueue: work queued in a client object, admitted under a holder's budget.

Lives here: the queue's shell: the public API (enqueue, cancel, status;
releases are ``queue/releases``'), the timers a new instance derives from
its rows, and which key's pump is due when. The parts it is made
of: ``queue/memory`` (shared memory, options, the one commit),
``queue/requests`` (each key's pump and request, and what its reply
does), ``queue/grants`` (claims and grant reports), ``queue/leases``
(draws and lease reports), ``queue/admission`` (``admit()`` and the
``finished()`` sweep), ``queue/releases`` (an item's release, how its
holder hears of it, and the deletion of done items), ``queue/old_outbox`` (what older versions queued), and
the pure rules of ``queue/pure/core`` and ``queue/pure/lease_rules``. Must not know: the holder's rules (it only reads
its replies), how a message is spelled on the wire (``messages``), or SQL
(``queue/store``).

An item is ``queued`` until a permit is granted for it, and ``admitted``
once the holder confirmed it: the reply of a request that says ``claims``
confirms the permits it grants, or (with a holder that grants unclaimed
permits) the answer to a claim, while the item is ``claiming``. ``admit()``
is then called, after the admission committed, until it returns. An item
drawn from a lease is admitted at once: the holder already counts the
lease, so the draw and the admission commit together. Releasing an item
writes its new state (see queue_releases). Done items are deleted
``keep_done_ms`` after they were released or cancelled (at once, for a
released item with no record to keep, with ``keep_done_ms`` 0), or
sooner past ``keep_done_max``.

Every change that writes goes through ``QueueContext.commit``: what a
transaction changes in memory is put back if it fails, and the commit
moves the alarm. (Memory that stands for no row, such as a request in
flight or the holder's latest word, changes outside commits.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..._common.clock import now_ms
from ..._common.listeners import notify
from ..._common.schema import public_migrate
from ...retry import Backoff
from ...scheduler.alarm import DurabilityScheduler, Timer
from ..client import SemaphoreClient
from ..identity import wire_identity
from ..messages import MAX_DEMAND_ENTRIES, MAX_WAIT_MS, ProtocolError, Reply
from .admission import Admission, AdmittedItem
from .grants import QueueGrants
from .input import checked_items, identifier
from .leases import QueueLeases
from .memory import PARTICIPANT, QueueContext, QueueOptions
from .old_outbox import CHANNEL, OLD_LEASE_CHANNEL, OldOutboxDrain
from .pure.core import fallback_at, may_leave_line, oldest_of
from .pure.states import (
    CANCELLED,
    CLAIMING,
    QUEUED,
    Item,
    QueueEvent as QueueEvent,
    TimerKind,
    Via,
    parse_timer_key,
)
from .releases import QueueReleases
from .requests import KeyRequests
from .store import COMPONENT as QUEUE_COMPONENT, TABLES as QUEUE_TABLES, QueueStore

__all__ = ["CHANNEL", "OLD_LEASE_CHANNEL", "PARTICIPANT", "AdmittedItem", "DurabilitySemaphoreQueue", "QueueEvent"]

log = logging.getLogger("durability.semaphore.queue")


class DurabilitySemaphoreQueue(QueueReleases):
    """The client half: queue items per semaphore key and admit them under the holder's budget.

    Args:
        scheduler: the object's scheduler (one queue per scheduler).
        client_id: a label for this queue's object (a shard's name, say), or
            None. The queue speaks to its holders as its object's own id,
            ``<client_id>@<the object's id>`` with a label, so two objects
            never share one even when given the same label (a queue that
            held something under a label before keeps speaking as the label
            until it starts holding nothing; ``identity``). The label
            is kept: an instance given None (one reached through its id
            alone has no ``ctx.id.name`` to make a label from) speaks under
            the label kept.
        server: a ``SemaphoreClient``, e.g. ``limits.with_(timeout, 5_000).bind(env)``.
        admit: ``admit(items)`` starts the admitted items' work; called after
            the admission commits and again, under ``retries``, until it
            returns. It must be idempotent on item id.
        finished: ``finished(ids) -> ids done``; asked about admitted items
            ``finished_check_ms`` after ``admit()`` returned and at that
            interval; the ones it names are released. Without it, an item
            whose ``release()`` is lost holds its permit until released by hand.
        on_lifecycle_event: ``QueueEvent`` listener (best effort).
        retries: backoff for ``admit()``, failed requests and report syncs.
        attempt_timeout_ms: a request unanswered this long counts as failed.
        report_delay_ms: how long releases gather before a ``sync`` sends them.
        request_wait_ms: how long the holder may hold a request that it cannot
            serve yet (a long poll). A timeout transform on ``server`` must
            allow this plus a round.
        lease_report_delay_ms: how long releases of drawn permits gather
            before a ``sync`` returns their footprint to the holder. Draws
            are never reported on their own (the holder counts the whole
            lease already); when the holder says it is contended, pending
            lease reports go at once.
        keep_done_ms: how long a released or cancelled item is kept (its id
            stays known: enqueueing it again is a no-op, ``status``,
            ``release`` and ``record`` still answer for it) before its row is
            deleted.
        keep_records_ms: how long an item released with a record
            (``release_keeping``) is kept (None: ``keep_done_ms``). Each done
            item goes within a thirtieth of its time more, with the others
            due by then, in one purge. With
            ``keep_done_ms`` 0, such an item's grant counts it as released
            and gone, as it counts one deleted at its release: a new instance
            does not report it again.
        keep_done_max: how many done items are kept: past it, those done
            longest ago go, within an hour, once an hour old (so the items of
            the last hour or two may exceed it). A new instance
            reads every item kept, a row read each, so an object woken
            often that keeps its items long bounds them here (None: no bound).
        checks_wait_ms: how long the object's own checks may wait for an
            event that runs them (a reply or a sync from the holder, or its
            call, for a new instance handing its admitted items to
            ``admit()`` again; a release for the ``finished()`` sweep; an
            alarm set for something else) before its alarm moves for them.
            0 (the default) runs them on time, on the alarm if nothing else
            comes: work that ran in the object was cut short
            with the old instance. An ``admit()`` whose work lives on
            outside the object (a job handed to a queue's consumer, which
            reports its end) may let them wait: the object then sleeps
            while its work runs, with no alarm of its own.
    """

    def __init__(self, scheduler: DurabilityScheduler, *, server: SemaphoreClient,
                 admit: Callable[[list[AdmittedItem]], Any],
                 finished: Callable[[list[str]], Any] | None = None, client_id: str | None = None,
                 on_lifecycle_event: Callable[[QueueEvent], Any] | None = None,
                 retries: Backoff = Backoff(initial_ms=1_000, max_ms=60_000),
                 attempt_timeout_ms: float = 10_000, finished_check_ms: float = 60_000,
                 report_delay_ms: float = 1_000, request_wait_ms: float = 50_000,
                 lease_report_delay_ms: float = 10_000, keep_done_ms: float = 600_000,
                 keep_records_ms: float | None = None, keep_done_max: int | None = None, woken: bool = False,
                 checks_wait_ms: float = 0.0) -> None:
        if not 0 <= request_wait_ms <= MAX_WAIT_MS:
            raise ValueError(f"request_wait_ms must be from 0 to {MAX_WAIT_MS}")
        if not keep_done_ms >= 0:
            raise ValueError("keep_done_ms must be 0 or more")
        if not checks_wait_ms >= 0:
            raise ValueError("checks_wait_ms must be 0 or more")
        if keep_records_ms is not None and not keep_records_ms >= 0:
            raise ValueError("keep_records_ms must be 0 or more, or None")
        if keep_done_max is not None and (type(keep_done_max) is not int or keep_done_max < 0):
            raise ValueError(f"keep_done_max must be a whole number, 0 or more, or None, not {keep_done_max!r}")
        self.scheduler = scheduler
        self.server = server
        self.on_lifecycle_event = on_lifecycle_event
        self.options = QueueOptions(attempt_timeout_ms, finished_check_ms, report_delay_ms, request_wait_ms,
                                    lease_report_delay_ms, keep_done_ms, woken, checks_wait_ms,
                                    keep_done_ms if keep_records_ms is None else keep_records_ms, keep_done_max)
        self.store = QueueStore(scheduler.sql)
        self.client_id = self._identity(client_id)
        self.ctx = ctx = QueueContext(scheduler, self.store, server, self.client_id, self.options)
        self.grants, self.lease_book = ctx.grants, ctx.lease_book
        self.leases = QueueLeases(ctx)
        self.admission = Admission(ctx, admit, finished, release=self._release,
                                   after_releases=self._report_at_once_if_contended, admitted=self._emit_admitted)
        ctx.admit_pending = self.admission.admit_pending_safely
        self.claims = QueueGrants(ctx, self.leases, self._wake)
        ctx.learn_listed = self.claims.learn_listed
        self.old_outbox = OldOutboxDrain(scheduler, ctx, self.claims, self.leases)
        self.requests = KeyRequests(ctx, self.claims, self.leases, self.admission, self.old_outbox, self._emit_blocked)
        scheduler.register(PARTICIPANT, self._on_timer, backoff=retries, durable=False)
        self._derive_timers()

    def _identity(self, label: str | None) -> str:
        """The id this queue speaks to its holders as (see ``identity``)."""
        object_id = str(self.scheduler.ctx.id.toString())
        wire_identity(object_id, label)  # a label it cannot speak as is refused before it is kept
        label = self.store.label(label)
        if label is not None and label != object_id and self.store.spoken_as_given():
            log.info("queue of %s speaks as %r as before, until it starts holding nothing", object_id, label)
            return identifier(label, "client_id")
        return wire_identity(object_id, label)

    def _derive_timers(self) -> None:
        """Set again, in a new instance, the timers its rows imply."""
        ctx, now = self.ctx, now_ms()
        for key in sorted(ctx.memory.unheard):  # the keys with queued items, and more
            if self.options.woken:
                # A holder that parks this key's request calls when it has news;
                # the key asks again by itself at the object's next fallback
                # point, which every instance derives alike and every key
                # shares: a new instance (production hibernates an idle object
                # within seconds) must not put the fallback off again, nor
                # cost a row to remember it.
                self.server.paced(key, fallback_at(ctx.demand(key), self.options.request_wait_ms, now,
                                                   ctx.fallback_phase_ms))
            else:
                interval = self.store.pacing(key)
                if interval is not None:  # the holder's pacing holds across an eviction
                    self.server.paced(key, now + interval)
            # (With no demand, the key asks now to hear what it holds: none of
            # its fallback points.)
            self._wake(key, now, fallback_point=self.options.woken and bool(ctx.demand(key)))
        if self.store.has_admitted():
            ctx.due_by(TimerKind.ADMIT, None, now, alarm_by=now + self.options.checks_wait_ms)
        for key in sorted({grant.key for grant in self.grants.grants() if self.claims.report_due(grant)}):
            ctx.due_by(TimerKind.REPORT, key, now)  # what the holder may not have heard
        for lease in self.lease_book.leases():
            self.leases.report_due(lease.key, lease.lease_id, now)
        self.leases.schedule_renewal()
        ctx.commit_now(lambda: self.store.stamp_untimed(now))
        first = self.store.first_purge_at(*self.options.kept_for())
        if first is not None:
            ctx.due_by(TimerKind.PURGE, None, max(now, self.options.purge_by(first, self.store.done_count(), now)))

    migrate = public_migrate(QUEUE_COMPONENT, QUEUE_TABLES, "the queue's tables")

    # -- the public surface ---------------------------------------------------
    async def enqueue(self, items: list[dict[str, Any]]) -> list[Item]:
        """Queue items ``{id, key, group, body}``; an id already known is a no-op
        that returns the existing item."""
        checked = checked_items(items)
        asks: list[str] = []
        stored = await self.ctx.commit(lambda: self._enqueued(checked, asks))
        for key in asks:
            self.requests.ask_in_this_event(key)
        return stored

    def _enqueued(self, checked: dict[str, tuple[str, str, str]], asks: list[str]) -> list[Item]:
        """Insert the items not known yet (inside a commit); every item, as
        stored. ``asks`` gets the keys to ask for at once, in this event."""
        now = now_ms()
        keys = set()
        # Keys that gained a group. A holder keeping a request of theirs
        # parked calls for what it asked: should that wait on a limit of its
        # own (a group limit, a start rate), a round skips it, and no call
        # ever brings the new group along; it would wait for the key's
        # fallback (4 minutes in the example Worker). The enqueue asks
        # itself, in a task of its event (one short call: a holder that parks
        # answers at once), not from an alarm set to now (a row, an alarm
        # run, and a row to set the alarm back: 0.23 rows and 0.12 requests
        # a job on the example Worker's workload; uv run
        # scripts/bench_vs_naive.py --system grants).
        fresh = set()
        waiting: dict[str, set[str]] = {}
        for item_id, (key, group, body) in checked.items():
            if self.store.item(item_id) is None:
                if key not in waiting:
                    waiting[key] = self.ctx.waiting_groups(key)
                if group not in waiting[key] and len(waiting[key]) < MAX_DEMAND_ENTRIES:  # (a request says no more)
                    fresh.add(key)
                self.store.insert(item_id, key, group, body, now)
                keys.add(key)
        for key in sorted(keys):
            # Draw from leases here, in the enqueue's own transaction: a
            # request in flight for the key must not hold these items up.
            self.leases.draw(key, now)
            if self.ctx.demand(key):
                at_once = key in fresh and self.options.woken
                self._wake(key, now, at_once=at_once)
                if at_once:
                    asks.append(key)
        stored = [self.store.item(item_id) for item_id in checked]
        assert all(stored)  # found or inserted above, in this transaction
        return [item for item in stored if item is not None]

    async def hear(self, key: str, reply: Any) -> dict[str, Any]:
        """A reply the key's holder calls this object with (``woken=True``):
        what a round had for its parked request. Call it from the object's
        ``semaphore_reply(key, reply)`` RPC method and return what it
        returns: the key's demand now, which the holder keeps in line. A
        malformed reply raises ``ValueError`` and changes nothing; one that
        comes late or twice changes nothing it should not (a grant's claims
        count once, and one listed past its claim deadline is given back)."""
        key = identifier(key, "key")
        try:
            parsed = Reply.parse(reply, "grants")
        except ProtocolError as error:
            raise ValueError(f"not a holder's reply: {error}") from None
        self.server.heard(key, reply)
        return (await self.requests.hear(key, parsed)).to_wire()

    async def check_finished(self, ids: list[str] | None = None) -> None:
        """Ask ``finished()`` now, from an event the object has anyway (a
        report that a job ended, say), so that a release that was lost comes
        back then, not at the sweep's alarm: about ``ids`` if given (those
        still admitted), else the sweep, if it is due."""
        if ids is None:
            await self.admission.check_finished_if_due()
        else:
            await self.admission.ask_finished([identifier(i, "id") for i in ids])

    async def told(self, timeout_s: float = 10.0) -> None:
        """Wait, ``timeout_s`` at most, until what the calling event left to
        tasks of its own is done: the holder told of a release when it is
        short of permits (``release_keeping``'s included: other releases
        wait for the report delay, on the alarm), admitted items handed on.
        Await it before answering a call whose caller tries again when it
        fails (a queue consumer's report): should the object be cut off
        before the holder heard, that call fails, and the caller's next try
        starts an instance that tells the holder, where nothing else might
        start one for a minute or more."""
        await self.ctx.own_work_done(timeout_s)

    async def resume(self) -> None:
        """The sweep's call: the alarm set again if lost, and idle keys ask what they hold (``hear_idle_keys``)."""
        await self.scheduler.resume()
        await self.requests.hear_idle_keys()

    async def hand_in_admitted(self) -> None:
        """Hand ``admit()`` now a new instance's admitted items (``resumed``), not at its next reply,
        sync or alarm: before a word about their work that must find them known (a consumer's report)."""
        await self.admission.admit_pending_safely()

    async def cancel(self, item_id: str) -> bool:
        """Remove an item that is still queued."""
        item = self._known(item_id)
        if item.state == CANCELLED:
            return True
        state = self._state(item)
        if state != QUEUED:
            raise ValueError(f"item {item_id!r} is {state}: only a queued item can be cancelled")
        await self.ctx.commit(lambda: self.ctx.move(item, CANCELLED))
        return True

    def status(self, item_id: str) -> dict[str, Any] | None:
        self.scheduler.resume_if_overdue()  # a read resumes an object whose alarm was lost
        item = self.store.item(item_id)
        if item is None:
            return None
        state = self._state(item)
        blocked = self.ctx.memory.blocked.get((item.key, item.group)) if state == QUEUED else None
        return {
            "id": item.id, "key": item.key, "group": item.group, "state": state,
            "via": Via.GRANT if state == CLAIMING else item.via,
            "blocked": None if blocked is None else {"reason": blocked[0], "waiting": blocked[1]},
        }

    def _state(self, item: Item) -> str:
        """The item's state: a queued item that a claim holds is ``claiming``."""
        if item.state == QUEUED and self.store.place_in_line(item) < self.ctx.reserved(item.key).get(item.group, 0):
            return CLAIMING
        return item.state

    def _known(self, item_id: str) -> Item:
        item = self.store.item(identifier(item_id, "id"))
        if item is None:
            raise KeyError(f"no item {item_id!r}")
        return item

    # -- timers -----------------------------------------------------------------
    async def _on_timer(self, timer: Timer) -> None:
        try:
            kind, key = parse_timer_key(timer.key)
        except ValueError:
            log.warning("no queue timer is called %r: dropped", timer.key)
            return
        if key is None:
            await {TimerKind.ADMIT: self.admission.admit_pending, TimerKind.FINISHED: self.admission.check_finished,
                   TimerKind.RENEW: self.leases.renew, TimerKind.PURGE: self._purge}[kind]()
        else:
            await {TimerKind.PUMP: self.requests.pump, TimerKind.REPORT: self.claims.report,
                   TimerKind.LEASE_REPORT: self.leases.report}[kind](key)

    def _wake(self, key: str, now: float, at_once: bool = False, fallback_point: bool = False) -> None:
        """Make the key's pump run (inside a commit): at once when the key
        holds unclaimed permits to claim, or ``at_once`` (the first waiting
        item of a group: the pacing a holder gave a parked request is a
        fallback, not a wait), else as soon as its pacing allows; a
        key out of line stays out while everything it waits with is still
        behind the mark it left on (younger items joined it).
        ``fallback_point``: its pacing is the fallback point a new instance
        derived (``QueueContext.pump_at``)."""
        ctx = self.ctx
        if at_once:  # (the caller asks in its own event: see _enqueued)
            self.server.ask_now(key)
            ctx.pump_at(key, now, earlier_only=True, in_this_event=True)
            return
        at = max(now, self.server.next_request_at(key) or now)
        if at_once or any(g.unclaimed > 0 and g.claim_deadline > now for g in self.grants.grants(key)) or any(
                lease.undrawn > 0 for lease in self.lease_book.leases(key)):
            at, fallback_point = now, False
        elif key in ctx.memory.away and may_leave_line(ctx.memory.away[key], oldest_of(ctx.demand(key))):
            return
        ctx.pump_at(key, at, earlier_only=True, fallback_point=fallback_point)

    # -- listeners ------------------------------------------------------------------------
    async def _emit_blocked(self, key: str, blocked: dict[str, dict[str, Any]]) -> None:
        await self._emit(QueueEvent("blocked", key, blocked=blocked))

    async def _emit_admitted(self, key: str, ids: tuple[str, ...]) -> None:
        await self._emit(QueueEvent("admitted", key, ids))

    async def _emit(self, event: QueueEvent) -> None:
        await notify(self.on_lifecycle_event, event, log, "queue lifecycle listener failed on %s", event.type)

