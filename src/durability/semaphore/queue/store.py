"""The queue's storage: items, the keys' pacing rows, and every query on them.

Lives here: the SQL of ``DurabilitySemaphoreQueue`` (its tables and
their versions are ``queue/schema``'s), and the one writer of item states
(``move_item``, which refuses any move ``queue/pure/states.TRANSITIONS`` does
not allow, a delete included). Must not know: the protocol with the
holder, timers, or when anything happens.

Items are a WITHOUT ROWID table keyed by id with no secondary index: each
state change of an item writes one row (a draw from a lease writes only
its item). The store reads the table once per instance, every column
but the bodies, and keeps what it read in step with its own writes
(``queue/item_rows``): every question about the items is answered in
memory, and a body is read by id when its item is handed out.

A released or cancelled item is kept ``keep_done_ms`` (so that enqueueing
its id again is a no-op and ``status`` still answers), then deleted. That
delete is one row written per item, and it keeps each instance's read of
the table the size of the recent work: kept for good, done items would
make it longer with the object's whole history (a scan of n rows is
billed n rows read, and an object that hibernates between events reads
its items once per event). With
``keep_done_ms`` 0 a released item is deleted at once instead, and
its key keeps a pacing row while it may hold grants (``register_key``); the
key of every lease learned keeps one too, in every mode.

No row is kept for a grant (``queue/grant_book`` keeps them in memory): a
grant's confirmed and released counts are the counts of its items
admitted or released on it, counted from the rows kept and again when an
item's state changes (``_all_counts``). The grant table older versions wrote is read
once (``legacy_grants``) and its rows deleted as their grants settle. No
row is kept for a lease either (``queue/lease_book``): its drawn and released
counts are its items' too (and, with ``keep_done_ms`` 0, draws whose
items went at their release, counted in memory); the lease rows older versions wrote are read
once (``legacy_leases``) and deleted as their leases settle.
Items a version before 4 moved to ``claiming`` keep that state until
answered and count as claimed too.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Set as AbstractSet
from typing import Any

from ..._common.clock import now_ms
from ..._common.schema import migrate, schema_version
from ..._common.sql import Sql
from .item_rows import COLUMNS as ROW_COLUMNS, ItemRow, ItemRows, queued_of
from .pure.states import (
    ADMITTED,
    CLAIMING,
    DONE,
    GONE,
    QUEUED,
    RELEASED,
    Counts,
    Item,
    LocalGrant,
    LocalLease,
    Via,
    move,
)
from .schema import (
    _SCHEMA,
    COMPONENT as COMPONENT,
    GRANTS,
    ITEMS,
    LABEL,
    LEASES,
    LEGACY,
    PACING,
    SPOKEN,
    TABLES as TABLES,
    _holds_anything,
)

_LEASE_COLUMNS = "lease_id, key, grp, permits, drawn, released, stopped, ttl_ms, renew_at, settled_at"
_GRANT_COLUMNS = "grant_id, key, grp, permits, claimed, confirmed, released, claim_deadline"


def _legacy_grant(row: dict[str, Any]) -> LocalGrant:
    return LocalGrant(row["grant_id"], row["key"], row["grp"], row["permits"], row["claimed"], 0, 0,
                      row["claim_deadline"])


def _lease(row: dict[str, Any], counts: dict[str, Counts]) -> LocalLease:
    # Drawn and released are the lease's items admitted or released (see the
    # module's docstring); the row's own counts hold for versions before 4.
    by_state = counts[row["lease_id"]].by_state if row["lease_id"] in counts else {}
    released = max(row["released"], by_state.get(RELEASED, 0))
    drawn = max(row["drawn"], by_state.get(ADMITTED, 0) + by_state.get(RELEASED, 0))
    return LocalLease(row["lease_id"], row["key"], row["grp"], row["permits"], drawn, released,
                      bool(row["stopped"]), row["ttl_ms"], row["renew_at"], row["settled_at"])


class QueueStore:
    def __init__(self, sql: Sql) -> None:
        self.sql = sql
        migrate(sql, COMPONENT, _SCHEMA)
        #: made before version 9: it has the tables older versions wrote to (``queue/schema``)
        self.legacy = schema_version(sql, LEGACY) > 0
        self._rows_version = sql.rollbacks
        self._item_rows = self._read_rows()
        # Read now and not at the first number: a number this instance read
        # before its first write (a message version held by a call in
        # flight) stays below every one it hands out, even once that row is deleted.
        self._seq = itertools.count(self._item_rows.max_seq() + 1)
        # Item state changes made through this store: the counts (_all_counts)
        # hold until the next one, or until the rows are read again.
        self._changes = 0
        self._memo: tuple[tuple[int, int], dict[str, dict[str, Counts]]] | None = None
        #: items this instance moved to admitted and not on since (a move
        #: rolled back may leave an id here: that item is not admitted, so
        #: nothing asks about it; if it is admitted later, it is by this instance)
        self.admitted_here: set[str] = set()

    def _read_rows(self) -> ItemRows:
        return ItemRows(self.sql.exec(f"SELECT {ROW_COLUMNS} FROM {ITEMS}"))

    @property
    def rows(self) -> ItemRows:
        """The items' rows (``queue/item_rows``), read again after a transaction
        rolled back: what this instance kept may include what it undid."""
        if self._rows_version != self.sql.rollbacks:
            self._rows_version = self.sql.rollbacks
            self._item_rows = self._read_rows()
        return self._item_rows

    # -- how the queue speaks to its holders ---------------------------------------
    def label(self, given: str | None) -> str | None:
        """The label the queue speaks under: ``given``, kept; or, given none,
        the one kept. An instance reached by its id alone does not know its
        object's name, and a label its user made from that name would be
        missing: the queue would speak as another client and strand what it
        holds. One row read per start; one written when the label changes
        (once in an object's life, in the usual case)."""
        row = self.sql.one(f"SELECT label FROM {LABEL}")
        kept = None if row is None else str(row["label"])
        if given is None or given == kept:
            return kept

        def keep() -> None:
            self.sql.exec(f"DELETE FROM {LABEL}")
            self.sql.exec(f"INSERT INTO {LABEL} (label) VALUES (?)", given)

        self.sql.transaction(keep)
        return given

    def spoken_as_given(self) -> bool:
        """True while the queue must speak as the client_id it was given, as
        versions before 6 did: it held something at the upgrade, and has held
        something at every start since. The row goes at the first start that
        finds nothing held (no item, no key row, no older grant or lease row):
        one row read per start, and two writes in an object's life at most."""
        if not self.legacy or self.sql.one(f"SELECT since FROM {SPOKEN}") is None:
            return False
        if _holds_anything(self.sql):
            return True
        self.sql.transaction(lambda: self.sql.exec(f"DELETE FROM {SPOKEN}"))
        return False

    # -- pacing -----------------------------------------------------------------
    def pacing(self, key: str) -> float | None:
        row = self.sql.one(f"SELECT interval_ms FROM {PACING} WHERE key = ?", key)
        return None if row is None else row["interval_ms"]

    def set_pacing(self, key: str, interval_ms: float) -> None:
        """Keep the key's pacing interval; a row is written only when it changes."""
        self.sql.exec(
            f"INSERT INTO {PACING} (key, interval_ms) VALUES (?, ?) ON CONFLICT (key) "
            f"DO UPDATE SET interval_ms = excluded.interval_ms WHERE {PACING}.interval_ms != excluded.interval_ms",
            key, interval_ms,
        )

    # -- keys that may hold grants or leases ----------------------------------------
    # A pacing row stands for its key: written (interval 0) before the key's
    # first request when done items are not kept, and when a lease of the key
    # is learned; deleted at an instance's first ask that finds the key
    # holding nothing here. A new instance asks about every key with a row:
    # nothing else tells it of grants it admitted on and deleted, or of
    # leases it drew nothing from (neither has a row).
    def register_key(self, key: str) -> None:
        """One row written per key until it is unregistered; none after."""
        self.sql.exec(f"INSERT INTO {PACING} (key, interval_ms) VALUES (?, 0) ON CONFLICT (key) DO NOTHING", key)

    def registered_keys(self) -> list[str]:
        return [r["key"] for r in self.sql.exec(f"SELECT key FROM {PACING} ORDER BY key")]

    def unregister_key(self, key: str) -> None:
        self.sql.exec(f"DELETE FROM {PACING} WHERE key = ?", key)

    def has_items(self, key: str) -> bool:
        """Has the key any item but those kept for their record?"""
        return self.rows.has_key(key)

    # -- items ----------------------------------------------------------------
    def item(self, item_id: str) -> Item | None:
        row = self.rows.get(item_id)
        return None if row is None else self._items([row])[0]

    def insert(self, item_id: str, key: str, group: str, body_json: str, now: float) -> None:
        seq = next(self._seq)
        self.sql.exec(
            f"INSERT INTO {ITEMS} (id, key, grp, body, seq, enqueued_at, state) VALUES (?, ?, ?, ?, ?, ?, ?)",
            item_id, key, group, body_json, seq, now, QUEUED,
        )
        self.rows.inserted(ItemRow(item_id, key, group, seq, now, QUEUED))

    def oldest_queued(self, key: str, group: str, limit: int, skip: int = 0) -> list[ItemRow]:
        """The oldest ``limit`` queued items of a key and group after the first
        ``skip`` (their rows, bodies left out: a claim counts them, an admission moves them)."""
        return self.rows.in_state(QUEUED, key, group)[skip:skip + limit]

    def place_in_line(self, item: Item) -> int:
        """How many queued items of its key and group are ahead of ``item``."""
        return sum(1 for row in self.rows.in_state(QUEUED, item.key, item.group) if row.seq < item.seq)

    def demand(self, key: str, reserved: dict[str, int],
               times: int) -> list[tuple[str, int, float, tuple[float, ...]]]:
        """For one key, per group, the queued items past the first
        ``reserved[group]``: (group, their count, the oldest one's enqueue
        time, the enqueue times of the oldest ``times`` of them), oldest group first."""
        counts: dict[str, int] = {}
        oldest: dict[str, list[float]] = {}
        for group, enqueued_at in queued_of(self.rows, key):
            seen = counts[group] = counts.get(group, 0) + 1
            if reserved.get(group, 0) < seen <= reserved.get(group, 0) + times:
                oldest.setdefault(group, []).append(enqueued_at)
        # Sorted: a clock that stepped back must not make the request malformed.
        demand = [(group, counts[group] - reserved.get(group, 0), min(at), tuple(sorted(at)))
                  for group, at in oldest.items()]
        return sorted(demand, key=lambda d: d[2])

    def keys_in(self, *states: str) -> list[str]:
        return self.rows.keys_in(states)

    def claiming(self, grant_id: str) -> list[Item]:
        return self._items(self.rows.in_state(CLAIMING, grant_id=grant_id))

    def move_item(self, item: Item | ItemRow, to: str, grant_id: str | None = None, via: str | None = None,
                  done_at: float | None = None, draw: int | None = None, record: str | None = None) -> None:
        """Write ``item``'s next state (``GONE`` deletes its row), as the life
        cycle allows, with the ``record`` (JSON) a released item keeps; else
        ValueError, and nothing is written."""
        move(item.state, to)
        self._changes += 1
        if to == ADMITTED:
            self.admitted_here.add(item.id)
        else:
            self.admitted_here.discard(item.id)
        if to == GONE:
            self.sql.exec(f"DELETE FROM {ITEMS} WHERE id = ?", item.id)
            self.rows.moved(item.id, GONE)
            return
        # An admission's time rides in the same row (``AdmittedItem.admitted_at``).
        admitted_at = now_ms() if to == ADMITTED else None
        self.sql.exec(
            f"UPDATE {ITEMS} SET state = ?, grant_id = ?, via = ?, done_at = ?, draw = ?, "
            "admitted_at = coalesce(?, admitted_at), record = ? WHERE id = ?",
            to, grant_id, via, done_at, draw, admitted_at, record, item.id,
        )
        row = self.rows.get(item.id)
        self.rows.moved(item.id, to, grant_id=grant_id, via=via, done_at=done_at, draw=draw,
                        recorded=record is not None,
                        admitted_at=admitted_at if admitted_at is not None or row is None else row.admitted_at)

    # -- done items: kept a while, then deleted ----------------------------------
    def first_purge_at(self, keep_ms: float, keep_records_ms: float) -> float | None:
        """When the first done item's purge comes: ``keep_ms`` after it was done,
        ``keep_records_ms`` for one released with a record."""
        return min((row.done_at + (keep_records_ms if row.recorded else keep_ms)
                    for row in self.rows.done() if row.done_at is not None), default=None)

    def done_count(self) -> int:
        return len(self.rows.done())

    def record(self, item_id: str) -> str | None:
        """The record (JSON) an item released with one keeps; None for any other item (a row read)."""
        row = self.sql.one(f"SELECT record FROM {ITEMS} WHERE id = ?", item_id)
        return None if row is None else row["record"]

    def stamp_untimed(self, now: float) -> None:
        """Give the time ``now`` to items done before version 4 (no ``done_at``:
        kept ``keep_done_ms`` from the upgrade, like any done item) and to
        items admitted before their admission was timed (no ``admitted_at``:
        work sent elsewhere counts from it, and ``now`` is later than any send
        of it). One write per such item, once per object; no read when there is none."""
        if not self.rows.untimed():
            return
        self.sql.exec(
            f"UPDATE {ITEMS} SET done_at = CASE WHEN state = ? THEN done_at ELSE ? END, "
            "admitted_at = CASE WHEN state = ? THEN ? ELSE admitted_at END "
            "WHERE (state IN (?, ?) AND done_at IS NULL) OR (state = ? AND admitted_at IS NULL)",
            ADMITTED, now, ADMITTED, now, *DONE, ADMITTED,
        )
        self.rows.stamped(now)

    def purge_done(self, before: tuple[float, float], limit: int, held: AbstractSet[str] = frozenset(),
                   held_keys: AbstractSet[str] = frozenset(), over: int = 0, over_before: float = 0.0) -> bool:
        """Delete up to ``limit`` items done at ``before`` or earlier (its
        second time for those released with a record), and of the ``over``
        done longest ago those done at ``over_before`` or earlier, in the
        order they were enqueued, except those whose counts a grant
        (``held``) or lease still held here is made of (they go once it is
        settled), and those of ``held_keys``. True if more are due."""
        live = set(held)
        if self.legacy:
            live |= {row["lease_id"] for row in self.sql.exec(f"SELECT lease_id FROM {LEASES}")}
        free = [(row.done_at, row) for row in self.rows.done() if row.done_at is not None
                and row.grant_id not in live and row.key not in held_keys]
        oldest = sorted(free, key=lambda pair: pair[0])[:over]
        overflow = {row.id for done_at, row in oldest if done_at <= over_before}
        due = [row for done_at, row in free if done_at <= before[row.recorded] or row.id in overflow]
        self._changes += 1
        for row in due[:limit]:
            move(row.state, GONE)  # (a done item may go: the table says so)
            self.sql.exec(f"DELETE FROM {ITEMS} WHERE id = ?", row.id)
            self.rows.moved(row.id, GONE)
        return len(due) > limit

    def has_admitted(self) -> bool:
        return bool(self.rows.in_state(ADMITTED))

    def admitted(self) -> list[Item]:
        """Admitted items not yet released, oldest first."""
        return self._items(self.rows.in_state(ADMITTED))  # (each call its own bodies: admit() may change them)

    def _items(self, rows: list[ItemRow]) -> list[Item]:
        """The items of ``rows``, with their bodies: an admitted item's kept once
        read, any other read by id (a row read each; bodies can be large, and
        most items are read whole only when they are handed out)."""
        # (One statement per id: workerd bills an IN list two rows read per value, a key's search one.)
        read = {row.id: self.sql.exec(f"SELECT body FROM {ITEMS} WHERE id = ?", row.id)[0]["body"]
                for row in rows if self.rows.body(row.id) is None}
        items = []
        for row in rows:
            body = self.rows.body(row.id) or read[row.id]
            self.rows.keep_body(row.id, body)
            items.append(Item(row.id, row.key, row.grp, json.loads(body), row.seq, row.enqueued_at, row.state,
                              row.grant_id, row.via, row.admitted_at, row.draw))
        return items

    # -- grants: counted from their items (the terms live in memory, grant_book) --
    def grant_counts(self, key: str | None = None, grant_id: str | None = None) -> dict[str, Counts]:
        """grant id -> (key, group, item state -> count), for the items claimed
        on grants (of one key, or one grant, or all)."""
        return self._counts(Via.GRANT, key, grant_id)

    def _counts(self, via: str, key: str | None = None, grant_id: str | None = None) -> dict[str, Counts]:
        """grant or lease id -> (key, group, item state -> count), for the items
        admitted ``via`` a grant or a lease (of one key, or one id, or all)."""
        counts = self._all_counts().get(via, {})
        if grant_id is not None:
            return {grant_id: counts[grant_id]} if grant_id in counts else {}
        return dict(counts) if key is None else {i: c for i, c in counts.items() if c.key == key}

    def _all_counts(self) -> dict[str, dict[str, Counts]]:
        """via -> id -> counts, counted once and kept until an item's state
        changes. (The queue asks for these counts many times per item.)"""
        version = (self._changes, self.sql.rollbacks)
        if self._memo is None or self._memo[0] != version:
            self._memo = (version, self.rows.counts())
        return self._memo[1]

    def legacy_grants(self) -> list[LocalGrant]:
        """Grant rows older versions wrote (no grant row is written since)."""
        if not self.legacy:
            return []
        return [_legacy_grant(r) for r in self.sql.exec(f"SELECT {_GRANT_COLUMNS} FROM {GRANTS} ORDER BY grant_id")]

    def delete_grant(self, grant_id: str) -> None:
        self.sql.exec(f"DELETE FROM {GRANTS} WHERE grant_id = ?", grant_id)

    # -- leases ---------------------------------------------------------------
    def lease_counts(self, key: str | None = None, lease_id: str | None = None) -> dict[str, Counts]:
        """lease id -> (key, group, item state -> count), for the items drawn
        on leases (of one key, or one lease, or all)."""
        return self._counts(Via.LEASE, key, lease_id)

    def legacy_leases(self) -> list[LocalLease]:
        """Lease rows older versions wrote (no lease row is written since)."""
        if not self.legacy:
            return []
        rows = self.sql.exec(f"SELECT {_LEASE_COLUMNS} FROM {LEASES} ORDER BY lease_id")
        counts = self._counts(Via.LEASE) if rows else {}
        return [_lease(r, counts) for r in rows]

    def drop_lease(self, lease_id: str) -> None:
        self.sql.exec(f"DELETE FROM {LEASES} WHERE lease_id = ?", lease_id)
