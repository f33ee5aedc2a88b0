"""The conformance probe's Durable Object in Python: the same script, on the
embedded runtime and in real Pyodide.

Lives here: the Python interpreter of probe operations, written the way a
user's Worker reaches storage (``self.ctx.storage`` through the ``workers``
SDK). Its twin on real workerd is ``fidelity/workerd/probe.js``; both
record the same shapes. Must not know: what is expected.
"""

import time

from workers import DurableObject


class RolledBack(Exception):
    pass


def _error(error):
    message = getattr(error, "message", None) or str(error)
    return {"error": message.removeprefix("Error: "), "kind": getattr(error, "name", type(error).__name__)}


def _bindings(op):
    # {"bigint": digits} stands for an int that Pyodide turns into a JavaScript BigInt.
    return [int(b["bigint"]) if isinstance(b, dict) else b for b in op.get("bindings", [])]


def _cursor_record(cursor, how):
    columns = list(cursor.columnNames)
    if how == "raw":
        rows = [list(row) for row in cursor.raw()]
    elif how == "one":
        rows = [dict(cursor.one())]
    else:
        rows = [dict(row) for row in cursor.toArray()]
    return {"columns": columns, "rows": rows, **_counters(cursor)}


def _counters(cursor):
    # Read once, after the cursor is consumed (the SDK freezes them). A host
    # without counters (stock SQLite) throws: the record then has none.
    try:
        return {"rowsRead": cursor.rowsRead, "rowsWritten": cursor.rowsWritten}
    except Exception:
        return {}


class Probe(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.storage = ctx.storage
        self.sql = ctx.storage.sql

    def _step(self, op):
        try:
            if op["op"] == "sql":
                return _cursor_record(self.sql.exec(op["query"], *_bindings(op)), op.get("how"))
            if op["op"] == "counters_twice":
                cursor = self.sql.exec(op["query"], *_bindings(op))
                before = [cursor.rowsRead, cursor.rowsWritten]
                cursor.toArray()
                return {"before": before, "after": [cursor.rowsRead, cursor.rowsWritten]}
            if op["op"] == "transaction":
                return {"value": self.storage.transactionSync(lambda: self._transaction(op))}
        except Exception as error:  # recorded, as the JavaScript probe records it
            return _error(error)
        return {"error": f"unknown op {op['op']}", "kind": "Error"}

    def _transaction(self, op):
        for inner in op["ops"]:
            result = self._step(inner)
            if "error" in result:
                raise RolledBack(result["error"])
        if op.get("fail"):
            raise RolledBack("rolled back on purpose")
        return op.get("value")

    async def run(self, ops):
        results = []
        for op in ops:
            if op["op"] == "set_alarm_in_past":
                self.sql.exec("CREATE TABLE IF NOT EXISTS probe_alarms "
                              "(run INTEGER, retry INTEGER, is_retry INTEGER, alarm_during REAL)")
                await self.storage.setAlarm(time.time() * 1000 - op["ago_ms"])
                results.append({"alarmSet": True})
            elif op["op"] == "sync":
                await self.storage.sync()
                results.append({"synced": True})
            elif op["op"] == "alarm_log":
                rows = self.sql.exec("SELECT run, retry, is_retry, alarm_during FROM probe_alarms ORDER BY run")
                results.append({"runs": [dict(r) for r in rows.toArray()],
                                "alarmAfter": await self.storage.getAlarm()})
            else:
                results.append(self._step(op))
        return results

    async def alarm(self, info):
        during = await self.storage.getAlarm()
        runs = self.sql.exec("SELECT count(*) AS n FROM probe_alarms").one()["n"]
        retry = getattr(info, "retryCount", -1)
        self.sql.exec("INSERT INTO probe_alarms VALUES (?, ?, ?, ?)", runs + 1, retry,
                      int(bool(getattr(info, "isRetry", False))), during)
        if runs == 0:
            raise RuntimeError("the first alarm run fails on purpose")
