"""The narrow SQL interface every primitive speaks: the runtime edge for storage.

Lives here: ``Sql`` over ``ctx.storage`` (``exec`` returning plain dict rows,
``transaction`` running a synchronous function atomically) and the alarm
calls. It is the only library code that touches ``ctx.storage``, so the
JavaScript shapes of production (JsDict rows, cursors whose counters freeze,
camelCase methods) stop here.
Must not know: any primitive's tables or protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class Sql:
    def __init__(self, ctx: Any) -> None:
        self._storage = ctx.storage
        self._sql = ctx.storage.sql
        self.rollbacks = 0  #: transactions rolled back: what was read inside one may be undone
        self.depth = 0  #: transactions of this ``Sql`` open now (nested ones count)

    def exec(self, query: str, *bindings: Any) -> list[dict[str, Any]]:
        """Run one statement (or several, without bindings) and return every row.

        The cursor is always consumed here: an unconsumed cursor can make
        later statements fail in production.
        """
        return [dict(row) for row in self._sql.exec(query, *bindings).toArray()]

    def one(self, query: str, *bindings: Any) -> dict[str, Any] | None:
        """The single row a query returns, or None when it returns none."""
        rows = self.exec(query, *bindings)
        if len(rows) > 1:
            raise ValueError(f"expected at most one row, got {len(rows)}: {query}")
        return rows[0] if rows else None

    def transaction(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (synchronous, no awaits) so that its writes commit together."""
        self.depth += 1
        try:
            return self._storage.transactionSync(fn)
        except BaseException:
            self.rollbacks += 1
            raise
        finally:
            self.depth -= 1

    async def flush(self) -> None:
        """Wait until every write made so far is durable (``ctx.storage.sync()``;
        not the scheduler's ``sync``, which moves the alarm, nor a ``sync``
        message, which carries reports to a holder)."""
        await self._storage.sync()

    async def get_alarm(self) -> float | None:
        return await self._storage.getAlarm()

    async def set_alarm(self, at_ms: float) -> None:
        await self._storage.setAlarm(at_ms)

    async def delete_alarm(self) -> None:
        await self._storage.deleteAlarm()


class GrowingCounter:
    """Numbers that only grow within this instance, starting above a column's maximum.

    ``max_query`` returns that maximum as ``n`` (NULL when the table is
    empty). It is read once, when the counter is made (its table must
    exist), so a counter costs one scan per instance and no write. Read
    then and not at the first number: a number this instance read from the
    table before its first write (a message version held by a call in
    flight) must stay below every number it hands out, even once that row
    is deleted.
    """

    def __init__(self, sql: Sql | None, max_query: str) -> None:
        """(``sql`` None: the table is not made yet, so no number was ever handed out.)"""
        row = sql.one(max_query) if sql is not None else None
        self._last = int(row["n"] or 0) if row else 0

    def next(self) -> int:
        self._last += 1
        return self._last
