"""The rows workerd bills one SQL statement for: read and written, as the model counts them.

Lives here: ``RowCounting``, the part of ``SqlDatabase`` that counts the
rows a statement reads and writes from its shape and from what it changed,
and what that count needs to know of the schema (each table's indexes,
AUTOINCREMENT, WITHOUT ROWID).
Must not know: batches, cursors, or how a statement's shape is learned;
the database hands over the shape and the changes.

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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._sql_shapes import _Shape

_INTERNAL = "/* durability.testing */ "
_TRAILING_LIMIT = re.compile(r"\s+LIMIT\s+(\d+|\?)(\s+OFFSET\s+(\d+|\?))?\s*$", re.IGNORECASE)


@dataclass
class _TableInfo:
    indexes: list[tuple[str, list[str | None]]]  # (name, columns) of every index
    autoincrement: bool
    without_rowid: bool


class RowCounting:
    """How an ``SqlDatabase`` counts the rows each statement reads and writes."""

    if TYPE_CHECKING:  # what these methods use of the database they are part of
        _conn: sqlite3.Connection
        _tables: dict[str, _TableInfo]

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

