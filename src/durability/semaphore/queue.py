"""DurabilitySemaphoreQueue: work queued in a client object, admitted under a holder's budget.

Lives here: the queue's runtime side: enqueue, draws from this object's
leases, requests to the holder paced by ``nextRequestAt`` (grants come
claimed: the reply admits), claims on grants that come unclaimed (from
older holders), ``admit()`` retried until it returns, ``release``,
``cancel``, ``status``, the ``finished()`` sweep, lease renewals and
returns, the deletion of done items, and reports as cumulative counts read
from the items (grant_book, lease_book), sent by a ``sync`` (``_report``,
``_report_leases``) or with the next request; the outbox channel
``durability.semaphore-queue`` only sends what older versions queued there.
Must not know: the holder's rules (it only reads its replies), how a message
or reply is spelled on the wire (it builds and reads the classes of
``messages``), or SQL (the store owns that).

An item is ``queued`` until a permit is granted for it, and ``admitted``
once the holder confirmed it: the reply of a request that says ``claims``
confirms the permits it grants, or (with a holder that grants unclaimed
permits) the answer to a claim, while the item is ``claiming``. ``admit()``
is then called, after the admission committed, until it returns. An item
drawn from a lease is admitted at once: the holder already counts the
lease, so the draw and the admission commit together. Releasing an item
writes its new state, which is also its grant's released count (a grant's
counts are its items', see grant_book), or the lease's new count in the
same transaction; the holder learns it from the next request or a
``sync``. A drawn permit is one-shot: releasing it returns footprint to
the holder, never a permit to draw. Done items are deleted
``keep_done_ms`` after they were released or cancelled (at once, for a
released item, with ``keep_done_ms`` 0).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from .._calls import retryable
from .._checks import storable_text
from .._clock import now_ms
from .._listeners import notify
from .._schema import public_migrate
from ..outbox import DurabilityOutbox, OutboxMessage
from ..retry import Backoff
from ..scheduler import DurabilityScheduler, Timer
from .client import SemaphoreClient
from .grant_book import GrantBook
from .lease_book import LeaseBook
from .messages import (
    MAX_DEMAND_ENTRIES,
    MAX_ID_LENGTH,
    MAX_REPORTS,
    MAX_WAIT_MS,
    OK,
    RETIRED,
    SETTLED,
    Demand,
    GrantEntry,
    LeaseEntry,
    LeaseOutcome,
    LeaseReport,
    Reply,
    Report,
    ReportOutcome,
    Request,
    Sync,
    queued_grant_report,
    queued_lease_id,
)
from .queue_core import ask_again_at_once, may_leave_line, move, pacing_interval, report_due, settle
from .queue_store import (
    ADMITTED,
    CANCELLED,
    CLAIMING,
    COMPONENT as QUEUE_COMPONENT,
    QUEUED,
    RELEASED,
    TABLES as QUEUE_TABLES,
    Item,
    LocalGrant,
    LocalLease,
    QueueStore,
    Via,
)

log = logging.getLogger("durability.semaphore.queue")
PARTICIPANT = "durability.semaphore-queue"
# Every queue timer is due when the queue's own rows say (a key with queued
# items, at its pacing; items admitted; lease renewal times), so they live
# in memory, cost no row, and the constructor derives them again.
CHANNEL = "durability.semaphore-queue"  #: the outbox channel older versions queued reports on
# Opened only to send what older versions queued there (grant reports on
# CHANNEL, lease reports on this one).
OLD_LEASE_CHANNEL = "durability.semaphore-queue.leases"
ADMIT, FINISHED, PUMP, PURGE, RENEW, REPORT = "admit", "finished", "pump:", "purge", "renew", "report:"
LEASE_REPORT = "lease-report:"
MIN_RENEW_MS = 1_000  # a lease listed with no ttl (leases turned off) is not renewed in a tight loop
FINISHED_BATCH = 100
#: a request is not sent, or held, closer than this to the end of the alarm's
#: starts (scheduler.starts_left_ms): its reply's work must start in time
REQUEST_MARGIN_MS = 5_000
PURGE_BATCH = 500  #: done items deleted per transaction; the purge timer comes back at once for more


@dataclass(frozen=True)
class AdmittedItem:
    id: str
    key: str
    group: str
    body: Any
    via: str  #: a ``Via``: "grant" (a claim the holder confirmed) or "lease" (drawn with no round trip)


@dataclass(frozen=True)
class QueueEvent:
    type: str  #: "admitted", "released", "blocked"
    key: str
    ids: tuple[str, ...] = ()
    blocked: dict[str, dict[str, Any]] | None = None  #: group -> {"reason", "waiting"}, for "blocked"


def _identifier(value: Any, what: str) -> str:
    if not storable_text(value, MAX_ID_LENGTH):
        raise ValueError(f"{what} must be a string of 1 to {MAX_ID_LENGTH} characters with a UTF-8 form, "
                         f"not {value!r}")
    return value


def _check_body(value: Any, where: str = "body") -> None:
    """A body must survive JSON and RPC unchanged: plain values, lists and string-keyed dicts."""
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{where} holds a non-finite number")
        return
    if isinstance(value, list):
        for i, entry in enumerate(value):
            _check_body(entry, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for k, entry in value.items():
            if not isinstance(k, str):
                raise ValueError(f"{where} has a key that is not a string: {k!r}")
            _check_body(entry, f"{where}.{k}")
        return
    raise ValueError(f"{where} holds a {type(value).__name__}, which JSON and RPC do not carry unchanged")


class DurabilitySemaphoreQueue:
    """The client half: queue items per semaphore key and admit them under the holder's budget.

    Args:
        scheduler: the object's scheduler (one queue per scheduler).
        client_id: this object's stable id, e.g. ``ctx.id.toString()``.
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
            stays known: enqueueing it again is a no-op, ``status`` and
            ``release`` still answer for it) before its row is deleted.
    """

    def __init__(self, scheduler: DurabilityScheduler, *, client_id: str, server: SemaphoreClient,
                 admit: Callable[[list[AdmittedItem]], Any],
                 finished: Callable[[list[str]], Any] | None = None,
                 on_lifecycle_event: Callable[[QueueEvent], Any] | None = None,
                 retries: Backoff = Backoff(initial_ms=1_000, max_ms=60_000),
                 attempt_timeout_ms: float = 10_000, finished_check_ms: float = 60_000,
                 report_delay_ms: float = 1_000, request_wait_ms: float = 50_000,
                 lease_report_delay_ms: float = 10_000, keep_done_ms: float = 600_000) -> None:
        self.scheduler = scheduler
        self.client_id = _identifier(client_id, "client_id")
        self.server = server
        self.admit = admit
        self.finished = finished
        self.on_lifecycle_event = on_lifecycle_event
        self.attempt_timeout_ms = attempt_timeout_ms
        self.finished_check_ms = finished_check_ms
        if not 0 <= request_wait_ms <= MAX_WAIT_MS:
            raise ValueError(f"request_wait_ms must be from 0 to {MAX_WAIT_MS}")
        self.request_wait_ms = request_wait_ms
        if not keep_done_ms >= 0:
            raise ValueError("keep_done_ms must be 0 or more")
        self.keep_done_ms = keep_done_ms
        self.report_delay_ms = report_delay_ms
        self.lease_report_delay_ms = lease_report_delay_ms
        self.store = QueueStore(scheduler.sql)
        # A reply is never applied later than its request's time limit, so a
        # grant or lease settled here longer ago than that cannot be revived by one.
        self.grants = GrantBook(self.store, remember_ms=self._settled_horizon_ms())
        self.lease_book = LeaseBook(self.store, self._settled_horizon_ms(), now_ms())
        self._start_memory()
        # The outbox channels only send what older versions queued there:
        # reports are read from the items now (see _report and
        # _report_leases).
        outbox = DurabilityOutbox.of(scheduler)
        self._channels = {name: outbox.channel(name, self._send_outbox, delay_ms=lease_report_delay_ms,
                                               batch_size=MAX_REPORTS) for name in (CHANNEL, OLD_LEASE_CHANNEL)}
        scheduler.register(PARTICIPANT, self._on_timer, backoff=retries, durable=False)
        self._derive_timers()

    def _start_memory(self) -> None:
        """What an instance keeps in memory only, as a new instance starts it."""
        # Keys a new instance has not heard the holder about yet: claims an
        # older instance made there may have been confirmed unbeknown to this
        # one (see grant_book). Their done items are kept until it has. And
        # the keys with a row: without kept done items (keep_done_ms 0), the
        # keys that may hold grants; and the keys of leases (see lease_book).
        self._unheard: set[str] = set(self.store.keys_in(QUEUED, CANCELLED)) | set(self.store.registered_keys())
        # Their first request is answered at its round, not held: a holder
        # that grants unclaimed permits (an older version) would not take
        # an earlier instance's claims for news. Later, a request that
        # failed leaves its key unheard too, but a holder that claims for
        # this queue answers at once when it holds a grant made since the
        # key's heardUpTo.
        self._first_ask: set[str] = set(self._unheard)
        #: per key, the latest claim deadline of the grants the holder listed
        #: here: grants made later, its next reply lists as news (heardUpTo)
        self._heard_up_to: dict[str, float] = {}
        # Leases whose report the holder may not have heard: id -> (key,
        # version). Memory, like _acked: a new instance reports every lease.
        self._lease_due: dict[str, tuple[str, int]] = {}
        self._lease_versions = itertools.count(1)
        self._blocked: dict[tuple[str, str], tuple[str, int]] = {}
        self._contended: set[str] = set()  #: keys whose holder last said it is short of permits
        self._admitting = asyncio.Lock()
        # When admit() returned for each admitted item, in this instance. Not
        # a row: a new instance calls admit() again for every admitted item
        # (admit() is idempotent on item id), which saves a row written per
        # item; finished() is asked about an item only once admit() returned.
        self._returned: dict[str, float] = {}
        self._acked: dict[str, int] = {}  #: grant id -> the released count the holder confirmed hearing
        #: keys whose holder's last reply listed every lease it counts here
        #: (a released drawn item's row may then go at once)
        self._all_listed: set[str] = set()
        self._report_now: set[str] = set()  #: keys with releases to report at once (contended)
        #: keys served while contended that hold no request (queue_core.may_leave_line),
        #: with the line mark they left on: their next release rides on a request
        #: instead of a sync
        self._away: dict[str, dict[str, float]] = {}
        #: keys whose pump is due now to carry a release's report (lease reports wait for it)
        self._rejoining: set[str] = set()
        #: lease id -> the version of its report a request in flight carries
        self._leases_in_flight: dict[str, int] = {}
        #: per key, its requests that failed in a row (queue_core.ask_again_at_once)
        self._failures: dict[str, int] = {}

    def _derive_timers(self) -> None:
        """Set again, in a new instance, the timers its rows imply."""
        now = now_ms()
        for key in sorted(self._unheard):  # the keys with queued items, and more
            interval = self.store.pacing(key)
            if interval is not None:  # the holder's pacing holds across an eviction
                self.server.paced(key, now + interval)
            self._wake(key, now)
        if self.store.admitted():
            self.scheduler.schedule_by(PARTICIPANT, ADMIT, now)
        for key in sorted({grant.key for grant in self.grants.grants() if self._report_due(grant)}):
            self.scheduler.schedule_by(PARTICIPANT, REPORT + key, now)  # what the holder may not have heard
        for lease in self.lease_book.leases():
            self._lease_report_due(lease.key, lease.lease_id, now)
        self._schedule_renewal()
        self.scheduler.transaction(lambda: self.store.stamp_done(now))
        oldest_done = self.store.oldest_done()
        if oldest_done is not None:
            self.scheduler.schedule_by(PARTICIPANT, PURGE, max(now, oldest_done + self.keep_done_ms))

    migrate = public_migrate(QUEUE_COMPONENT, QUEUE_TABLES, "the queue's tables")

    # -- the public surface ---------------------------------------------------
    async def enqueue(self, items: list[dict[str, Any]]) -> list[Item]:
        """Queue items ``{id, key, group, body}``; an id already known is a no-op
        that returns the existing item."""
        if not isinstance(items, list) or not items:
            raise ValueError("enqueue takes a non-empty list of items")
        checked: dict[str, tuple[str, str, str]] = {}
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise ValueError(f"items[{i}] must be a dict")
            item_id = _identifier(item.get("id"), f"items[{i}].id")
            key = _identifier(item.get("key"), f"items[{i}].key")
            group = _identifier(item.get("group", "default"), f"items[{i}].group")
            _check_body(item.get("body"), f"items[{i}].body")
            body = json.dumps(item.get("body"), sort_keys=True, separators=(",", ":"))
            if item_id in checked and checked[item_id] != (key, group, body):
                raise ValueError(f"item {item_id!r} appears twice with different contents")
            checked[item_id] = (key, group, body)

        def change() -> list[Item]:
            now = now_ms()
            keys = set()
            for item_id, (key, group, body) in checked.items():
                if self.store.item(item_id) is None:
                    self.store.insert(item_id, key, group, body, now)
                    keys.add(key)
            for key in sorted(keys):
                # Draw from leases here, in the enqueue's own transaction: a
                # request in flight for the key must not hold these items up.
                self._draw(key, now)
                if self._demand(key):
                    self._wake(key, now)
            return [stored_item(item_id) for item_id in checked]

        def stored_item(item_id: str) -> Item:
            item = self.store.item(item_id)
            assert item is not None  # found or inserted above, in this transaction
            return item

        stored = self.scheduler.transaction(change)
        await self.scheduler.sync()
        return stored

    async def release(self, item_id: str) -> bool:
        """Return an admitted item's permit. True if released now or before
        (within ``keep_done_ms``; after that the id is unknown: ``KeyError``)."""
        item = self._known(item_id)
        if item.state == RELEASED:
            return True
        if item.state != ADMITTED:
            raise ValueError(f"item {item_id!r} is {self._state(item)}, not admitted")
        self.scheduler.transaction(lambda: self._release(item))
        await self.scheduler.sync()
        await self._report_at_once_if_contended({item.key})
        await self._emit(QueueEvent("released", item.key, (item.id,)))
        return True

    async def _report_at_once_if_contended(self, keys: set[str]) -> None:
        """Releases of a key whose holder said it is short of permits go out
        now, not after the channels' delay: waiting work gets them sooner."""
        for key in sorted(self._report_now):
            self._report_now.discard(key)
            await self._report_safely(key)
        if keys & self._contended:
            await self._report_all_leases()

    async def cancel(self, item_id: str) -> bool:
        """Remove an item that is still queued."""
        item = self._known(item_id)
        if item.state == CANCELLED:
            return True
        state = self._state(item)
        if state != QUEUED:
            raise ValueError(f"item {item_id!r} is {state}: only a queued item can be cancelled")
        self.scheduler.transaction(lambda: self._move(item, CANCELLED))
        await self.scheduler.sync()
        return True

    def _state(self, item: Item) -> str:
        """The item's state: a queued item that a claim holds is ``claiming``."""
        if item.state == QUEUED and self.store.place_in_line(item) < self._reserved(item.key).get(item.group, 0):
            return CLAIMING
        return item.state

    def _known(self, item_id: str) -> Item:
        item = self.store.item(_identifier(item_id, "id"))
        if item is None:
            raise KeyError(f"no item {item_id!r}")
        return item

    def status(self, item_id: str) -> dict[str, Any] | None:
        self.scheduler.resume_if_overdue()  # a read resumes an object whose alarm was lost
        item = self.store.item(item_id)
        if item is None:
            return None
        state = self._state(item)
        blocked = self._blocked.get((item.key, item.group)) if state == QUEUED else None
        return {
            "id": item.id, "key": item.key, "group": item.group, "state": state,
            "via": Via.GRANT if state == CLAIMING else item.via,
            "blocked": None if blocked is None else {"reason": blocked[0], "waiting": blocked[1]},
        }

    # -- timers -----------------------------------------------------------------
    def _wake(self, key: str, now: float) -> None:
        """Make the key's pump run (inside a transaction): at once when the key
        holds unclaimed permits to claim, else as soon as its pacing allows; a
        key out of line stays out while everything it waits with is still
        behind the mark it left on (younger items joined it)."""
        at = max(now, self.server.next_request_at(key) or now)
        if any(g.unclaimed > 0 and g.claim_deadline > now for g in self.grants.grants(key)) or any(
                lease.undrawn > 0 for lease in self.lease_book.leases(key)):
            at = now
        elif key in self._away and may_leave_line(self._away[key], _oldest_of(self._demand(key))):
            return
        self.scheduler.schedule_by(PARTICIPANT, PUMP + key, at)

    async def _on_timer(self, timer: Timer) -> None:
        if timer.key == ADMIT:
            await self._admit_pending()
        elif timer.key == FINISHED:
            await self._check_finished()
        elif timer.key == RENEW:
            await self._renew_leases()
        elif timer.key.startswith(PUMP):
            await self._pump(timer.key[len(PUMP):])
        elif timer.key.startswith(REPORT):
            await self._report(timer.key[len(REPORT):])
        elif timer.key == PURGE:
            await self._purge()
        elif timer.key.startswith(LEASE_REPORT):
            await self._report_leases(timer.key[len(LEASE_REPORT):])

    # -- claims and requests ------------------------------------------------------
    def _claim_local(self, key: str, now: float) -> None:
        """Draw, for queued items, from this object's leases, then claim
        permits it already holds unclaimed."""
        self._draw(key, now)
        self._claim(key, now)

    def _draw(self, key: str, now: float) -> None:
        """Admit queued items at once on permits drawn from this object's leases
        (inside a transaction: the draw and the admission commit together)."""
        drawn = False
        reserved = self._reserved(key)
        for lease in self.lease_book.leases(key):
            if lease.undrawn <= 0:
                continue
            items = self.store.oldest_queued(key, lease.group, lease.undrawn, reserved.get(lease.group, 0))
            for number, item in enumerate(items, start=lease.drawn + 1):  # numbered in order (see lease_book)
                self._move(item, ADMITTED, lease.lease_id, Via.LEASE, number)
            drawn = drawn or bool(items)
        if drawn:
            self.scheduler.schedule_by(PARTICIPANT, ADMIT, now)

    def _claim(self, key: str, now: float) -> None:
        """Claim, for queued items, permits this object already holds unclaimed."""
        reserved = self._reserved(key)
        for grant in self.grants.grants(key):
            if grant.claim_deadline <= now:
                if self._finished_here(grant, now):
                    self.grants.forget(grant.grant_id, now, grant.claimed)  # the holder takes it back
                    continue
                if grant.claimed == grant.confirmed == grant.released:
                    continue  # its last releases are still to be reported
            else:
                skip = reserved.get(grant.group, 0)
                items = self.store.oldest_queued(key, grant.group, grant.unclaimed, skip) if grant.unclaimed > 0 else []
                if items:
                    # The row's claimed count is the claim's durable report
                    # (_report sends it at once, and a new instance again);
                    # the claims hold the oldest queued items without a write.
                    reserved[grant.group] = skip + len(items)
                    self.grants.keep(replace(grant, claimed=grant.claimed + len(items)))

    def _finished_here(self, grant: LocalGrant, now: float) -> bool:
        """Past its claim deadline, every claim answered and released, and the
        holder told: nothing about the grant is left to do here."""
        return (grant.claim_deadline <= now and grant.claimed == grant.confirmed == grant.released
                and not self._report_due(grant))

    def _reserved(self, key: str) -> dict[str, int]:
        """Per group, how many of the oldest queued items claims hold (they are ``claiming``)."""
        reserved: dict[str, int] = {}
        for grant in self.grants.grants(key):
            if grant.pending > 0:
                reserved[grant.group] = reserved.get(grant.group, 0) + grant.pending
        return reserved

    def _demand(self, key: str) -> list[tuple[str, int, float]]:
        """(group, count, oldest) of the key's items waiting for a permit, oldest group first."""
        return self.store.demand(key, self._reserved(key))

    def _move(self, item: Item, state: str, grant_id: str | None = None, via: str | None = None,
              draw: int | None = None) -> None:
        """Write an item's next state, as the life cycle (queue_core.TRANSITIONS) allows."""
        done_at = None
        if state in (RELEASED, CANCELLED):
            done_at = now_ms()
            self.scheduler.schedule_by(PARTICIPANT, PURGE, done_at + self.keep_done_ms)
        self.store.set_state(item.id, move(item.state, state), grant_id, via, done_at, draw)

    async def _purge(self) -> None:
        """Delete items done ``keep_done_ms`` ago or more (see QueueStore.purge_done)."""
        def purge() -> None:
            now = now_ms()
            held = {lease.lease_id for lease in self.lease_book.leases()}  # their counts are their items
            for grant in self.grants.grants():
                if self._finished_here(grant, now):  # a grant no pump came by to forget
                    self.grants.forget(grant.grant_id, now, grant.claimed)
                else:
                    held.add(grant.grant_id)
            self.grants.prune(now)
            self.lease_book.prune(now)
            if self.store.purge_done(now - self.keep_done_ms, PURGE_BATCH, held, self._unheard):
                self.scheduler.schedule(PARTICIPANT, PURGE, now)
                return
            oldest = self.store.oldest_done()
            if oldest is not None:
                at = oldest + self.keep_done_ms
                if at <= now:
                    # Held by a grant or a lease still here: look again an
                    # interval on, not in a loop (a lease's settlement calls
                    # the purge sooner).
                    at = now + max(self.keep_done_ms, self._settled_horizon_ms())
                self.scheduler.schedule(PARTICIPANT, PURGE, at)

        self.scheduler.transaction(purge)
        await self.scheduler.sync()

    def _release(self, item: Item) -> None:
        self._returned.pop(item.id, None)
        grant_id = item.grant_id
        assert grant_id is not None  # an admitted item came through a grant or a lease
        grant = self.grants.grant(grant_id) if item.via == Via.GRANT else None
        lease = self.lease_book.lease(grant_id) if item.via == Via.LEASE else None
        if self.keep_done_ms == 0 and grant is not None:
            # Not kept: its row goes now, one write instead of two, and its
            # grant counts it as a claim with no item, released. An instance
            # that starts before the holder heard counts it so again: its
            # key's row makes it ask, and the holder lists the grant's claims.
            self.store.delete(item.id)
            self.grants.keep(replace(grant, extra=grant.extra + 1))
        elif self.keep_done_ms == 0 and lease is not None and item.draw is not None and item.key in self._all_listed:
            # The same for a numbered draw, when the key's holder lists every
            # lease: one write instead of two. The terms keep the drawn count
            # it was part of; a new instance counts it from the other draws'
            # numbers or the holder's answer (see lease_book).
            self.store.delete(item.id)
            self.lease_book.keep(lease)
        else:
            self._move(item, RELEASED, item.grant_id, item.via, item.draw)
        if self._rejoin_with(item) and item.via == Via.GRANT:
            return
        if item.via == Via.LEASE:  # its released count is its items released: report it
            self._lease_report_due(item.key, grant_id, now_ms() + self.lease_report_delay_ms)
            return
        # The item's released state is the release's durable report (see _report).
        if item.key in self._contended:
            self._report_now.add(item.key)  # the caller reports it at once (_report_at_once_if_contended)
        else:
            self.scheduler.schedule_by(PARTICIPANT, REPORT + item.key, now_ms() + self.report_delay_ms)

    def _rejoin_with(self, item: Item) -> bool:
        """A release of a key out of line with work waiting puts it back in
        line now: True if it did. Its request carries the report (a grant's
        claims and releases, _due_reports, and its leases' reports): one call
        instead of a sync and a request. If it fails, they go on their own."""
        if item.key not in self._away or not self._demand(item.key):
            return False
        del self._away[item.key]
        self._rejoining.add(item.key)
        self.scheduler.schedule(PARTICIPANT, PUMP + item.key, now_ms())
        return True

    async def _pump(self, key: str) -> None:
        self._away.pop(key, None)
        rejoining = key in self._rejoining
        self._rejoining.discard(key)
        self.scheduler.transaction(lambda: self._claim_local(key, now_ms()))
        demand = self._demand(key)[:MAX_DEMAND_ENTRIES]
        wait = self._request_wait(key, demand)
        if wait is None:
            if not demand:
                self._failures.pop(key, None)  # nothing to ask for: no failures in a row any more
            await self._report_safely(key)  # claims get confirmed by a sync at once
            if rejoining:  # the lease reports that waited for this request go on their own
                await self._report_leases_safely(key)
            return
        await self._ask_or_retry(key, demand, wait)

    async def _ask_or_retry(self, key: str, demand: list[tuple[str, int, float]], wait: float) -> None:
        """Ask; if the request fails, ask again now or leave it to the pump's
        backoff (``queue_core.ask_again_at_once``)."""
        sent_at = now_ms()
        try:
            await self._ask(key, demand, wait)
        except Exception as error:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
            timed_out = isinstance(error, TimeoutError)
            if not ask_again_at_once(retryable(error), now_ms() - sent_at, timed_out, failures):
                raise  # the pump's timer retries it, under ``retries``
            log.info("a request for %s failed: %r; asking again now", key, error)
            self.scheduler.transaction(lambda: self.scheduler.schedule(PARTICIPANT, PUMP + key, now_ms()))
            await self.scheduler.sync()
            return
        self._failures.pop(key, None)

    def _request_wait(self, key: str, demand: list[tuple[str, int, float]]) -> float | None:
        """How long the holder may hold the key's request now, or None: no
        request now (nothing to ask for, or not yet: the pump is due again)."""
        if not demand and key not in self._unheard:  # (an unheard key asks, to hear its grants)
            return None
        now = now_ms()
        next_at = self.server.next_request_at(key)
        if next_at is not None and next_at > now:
            self.scheduler.schedule(PARTICIPANT, PUMP + key, next_at)
            return None
        left = self.scheduler.starts_left_ms()
        if left is not None and left < REQUEST_MARGIN_MS:
            # This alarm stops starting timers before a reply could start its
            # work: permits granted now would idle until a fresh alarm. Ask
            # from that one instead, and let other clients have them.
            at = now_ms() + left  # not due before then: this alarm does not run it again
            self.scheduler.transaction(lambda: self.scheduler.schedule(PARTICIPANT, PUMP + key, at))
            return None
        # An instance's first request for a key is answered at its round,
        # not held: the answer's listing is what the key waits for.
        wait = 0 if key in self._first_ask else self.request_wait_ms
        if left is not None:
            wait = min(wait, left - REQUEST_MARGIN_MS)  # the reply comes back while timers still start
        return wait

    async def _ask(self, key: str, demand: list[tuple[str, int, float]], wait: float) -> None:
        """Send the key's request, with its claims and a report of each of its
        leases (current counts, releases and stops, and a heartbeat), and apply
        the reply."""
        claims = self._due_reports(key)
        leases = self.lease_book.leases(key)[:MAX_REPORTS]
        reported = {lease.lease_id for lease in leases}
        lease_piggybacked = [m for channel in self._channels.values() for m in channel.pending()
                             if queued_lease_id(m.body) in reported]
        lease_versions = {i: self._lease_due[i][1] for i in reported if i in self._lease_due}
        message = self._request_message(key, demand, claims, leases, wait)
        limit_s = (self.attempt_timeout_ms + self.request_wait_ms) / 1000
        # Until its reply is applied, the request's round may have granted
        # (claimed) permits this object has not heard of: if it fails, the key
        # asks again even with no demand left, to hear of them.
        self._unheard.add(key)
        if self.keep_done_ms == 0:
            self.scheduler.transaction(lambda: self.store.register_key(key))
        reply = await self._sent_with_lease_reports(key, lease_versions, self.server.request(key, message.to_wire()),
                                                    limit_s)

        def apply() -> None:
            self._lease_reports_heard(lease_versions)
            self._acknowledge(lease_piggybacked)
            self._apply_grants_reply(key, reply, claims)

        self.scheduler.transaction(apply)
        self._unheard.discard(key)  # a round answered: it had heard whatever an older instance sent
        if key in self._first_ask:
            # A key's row is dropped here, at an instance's first ask, if the
            # key holds nothing: the rows are the keys used since the last
            # start, and a key busy again and again costs no row each time.
            self._first_ask.discard(key)
            self.scheduler.transaction(lambda: self._unregister_if_idle(key))
        await self.scheduler.sync()
        await self._after_reply(key, reply)

    def _report_on_their_own(self, key: str, leases: bool) -> None:
        """A request that carried the key's reports failed: a sync sends them
        now (a release's report must not wait for the pump's backoff)."""
        self.scheduler.schedule_by(PARTICIPANT, REPORT + key, now_ms())
        if leases:
            self.scheduler.schedule_by(PARTICIPANT, LEASE_REPORT + key, now_ms())

    async def _sent_with_lease_reports(self, key: str, versions: dict[str, int], call: Awaitable[Any],
                                       limit_s: float) -> Reply:
        """The grants reply to a request carrying these lease reports. While it
        is in flight (held, perhaps for minutes) no ``sync`` repeats them; if it
        fails, they go on their own at once."""
        self._leases_in_flight.update(versions)
        try:
            return Reply.parse(await asyncio.wait_for(call, limit_s), "grants")
        except BaseException:
            self.scheduler.transaction(lambda: self._report_on_their_own(key, bool(versions)))
            raise
        finally:
            for lease_id, version in versions.items():
                if self._leases_in_flight.get(lease_id) == version:
                    del self._leases_in_flight[lease_id]

    def _request_message(self, key: str, demand: list[tuple[str, int, float]], claims: dict[str, Report],
                         leases: list[LocalLease], wait: float) -> Request:
        return Request(self.client_id, tuple(Demand(g, n, oldest) for g, n, oldest in demand),
                       tuple(claims.values()), wait, leases=True,
                       lease_reports=tuple(_lease_report(lease) for lease in leases), claims=True,
                       heard_up_to=self._heard_up_to.get(key, 0.0))

    def _apply_grants_reply(self, key: str, reply: Reply, sent: dict[str, Report]) -> None:
        now = now_ms()
        self._apply_outcomes(reply.reports, sent)
        self._apply_lease_outcomes(reply.lease_reports, now)
        self._learn_leases(key, reply.leases, now, reply.all_leases_listed)
        if reply.all_leases_listed:  # a new instance will hear of every lease: a drawn item need not be kept
            self._all_listed.add(key)
        else:
            self._all_listed.discard(key)
        if reply.contended:
            self._return_idle_leases(key)  # _after_reply reports them
        self._learn_grants(key, reply.grants)
        interval = pacing_interval((reply.next_request_at or now) - now)
        if interval > 0:  # "ask at once" (a reply with permits) is not pacing to keep
            self.store.set_pacing(key, interval)
        self._claim_local(key, now)
        left = self._demand(key)
        if left:
            at = max(now, reply.next_request_at or now)
            if reply.contended and may_leave_line(reply.line, _oldest_of(left)):
                # Back in line with its next release, or after a long poll's
                # length if none comes: a held request would wait that long.
                self._away[key] = reply.line
                at = max(at, now + self.request_wait_ms)
            self.scheduler.schedule(PARTICIPANT, PUMP + key, at)

    def _learn_grants(self, key: str, entries: tuple[GrantEntry, ...]) -> None:
        """Keep what the holder lists of the key's grants (new grants, their
        permits and deadlines) and admit on the claims it confirmed: those a
        grant came with, and those an older instance made here and this one
        never knew (see grant_book)."""
        for entry in entries:
            if self.grants.stale(entry.grant_id, entry.claimed):
                continue  # a reply sent before it was settled here
            known = self.grants.grant(entry.grant_id)
            if known is None:
                known = LocalGrant(entry.grant_id, key, entry.group, entry.permits, 0, 0, 0, entry.claim_deadline)
            learned = replace(known, permits=entry.permits, claim_deadline=entry.claim_deadline,
                              claimed=max(known.claimed, entry.claimed))
            unknown = entry.claimed - learned.confirmed  # confirmed there, no item here counts
            if unknown > 0:  # the listing is the holder's confirmation: admit on it now
                # Releases the holder heard beyond those counted here were
                # of items this object deleted and then forgot (keep_done_ms
                # 0, a new instance): their permits may be anyone's by now.
                released_there = min(unknown, max(0, entry.released - learned.released))
                admitted = self._answer_claims(learned, unknown - released_there, 0)
                learned = replace(learned, extra=learned.extra + unknown - admitted)  # no item left: given back
                if admitted:
                    self.scheduler.schedule_by(PARTICIPANT, ADMIT, now_ms())
            if learned != known or not self.grants.knows_terms(entry.grant_id):
                self.grants.keep(learned)
            self._heard_up_to[key] = max(self._heard_up_to.get(key, 0.0), entry.claim_deadline)

    def _heard(self, key: str, reply: Reply) -> None:
        if reply.contended:
            self._contended.add(key)
        else:
            self._contended.discard(key)

    async def _after_reply(self, key: str, reply: Reply) -> None:
        self._heard(key, reply)
        blocked = {b.group: (b.reason, b.waiting) for b in reply.blocked}
        for (k, group) in [k for k in self._blocked if k[0] == key]:
            if group not in blocked:
                del self._blocked[(k, group)]
        for group, value in blocked.items():
            self._blocked[(key, group)] = value
        if blocked:
            await self._emit(QueueEvent("blocked", key, blocked={
                g: {"reason": r, "waiting": w} for g, (r, w) in blocked.items()}))
        await self._report_safely(key)  # claims made from new grants get confirmed now
        stopping = any(o.status != OK for o in reply.lease_reports) or any(e.retired for e in reply.leases)
        if reply.contended or stopping:
            await self._report_all_leases()  # the holder is short, or must hear a stop: now
        await self._admit_pending_safely()

    def _apply_outcomes(self, outcomes: tuple[ReportOutcome, ...], sent: dict[str, Report] | None = None) -> None:
        """Confirmed claims admit their items; claims the holder refused go back in line.

        ``sent``: the reports the answer is to, by grant id: whatever the
        holder answered, it has heard those released counts."""
        admitted = False
        for outcome in outcomes:
            grant = self.grants.grant(outcome.grant_id)
            if grant is None:
                continue
            settlement = settle(grant, outcome)
            count = self._answer_claims(grant, settlement.admit, settlement.requeue)
            admitted = admitted or count > 0
            if settlement.forget:
                self.grants.forget(grant.grant_id, now_ms(), grant.claimed)
                self._acked.pop(grant.grant_id, None)
            else:
                sent_report = (sent or {}).get(grant.grant_id)
                heard = outcome.released if sent_report is None else sent_report.released
                self._acked[grant.grant_id] = max(self._acked.get(grant.grant_id, 0), heard)
                # Confirmed claims with no queued item left (claims taken up
                # from an older instance) are released at once.
                extra = grant.extra + settlement.admit - count
                self.grants.keep(replace(settlement.grant, extra=extra))
            if settlement.requeue:
                self._wake(grant.key, now_ms())
        if admitted:
            self.scheduler.schedule_by(PARTICIPANT, ADMIT, now_ms())

    def _unregister_if_idle(self, key: str) -> None:
        """Drop the key's row if it holds nothing here (see register_key)."""
        if (key not in self._unheard and not self.grants.grants(key)
                and not self.lease_book.leases(key) and not self.store.has_items(key)):
            self.store.unregister_key(key)

    def _answer_claims(self, grant: LocalGrant, admit: int, requeue: int) -> int:
        """Admit ``admit`` of the items the grant's claims hold, oldest first,
        and let ``requeue`` more go back in line. Returns how many were
        admitted: fewer only if fewer items are queued.

        Items written as claiming by an older version come first; then the
        oldest queued items of the group, which claims hold in line order.
        (Claims on other grants of the group hold the next ones: any item
        the group's claims hold may be admitted by any of them.)
        """
        rows = self.store.claiming(grant.grant_id) if grant.claiming_rows else []
        to_admit = rows[:admit]
        if len(to_admit) < admit:
            to_admit += self.store.oldest_queued(grant.key, grant.group, admit - len(to_admit))
        for item in to_admit:
            self._move(item, ADMITTED, grant.grant_id, Via.GRANT)
        for item in rows[admit:admit + requeue]:
            self._move(item, QUEUED)
        return len(to_admit)

    # -- reports of grants: derived from the grant rows ---------------------------
    # A grant row holds the cumulative claimed and released counts, written in
    # the transaction of the claim or release: that row is the report's
    # durable copy, so no outbox row is written for it. What the holder has
    # acknowledged is kept in memory (``_acked``); a new instance, knowing
    # nothing, reports every grant with releases once more (cumulative counts
    # make a repeat harmless).
    def _report_due(self, grant: LocalGrant) -> bool:
        return report_due(grant, self._acked.get(grant.grant_id, 0))

    def _due_reports(self, key: str) -> dict[str, Report]:
        """The key's grant reports the holder may not have heard, by grant id."""
        grants = [g for g in self.grants.grants(key) if self._report_due(g)][:MAX_REPORTS]
        return {g.grant_id: Report(g.grant_id, g.claimed, g.released) for g in grants}

    async def _report(self, key: str) -> None:
        """Send the key's due grant reports in one ``sync`` and apply the answer."""
        reports = self._due_reports(key)
        if not reports:
            return
        sync = Sync(self.client_id, tuple(reports.values()))
        reply = Reply.parse(
            await asyncio.wait_for(self.server.sync(key, sync.to_wire()), self.attempt_timeout_ms / 1000), "synced")

        def apply() -> None:
            self._apply_outcomes(reply.reports, reports)
            self._learn_grants(key, reply.grants)
            self._claim(key, now_ms())
            if reply.leases:  # leases retired since: stop drawing now
                self._learn_leases(key, reply.leases, now_ms())
            self._after_contended(key, reply)
            if any(self._report_due(g) for g in self.grants.grants(key)):
                self.scheduler.schedule_by(PARTICIPANT, REPORT + key, now_ms())  # more than one sync holds

        self.scheduler.transaction(apply)
        await self.scheduler.sync()
        await self._admit_pending_safely()

    async def _report_safely(self, key: str) -> None:
        try:
            await self._report(key)
        except Exception as error:  # the report timer retries, with backoff
            log.warning("reporting grants of %s failed: %r; it will be retried", key, error)
            self.scheduler.transaction(lambda: self.scheduler.schedule_by(PARTICIPANT, REPORT + key, now_ms()))
            await self.scheduler.sync()

    async def _send_outbox(self, messages: list[OutboxMessage]) -> None:
        """The outbox channels' sender: lease reports, and grant reports an
        older version queued."""
        await self._send_reports([m for m in messages if queued_grant_report(m.body) is not None])
        await self._send_lease_reports([m for m in messages if queued_lease_id(m.body) is not None])

    def _acknowledge(self, messages: list[OutboxMessage]) -> None:
        for name in sorted({m.channel for m in messages}):
            self._channels[name].acknowledge([m for m in messages if m.channel == name])

    async def _send_reports(self, messages: list[OutboxMessage]) -> None:
        """Grant reports an older version queued in the outbox: a ``sync`` per
        key with their cumulative counts."""
        if not messages:
            return

        def on_reply(key: str, reply: Reply, batch: list[OutboxMessage]) -> None:
            self._apply_outcomes(reply.reports)
            self._acknowledge(batch)
            if reply.leases:  # leases retired since: stop drawing now
                self._learn_leases(key, reply.leases, now_ms())
            self._after_contended(key, reply)

        def sync(batch: list[OutboxMessage]) -> Sync:
            reports = [queued_grant_report(m.body) for m in batch]
            return Sync(self.client_id, tuple(report for report in reports if report is not None))

        await self._sync_per_key(messages, sync, on_reply)

    async def _sync_per_key(self, messages: list[OutboxMessage], sync_of: Callable[[list[OutboxMessage]], Sync],
                            on_reply: Callable[[str, Reply, list[OutboxMessage]], None]) -> None:
        """Send one ``sync`` per key, ``sync_of(batch)``, and apply each
        answer in its own transaction with ``on_reply(key, reply, batch)``.

        Each key's reports are acknowledged as soon as its holder answered, so
        one unreachable holder delays only its own account's reports.
        """
        by_key: dict[str, list[OutboxMessage]] = {}
        for message in messages:
            by_key.setdefault(message.body["key"], []).append(message)
        failure: Exception | None = None
        for key, batch in by_key.items():
            sync = sync_of(batch).to_wire()
            try:
                reply = Reply.parse(
                    await asyncio.wait_for(self.server.sync(key, sync), self.attempt_timeout_ms / 1000), "synced"
                )
            except Exception as error:
                failure = failure or error
                continue
            self.scheduler.transaction(lambda: on_reply(key, reply, batch))  # noqa: B023 (it runs here and now)
            await self.scheduler.sync()
        if failure is not None:
            raise failure

    def _after_contended(self, key: str, reply: Reply) -> None:
        """A holder short of permits gets back, at once, what idle leases hold undrawn."""
        self._heard(key, reply)
        if reply.contended and self._return_idle_leases(key):
            # Report what that stopped now, not after the delay. Only then: a
            # shard that holds no idle lease has nothing to send, and an alarm
            # woken for nothing is still billed as a request.
            self.scheduler.schedule_by(PARTICIPANT, LEASE_REPORT + key, now_ms())

    # -- leases -----------------------------------------------------------------------
    def _put_lease_and_report(self, lease: LocalLease) -> None:
        """Keep a lease and have it reported (its counts are read when the report is sent)."""
        self.lease_book.keep(lease)
        self._lease_report_due(lease.key, lease.lease_id, now_ms() + self.lease_report_delay_ms)

    def _lease_report_due(self, key: str, lease_id: str, at: float) -> None:
        """The holder must hear about the lease again: by ``at``, or with the key's next request."""
        self._lease_due[lease_id] = (key, next(self._lease_versions))
        self.scheduler.schedule_by(PARTICIPANT, LEASE_REPORT + key, at)

    def _lease_reports_heard(self, versions: dict[str, int]) -> None:
        """The holder answered reports of these leases, as they stood at these versions."""
        for lease_id, version in versions.items():
            if self._lease_due.get(lease_id, (None, None))[1] == version:
                del self._lease_due[lease_id]

    async def _report_leases(self, key: str) -> None:
        """Send the key's due lease reports (current counts) in one ``sync`` and apply the answer."""
        if key in self._rejoining:  # the key's request, due now, carries them
            # (a backstop, should that request not be sent: reports in flight are not repeated)
            self.scheduler.transaction(lambda: self.scheduler.schedule_by(
                PARTICIPANT, LEASE_REPORT + key, now_ms() + self.lease_report_delay_ms))
            return
        due = {i: v for i, (k, v) in self._lease_due.items() if k == key and self._leases_in_flight.get(i) != v}
        leases = {i: self.lease_book.lease(i) for i in sorted(due)}
        current = [lease for lease in leases.values() if lease is not None and lease.settled_at is None]
        # Settled or forgotten since: nothing left to say about those.
        self._lease_reports_heard({i: due[i] for i, lease in leases.items() if lease not in current})
        current = current[:MAX_REPORTS]
        if not current:
            return
        sync = Sync(self.client_id, (), tuple(_lease_report(lease) for lease in current))
        reply = Reply.parse(
            await asyncio.wait_for(self.server.sync(key, sync.to_wire()), self.attempt_timeout_ms / 1000), "synced")

        def apply() -> None:
            self._lease_reports_heard({lease.lease_id: due[lease.lease_id] for lease in current})
            self._apply_lease_outcomes(reply.lease_reports, now_ms())
            if reply.leases:
                self._learn_leases(key, reply.leases, now_ms())
            self._after_contended(key, reply)
            if any(k == key for k, _ in self._lease_due.values()):
                self.scheduler.schedule_by(PARTICIPANT, LEASE_REPORT + key, now_ms())  # more than one sync holds

        self.scheduler.transaction(apply)
        await self.scheduler.sync()

    async def _report_all_leases(self) -> None:
        """Send every due lease report now, of every key: a holder short of
        permits gets back the footprint of permits released here sooner
        (with jobs of 100 ms to 2 s, the limit is busy 2 to 3 points more
        of the time than when only the key at hand reports at once)."""
        for key in sorted({k for k, _ in self._lease_due.values()}):
            await self._report_leases_safely(key)

    async def _report_leases_safely(self, key: str) -> None:
        try:
            await self._report_leases(key)
        except Exception as error:  # the lease report timer retries, with backoff
            log.warning("reporting leases of %s failed: %r; it will be retried", key, error)
            self.scheduler.transaction(lambda: self.scheduler.schedule_by(PARTICIPANT, LEASE_REPORT + key, now_ms()))
            await self.scheduler.sync()

    def _learn_leases(self, key: str, entries: tuple[LeaseEntry, ...], now: float, listed_all: bool = False) -> None:
        """Leases the holder lists: new ones, ones whose reply was lost, ones to stop drawing from,
        and (``listed_all``) every other one it counts for this object."""
        for entry in entries:
            if self.lease_book.settled(entry.lease_id):
                continue  # a reply sent before it was settled here
            known = self.lease_book.lease(entry.lease_id)
            if known is not None:
                if entry.retired and not known.stopped and known.settled_at is None:
                    self._put_lease_and_report(replace(known, stopped=True))
                continue
            lease = LocalLease(entry.lease_id, key, entry.group, entry.permits, 0, 0,
                               entry.retired or not self._may_take_up(key, entry, listed_all),
                               entry.ttl_ms, _renew_at(now, entry.ttl_ms), None)
            # Drawn from by an older instance with no item here left: each
            # draw was released (its item deleted), and it settles with the
            # report. (A late reply naming a lease settled here is caught by
            # the settled ids kept in memory, above.)
            lease = _with_heard_draws(lease, entry.drawn)
            # No row holds the lease: the key's row makes a new instance ask
            # about it (a write only the first time the key is registered).
            self.store.register_key(key)
            if lease.stopped:
                self._put_lease_and_report(lease)  # tell the holder nothing was drawn
            else:
                self.lease_book.keep(lease)
        self._schedule_renewal()

    def _may_take_up(self, key: str, entry: LeaseEntry, listed_all: bool) -> bool:
        """May a listed lease unknown here be drawn from? Only one issued for
        this instance's own request: any other may have been drawn from by an
        older instance whose items are gone (its draws' numbers with them), so
        it goes back, as one with nothing queued in its group does. (A holder
        that does not list every lease marks none new; its listing holds
        only leases nothing was drawn from, while every drawn item is kept.)"""
        if listed_all and not entry.new:
            return False
        return entry.drawn == 0 and entry.group in {group for group, _, _ in self._demand(key)}

    def _apply_lease_outcomes(self, outcomes: tuple[LeaseOutcome, ...], now: float) -> None:
        for outcome in outcomes:
            known = self.lease_book.lease(outcome.lease_id)
            if known is None or known.settled_at is not None:
                continue
            lease = _with_heard_draws(known, outcome.drawn)
            status = outcome.status
            renewed = lease
            if lease.renew_at < now + lease.ttl_ms / 4:
                # Heard: the next report may wait half a lifetime. A renewal
                # still far off is kept (one row write fewer; it only comes early).
                renewed = replace(lease, renew_at=_renew_at(now, lease.ttl_ms))
            if status == SETTLED:
                if lease.released == lease.drawn:
                    self.lease_book.forget(lease.lease_id, now)
                    self.scheduler.schedule_by(PARTICIPANT, PURGE, now)  # its items may go
                    continue
                else:  # the holder gave up its part; draw nothing more, report releases
                    renewed = replace(renewed, stopped=True)
            elif status == RETIRED:
                renewed = replace(renewed, stopped=True)
                if not lease.stopped or lease.released == lease.drawn:
                    # Keep reporting a stopped lease until the holder settles it.
                    self._put_lease_and_report(renewed)
                    continue
            if renewed != known:
                self.lease_book.keep(renewed)
        self._schedule_renewal()

    def _return_idle_leases(self, key: str) -> bool:
        """The holder is short of permits: give back what leases in groups with
        nothing queued have not drawn. True if any was given back."""
        leases = [lease for lease in self.lease_book.leases(key) if lease.undrawn > 0]
        if not leases:
            return False
        queued = {group for group, _, _ in self._demand(key)}
        idle = [lease for lease in leases if lease.group not in queued]
        for lease in idle:
            self._put_lease_and_report(replace(lease, stopped=True))
        return bool(idle)

    def _settled_horizon_ms(self) -> float:
        """How long a settled lease is remembered: longer than any reply can take."""
        return 2 * (self.attempt_timeout_ms + self.request_wait_ms)

    def _schedule_renewal(self) -> None:
        renewal = self.lease_book.earliest_renewal()
        if renewal is None:
            self.scheduler.cancel(PARTICIPANT, RENEW)
        else:
            self.scheduler.schedule(PARTICIPANT, RENEW, renewal)

    async def _renew_leases(self) -> None:
        """At half its lifetime a lease is reported again: one with permits in
        use keeps them counted; one idle with nothing queued goes back."""
        def renew() -> None:
            now = now_ms()
            queued = {}
            for lease in self.lease_book.leases():
                if lease.renew_at > now:
                    continue
                if lease.key not in queued:
                    queued[lease.key] = {group for group, _, _ in self._demand(lease.key)}
                idle = lease.in_use == 0 and lease.group not in queued[lease.key]
                stopped = lease.stopped or idle
                self._put_lease_and_report(replace(lease, stopped=stopped, renew_at=_renew_at(now, lease.ttl_ms)))
            self._schedule_renewal()

        self.scheduler.transaction(renew)
        await self.scheduler.sync()
        await self._report_all_leases()

    async def _send_lease_reports(self, messages: list[OutboxMessage]) -> None:
        """The lease channel's sender: a ``sync`` per key with each lease's current counts."""
        current = {}
        for message in messages:
            lease_id = queued_lease_id(message.body)
            lease = self.lease_book.lease(lease_id) if lease_id is not None else None
            if lease is not None and lease.settled_at is None:
                current[(message.channel, message.id)] = lease
        gone = [m for m in messages if (m.channel, m.id) not in current]
        if gone:  # settled since: nothing left to say
            self._acknowledge(gone)

        def sync(batch: list[OutboxMessage]) -> Sync:
            return Sync(self.client_id, (), tuple(_lease_report(current[(m.channel, m.id)]) for m in batch))

        def on_reply(key: str, reply: Reply, batch: list[OutboxMessage]) -> None:
            self._acknowledge(batch)  # first: an outcome may queue a newer report
            self._apply_lease_outcomes(reply.lease_reports, now_ms())
            if reply.leases:
                self._learn_leases(key, reply.leases, now_ms())
            self._after_contended(key, reply)

        await self._sync_per_key([m for m in messages if (m.channel, m.id) in current], sync, on_reply)

    # -- admission, release and the finished() sweep ----------------------------------
    async def _admit_pending_safely(self) -> None:
        try:
            await self._admit_pending()
        except Exception as error:  # the admit timer retries
            log.warning("admit() failed: %r; it will be retried", error)

    async def _admit_pending(self) -> None:
        async with self._admitting:
            if not self._to_admit():
                return
            # The admissions (and a lease draw with them) must be durable before
            # any work starts: work started on an admission that is then lost
            # would run on a permit nobody counts.
            await self.scheduler.sql.sync()
            items = self._to_admit()
            if not items:
                return
            admitted = [AdmittedItem(i.id, i.key, i.group, i.body, i.via or Via.GRANT) for i in items]
            result = self.admit(admitted)
            if inspect.isawaitable(result):
                await result

            now = now_ms()
            for item in items:
                self._returned[item.id] = now
            if not self._to_admit():  # items admitted meanwhile still need the timer
                self.scheduler.cancel(PARTICIPANT, ADMIT)
            if self.finished is not None:
                self.scheduler.schedule_by(PARTICIPANT, FINISHED, now + self.finished_check_ms)
            await self.scheduler.sync()
        for key in sorted({i.key for i in items}):
            await self._emit(QueueEvent("admitted", key, tuple(i.id for i in items if i.key == key)))

    def _to_admit(self) -> list[Item]:
        """Admitted items whose admit() has not returned in this instance."""
        return [item for item in self.store.admitted() if item.id not in self._returned]

    async def _check_finished(self) -> None:
        if self.finished is None:
            return
        now = now_ms()
        cutoff = now - self.finished_check_ms
        due = sorted((at, item_id) for item_id, at in self._returned.items() if at <= cutoff)
        candidates = [item for item in (self.store.item(item_id) for _, item_id in due)
                      if item is not None and item.state == ADMITTED]
        for start in range(0, len(candidates), FINISHED_BATCH):
            chunk = candidates[start:start + FINISHED_BATCH]
            asked = {item.id: item for item in chunk}
            result = self.finished(list(asked))
            done = await result if inspect.isawaitable(result) else result
            finished_items = [asked[i] for i in done if i in asked]
            if finished_items:
                def release_all(finished_items: list[Item] = finished_items) -> None:
                    for item in finished_items:
                        current = self.store.item(item.id)
                        if current is not None and current.state == ADMITTED:
                            self._release(current)

                self.scheduler.transaction(release_all)
                await self.scheduler.sync()
                await self._report_at_once_if_contended({item.key for item in finished_items})
        self._schedule_finished(cutoff)
        await self.scheduler.sync()

    def _schedule_finished(self, asked_up_to: float) -> None:
        """Ask ``finished()`` about each item ``finished_check_ms`` after its
        ``admit()`` returned, and again at that interval.

        ``asked_up_to``: the sweep that just ran asked about items whose
        admit() returned by then; the next sweep is due for the first item
        not asked yet, or one interval on for the ones asked.
        """
        if self.finished is None:
            return
        not_asked = [at for at in self._returned.values() if at > asked_up_to]
        due = [min(not_asked) + self.finished_check_ms] if not_asked else []
        if len(not_asked) < len(self._returned):
            due.append(now_ms() + self.finished_check_ms)
        if due:
            self.scheduler.schedule(PARTICIPANT, FINISHED, min(due))
        else:
            self.scheduler.cancel(PARTICIPANT, FINISHED)

    async def _emit(self, event: QueueEvent) -> None:
        await notify(self.on_lifecycle_event, event, log, "queue lifecycle listener failed on %s", event.type)


def _oldest_of(demand: list[tuple[str, int, float]]) -> dict[str, float]:
    """Per group, the enqueue time of the oldest item of ``demand`` (``_demand``'s entries)."""
    return {group: oldest for group, _, oldest in demand}


def _with_heard_draws(lease: LocalLease, heard_drawn: int) -> LocalLease:
    """The holder heard of more draws than this instance counts: an older
    one made them, and their items are gone, so each was released (see
    lease_book). The holder heard no more draws than were made: every one
    it heard of beyond those counted here is one whose item went."""
    if heard_drawn <= lease.drawn:
        return lease
    # (A lease known from its items only took its permits as their count.)
    return replace(lease, permits=max(lease.permits, heard_drawn), drawn=heard_drawn,
                   released=heard_drawn - lease.in_use)


def _lease_report(lease: LocalLease) -> LeaseReport:
    """The lease's current counts, as the holder is told them."""
    return LeaseReport(lease.lease_id, lease.group, lease.permits, lease.drawn, lease.released, lease.stopped)


def _renew_at(now: float, ttl_ms: float) -> float:
    """Half a lease's lifetime from now: reported then, it never reaches its ttl unreported."""
    return now + max(ttl_ms / 2, MIN_RENEW_MS)

