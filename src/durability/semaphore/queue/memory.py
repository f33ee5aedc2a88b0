"""What every part of a queue shares: its memory, its options, and the one way it commits.

Lives here: ``QueueMemory`` (what an instance keeps in memory only, as a
new instance starts it), ``QueueOptions``, and ``QueueContext``: the
scheduler, store, books, memory and options the queue's parts share, with
``commit`` (one transaction, memory put back if it fails, then the alarm
moved), the item mover, the queue's timers by kind, the key's demand, and
``exchange`` (one ``sync`` sent, its reply parsed, its application
committed). Must not know: what a reply means (the parts apply it), SQL
(the store), or the public API.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from ..._common.clock import now_ms
from ...scheduler.alarm import DurabilityScheduler
from ..client import SemaphoreClient
from ..messages import MAX_DEMAND_TIMES, Demand, GrantEntry, Reply, Sync
from .grant_book import GrantBook
from .item_rows import ItemRow
from .lease_book import LeaseBook
from .pure.core import grid_at_or_after
from .pure.states import CANCELLED, DONE, QUEUED, Item, TimerKind, timer_key
from .store import QueueStore

T = TypeVar("T")
PARTICIPANT = "durability.semaphore-queue"
#: how long done items past ``keep_done_max`` may wait for their purge, and the
#: least they are kept (a caller asking again about work just done still finds it)
OVER_MAX_WAIT_MS = 3_600_000
#: a done item's purge waits its time to be kept and a thirtieth more (``QueueOptions.kept_for``)
PURGE_SLACK = 31 / 30
log = logging.getLogger("durability.semaphore.queue")


@dataclass(frozen=True)
class QueueOptions:
    attempt_timeout_ms: float
    finished_check_ms: float
    report_delay_ms: float
    request_wait_ms: float
    lease_report_delay_ms: float
    keep_done_ms: float
    #: the object answers its holder's calls (``hear``): requests say so, and
    #: a holder that can reach it answers at once and calls back with news
    woken: bool = False
    #: how long the object's own checks (admitted items handed in again by a
    #: new instance, the finished() sweep) may wait for its next event
    checks_wait_ms: float = 0.0
    #: how long an item released with a record is kept
    keep_records_ms: float = 0.0
    #: done items kept past their hour at most (None: as many as the times make)
    keep_done_max: int | None = None

    def kept_for(self) -> tuple[float, float]:
        """How long a done item, and one released with a record, waits for its
        purge: its time to be kept and a thirtieth more, so that the items done
        within that while go in one purge (an alarm and a run), not one each."""
        return self.keep_done_ms * PURGE_SLACK, self.keep_records_ms * PURGE_SLACK

    def purge_by(self, first_due: float, done_count: int, now: float) -> float:
        """When the purge is due, with the first done item due to go at
        ``first_due`` and ``done_count`` kept: then, or sooner, within
        ``OVER_MAX_WAIT_MS``, once more than ``keep_done_max`` are kept (so
        that one purge deletes an hour's worth, not one per release)."""
        if self.keep_done_max is not None and done_count > self.keep_done_max:
            return min(first_due, now + OVER_MAX_WAIT_MS)
        return first_due

    @property
    def settled_horizon_ms(self) -> float:
        """How long a settled grant or lease is remembered: longer than any
        reply can take (a reply is never applied later than its request's
        time limit, so one settled longer ago cannot be revived by one)."""
        return 2 * (self.attempt_timeout_ms + self.request_wait_ms)


@dataclass
class QueueMemory:
    """What an instance keeps in memory only. Every field is a container the
    commit copies before a transaction and puts back if it fails."""

    # Keys a new instance has not heard the holder about yet: claims an
    # older instance made there may have been confirmed unbeknown to this
    # one (see grant_book). Their done items are kept until it has. Later, a
    # request that failed leaves its key unheard too.
    unheard: set[str] = field(default_factory=set)
    # Keys whose first request in this instance is answered at its round, not
    # held: a holder that grants unclaimed permits (an older version) would
    # not take an earlier instance's claims for news.
    first_ask: set[str] = field(default_factory=set)
    #: per key, the latest claim deadline of the grants the holder listed
    #: here: grants made later, its next reply lists as news (heardUpTo)
    heard_up_to: dict[str, float] = field(default_factory=dict)
    #: leases whose report the holder may not have heard: id -> (key,
    #: version). A new instance reports every lease.
    lease_due: dict[str, tuple[str, int]] = field(default_factory=dict)
    blocked: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)
    contended: set[str] = field(default_factory=set)  #: keys whose holder last said it is short of permits
    # When admit() returned for each admitted item, in this instance. Not a
    # row: a new instance calls admit() again for every admitted item
    # (admit() is idempotent on item id), which saves a row written per
    # item; finished() is asked about an item only once admit() returned.
    returned: dict[str, float] = field(default_factory=dict)
    acked: dict[str, int] = field(default_factory=dict)  #: grant id -> released count the holder confirmed hearing
    #: keys whose holder's last reply listed every lease it counts here (a
    #: released drawn item's row may then go at once)
    all_listed: set[str] = field(default_factory=set)
    report_now: set[str] = field(default_factory=set)  #: keys with releases to report at once (contended)
    #: keys served while contended that hold no request (queue/pure/core.may_leave_line),
    #: with the line mark they left on: their next release rides on a request
    #: instead of a sync
    away: dict[str, dict[str, float]] = field(default_factory=dict)
    #: keys whose pump is due now to carry a release's report (lease reports wait for it)
    rejoining: set[str] = field(default_factory=set)
    #: lease id -> the version of its report a request in flight carries
    leases_in_flight: dict[str, int] = field(default_factory=dict)
    #: keys with a request on its way: its reply may bring as new a grant that
    #: another answer lists first as not new (``learn`` in ``queue/grants`` leaves it to the reply)
    asking: set[str] = field(default_factory=set)
    #: per key, the listings of grants so put off: decided once the request's reply is applied,
    #: as they would have been (``QueueGrants.decide_deferred``), whether or not that reply names them
    deferred: dict[str, list[GrantEntry]] = field(default_factory=dict)
    #: per key, its requests that failed in a row (queue/pure/core.ask_again_at_once)
    failures: dict[str, int] = field(default_factory=dict)
    #: per key, when its holder's last word (a reply, a call) came to this instance
    heard_at: dict[str, float] = field(default_factory=dict)
    #: woken keys whose last word listed claims too late to use (given back):
    #: the call that brought them failed, so the next request is a fallback
    gave_back: set[str] = field(default_factory=set)

    @classmethod
    def of_new_instance(cls, store: QueueStore) -> QueueMemory:
        # The keys unheard: those with queued or cancelled items, and the
        # keys with a row: without kept done items (keep_done_ms 0), the keys
        # that may hold grants; and the keys of leases (see lease_book).
        unheard = set(store.keys_in(QUEUED, CANCELLED)) | set(store.registered_keys())
        return cls(unheard=unheard, first_ask=set(unheard))

    def copy(self) -> QueueMemory:
        return QueueMemory(**{f.name: type(value)(value) for f in fields(self)
                              for value in [getattr(self, f.name)]})

    def put_back(self, copy: QueueMemory) -> None:
        """Be ``copy`` again, in place (whoever holds this memory sees it)."""
        for f in fields(self):
            setattr(self, f.name, getattr(copy, f.name))

    def heard(self, key: str, reply: Reply) -> None:
        """The holder's latest word on whether it is short of permits."""
        if reply.contended:
            self.contended.add(key)
        else:
            self.contended.discard(key)


async def _nothing() -> None:
    return None


class QueueContext:
    """The scheduler, store, books, memory and options a queue's parts share."""

    def __init__(self, scheduler: DurabilityScheduler, store: QueueStore, server: SemaphoreClient,
                 client_id: str, options: QueueOptions) -> None:
        self.scheduler = scheduler
        self.store = store
        self.server = server
        self.client_id = client_id
        self.options = options
        #: this object's name, if the instance knows one: a holder that calls back reaches it by it
        name = getattr(getattr(scheduler.ctx, "id", None), "name", None)
        self.object_name: str | None = name if isinstance(name, str) and name else None

        self.grants = GrantBook(store, remember_ms=options.settled_horizon_ms)
        self.lease_book = LeaseBook(store, options.settled_horizon_ms, now_ms())
        self.memory = QueueMemory.of_new_instance(store)
        #: how the grants part reads a sync's answer: every answer lists the
        #: client's grants (a round may just have made one for it), whichever
        #: part sent the sync, and a grant listed new is news once only
        self.learn_listed: Callable[[str, Reply], None] = lambda key, reply: None
        #: hands what the queue admitted to ``admit()`` (``Admission.admit_pending_safely``)
        self.admit_pending: Callable[[], Awaitable[None]] = _nothing
        #: run_in_this_event's tasks (a loop holds tasks weakly), each with the task that started it
        self._tasks: dict[asyncio.Task[None], asyncio.Task[Any] | None] = {}

    # -- commits ----------------------------------------------------------------
    async def commit(self, change: Callable[[], T], *, move_alarm: bool = True) -> T:
        """Run ``change`` in one transaction; then move the alarm to the
        earliest timer. If the transaction fails, memory (the queue's, the
        books', the scheduler's timers) is put back as it was: no memory
        ever stands for a write that did not happen. Nothing the queue keeps
        in memory may change inside a transaction but through here.

        ``move_alarm=False`` is for a change that only sets a timer no
        sooner than one already due (its alarm is set already)."""
        result = self.commit_now(change)
        if move_alarm:
            await self.scheduler.sync()
        return result

    def commit_now(self, change: Callable[[], T]) -> T:
        """``commit`` without moving the alarm: for the constructor (the
        scheduler's own check arms it once the instance is built)."""
        return self._undone_if_failed(lambda: self.scheduler.transaction(change))

    async def update(self, change: Callable[[], T]) -> T:
        """``commit`` for a change of memory and timers only, with no row to
        write: no transaction is opened (an empty one still costs a write
        batch, and a crash can strike it)."""
        result = self._undone_if_failed(change)
        await self.scheduler.sync()
        return result

    def _undone_if_failed(self, run: Callable[[], T]) -> T:
        memory, grants, leases = self.memory.copy(), self.grants.snapshot(), self.lease_book.snapshot()
        timers = self.scheduler.memory_snapshot()
        try:
            return run()
        except BaseException:
            self.memory.put_back(memory)
            self.grants.restore(grants)
            self.lease_book.restore(leases)
            self.scheduler.memory_restore(timers)
            raise

    # -- inside a commit: item moves and timers ----------------------------------------
    def move(self, item: Item | ItemRow, state: str, grant_id: str | None = None, via: str | None = None,
             draw: int | None = None, record: str | None = None) -> None:
        """Write an item's next state, as the life cycle (queue/pure/states.TRANSITIONS) allows
        (``record``: what a released item keeps of its work)."""
        done_at = None
        if state in DONE:
            done_at = now_ms()
            keep_ms = self.options.kept_for()[record is not None]
            self.due_by(TimerKind.PURGE, None, self.options.purge_by(done_at + keep_ms, self.store.done_count() + 1,
                                                                     done_at))
        self.store.move_item(item, state, grant_id, via, done_at, draw, record)

    def due_at(self, kind: TimerKind, key: str | None, at: float, *, alarm_by: float | None = None) -> None:
        """The timer fires at ``at``, whatever time it had (``alarm_by``: see ``DurabilityScheduler.schedule_by``)."""
        self.scheduler.schedule(PARTICIPANT, timer_key(kind, key), at, alarm_by=alarm_by)

    def due_by(self, kind: TimerKind, key: str | None, at: float, *, alarm_by: float | None = None,
               covered: bool = False) -> None:
        """The timer fires no later than ``at``: an earlier time is kept
        (``covered``: see ``DurabilityScheduler.schedule_by``)."""
        self.scheduler.schedule_by(PARTICIPANT, timer_key(kind, key), at, alarm_by=alarm_by, covered=covered)

    @property
    def fallback_phase_ms(self) -> float:
        """Where this object's fallback points fall in each ``request_wait_ms``:
        fixed by its client id, so that every instance derives the same
        points and the objects of a holder do not all ask at once."""
        every = max(1, int(self.options.request_wait_ms))
        return float(zlib.crc32(self.client_id.encode()) % every)

    def pump_at(self, key: str, at: float, *, earlier_only: bool = False, in_this_event: bool = False,
                fallback_point: bool = False) -> None:
        """The key's pump runs at ``at`` (no later: ``earlier_only``). A woken
        key's fallback (half a request wait off or more) is due then, for any
        event or alarm run that comes, but moves the alarm no sooner than the
        object's next fallback point, and no word from the holder puts it
        off: the keys of one object share one alarm run per
        ``request_wait_ms``. Each fallback set apart cost its own run and a
        row to set the alarm again, and each word from the holder that put a
        fallback off left an alarm to fire for nothing (docs/queue.md).
        ``in_this_event``: the caller runs the pump itself once its commit is
        done (``KeyRequests.ask_in_this_event``); the alarm is its backstop,
        at the fallback point the answer's own fallback will want.
        ``fallback_point``: ``at`` is the object's fallback point a new
        instance derived for a key its rows say waits, which an earlier
        instance with the key waiting kept the alarm at or before
        (``covered``, see ``DurabilityScheduler.schedule_by``)."""
        alarm_by = None
        every = self.options.request_wait_ms
        if in_this_event:
            alarm_by = grid_at_or_after(at + every, every, self.fallback_phase_ms) if every > 0 else at
        elif self.options.woken and every > 0 and at - now_ms() >= every / 2:
            alarm_by = grid_at_or_after(at, every, self.fallback_phase_ms)
            earlier_only = True
        if earlier_only:
            self.due_by(TimerKind.PUMP, key, at, alarm_by=alarm_by, covered=fallback_point)
        else:
            self.due_at(TimerKind.PUMP, key, at, alarm_by=alarm_by)

    def run_in_this_event(self, kind: TimerKind, key: str | None = None) -> None:
        """Run the timer now, in a task of the caller's event, if it is due
        (``DurabilityScheduler.run_now``): work an event makes due and does
        itself sets no alarm to now (a row, an alarm run and a row to set it
        back). The caller need not wait; the object stays awake (and billed)
        until the task ends, as for an alarm run. A failure is retried from
        the alarm, under the timer's backoff. Outside a running loop (no
        event), its alarm runs it."""
        self.in_this_event(lambda: self._run_now(timer_key(kind, key)))

    def in_this_event(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work()`` in a task of the caller's event (none outside one):
        what it does must also be owed by the rows, for a later event to do
        should this one end first."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        task = loop.create_task(self._logged(work))
        self._tasks[task] = asyncio.current_task()
        task.add_done_callback(lambda done: self._tasks.pop(done, None))

    async def own_work_done(self, timeout_s: float) -> None:
        """Wait, ``timeout_s`` at most, until the work the calling task left to
        tasks of its own (``in_this_event``) has ended: not other events'
        (an enqueue's request may be held at its holder for minutes)."""
        caller = asyncio.current_task()
        own = [task for task, starter in self._tasks.items() if starter is caller]
        if own:
            await asyncio.wait(own, timeout=timeout_s)

    @staticmethod
    async def _logged(work: Callable[[], Awaitable[None]]) -> None:
        try:
            await work()
        except Exception as error:  # what it owed is owed still: a later event does it
            log.warning("the queue's work in this event failed: %r", error)

    async def _run_now(self, name: str) -> None:
        try:
            await self.scheduler.run_now(PARTICIPANT, name)
            await self.scheduler.sync()
        except Exception as error:  # its timer is due all the same: the next alarm or sync runs it
            log.warning("the queue's timer %s failed: %r; the alarm runs it again", name, error)

    def admit_in_this_event(self) -> None:
        """Admitted items are handed to ``admit()`` now, by the event that
        admitted them (a reply's or a report's, once its commit is done):
        the admit timer is due now but moves no alarm before the key's
        fallback would. Setting the alarm to now for a pass already under
        way cost a row, an alarm run and a row to set it back; the alarm
        stays the backstop for an event cut short (``request_wait_ms`` at
        most, and a new instance admits at its start)."""
        now = now_ms()
        self.due_by(TimerKind.ADMIT, None, now, alarm_by=now + self.options.request_wait_ms)

    def is_due(self, kind: TimerKind, key: str | None = None, by: float | None = None) -> bool:
        """Whether the timer is set and due (by ``by``, else now)."""
        timer = self.scheduler.timer(PARTICIPANT, timer_key(kind, key))
        return timer is not None and timer.due_at <= (now_ms() if by is None else by)

    def cancel(self, kind: TimerKind, key: str | None = None) -> None:
        self.scheduler.cancel(PARTICIPANT, timer_key(kind, key))

    # -- reads ------------------------------------------------------------------------
    def reserved(self, key: str) -> dict[str, int]:
        """Per group, how many of the oldest queued items claims hold (they are ``claiming``)."""
        reserved: dict[str, int] = {}
        for grant in self.grants.grants(key):
            if grant.pending > 0:
                reserved[grant.group] = reserved.get(grant.group, 0) + grant.pending
        return reserved

    def demand(self, key: str) -> list[Demand]:
        """Per group, the key's items waiting for a permit, oldest group first."""
        return [Demand(*entry) for entry in self.store.demand(key, self.reserved(key), MAX_DEMAND_TIMES)]

    def waiting_groups(self, key: str) -> set[str]:
        return {d.group for d in self.demand(key)}

    # -- the holder ---------------------------------------------------------------------
    async def send_sync(self, key: str, sync: Sync) -> Reply:
        """Send ``sync`` to the key's holder and read its reply (raises if it
        fails, times out, or is malformed)."""
        return Reply.parse(await asyncio.wait_for(
            self.server.sync(key, sync.to_wire()), self.options.attempt_timeout_ms / 1000), "synced")

    async def exchange(self, key: str, sync: Sync, apply: Callable[[Reply], None]) -> Reply:
        """``send_sync``, then commit ``apply(reply)`` and the grants it
        lists: nothing is applied unless a well-formed reply came. What they
        admit is handed to ``admit()`` in this event, with no alarm set for it."""
        reply = await self.send_sync(key, sync)

        def apply_all() -> None:
            apply(reply)
            self.learn_listed(key, reply)

        await self.commit(apply_all)
        await self.admit_pending()
        return reply

