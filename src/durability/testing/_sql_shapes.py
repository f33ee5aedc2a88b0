"""What one SQL statement does, learned from SQLite's authorizer and its query plan.

Lives here: ``StatementShapes``, the part of ``SqlDatabase`` that learns a
statement's ``_Shape`` (the table it inserts into, updates or deletes from,
whether it changes the schema, the tables it scans whole, its sorters, its
search and its key terms) and keeps it until the schema changes, and the
authorizer, which learns a statement's shape as SQLite prepares it and
refuses what workerd refuses.
Must not know: what a shape costs in rows (``_sql_counts``), or batches.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._sql_cursor import Row
from ._sql_rules import _ALLOWED_PRAGMAS, _TEMP_ACTIONS, NOT_AUTHORIZED, TRANSACTION_REFUSED, _js_error
from ._values import JsException

_WRITE_ACTIONS = {sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE}
_DDL_ACTIONS = {
    sqlite3.SQLITE_CREATE_TABLE, sqlite3.SQLITE_CREATE_INDEX, sqlite3.SQLITE_DROP_TABLE,
    sqlite3.SQLITE_DROP_INDEX, sqlite3.SQLITE_ALTER_TABLE, sqlite3.SQLITE_CREATE_VIEW,
    sqlite3.SQLITE_DROP_VIEW, sqlite3.SQLITE_CREATE_TRIGGER, sqlite3.SQLITE_DROP_TRIGGER,
}
_LIMIT = re.compile(r"\bLIMIT\s+(\d+|\?)", re.IGNORECASE)
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


class StatementShapes:
    """How an ``SqlDatabase`` learns what each statement does."""

    if TYPE_CHECKING:  # what these methods use of the database they are part of
        _conn: sqlite3.Connection
        _shapes: dict[str, _Shape]
        _schema_version: int
        _learning: _Shape | None
        _refusal: str | None

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
