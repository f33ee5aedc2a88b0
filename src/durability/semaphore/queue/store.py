"""The queue's storage: items, the keys' pacing rows, and every query on them.

Lives here: the SQL of ``DurabilitySemaphoreQueue`` (its tables and
their versions are ``queue/schema``'s), and the one writer of item states
(``move_item``, which refuses any move ``queue/pure/states.TRANSITIONS`` does
not allow, a delete included). Must not know: the protocol with the
holder, timers, or when anything happens.

Items are a WITHOUT ROWID table keyed by id with no secondary index: each
state change of an item writes one row (a draw from a lease writes only
its item). Finding the oldest queued items scans the
table; reads cost a thousandth of writes.

A released or cancelled item is kept ``keep_done_ms`` (so that enqueueing
its id again is a no-op and ``status`` still answers), then deleted. That
delete is one row written per item, and it keeps every scan of the table
the size of the recent work: kept for good, done items made each scan
longer with the object's whole history (a scan of n rows is billed n rows
read, and the queue scans its items dozens of times per item, so keeping
more than a few dozen done items costs more than deleting them). With
``keep_done_ms`` 0 a released item is deleted at once instead, and
its key keeps a pacing row while it may hold grants (``register_key``); the
key of every lease learned keeps one too, in every mode.

No row is kept for a grant (``queue/grant_book`` keeps them in memory): a
grant's confirmed and released counts are the counts of its items
admitted or released on it, scanned once and kept until an item's state
changes (``_all_counts``). The grant table older versions wrote is read
once (``legacy_grants``) and its rows deleted as their grants settle. No
row is kept for a lease either (``queue/lease_book``): its drawn and released
counts are its items' too (and, with ``keep_done_ms`` 0, draws whose
items went at their release, counted in memory); the lease rows older versions wrote are read
once (``legacy_leases``) and deleted as their leases settle.
Items a version before 4 moved to ``claiming`` keep that state until
answered and count as claimed too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Set as AbstractSet
from typing import Any

from ..._common.clock import now_ms
from ..._common.schema import migrate
from ..._common.sql import GrowingCounter, Sql
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
    PACING,
    SPOKEN,
    TABLES as TABLES,
    _holds_anything,
)

_LEASE_COLUMNS = "lease_id, key, grp, permits, drawn, released, stopped, ttl_ms, renew_at, settled_at"
_ITEM_COLUMNS = "id, key, grp, body, seq, enqueued_at, state, grant_id, via, admitted_at, draw"
_GRANT_COLUMNS = "grant_id, key, grp, permits, claimed, confirmed, released, claim_deadline"


def _item(row: dict[str, Any]) -> Item:
    return Item(row["id"], row["key"], row["grp"], json.loads(row["body"]), row["seq"],
                row["enqueued_at"], row["state"], row["grant_id"], row["via"], row["admitted_at"], row["draw"])


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
        self._seq = GrowingCounter(sql, f"SELECT max(seq) AS n FROM {ITEMS}")
        # Item state changes made through this store: the counts scanned
        # (_all_counts) hold until the next one, or until a transaction rolls
        # back (counts read inside it may include what it undid).
        self._changes = 0
        self._memo: tuple[tuple[int, int], dict[str, dict[str, Counts]]] | None = None
        # The same, with inserts too, for the queued and admitted items read
        # (demand and admit() passes read them a dozen times per job: about
        # 650 of the 1,080 rows a job read on the demo's workload).
        self._inserts = 0
        self._item_memo: tuple[tuple[int, int, int], dict[str | None, list[Any]]] = ((0, 0, -1), {})
        #: items this instance moved to admitted and not on since (a move
        #: rolled back may leave an id here: that item is not admitted, so
        #: nothing asks about it; if it is admitted later, it is by this instance)
        self.admitted_here: set[str] = set()

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
        if self.sql.one(f"SELECT since FROM {SPOKEN}") is None:
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
        # (A count, not LIMIT 1: with no index both scan the table, and the
        # embedded runtime bills a scan's reads as workerd does only in full.)
        count: int = self.sql.exec(f"SELECT count(*) AS n FROM {ITEMS} WHERE key = ?", key)[0]["n"]  # always one row
        return count > 0

    # -- items ----------------------------------------------------------------
    def item(self, item_id: str) -> Item | None:
        row = self.sql.one(f"SELECT {_ITEM_COLUMNS} FROM {ITEMS} WHERE id = ?", item_id)
        return None if row is None else _item(row)

    def insert(self, item_id: str, key: str, group: str, body_json: str, now: float) -> None:
        self._inserts += 1
        self.sql.exec(
            f"INSERT INTO {ITEMS} (id, key, grp, body, seq, enqueued_at, state) VALUES (?, ?, ?, ?, ?, ?, ?)",
            item_id, key, group, body_json, self._seq.next(), now, QUEUED,
        )

    def oldest_queued(self, key: str, group: str, limit: int, skip: int = 0) -> list[Item]:
        """The oldest ``limit`` queued items of a key and group after the first ``skip``."""
        rows = self.sql.exec(
            f"SELECT {_ITEM_COLUMNS} FROM {ITEMS} WHERE key = ? AND grp = ? AND state = ? "
            "ORDER BY seq LIMIT ? OFFSET ?",
            key, group, QUEUED, limit, skip,
        )
        return [_item(r) for r in rows]

    def place_in_line(self, item: Item) -> int:
        """How many queued items of its key and group are ahead of ``item``."""
        row = self.sql.one(f"SELECT count(*) AS n FROM {ITEMS} WHERE key = ? AND grp = ? AND state = ? AND seq < ?",
                           item.key, item.group, QUEUED, item.seq)
        return row["n"] if row else 0

    def demand(self, key: str, reserved: dict[str, int],
               times: int) -> list[tuple[str, int, float, tuple[float, ...]]]:
        """For one key, per group, the queued items past the first
        ``reserved[group]``: (group, their count, the oldest one's enqueue
        time, the enqueue times of the oldest ``times`` of them), oldest group first."""
        rows = self._read_once(key, lambda: [
            (row["grp"], row["enqueued_at"]) for row in self.sql.exec(
                f"SELECT grp, enqueued_at FROM {ITEMS} WHERE key = ? AND state = ? ORDER BY seq", key, QUEUED)])
        counts: dict[str, int] = {}
        oldest: dict[str, list[float]] = {}
        for group, enqueued_at in rows:
            seen = counts[group] = counts.get(group, 0) + 1
            if reserved.get(group, 0) < seen <= reserved.get(group, 0) + times:
                oldest.setdefault(group, []).append(enqueued_at)
        # Sorted: a clock that stepped back must not make the request malformed.
        demand = [(group, counts[group] - reserved.get(group, 0), min(at), tuple(sorted(at)))
                  for group, at in oldest.items()]
        return sorted(demand, key=lambda d: d[2])

    def keys_in(self, *states: str) -> list[str]:
        marks = ", ".join("?" * len(states))
        rows = self.sql.exec(f"SELECT DISTINCT key FROM {ITEMS} WHERE state IN ({marks}) ORDER BY key", *states)
        return [r["key"] for r in rows]

    def claiming(self, grant_id: str) -> list[Item]:
        rows = self.sql.exec(
            f"SELECT {_ITEM_COLUMNS} FROM {ITEMS} WHERE grant_id = ? AND state = ? ORDER BY seq",
            grant_id, CLAIMING,
        )
        return [_item(r) for r in rows]

    def move_item(self, item: Item, to: str, grant_id: str | None = None, via: str | None = None,
                  done_at: float | None = None, draw: int | None = None) -> None:
        """Write ``item``'s next state (``GONE`` deletes its row), as the life
        cycle allows; else ValueError, and nothing is written."""
        move(item.state, to)
        self._changes += 1
        if to == ADMITTED:
            self.admitted_here.add(item.id)
        else:
            self.admitted_here.discard(item.id)
        if to == GONE:
            self.sql.exec(f"DELETE FROM {ITEMS} WHERE id = ?", item.id)
            return
        # An admission's time rides in the same row (``AdmittedItem.admitted_at``).
        admitted_at = now_ms() if to == ADMITTED else None
        self.sql.exec(
            f"UPDATE {ITEMS} SET state = ?, grant_id = ?, via = ?, done_at = ?, draw = ?, "
            "admitted_at = coalesce(?, admitted_at) WHERE id = ?",
            to, grant_id, via, done_at, draw, admitted_at, item.id,
        )

    # -- done items: kept a while, then deleted ----------------------------------
    def oldest_done(self) -> float | None:
        """When the longest-done item was released or cancelled."""
        row = self.sql.one(f"SELECT min(done_at) AS t FROM {ITEMS} WHERE state IN (?, ?)", *DONE)
        return None if row is None else row["t"]

    def stamp_untimed(self, now: float) -> None:
        """Give the time ``now`` to items done before version 4 (no ``done_at``:
        kept ``keep_done_ms`` from the upgrade, like any done item) and to
        items admitted before their admission was timed (no ``admitted_at``:
        work sent elsewhere counts from it, and ``now`` is later than any send
        of it). One write per such item, once per object; one scan, as before."""
        self.sql.exec(
            f"UPDATE {ITEMS} SET done_at = CASE WHEN state = ? THEN done_at ELSE ? END, "
            "admitted_at = CASE WHEN state = ? THEN ? ELSE admitted_at END "
            "WHERE (state IN (?, ?) AND done_at IS NULL) OR (state = ? AND admitted_at IS NULL)",
            ADMITTED, now, ADMITTED, now, *DONE, ADMITTED,
        )

    def purge_done(self, before: float, limit: int, held: AbstractSet[str] = frozenset(),
                   held_keys: AbstractSet[str] = frozenset()) -> bool:
        """Delete up to ``limit`` items done at ``before`` or earlier, except those whose
        counts a grant (``held``) or lease still held here is made of (they go
        once it is settled), and those of ``held_keys``. True if more are due."""
        live = set(held) | {row["lease_id"] for row in self.sql.exec(f"SELECT lease_id FROM {LEASES}")}
        rows = self.sql.exec(
            f"SELECT id, key, grant_id, state FROM {ITEMS} WHERE state IN (?, ?) AND done_at <= ?", *DONE, before)
        due = [row for row in rows if row["grant_id"] not in live and row["key"] not in held_keys]
        self._changes += 1
        for row in due[:limit]:
            move(row["state"], GONE)  # (a done item may go: the table says so)
            self.sql.exec(f"DELETE FROM {ITEMS} WHERE id = ?", row["id"])
        return len(due) > limit

    def admitted(self) -> list[Item]:
        """Admitted items not yet released, oldest first."""
        rows = self._read_once(None, lambda: list(self.sql.exec(
            f"SELECT {_ITEM_COLUMNS} FROM {ITEMS} WHERE state = ? ORDER BY seq", ADMITTED)))
        return [_item(r) for r in rows]  # (each call its own bodies: admit() may change what it gets)

    def _read_once(self, key: str | None, read: Callable[[], list[Any]]) -> list[Any]:
        """What ``read()`` read of the key's queued items (None: the admitted
        ones), kept until an item is inserted or changes state through this
        store, or a transaction rolls back."""
        version = (self._changes, self._inserts, self.sql.rollbacks)
        if self._item_memo[0] != version:
            self._item_memo = (version, {})
        known = self._item_memo[1]
        if key not in known:
            known[key] = read()
        return known[key]

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
        """via -> id -> counts, from one scan of the items, kept until an item's
        state changes. (The queue asks for these counts many times per item;
        a scan reads every row of the table.)"""
        version = (self._changes, self.sql.rollbacks)
        if self._memo is None or self._memo[0] != version:
            rows = self.sql.exec(
                f"SELECT grant_id, via, key, grp, state, count(*) AS n, max(draw) AS last FROM {ITEMS} "
                "WHERE via IS NOT NULL AND state IN (?, ?, ?) GROUP BY grant_id, via, key, grp, state",
                CLAIMING, ADMITTED, RELEASED,
            )
            counts: dict[str, dict[str, Counts]] = {}
            for row in rows:
                by_id = counts.setdefault(row["via"], {})
                known = by_id.get(row["grant_id"]) or Counts(row["key"], row["grp"], {})
                known.by_state[row["state"]] = row["n"]
                by_id[row["grant_id"]] = known._replace(last_draw=max(known.last_draw, row["last"] or 0))
            self._memo = (version, counts)
        return self._memo[1]

    def legacy_grants(self) -> list[LocalGrant]:
        """Grant rows older versions wrote (no grant row is written since)."""
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
        rows = self.sql.exec(f"SELECT {_LEASE_COLUMNS} FROM {LEASES} ORDER BY lease_id")
        counts = self._counts(Via.LEASE) if rows else {}
        return [_lease(r, counts) for r in rows]

    def drop_lease(self, lease_id: str) -> None:
        self.sql.exec(f"DELETE FROM {LEASES} WHERE lease_id = ?", lease_id)
