"""The queue's vocabulary: item states and the one table of their moves, timer kinds, and the records.

Lives here: ``ItemState`` and ``TRANSITIONS`` (the item life cycle, with
``GONE`` for a deleted row, so that a delete is a move like any other),
``Via`` (how an item was admitted), ``TimerKind`` and the timer keys it
spells, the records the store reads and the books keep (``Item``,
``LocalGrant``, ``LocalLease``, ``Counts``), and what a listener hears
(``QueueEvent``). Must not know: storage, the wire, timers' times or the clock; it imports only the standard library,
so the store, the books and the pure core can all share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple


class ItemState(StrEnum):
    """An item's state. Every state but ``GONE`` is stored in the item's row."""

    QUEUED = "queued"
    CLAIMING = "claiming"  #: written by versions before 4; a claim now holds queued items with no write
    ADMITTED = "admitted"
    RELEASED = "released"
    CANCELLED = "cancelled"
    GONE = "gone"  #: its row deleted: purged once done, or deleted at its release (``keep_done_ms`` 0)


QUEUED, CLAIMING, ADMITTED, RELEASED, CANCELLED, GONE = ItemState
DONE = (RELEASED, CANCELLED)
STORED = tuple(state for state in ItemState if state != GONE)

#: state -> the states an item may move to from it. The store refuses any
#: other write, a delete included.
TRANSITIONS: dict[str, frozenset[str]] = {
    # A claim writes no item (it holds the oldest queued ones in line order):
    # the holder's confirmation admits them, as a lease draw does.
    QUEUED: frozenset({ADMITTED, CANCELLED}),
    # Items versions before 4 wrote as claiming: the holder confirmed, or refused.
    CLAIMING: frozenset({ADMITTED, QUEUED}),
    # Deleted at once when its release need not be kept (keep_done_ms 0).
    ADMITTED: frozenset({RELEASED, GONE}),
    RELEASED: frozenset({GONE}),  # purged keep_done_ms after its release
    CANCELLED: frozenset({GONE}),
    GONE: frozenset(),
}


def move(state: str, to: str) -> str:
    """The new state, if the life cycle allows it; else ValueError (nothing is written)."""
    if to not in TRANSITIONS.get(state, frozenset()):
        raise ValueError(f"an item cannot go from {state} to {to}")
    return to


class Via(StrEnum):
    """How an item was admitted."""

    GRANT = "grant"  #: on a claim the holder confirmed
    LEASE = "lease"  #: drawn from a lease, with no round trip


class TimerKind(StrEnum):
    """What a queue timer does when it fires. Per-key kinds spell ``kind:key``."""

    ADMIT = "admit"  #: call admit() for admitted items it has not returned for
    FINISHED = "finished"  #: ask finished() about items running long enough
    PURGE = "purge"  #: delete items done keep_done_ms ago
    RENEW = "renew"  #: report leases at half their lifetime
    PUMP = "pump"  #: per key: draw, claim, and ask the holder
    REPORT = "report"  #: per key: send grant reports the holder may not have heard
    LEASE_REPORT = "lease-report"  #: per key: send lease reports the holder may not have heard


PER_KEY = frozenset({TimerKind.PUMP, TimerKind.REPORT, TimerKind.LEASE_REPORT})


def timer_key(kind: TimerKind, key: str | None = None) -> str:
    """The scheduler's key for a timer of ``kind`` (of semaphore ``key``, for a per-key kind)."""
    if (kind in PER_KEY) != (key is not None):
        raise ValueError(f"a {kind} timer {'needs' if kind in PER_KEY else 'takes no'} key")
    return kind.value if key is None else f"{kind.value}:{key}"


def parse_timer_key(spelled: str) -> tuple[TimerKind, str | None]:
    """``timer_key``'s inverse; ValueError for a key no queue timer spells."""
    kind, sep, key = spelled.partition(":")
    timer = TimerKind(kind)
    if (timer in PER_KEY) != bool(sep):
        raise ValueError(f"not a queue timer key: {spelled!r}")
    return timer, (key if sep else None)


@dataclass(frozen=True)
class Item:
    id: str
    key: str
    group: str
    body: Any
    seq: int
    enqueued_at: float
    state: str
    grant_id: str | None
    via: str | None
    admitted_at: float | None
    draw: int | None = None  #: drawn from a lease: the draw's number in it (schema version 5 on)


@dataclass(frozen=True)
class LocalGrant:
    grant_id: str
    key: str
    group: str
    permits: int  #: as the holder last said
    claimed: int  #: claims made here (cumulative): its items claiming, admitted or released
    confirmed: int  #: claims the holder confirmed: its items admitted or released
    released: int  #: releases made here (cumulative): its items released
    claim_deadline: float
    claiming_rows: int = 0  #: items written as claiming (versions before 4)
    #: claims confirmed with no queued item left to admit: released at once
    #: (counted in ``confirmed`` and ``released``)
    extra: int = 0

    @property
    def pending(self) -> int:
        """Claims the holder has not answered that hold queued items (not claiming rows)."""
        return self.claimed - self.confirmed - self.claiming_rows

    @property
    def unclaimed(self) -> int:
        return self.permits - self.claimed


@dataclass(frozen=True)
class LocalLease:
    lease_id: str
    key: str
    group: str
    permits: int  #: as issued
    drawn: int  #: permits drawn here (cumulative); a drawn permit is never drawn again
    released: int  #: drawn permits given back (cumulative)
    stopped: bool  #: no more draws: retired by the holder, or returned by this queue
    ttl_ms: float
    renew_at: float  #: when to report it again (half its lifetime after the last answer)
    settled_at: float | None  #: settled, in a row an older version kept (a settled lease's row now goes at once)

    @property
    def undrawn(self) -> int:
        return 0 if self.stopped or self.settled_at is not None else self.permits - self.drawn

    @property
    def in_use(self) -> int:
        return self.drawn - self.released


class Counts(NamedTuple):
    """The items admitted on one grant or drawn on one lease, counted."""

    key: str
    group: str
    by_state: dict[str, int]  #: item state -> count
    last_draw: int = 0  #: a lease's: the highest draw number of its items


@dataclass(frozen=True)
class QueueEvent:
    """What a queue's lifecycle listener hears."""

    type: str  #: "admitted", "released", "blocked"
    key: str
    ids: tuple[str, ...] = ()
    blocked: dict[str, dict[str, Any]] | None = None  #: group -> {"reason", "waiting"}, for "blocked"
