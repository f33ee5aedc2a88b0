"""The queue's items as this instance knows them: read by one scan, then kept in step with every write.

Lives here: ``ItemRows``, every item's row but its body, read once per
instance (and again after a transaction rolls back), updated by the store
as it writes, and the questions the queue asks of its items, answered in
memory: a key's queued items, the admitted ones, the counts per grant or
lease, the keys in some states, the oldest done item. Must not know: SQL,
the protocol with the holder, timers, or when anything happens.

Why: the items table has no secondary index (each would cost a row written
per item and per state change, a thousand times the price of a row read),
so every question asked of the table is a scan, billed as every row read.
The queue asks a dozen per item, and a shard woken for each job's report
starts a new instance that asks them all again: on the demo's workload
those scans were about 600 of the 800 rows a job read. Now an instance
reads each item once. Bodies are not kept: a body is read by id when an
item is handed out (one row read), and kept while its item is admitted.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from .pure.states import ADMITTED, CLAIMING, DONE, GONE, QUEUED, RELEASED, Counts

#: the columns of an item's row that are kept here (all but its body and record: whether it has one)
COLUMNS = ("id, key, grp, seq, enqueued_at, state, grant_id, via, admitted_at, draw, done_at, "
           "record IS NOT NULL AS recorded")
_COUNTED = (CLAIMING, ADMITTED, RELEASED)


@dataclass(frozen=True)
class ItemRow:
    id: str
    key: str
    grp: str
    seq: int
    enqueued_at: float
    state: str
    grant_id: str | None = None
    via: str | None = None
    admitted_at: float | None = None
    draw: int | None = None
    done_at: float | None = None
    recorded: bool = False  #: released with a record (``release_keeping``)


class ItemRows:
    """Every item's row but its body, in memory, by state, each state's in seq order.

    Grouped by state, a question reads only the rows of the state it asks
    about (the queued ones, mostly), not the done ones a queue keeps."""

    def __init__(self, rows: Iterable[dict[str, Any]]) -> None:
        self._rows: dict[str, ItemRow] = {}
        self._by_state: dict[str, dict[str, ItemRow]] = {}
        self._unsorted: set[str] = set()  #: states whose rows came out of seq order
        #: rows per key, those that keep a record left out: with ``keep_done_ms``
        #: 0 such an item names no grant, so its key holds nothing for it (and,
        #: kept on its grant with a longer ``keep_done_ms``, it holds no permit)
        self._keys: Counter[str] = Counter()
        for row in sorted(rows, key=lambda r: r["seq"]):
            self._put(ItemRow(**row))
        self._bodies: dict[str, str] = {}  #: body JSON of admitted items, read once each

    def _put(self, row: ItemRow) -> None:
        old = self._rows.pop(row.id, None)
        if old is not None:
            self._forget(old)
        bucket = self._by_state.setdefault(row.state, {})
        if bucket and next(reversed(bucket.values())).seq > row.seq:
            self._unsorted.add(row.state)
        bucket[row.id] = self._rows[row.id] = row
        if not row.recorded:
            self._keys[row.key] += 1

    def _drop(self, item_id: str) -> None:
        old = self._rows.pop(item_id, None)
        if old is not None:
            self._forget(old)

    def _forget(self, old: ItemRow) -> None:
        del self._by_state[old.state][old.id]
        if old.recorded:
            return
        self._keys[old.key] -= 1
        if not self._keys[old.key]:
            del self._keys[old.key]

    def _of(self, state: str) -> Iterable[ItemRow]:
        if state in self._unsorted:
            self._by_state[state] = dict(sorted(self._by_state[state].items(), key=lambda kv: kv[1].seq))
            self._unsorted.discard(state)
        return self._by_state.get(state, {}).values()

    # -- kept in step with the writes ----------------------------------------
    def inserted(self, row: ItemRow) -> None:
        self._put(row)

    def moved(self, item_id: str, to: str, **columns: Any) -> None:
        if to == GONE:
            self._drop(item_id)
        elif item_id in self._rows:
            self._put(replace(self._rows[item_id], state=to, **columns))
        if to != ADMITTED:
            self._bodies.pop(item_id, None)

    def stamped(self, now: float) -> None:
        """As ``QueueStore.stamp_untimed`` writes."""
        for row in self.untimed():
            self._put(replace(row, admitted_at=now) if row.state == ADMITTED else replace(row, done_at=now))

    # -- questions ----------------------------------------------------------
    def get(self, item_id: str) -> ItemRow | None:
        return self._rows.get(item_id)

    def body(self, item_id: str) -> str | None:
        return self._bodies.get(item_id)

    def keep_body(self, item_id: str, body: str) -> None:
        if item_id in self._rows and self._rows[item_id].state == ADMITTED:
            self._bodies[item_id] = body

    def max_seq(self) -> int:
        return max((r.seq for r in self._rows.values()), default=0)

    def has_key(self, key: str) -> bool:
        """Does the key have an item that is not a kept record?"""
        return self._keys[key] > 0

    def in_state(self, state: str, key: str | None = None, group: str | None = None,
                 grant_id: str | None = None) -> list[ItemRow]:
        """The items in ``state`` (of one key, group or grant), oldest first."""
        return [r for r in self._of(state) if (key is None or r.key == key)
                and (group is None or r.grp == group) and (grant_id is None or r.grant_id == grant_id)]

    def keys_in(self, states: Iterable[str]) -> list[str]:
        return sorted({r.key for state in set(states) for r in self._of(state)})

    def done(self) -> list[ItemRow]:
        return list(heapq.merge(*(self._of(state) for state in DONE), key=lambda r: r.seq))

    def untimed(self) -> list[ItemRow]:
        """Items done before ``done_at`` was kept, and admitted before ``admitted_at`` was."""
        return [r for r in self.done() if r.done_at is None] + [
            r for r in self._of(ADMITTED) if r.admitted_at is None]

    def counts(self) -> dict[str, dict[str, Counts]]:
        """via -> grant or lease id -> the counts of its items claiming, admitted or released."""
        counts: dict[str, dict[str, Counts]] = {}
        for r in (r for state in _COUNTED for r in self._of(state)):
            if r.via is None or r.grant_id is None:
                continue
            by_id = counts.setdefault(r.via, {})
            known = by_id.get(r.grant_id) or Counts(r.key, r.grp, {})
            known.by_state[r.state] = known.by_state.get(r.state, 0) + 1
            by_id[r.grant_id] = known._replace(last_draw=max(known.last_draw, r.draw or 0))
        return counts


def queued_of(rows: ItemRows, key: str) -> list[tuple[str, float]]:
    """(group, enqueue time) of the key's queued items, oldest first."""
    return [(r.grp, r.enqueued_at) for r in rows.in_state(QUEUED, key)]
