"""Where the rows written and read go: counts per table and statement, for one run on the embedded runtime.

Lives here: ``WriteBreakdown``, a context manager that attributes every row
the embedded SQL bills as written to the table the statement writes and its
kind (insert or upsert, update, delete, schema changes; timers by
participant and key), and every row it bills as read to the statement
(its text, spaces folded); ``rows`` and ``reads`` give them per job.
Must not know: which system runs; ``setAlarm`` writes are in the runtime's
totals, not here.
"""

from __future__ import annotations

import collections
import re

from durability.testing import _sql

_TARGET = re.compile(r"^\s*(INSERT|UPDATE|DELETE|CREATE TABLE|CREATE INDEX|DROP TABLE)\b(?:\s+OR\s+\w+)?"
                     r"(?:\s+INTO|\s+FROM|\s+IF NOT EXISTS|\s+IF EXISTS)?\s+(\w+)", re.IGNORECASE)


def _timer_kind(key: str) -> str:
    """"pump:k0" -> "pump"; an id (a job's) -> "<id>"; a fixed name stays."""
    if ":" in key:
        return key.split(":")[0]
    return "<id>" if any(c.isdigit() for c in key) else key


class WriteBreakdown:
    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()
        self.read_counts: collections.Counter = collections.Counter()
        self._real = None

    def __enter__(self) -> WriteBreakdown:
        real = self._real = _sql.SqlDatabase._exec_one
        counts, read_counts = self.counts, self.read_counts

        def exec_one(database, statement, values):
            cursor = real(database, statement, values)
            if cursor._reads:
                read_counts[" ".join(statement.split())] += cursor._reads
            if cursor._writes:
                match = _TARGET.match(statement)
                verb, table = (match.group(1).lower(), match.group(2)) if match else ("other", statement[:30])
                if verb == "insert" and "ON CONFLICT" in statement.upper():
                    verb = "upsert"
                if table == "durability_timers" and len(values) >= 2:
                    verb += f" {values[0]}/{_timer_kind(str(values[1]))}"
                counts[(table, verb)] += cursor._writes
            return cursor

        _sql.SqlDatabase._exec_one = exec_one
        return self

    def __exit__(self, *exc) -> None:
        _sql.SqlDatabase._exec_one = self._real

    def rows(self, jobs: int) -> list[tuple[str, str, float]]:
        """(table, kind, rows written per job), the largest first."""
        return [(table, verb, round(n / max(jobs, 1), 2)) for (table, verb), n in self.counts.most_common()]

    def reads(self, jobs: int, top: int = 15) -> list[tuple[str, float]]:
        """(statement, rows read per job) for the ``top`` statements that read most."""
        return [(statement, round(n / max(jobs, 1), 1)) for statement, n in self.read_counts.most_common(top)]
