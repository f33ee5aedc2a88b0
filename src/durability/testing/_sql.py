"""One Durable Object's SQLite database, with workerd's rules and counters.

Lives here: ``sqlite3`` under the surface of ``ctx.storage.sql`` (the
statements of one ``exec``, their bindings, running each of them), the
implicit write batch and savepoints. What a statement does is learned in
``_sql_shapes``, the rows it reads and writes are counted in
``_sql_counts``, what workerd refuses and how it words errors is in
``_sql_rules``, and the cursor a statement returns is in ``_sql_cursor``.
Must not know: the event loop, RPC, alarms. The storage layer decides when
a batch commits; this module only knows how.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from ._sql_counts import _INTERNAL, RowCounting, _TableInfo
from ._sql_cursor import SqlCursor as SqlCursor
from ._sql_rules import (
    MAX_BOUND_PARAMETERS,
    MAX_ROW_BYTES,
    MAX_STATEMENT_BYTES,
    MULTIPLE_STATEMENTS_WITH_PARAMETERS,
    TRANSACTION_REFUSED as TRANSACTION_REFUSED,
    _js_error,
)
from ._sql_shapes import _DDL, StatementShapes, _Shape
from ._values import JsException, sql_binding, sql_value


class SqlDatabase(StatementShapes, RowCounting):
    """The SQLite file of one Durable Object; it outlives every instance."""

    def __init__(self, on_batch_open: Callable[[], None] | None = None) -> None:
        self._conn = sqlite3.connect(":memory:", isolation_level=None)
        self._conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, MAX_BOUND_PARAMETERS)
        self._conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_STATEMENT_BYTES)
        self._conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_ROW_BYTES)
        self._conn.set_authorizer(self._authorize)
        self._shapes: dict[str, _Shape] = {}
        self._schema_version = 0
        self._tables: dict[str, _TableInfo] = {}
        self._learning: _Shape | None = None
        self._refusal: str | None = None
        self._savepoints = 0
        self.in_batch = False
        self.rows_read = 0
        self.rows_written = 0
        self.on_batch_open = on_batch_open

    # -- batches and savepoints, issued by the storage layer -------------
    def _internal(self, statement: str) -> None:
        self._conn.execute(_INTERNAL + statement)

    def open_batch(self) -> None:
        if not self.in_batch:
            self._internal("BEGIN")
            self.in_batch = True
            if self.on_batch_open is not None:
                self.on_batch_open()

    def commit_batch(self) -> None:
        if self.in_batch and self._savepoints == 0:
            self._internal("COMMIT")
            self.in_batch = False

    def rollback_batch(self) -> None:
        if self.in_batch:
            self._internal("ROLLBACK")
            self.in_batch = False
            self._savepoints = 0

    def begin_savepoint(self) -> str:
        self.open_batch()
        name = f"_cf_sync_savepoint_{self._savepoints}"
        self._internal(f"SAVEPOINT {name}")
        self._savepoints += 1
        return name

    def end_savepoint(self, name: str, *, rollback: bool) -> None:
        self._savepoints -= 1
        if rollback:
            self._internal(f"ROLLBACK TO {name}")
        self._internal(f"RELEASE {name}")

    def run_in_savepoint(self, fn: Callable[[], Any]) -> Any:
        """``transactionSync``: fn's writes land together or not at all; nests."""
        name = self.begin_savepoint()
        try:
            result = fn()
        except BaseException:
            self.end_savepoint(name, rollback=True)
            raise
        self.end_savepoint(name, rollback=False)
        return result

    # -- statements ---------------------------------------------------------
    def exec(self, query: str, bindings: tuple[Any, ...]) -> SqlCursor:
        if not isinstance(query, str):
            raise JsException("SQL query must be a string", name="TypeError")
        statements = split_statements(query)
        if not statements:
            raise JsException("SQL code did not contain a statement.")
        values = [sql_binding(value) for value in bindings]
        cursor = None
        for index, statement in enumerate(statements):
            # workerd binds the values to the last statement; one before it
            # that takes parameters is refused when its turn comes.
            last = index == len(statements) - 1
            try:
                shape = self._shape_of(statement, values if last else [])
            except JsException as error:
                if not last and error.message.startswith("Incorrect number of bindings"):
                    raise JsException(MULTIPLE_STATEMENTS_WITH_PARAMETERS) from None
                raise
            if shape.writes:
                self.open_batch()  # production starts its implicit transaction on a write
            cursor = self._exec_one(statement, values if last else [])
        assert cursor is not None
        return cursor

    def _exec_one(self, statement: str, values: list[Any]) -> SqlCursor:
        shape = self._shape_of(statement, values)
        scanned = sum(self._count_rows(table) for table in shape.full_scans)
        target = shape.inserts if shape.is_upsert else None
        rows_before = self._count_rows(target) if target else 0
        searched = self._searched_rows(statement, values, shape.search) if shape.search else None
        sorted_rows = [self._sorted_rows(statement, values, kind) for kind in shape.sorters]
        # (The authorizer marks a DDL statement only as it runs: read the text.)
        schema_rows = self._count_rows("sqlite_master") if _DDL.match(statement) else 0
        changes_before = self._conn.total_changes
        self._learning = shape  # refusals still apply to the real statement
        try:
            cursor = self._conn.execute(statement, values)
            rows = [tuple(sql_value(v) for v in row) for row in cursor.fetchall()]
        except sqlite3.Error as error:
            raise _js_error(error) from None
        finally:
            self._learning = None
        columns = [d[0] for d in cursor.description] if cursor.description else []
        changed = self._conn.total_changes - changes_before
        if shape.is_ddl:
            version = self._conn.execute(_INTERNAL + "PRAGMA schema_version").fetchone()[0]
            reads = writes = 0
            if version != self._schema_version:  # not an IF NOT EXISTS that did nothing
                self._schema_version = version
                self._tables.clear()
                self._shapes.clear()
                reads, writes = self._ddl_cost(statement, schema_rows, self._count_rows("sqlite_master") - schema_rows)
        else:
            inserted = (self._count_rows(target) - rows_before) if target else None
            writes_rows = (shape.inserts or shape.updates or shape.deletes) is not None
            returning = bool(columns) and writes_rows
            reads, writes = self._cost(shape, changed, inserted, len(rows), scanned, returning, searched)
            # A sorter (temp B-tree) reads back every row put into it, and one when empty.
            reads += sum(max(n, 1) for n in sorted_rows)
        self.rows_read += reads
        self.rows_written += writes
        return SqlCursor(columns, rows, reads, writes)

    def inspect(self, query: str, *bindings: Any) -> list[dict[str, Any]]:
        """Read state for a test or a demo: not billed, not refused, not in any batch."""
        cursor = self._conn.execute(_INTERNAL + query, [sql_binding(b) for b in bindings])
        columns = [d[0] for d in cursor.description or []]
        return [dict(zip(columns, row)) for row in cursor.fetchall()]

    def database_size(self) -> int:
        pages: int = self._conn.execute(_INTERNAL + "PRAGMA page_count").fetchone()[0]
        size: int = self._conn.execute(_INTERNAL + "PRAGMA page_size").fetchone()[0]
        return pages * size

    def close(self) -> None:
        self._conn.close()


def split_statements(query: str) -> list[str]:
    """Split SQL text into complete statements, as SQLite's parser would."""
    statements, current = [], ""
    for piece in query.split(";"):
        current += piece + ";"
        if sqlite3.complete_statement(current):
            text = current.strip().rstrip(";").strip()
            if text:
                statements.append(text)
            current = ""
    rest = current[:-1].strip()  # the final piece gained a ';' it never had
    if rest:
        statements.append(rest)
    return statements
