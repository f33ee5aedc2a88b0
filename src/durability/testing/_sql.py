"""One Durable Object's SQLite database, with workerd's rules and counters.

Lives here: ``sqlite3`` under the surface of ``ctx.storage.sql`` (cursors,
bindings, refused statements, error messages), the implicit write batch and
savepoints, and the model that counts rows read and written.
Must not know: the event loop, RPC, alarms. The storage layer decides when
a batch commits; this module only knows how.

Counting model. workerd bills every B-tree entry a statement inserts or
deletes from a table (an index entry counts as a row) and every row a
statement visits. SQLite's Python binding cannot see its virtual machine, so
the counts are derived from what the binding can see (rows changed, the
columns a statement touches, the query plan, the schema, and counts of the
rows a search's key finds), fitted to workerd and checked against it by the
conformance probe (``fidelity/conformance.py``), statement by statement:

* INSERT: each row costs one write plus one per index on the table (a TEXT
  or composite primary key is an index; in a WITHOUT ROWID table it is the
  table). AUTOINCREMENT adds one read and one write per statement.
* UPDATE: each changed row costs one write plus one per index holding a
  column the statement assigns; an upsert that takes the UPDATE path counts
  as an UPDATE of that row, and reads it only in a rowid table.
* DELETE: one write per row (index entries removed are not counted).
* Reads: a full scan reads every row of the table (one when it is empty;
  a bare ``count(*)`` none then); a scan with LIMIT and no sorter stops at
  the rows it yields; a search reads the rows its key finds, kept or not;
  each sorter (``USE TEMP B-TREE``) reads back the rows put into it (one
  when empty); RETURNING reads each returned row once more.
* Schema: CREATE TABLE reads one row and writes its schema rows plus one;
  CREATE INDEX reads 2 + 2n and writes n + 1 over n rows; ALTER TABLE ADD
  COLUMN reads 2 plus the schema table's rows and writes one; DROP writes
  none (its reads of the schema table are not modelled).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ._values import JsDict, JsException, sql_binding, sql_value

T = TypeVar("T")
Row = tuple[Any, ...]  #: a row as sqlite3 returns it

# workerd's limits for one statement (see shared platform notes).
MAX_BOUND_PARAMETERS = 100
MAX_STATEMENT_BYTES = 100_000
MAX_ROW_BYTES = 2_000_000

TRANSACTION_REFUSED = (
    "To execute a transaction, please use the state.storage.transaction() or "
    "state.storage.transactionSync() APIs instead of the SQL BEGIN TRANSACTION "
    "or SAVEPOINT statements. The JavaScript API is safer because it will "
    "automatically roll back on exceptions, and because it interacts correctly "
    "with Durable Objects' automatic atomic write coalescing."
)

MULTIPLE_STATEMENTS_WITH_PARAMETERS = (
    "When executing multiple SQL statements in a single call, only the last "
    "statement can have parameters."
)

_PRIMARY_ERROR_NAMES = {
    1: "SQLITE_ERROR", 2: "SQLITE_INTERNAL", 3: "SQLITE_PERM", 4: "SQLITE_ABORT",
    5: "SQLITE_BUSY", 6: "SQLITE_LOCKED", 7: "SQLITE_NOMEM", 8: "SQLITE_READONLY",
    9: "SQLITE_INTERRUPT", 10: "SQLITE_IOERR", 11: "SQLITE_CORRUPT",
    13: "SQLITE_FULL", 18: "SQLITE_TOOBIG", 19: "SQLITE_CONSTRAINT",
    20: "SQLITE_MISMATCH", 21: "SQLITE_MISUSE", 23: "SQLITE_AUTH", 25: "SQLITE_RANGE",
}

# The PRAGMAs workerd lets through (its authorizer); every other one is refused.
_ALLOWED_PRAGMAS = {
    "table_list", "table_info", "table_xinfo", "data_version", "page_size",
    "case_sensitive_like", "foreign_keys", "defer_foreign_keys",
    "ignore_check_constraints", "legacy_alter_table", "recursive_triggers",
    "reverse_unordered_selects", "foreign_key_check", "foreign_key_list",
    "index_info", "index_list", "index_xinfo", "quick_check", "optimize",
}
NOT_AUTHORIZED = "not authorized: SQLITE_AUTH"
_TEMP_ACTIONS = {
    sqlite3.SQLITE_CREATE_TEMP_TABLE, sqlite3.SQLITE_CREATE_TEMP_INDEX,
    sqlite3.SQLITE_CREATE_TEMP_VIEW, sqlite3.SQLITE_CREATE_TEMP_TRIGGER,
    sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH,
}

_INTERNAL = "/* durability.testing */ "
_WRITE_ACTIONS = {sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE}
_DDL_ACTIONS = {
    sqlite3.SQLITE_CREATE_TABLE, sqlite3.SQLITE_CREATE_INDEX, sqlite3.SQLITE_DROP_TABLE,
    sqlite3.SQLITE_DROP_INDEX, sqlite3.SQLITE_ALTER_TABLE, sqlite3.SQLITE_CREATE_VIEW,
    sqlite3.SQLITE_DROP_VIEW, sqlite3.SQLITE_CREATE_TRIGGER, sqlite3.SQLITE_DROP_TRIGGER,
}
_LIMIT = re.compile(r"\bLIMIT\s+(\d+|\?)", re.IGNORECASE)
_TRAILING_LIMIT = re.compile(r"\s+LIMIT\s+(\d+|\?)(\s+OFFSET\s+(\d+|\?))?\s*$", re.IGNORECASE)
_SORTER = re.compile(r"USE TEMP B-TREE FOR (.+)")
_DDL = re.compile(r"\s*(CREATE|DROP|ALTER)\b", re.IGNORECASE)
_COUNT_TABLE = re.compile(r"\s*SELECT\s+count\(\*\)(\s+AS\s+\w+)?\s+FROM\s+\"?\w+\"?\s*", re.IGNORECASE)
_SEARCH = re.compile(r"SEARCH (\S+)(?: AS \S+)? USING (?:PRIMARY KEY|(?:COVERING )?INDEX \S+) \((.*)\)")


@dataclass
class _Shape:
    """What one statement does, learned from the authorizer and its plan."""

    inserts: str | None = None
    updates: str | None = None
    update_columns: list[str] = field(default_factory=list)
    deletes: str | None = None
    is_ddl: bool = False
    reads_tables: bool = False
    full_scans: list[str] = field(default_factory=list)
    has_limit: bool = False
    sorters: list[str] = field(default_factory=list)  #: temp B-trees: ORDER BY, GROUP BY, DISTINCT
    search: tuple[str, list[tuple[str, str]]] | None = None  #: (table, key terms) of a search
    counts_table: bool = False  #: ``SELECT count(*) FROM t`` alone: SQLite counts without stepping

    @property
    def writes(self) -> bool:
        return self.is_ddl or (self.inserts or self.updates or self.deletes) is not None

    @property
    def is_upsert(self) -> bool:
        return self.inserts is not None and self.updates == self.inserts


@dataclass
class _TableInfo:
    indexes: list[tuple[str, list[str | None]]]  # (name, columns) of every index
    autoincrement: bool
    without_rowid: bool


class SqlCursor:
    """``SqlStorageCursor`` as Python code sees it through the workers SDK.

    Like the SDK's wrapper, the first read of ``rowsRead``, ``rowsWritten`` or
    ``columnNames`` is cached: read the counters once, after consuming the
    cursor, or they stay frozen at a partial value.
    """

    def __init__(self, columns: list[str], rows: list[Row], rows_read: int,
                 rows_written: int) -> None:
        self._columns = columns
        self._rows = rows
        self._position = 0
        self._reads = rows_read
        self._writes = rows_written
        self._frozen: dict[str, Any] = {}

    # -- consumption --------------------------------------------------
    def _take_rest(self) -> list[Row]:
        rest = self._rows[self._position:]
        self._position = len(self._rows)
        return rest

    def _as_dict(self, row: Row) -> JsDict:
        return JsDict(zip(self._columns, row))

    def toArray(self) -> list[JsDict]:
        return [self._as_dict(row) for row in self._take_rest()]

    def one(self) -> JsDict:
        rest = self._take_rest()
        if not rest:
            raise JsException("Expected exactly one result from SQL query, but got no results.")
        if len(rest) > 1:
            raise JsException(
                "Expected exactly one result from SQL query, but got multiple results."
            )
        return self._as_dict(rest[0])

    def raw(self) -> Iterator[list[Any]]:
        for row in self._take_rest():
            yield list(row)

    def next(self) -> JsDict:
        if self._position >= len(self._rows):
            return JsDict(done=True)
        row = self._rows[self._position]
        self._position += 1
        return JsDict(done=False, value=self._as_dict(row))

    def __iter__(self) -> Iterator[JsDict]:
        while self._position < len(self._rows):
            row = self._rows[self._position]
            self._position += 1
            yield self._as_dict(row)

    # -- attributes frozen on first read, as the SDK's wrapper does ------
    def _frozen_value(self, name: str, current: T) -> T:
        if name not in self._frozen:
            self._frozen[name] = current
        frozen: T = self._frozen[name]  # each name only ever holds what its property reads
        return frozen

    @property
    def columnNames(self) -> list[str]:
        return self._frozen_value("columnNames", list(self._columns))

    @property
    def rowsRead(self) -> int:
        consumed = self._position >= len(self._rows)
        return self._frozen_value("rowsRead", self._reads if consumed else 0)

    @property
    def rowsWritten(self) -> int:
        return self._frozen_value("rowsWritten", self._writes)


class SqlDatabase:
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

    # -- the authorizer: refusals, and what a statement touches ----------
    def _authorize(self, action: int, arg1: str | None, arg2: str | None, _db: str | None,
                   _source: str | None) -> int:
        if self._learning is None:  # one of our own statements
            return sqlite3.SQLITE_OK
        shape = self._learning
        if action in (sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT):
            self._refusal = TRANSACTION_REFUSED
            return sqlite3.SQLITE_DENY
        table = arg1
        if (
            action in _TEMP_ACTIONS
            or (action == sqlite3.SQLITE_PRAGMA and arg1 not in _ALLOWED_PRAGMAS)
            or (table and table.startswith("_cf_"))
        ):
            self._refusal = NOT_AUTHORIZED
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_INSERT and shape.inserts is None:
            shape.inserts = table
        elif action == sqlite3.SQLITE_UPDATE and table and arg2 and not table.startswith("sqlite_"):
            shape.updates = shape.updates or table
            if arg2 not in shape.update_columns:
                shape.update_columns.append(arg2)
        elif action == sqlite3.SQLITE_DELETE and table and not table.startswith("sqlite_"):
            shape.deletes = shape.deletes or table
        elif action in _DDL_ACTIONS:
            shape.is_ddl = True
        elif action == sqlite3.SQLITE_READ and table and not table.startswith("sqlite_"):
            shape.reads_tables = True
        return sqlite3.SQLITE_OK

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

    def _shape_of(self, statement: str, values: list[Any]) -> _Shape:
        shape = self._shapes.get(statement)
        if shape is not None:
            return shape
        shape = _Shape(has_limit=bool(_LIMIT.search(statement)))
        self._learning, self._refusal = shape, None
        try:
            # Preparing EXPLAIN runs the authorizer over the real statement. The
            # schema version in the text keeps sqlite3's statement cache from
            # answering without preparing (and so without the authorizer).
            explain = f"EXPLAIN QUERY PLAN /* schema {self._schema_version} */ {statement}"
            plan = self._conn.execute(explain, values).fetchall()
        except sqlite3.Error as error:
            if self._refusal is not None:
                raise JsException(self._refusal) from None
            raise _js_error(error, statement) from None
        finally:
            self._learning = None
        if not shape.is_ddl:
            shape.full_scans = _full_scans(plan)
            shape.sorters = [m.group(1) for row in plan if (m := _SORTER.match(row[-1]))]
            shape.search = _equality_search(plan) if not shape.full_scans else None
            shape.counts_table = bool(_COUNT_TABLE.fullmatch(statement))
            self._shapes[statement] = shape
        return shape

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

    def _cost(self, shape: _Shape, changed: int, inserted: int | None, returned: int,
              scanned: int, returning: bool, searched: int | None) -> tuple[int, int]:
        reads = writes = 0
        # RETURNING reads its buffered rows back, and one read even when empty.
        returned = max(returned, 1) if returning else returned
        if shape.inserts is not None and not shape.inserts.startswith("sqlite_"):
            table = self._table(shape.inserts)
            new_rows = changed if inserted is None else inserted
            updated = changed - new_rows
            writes += new_rows * (1 + len(table.indexes))
            if updated:
                writes += updated * (1 + self._touched_indexes(table, shape.update_columns))
                # A rowid table finds the row through its key index, then reads it;
                # a WITHOUT ROWID table updates the entry the conflict found.
                reads += 0 if table.without_rowid else updated
            if table.autoincrement and new_rows:
                reads, writes = reads + 1, writes + 1
            if shape.updates is None or shape.is_upsert:
                return reads + returned, writes
        # A scan reads every row it steps over, and one even over an empty table
        # (a bare count(*) counts the table without stepping). A LIMIT stops a
        # scan early only when no sorter needs every row first.
        stops_early = shape.has_limit and not shape.sorters
        visited = max(scanned, 1) if shape.full_scans and not stops_early else None
        if shape.counts_table:
            visited = scanned
        if shape.full_scans and stops_early:
            returned = max(returned, 1)
        if visited is None and searched is not None:
            # A search reads the rows its key finds, kept or not (and at least those it changed).
            visited = max(searched, changed) if shape.updates or shape.deletes else searched
        if shape.updates is not None:
            table = self._table(shape.updates)
            writes += changed * (1 + self._touched_indexes(table, shape.update_columns))
            reads += changed if visited is None else visited
            reads += returned
        elif shape.deletes is not None:
            writes += changed
            reads += changed if visited is None else visited
            reads += returned
        elif shape.reads_tables:
            if visited is None:
                reads += returned
            elif shape.counts_table or (searched is not None and not shape.full_scans):
                reads += visited  # an aggregate over a search returns a row it never read
            else:
                reads += max(visited, returned)
        return reads, writes

    def _ddl_cost(self, statement: str, schema_rows: int, schema_rows_added: int) -> tuple[int, int]:
        """What workerd bills a schema change (measured): its rows in sqlite_schema, and more."""
        if re.match(r"\s*ALTER\s+TABLE\s+\S+\s+ADD\b", statement, re.IGNORECASE):
            return 2 + schema_rows, 1  # the schema table is read through, one row rewritten
        create_index = re.match(r"\s*CREATE\s+(UNIQUE\s+)?INDEX\b", statement, re.IGNORECASE)
        if create_index:
            table = re.search(r"\bON\s+\"?(\w+)", statement, re.IGNORECASE)
            rows = self._count_rows(table.group(1)) if table else 0
            return 2 + 2 * rows, schema_rows_added + rows  # scanned, then sorted into the index
        if re.match(r"\s*CREATE\s+TABLE\b", statement, re.IGNORECASE):
            sequence = 1 if re.search(r"\bAUTOINCREMENT\b", statement, re.IGNORECASE) and schema_rows_added > 1 else 0
            return 1 + sequence, schema_rows_added + 1 + sequence
        return 0, max(schema_rows_added, 0)

    def _searched_rows(self, statement: str, values: list[Any],
                       search: tuple[str, list[tuple[str, str]]]) -> int | None:
        """Rows a search finds through its key terms, from the values bound to them."""
        table, terms = search
        where = re.search(r"\bWHERE\b", statement, re.IGNORECASE)
        if where is None:
            return None
        bound = []
        for column, operator in terms:
            # Only the WHERE clause: the same column may be assigned in SET before it.
            match = re.compile(rf"(?<![\w.]){re.escape(column)}\s*{re.escape(operator)}\s*"
                               rf"(\?|'((?:[^']|'')*)'|(-?\d+(?:\.\d+)?))").search(statement, where.end())
            if match is None:
                return None
            if match.group(1) == "?":
                index = statement[: match.end()].count("?") - 1
                if index >= len(values):
                    return None
                bound.append(values[index])
            else:  # a literal in the text
                bound.append(match.group(2).replace("''", "'") if match.group(2) is not None
                             else float(match.group(3)))
        condition = " AND ".join(f'"{column}" {operator} ?' for column, operator in terms)
        count: int = self._conn.execute(_INTERNAL + f'SELECT count(*) FROM "{table}" WHERE {condition}',
                                        bound).fetchone()[0]
        return count

    def _sorted_rows(self, statement: str, values: list[Any], kind: str) -> int:
        """Rows put into one sorter: those grouped, or those the statement yields before its LIMIT."""
        if "GROUP BY" in kind:
            match = re.match(r"\s*SELECT\s+(.*?)\s+FROM\s+(.*?)\s+GROUP\s+BY\b", statement, re.IGNORECASE | re.DOTALL)
            if match and "?" not in match.group(1):
                source = match.group(2)
                return self._count_of(f"SELECT 1 FROM {source}", values[: source.count("?")])
        limit = _TRAILING_LIMIT.search(statement)
        body, kept = statement, values
        if limit:
            body = statement[: limit.start()]
            kept = values[: len(values) - limit.group(0).count("?")]
        if not re.match(r"\s*SELECT\b", body, re.IGNORECASE):
            return 0
        return self._count_of(body, kept)

    def _count_of(self, query: str, values: list[Any]) -> int:
        try:
            count: int = self._conn.execute(_INTERNAL + f"SELECT count(*) FROM ({query})", values).fetchone()[0]
        except sqlite3.Error:
            return 0
        return count

    # -- schema knowledge for the model ----------------------------------
    def _table(self, name: str) -> _TableInfo:
        info = self._tables.get(name)
        if info is None:
            info = self._tables[name] = self._describe(name)
        return info

    def _describe(self, name: str) -> _TableInfo:
        quoted = name.replace('"', '""')
        sql_row = self._conn.execute(
            _INTERNAL + "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?",
            (name,),
        ).fetchone()
        create = (sql_row[0] if sql_row else "") or ""
        without_rowid = bool(re.search(r"without\s+rowid\s*;?\s*$", create, re.IGNORECASE))
        indexes = []
        for _, index_name, _, origin, *_ in self._conn.execute(
            _INTERNAL + f'PRAGMA index_list("{quoted}")'
        ).fetchall():
            if without_rowid and origin == "pk":
                continue  # the table itself
            quoted_index = index_name.replace('"', '""')
            columns = [
                row[2] for row in self._conn.execute(
                    _INTERNAL + f'PRAGMA index_info("{quoted_index}")'
                ).fetchall()
            ]
            indexes.append((index_name, columns))
        return _TableInfo(indexes, "autoincrement" in create.lower(), without_rowid)

    @staticmethod
    def _touched_indexes(table: _TableInfo, columns: list[str]) -> int:
        return sum(
            1 for _, indexed in table.indexes
            if None in indexed or any(column in indexed for column in columns)
        )

    def _count_rows(self, table: str) -> int:
        quoted = table.replace('"', '""')
        count: int = self._conn.execute(_INTERNAL + f'SELECT count(*) FROM "{quoted}"').fetchone()[0]
        return count

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


def _equality_search(plan: list[Row]) -> tuple[str, list[tuple[str, str]]] | None:
    """The table and key terms (column, operator) of a plan's one search: ``a=? AND b>?``."""
    searches = [m for row in plan if (m := _SEARCH.match(row[-1]))]
    if len(searches) != 1:
        return None
    table, terms = searches[0].groups()
    found = []
    for term in terms.split(" AND "):
        match = re.fullmatch(r"(\w+)(=|>=|<=|>|<)\?", term)
        if match is None:
            return None  # IN, IS, expressions: not counted here
        found.append((match.group(1), match.group(2)))
    return table, found


def _full_scans(plan: list[Row]) -> list[str]:
    """Tables a plan scans whole: ``SCAN t`` (with or without an index), or a
    ``SEARCH`` of the primary key with no key terms (an aggregate over a
    WITHOUT ROWID table), which steps through every row. A search of an
    index with no terms is min()/max() reading one end of it."""
    tables = []
    for row in plan:
        detail = row[-1]
        match = (re.match(r"SCAN (\S+)(?: AS \S+)?", detail)
                 or re.fullmatch(r"SEARCH (\S+)(?: AS \S+)? USING PRIMARY KEY", detail))
        if match and "CONSTANT ROW" not in detail:
            table = match.group(1)
            if not table.startswith("(") and table not in tables:
                tables.append(table)
    return tables


_SYNTAX_ERROR = re.compile(r'near "(.+)": syntax error')


def _js_error(error: sqlite3.Error, statement: str = "") -> JsException:
    """A SQLite error worded as workerd words it: message, offset, code, extended code."""
    code = getattr(error, "sqlite_errorcode", None)
    extended = getattr(error, "sqlite_errorname", None)
    if code is None:
        return JsException(str(error))
    primary = _PRIMARY_ERROR_NAMES.get(code & 0xFF, extended or "SQLITE_ERROR")
    message = str(error)
    # workerd adds where the syntax error is; Python's sqlite3 does not say,
    # but the token SQLite quotes is found at that offset.
    near = _SYNTAX_ERROR.fullmatch(message)
    if near and near.group(1) in statement:
        message += f" at offset {statement.index(near.group(1))}"
    message = f"{message}: {primary}"
    if extended and extended != primary:
        message += f" (extended: {extended})"
    return JsException(message)
