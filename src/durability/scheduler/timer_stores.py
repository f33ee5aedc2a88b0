"""Where the scheduler keeps timers: rows in SQL, or memory, behind one interface.

Lives here: ``SqlTimers`` (the ``durability_timers`` table: a durable
participant's timers) and ``MemoryTimers`` (a ``durable=False``
participant's, derived again by each new instance), each able to set,
cancel, read, list and retry a timer and to say which are due. Must not
know: participants, handlers, the alarm, or when anything runs.

Each timer has a version, new at every write: a run that ends deletes its
timer only if no write came since (``forget``).

The table is made when a durable participant registers: an object whose
participants all keep their timers in memory (as every participant in this
library does) never makes it, three rows a new object writes no more (two
for the ``CREATE TABLE``, as workerd bills it, and its version's row).
"""

from __future__ import annotations

import itertools
from collections.abc import Container
from typing import Any

from .._common.schema import migrate, schema_version
from .._common.sql import GrowingCounter, Sql

COMPONENT = "scheduler"
TABLES = ["durability_timers"]
# Rows are keyed by (participant, key) in a WITHOUT ROWID table with no
# other index: scheduling, rescheduling and deleting a timer each write one
# row. Finding due timers scans the table; a scan costs reads, which are a
# thousandth of the price of writes, and an object keeps few timers.
_SCHEMA = {
    1: [
        """
        CREATE TABLE IF NOT EXISTS durability_timers (
          participant TEXT NOT NULL,
          key TEXT NOT NULL,
          due_at REAL NOT NULL,
          attempt INTEGER NOT NULL DEFAULT 0,
          version INTEGER NOT NULL DEFAULT 0,
          PRIMARY KEY (participant, key)
        ) WITHOUT ROWID
        """
    ]
}

Row = dict[str, Any]  #: participant, key, due_at, attempt, version (and memory=True from MemoryTimers)
Timer = tuple[str, str]  #: (participant, key)


class SqlTimers:
    """A durable participant's timers, one row each (the upsert writes a row, the delete another)."""

    def __init__(self, sql: Sql) -> None:
        self.sql = sql
        made = schema_version(sql, COMPONENT) > 0
        if made:
            migrate(sql, COMPONENT, _SCHEMA)  # (any version after the first)
        #: (rollbacks then, whether the table was there): a rollback may undo the table made in it
        self._table = (sql.rollbacks, made)
        # Versions come from a counter that only grows in this instance: a run
        # that ends deletes its timer only if no write came since, even one
        # that deleted the timer and wrote it again (a version restarting
        # from zero would be taken for the one that ran).
        self._versions = GrowingCounter(sql if made else None, "SELECT max(version) AS n FROM durability_timers")
        # The earliest due time, read once and kept until this store writes
        # again or a transaction rolls back: every sync of the alarm asks
        # for it (a scan of the table each time: about 15 rows read a job on
        # the demo's workload).
        self._writes = 0
        self._earliest: tuple[tuple[int, int], list[float]] | None = None

    def _made(self) -> bool:
        """Is the table there? (Nothing to read or delete if not.)"""
        seen_at, made = self._table
        if seen_at != self.sql.rollbacks:
            made = schema_version(self.sql, COMPONENT) > 0
            self._table = (self.sql.rollbacks, made)
        return made

    def make(self) -> None:
        """Make the table, if it is not: when a durable participant registers
        (in the object's constructor, outside any transaction: a transaction
        rolled back past this library's ``Sql`` would leave ``_made`` wrong)."""
        if not self._made():
            migrate(self.sql, COMPONENT, _SCHEMA)
            self._table = (self.sql.rollbacks, True)

    def upsert(self, participant: str, key: str, at_ms: float, *, earlier_only: bool, always: bool) -> None:
        self.make()
        self._writes += 1
        when = "1" if always else (
            "excluded.due_at < durability_timers.due_at" if earlier_only
            else "durability_timers.due_at != excluded.due_at")
        self.sql.exec(
            "INSERT INTO durability_timers (participant, key, due_at, version) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (participant, key) DO UPDATE SET due_at = excluded.due_at, "
            f"attempt = 0, version = excluded.version WHERE {when}",
            participant, key, at_ms, self._versions.next(),
        )

    def cancel(self, participant: str, key: str) -> None:
        if not self._made():
            return
        self._writes += 1
        self.sql.exec("DELETE FROM durability_timers WHERE participant = ? AND key = ?", participant, key)

    def get(self, participant: str, key: str) -> Row | None:
        if not self._made():
            return None
        return self.sql.one("SELECT due_at, attempt FROM durability_timers WHERE participant = ? AND key = ?",
                            participant, key)

    def of(self, participant: str) -> list[Row]:
        if not self._made():
            return []
        return self.sql.exec("SELECT key, due_at, attempt FROM durability_timers WHERE participant = ?", participant)

    def due(self, now: float) -> list[Row]:
        if not self._made():
            return []
        return self.sql.exec(
            "SELECT participant, key, due_at, attempt, version FROM durability_timers WHERE due_at <= ? "
            "ORDER BY due_at", now)

    def earliest(self) -> list[float]:
        if not self._made():
            return []
        version = (self._writes, self.sql.rollbacks)
        if self._earliest is None or self._earliest[0] != version:
            row = self.sql.one("SELECT min(due_at) AS due FROM durability_timers")
            self._earliest = (version, [row["due"]] if row is not None and row["due"] is not None else [])
        return list(self._earliest[1])

    def next_due(self, running: Container[Timer]) -> list[float]:
        if not self._made():
            return []
        rows = self.sql.exec("SELECT participant, key, due_at FROM durability_timers ORDER BY due_at")
        return [r["due_at"] for r in rows if (r["participant"], r["key"]) not in running][:1]

    def version(self, participant: str, key: str) -> int | None:
        if not self._made():
            return None
        row = self.sql.one("SELECT version FROM durability_timers WHERE participant = ? AND key = ?", participant, key)
        return None if row is None else row["version"]

    def forget(self, participant: str, key: str, version: int) -> None:
        """Delete a timer that ran, unless it was written since."""
        if not self._made():
            return
        self._writes += 1
        self.sql.exec("DELETE FROM durability_timers WHERE participant = ? AND key = ? AND version = ?",
                      participant, key, version)

    def retry(self, participant: str, key: str, version: int, at_ms: float, attempt: int) -> None:
        """A run failed: the timer is due again at ``at_ms``, unless it was written since."""
        if not self._made():
            return
        self._writes += 1
        self.sql.exec(
            "UPDATE durability_timers SET due_at = ?, attempt = ?, version = ? "
            "WHERE participant = ? AND key = ? AND version = ?",
            at_ms, attempt, self._versions.next(), participant, key, version,
        )


class MemoryTimers:
    """A ``durable=False`` participant's timers: no row, and lost with the instance."""

    def __init__(self) -> None:
        self._rows: dict[Timer, Row] = {}
        self._versions = itertools.count(1)

    def upsert(self, participant: str, key: str, at_ms: float, *, earlier_only: bool, always: bool,
               alarm_at: float | None = None, covered: bool = False) -> None:
        """``alarm_at``: the alarm need not fire before then for this timer
        (its caller runs it sooner itself); the due time by default.
        ``covered``: see ``DurabilityScheduler.schedule_by``; a caller that
        needs the timer by the same time or sooner and says nothing of the
        kind takes it away."""
        alarm_at = at_ms if alarm_at is None else alarm_at
        current = self._rows.get((participant, key))
        if current is not None and not always and (
                at_ms >= current["due_at"] if earlier_only else at_ms == current["due_at"]):
            current["alarm_at"] = min(current["alarm_at"], alarm_at)  # a caller that needs the alarm sooner
            current["covered"] = current["covered"] and (covered or at_ms > current["due_at"])
            return
        if current is not None and earlier_only and not always:
            # An earlier time keeps the alarm an earlier caller needed (never before the new time).
            # (A running timer's request is a new one: its old alarm has fired.)
            alarm_at = max(at_ms, min(alarm_at, current["alarm_at"]))
        self._rows[(participant, key)] = {"participant": participant, "key": key, "due_at": at_ms,
                                          "alarm_at": alarm_at, "attempt": 0, "version": next(self._versions),
                                          "memory": True, "covered": covered}

    def cancel(self, participant: str, key: str) -> None:
        self._rows.pop((participant, key), None)

    def get(self, participant: str, key: str) -> Row | None:
        return self._rows.get((participant, key))

    def of(self, participant: str) -> list[Row]:
        return [row for (p, _), row in self._rows.items() if p == participant]

    def due(self, now: float) -> list[Row]:
        return [dict(row) for row in self._rows.values() if row["due_at"] <= now]

    def earliest(self, running: Container[Timer] = ()) -> list[float]:
        """When the alarm must fire for each timer (see ``upsert``) but
        ``running`` ones (their run sets the alarm it needs when it ends)."""
        return [row["alarm_at"] for timer, row in self._rows.items() if timer not in running]

    def uncovered_by(self, at_ms: float) -> list[float]:
        """The alarm times, up to ``at_ms``, of the timers not ``covered``."""
        return [row["alarm_at"] for row in self._rows.values() if row["alarm_at"] <= at_ms and not row["covered"]]

    def next_due(self, running: Container[Timer]) -> list[float]:
        return [row["due_at"] for timer, row in self._rows.items() if timer not in running]

    def version(self, participant: str, key: str) -> int | None:
        row = self._rows.get((participant, key))
        return None if row is None else row["version"]

    def forget(self, participant: str, key: str, version: int) -> None:
        if self.version(participant, key) == version:
            del self._rows[(participant, key)]

    def retry(self, participant: str, key: str, version: int, at_ms: float, attempt: int) -> None:
        current = self._rows.get((participant, key))
        if current is not None and current["version"] == version:
            current.update(due_at=at_ms, alarm_at=at_ms, attempt=attempt, version=next(self._versions), covered=False)

    def snapshot(self) -> dict[Timer, Row]:
        return {timer: dict(row) for timer, row in self._rows.items()}

    def restore(self, snapshot: dict[Timer, Row]) -> None:
        self._rows = {timer: dict(row) for timer, row in snapshot.items()}
