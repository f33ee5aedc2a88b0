"""``SqlStorageCursor``: the rows and counts one SQL statement hands back.

Lives here: ``SqlCursor``, read as Python code reads it through the workers
SDK (its rows consumed once, in any of the SDK's ways; its counters frozen
at their first read, as the SDK's wrapper freezes them).
Must not know: how the rows were found or counted; the database hands them
over complete.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

from ._values import JsDict, JsException

T = TypeVar("T")
Row = tuple[Any, ...]  #: a row as sqlite3 returns it


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
