"""The conformance probe (tier T3): one script of storage and alarm operations
on real workerd, on the embedded runtime and in real Pyodide, compared.

Lives here: the script (cursor shapes, refused statements, constraint
errors, ``transactionSync`` rollback, bindings, an alarm set in the past
whose first run throws), the statements the library itself issues
(recorded from the example Worker running on the embedded runtime, then
replayed one by one on workerd), the runners of each tier and the
comparison with its short allow-list. Must not know: pytest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from durability.testing import Runtime, load_worker_module
from durability.testing._sql import SqlDatabase

from .embedded import EmbeddedDriver
from .node_tools import run_json
from .pyodide_host import ROOT, run_host
from .scenarios import account_jobs, probe_script, uploads

WORKERD_RUNNER = ROOT / "fidelity" / "workerd" / "run.mjs"
PROBE_WORKER = ROOT / "fidelity" / "workers" / "conformance.py"
ALARM = {"object": "alarms", "runs": 2, "timeout_ms": 15_000}

SCRIPT = [
    {"op": "sql", "query": "CREATE TABLE t (id TEXT PRIMARY KEY, n INTEGER, x REAL, b TEXT)"},
    {"op": "sql", "query": "CREATE INDEX t_n ON t (n)"},
    {"op": "sql", "query": "INSERT INTO t VALUES (?, ?, ?, ?)", "bindings": ["a", 1, 1.5, None]},
    {"op": "sync"},
    {"op": "sql", "query": "INSERT INTO t VALUES (?, ?, ?, ?)", "bindings": ["b", 2, 2.0, "true"]},
    {"op": "sql", "query": "INSERT INTO t VALUES (?, ?, ?, ?)", "bindings": ["c", 2 ** 53 - 2, 0.1, "x"]},
    {"op": "sql", "query": "SELECT ? AS big", "bindings": [{"bigint": str(2 ** 53 - 1)}]},
    {"op": "sql", "query": "SELECT * FROM t ORDER BY id"},
    {"op": "sql", "query": "SELECT id, n FROM t ORDER BY id", "how": "raw"},
    {"op": "sql", "query": "SELECT n FROM t WHERE id = ?", "bindings": ["a"], "how": "one"},
    {"op": "sql", "query": "SELECT n FROM t WHERE id = ?", "bindings": ["zz"], "how": "one"},
    {"op": "sql", "query": "SELECT n FROM t", "how": "one"},
    {"op": "sql", "query": "SELECT count(*) AS c, sum(n) AS s FROM t WHERE n > ?", "bindings": [1]},
    {"op": "sql", "query": "UPDATE t SET n = n + 1 WHERE id = ?", "bindings": ["a"]},
    {"op": "sql", "query": "UPDATE t SET x = 9 WHERE n >= 2"},
    {"op": "sql", "query": "INSERT INTO t VALUES ('a', 5, 0, NULL) ON CONFLICT (id) DO UPDATE SET n = excluded.n"},
    {"op": "sql", "query": "DELETE FROM t WHERE id = ? RETURNING n", "bindings": ["b"]},
    {"op": "sql", "query": "INSERT INTO t VALUES (?, 1, 1, NULL)", "bindings": ["a"]},
    {"op": "sql", "query": "BEGIN"},
    {"op": "sql", "query": "SAVEPOINT s1"},
    {"op": "sql", "query": "SELEC 1"},
    {"op": "sql", "query": "SELECT * FROM missing"},
    {"op": "sql", "query": "SELECT 1 AS one; SELECT 2 AS two"},
    {"op": "sql", "query": "SELECT ? AS p; SELECT 2 AS two", "bindings": [1]},
    {"op": "sql", "query": "SELECT 1 AS one; SELECT ? AS p", "bindings": [1]},
    {"op": "counters_twice", "query": "SELECT * FROM t"},
    {"op": "transaction", "value": 7, "ops": [
        {"op": "sql", "query": "INSERT INTO t VALUES ('t1', 1, 1, NULL)"}]},
    {"op": "transaction", "fail": True, "ops": [
        {"op": "sql", "query": "INSERT INTO t VALUES ('t2', 1, 1, NULL)"}]},
    {"op": "transaction", "ops": [
        {"op": "sql", "query": "INSERT INTO t VALUES ('t3', 1, 1, NULL)"},
        {"op": "sql", "query": "INSERT INTO t VALUES ('t3', 1, 1, NULL)"}]},
    {"op": "sql", "query": "SELECT id FROM t WHERE id LIKE 't%' ORDER BY id"},
    {"op": "sql", "query": "CREATE TABLE auto (k INTEGER PRIMARY KEY AUTOINCREMENT, v TEXT)"},
    {"op": "sql", "query": "INSERT INTO auto (v) VALUES (?)", "bindings": ["one"]},
    {"op": "sql", "query": "PRAGMA table_list"},
    {"op": "sql", "query": "PRAGMA journal_mode"},
]

# How rows read are counted: scans, sorters, searches that find rows they do
# not keep, aggregates, upserts on a WITHOUT ROWID table, schema changes.
_SHAPES = [
    "SELECT min(v) AS m FROM x",
    "SELECT * FROM x ORDER BY v",
    "SELECT * FROM x WHERE k = ? ORDER BY v LIMIT ?",
    "SELECT * FROM x WHERE k = ? LIMIT 1",
    "SELECT k, count(*) AS n, min(v) AS o FROM x WHERE k = ? GROUP BY k ORDER BY o",
    "SELECT k, count(*) AS n FROM x GROUP BY k",
    "SELECT count(*) AS n FROM x",
    "SELECT count(*) AS n FROM x WHERE id = ?",
]


def _shape_ops() -> list[dict[str, Any]]:
    bindings = {"k = ?": ["a"], "LIMIT ?": [1], "id = ?": ["r0"]}
    ops = []
    for query in _SHAPES:
        values = [v for marker, vs in bindings.items() if marker in query for v in vs]
        ops.append({"op": "sql", "query": query, "bindings": values})
    return ops


SCRIPT += [{"op": "sql", "query": "CREATE TABLE x (id TEXT PRIMARY KEY, k TEXT, v REAL) WITHOUT ROWID"},
           *_shape_ops()]
for _n in range(3):
    SCRIPT += [{"op": "sql", "query": "INSERT INTO x VALUES (?, ?, ?)",
                "bindings": [f"r{_n}", "ab"[_n % 2], 10.0 - _n]}, *_shape_ops()]
SCRIPT += [
    {"op": "sql", "query": "INSERT INTO x VALUES (?, 'a', 1) ON CONFLICT (id) DO UPDATE SET v = excluded.v",
     "bindings": ["r0"]},
    {"op": "sql", "query": "INSERT INTO x VALUES (?, 'a', 1) ON CONFLICT (id) DO UPDATE SET v = excluded.v "
                           "RETURNING v", "bindings": ["r0"]},
    {"op": "sql", "query": "DELETE FROM x WHERE id = ? AND v = ?", "bindings": ["r0", 99]},
    {"op": "sql", "query": "UPDATE x SET v = 5 WHERE id = ? AND v = ?", "bindings": ["r1", 99]},
    {"op": "sql", "query": "CREATE TABLE IF NOT EXISTS x (id TEXT PRIMARY KEY) WITHOUT ROWID"},
    {"op": "sql", "query": "CREATE TABLE z (a TEXT PRIMARY KEY, b INTEGER)"},
    {"op": "sql", "query": "CREATE INDEX z_b ON z (b)"},
    {"op": "sql", "query": "CREATE INDEX x_v ON x (v)"},
    {"op": "sql", "query": "SELECT min(v) AS m FROM x"},
    {"op": "sql", "query": "DROP INDEX x_v"},
    {"op": "sql", "query": "DROP TABLE z"},
]


def basic_scripts() -> list[dict[str, Any]]:
    return [{"object": "script", "ops": SCRIPT},
            {"object": ALARM["object"], "ops": [{"op": "set_alarm_in_past", "ago_ms": 1_000}]}]


# -- the statements the library itself issues ---------------------------------
@contextmanager
def recording_statements() -> Iterator[dict[int, list[dict[str, Any]]]]:
    """Record every statement each object runs (text, bindings, counts) while inside."""
    log: dict[int, list[dict[str, Any]]] = {}
    real_exec = SqlDatabase.exec

    def exec(db, query, bindings):
        entry = {"op": "sql", "query": query, "bindings": list(bindings)}
        if not hasattr(db, "_recorded_as"):  # one log per database, whatever reuses its id() later
            db._recorded_as = len(log)
            log[db._recorded_as] = []
        log[db._recorded_as].append(entry)
        # The database's totals, not the cursor's counters: those freeze at
        # their first read, as in production, and the caller has not read yet.
        read, written = db.rows_read, db.rows_written
        try:
            cursor = real_exec(db, query, bindings)
        except Exception as error:
            entry["expect"] = {"error": str(getattr(error, "message", error))}
            raise
        entry["expect"] = {"rowsRead": db.rows_read - read, "rowsWritten": db.rows_written - written}
        return cursor

    SqlDatabase.exec = exec
    try:
        yield log
    finally:
        SqlDatabase.exec = real_exec


def library_statements(jobs: int = 30) -> list[dict[str, Any]]:
    """Run the example Worker (jobs under grants and under leases, counters,
    uploads) and return each object's statements."""
    limits = json.dumps({"acct-a": 2, "acct-b": 3})
    leases = json.dumps({"provisioning": {"mode": "strict"}, "permits_per_lease": 2, "ttl_ms": 60_000})
    with recording_statements() as log:
        with Runtime.from_wrangler(ROOT / "wrangler.toml", vars={"ACCOUNT_LIMITS": limits, "SHARDS": "3"}) as runtime:
            runtime.run(account_jobs.run(EmbeddedDriver(runtime), jobs=jobs))

            async def count():
                for i in range(6):
                    await runtime.call_entrypoint("add", f"counter-{i % 2}", "tally", i + 1)
                    await runtime.env.COUNTER.getByName(f"counter-{i % 2}").add("tally", 1)
            runtime.run(count())
            runtime.run(uploads.run(EmbeddedDriver(runtime)))
            runtime.advance(30)
        vars = {"ACCOUNT_LIMITS": limits, "SHARDS": "3", "ACCOUNT_LEASES": leases}
        with Runtime.from_wrangler(ROOT / "wrangler.toml", vars=vars) as runtime:
            runtime.run(account_jobs.run(EmbeddedDriver(runtime), jobs=jobs))
    return [{"object": f"replay-{n}", "ops": ops} for n, ops in enumerate(log.values())]


# -- the tiers -------------------------------------------------------------------
def run_workerd(scripts: list[dict[str, Any]], alarm: dict | None = ALARM) -> dict[str, Any]:
    report = run_json(WORKERD_RUNNER, {"scripts": _bare_scripts(scripts), "alarm": alarm})
    return {"results": report["results"], "alarm": report["alarm"]}


def run_embedded(scripts: list[dict[str, Any]], alarm: dict | None = ALARM) -> dict[str, Any]:
    with Runtime(load_worker_module(PROBE_WORKER), {"PROBE": "Probe"}) as runtime:
        return runtime.run(probe_script.run(EmbeddedDriver(runtime), _bare_scripts(scripts), alarm))


def run_pyodide(scripts: list[dict[str, Any]], alarm: dict | None = ALARM) -> dict[str, Any]:
    worker = {"main": "conformance", "module_dir": PROBE_WORKER.parent, "vars": {},
              "durableObjects": [{"name": "PROBE", "className": "Probe"}]}
    task = {"kind": "scenario", "module": "scenarios.probe_script", "function": "run",
            "args": {"scripts": _bare_scripts(scripts), "alarm": alarm}}
    return run_host(task, worker=worker)["result"]


def _bare(op: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in op.items() if k != "expect"}


def _bare_scripts(scripts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The scripts as a tier runs them: without what the embedded runtime expected."""
    return [{"object": s["object"], "ops": [_bare(op) for op in s["ops"]]} for s in scripts]


# -- comparing ---------------------------------------------------------------------
# Differences that are known, explained, and not bugs. Everything else fails.
ALLOWED = {
    "counters-before-consuming": "workerd has stepped only the first row when exec() returns, so "
                                 "counters read before the cursor is consumed are partial; in "
                                 "Python the SDK freezes them at that first read. The embedded "
                                 "runtime answers its final count there only after consuming; "
                                 "read them after consuming (the library does).",
    "pyodide-counters": "The Pyodide host runs stock SQLite (sql.js), which has no per-statement "
                        "counters: its cursors throw instead, and its counts are not compared.",
    "pyodide-error-code": "Stock SQLite's JavaScript API hides the result code workerd appends "
                          "(': SQLITE_CONSTRAINT (extended: ...)'); the message before it must match.",
    "error-detail": "An error's message must contain workerd's; the embedded runtime may add why "
                    "(a BigInt binding), and a Python exception keeps its own type.",
    "drop-reads": "workerd reads its schema table when it drops a table or an index (about ten "
                  "rows); the embedded runtime counts no reads there. DROP runs only when a "
                  "component is removed, never per request.",
}
_CODE_SUFFIX = re.compile(r": SQLITE_[A-Z_]+( \(extended: [A-Z_]+\))?$")


def _comparable(record: Any, tier: str) -> Any:
    """What of a record is compared: everything, but counters on Pyodide."""
    if not isinstance(record, dict) or "error" in record:
        return record
    if tier == "pyodide":
        return {k: v for k, v in record.items() if k not in ("rowsRead", "rowsWritten")}  # pyodide-counters
    return record


def _same_error(want: str, got: str, tier: str) -> bool:
    want, got = want.removeprefix("Error: "), got.removeprefix("Error: ")
    if tier == "pyodide":
        want = _CODE_SUFFIX.sub("", want)
    return want in got  # error-detail


def _alarm_log(log: dict[str, Any] | None) -> Any:
    # When getAlarm() answered a time, which time it was differs between runs.
    if log is None:
        return None
    runs = [{**run, "alarm_during": None if run["alarm_during"] is None else "a time"} for run in log["runs"]]
    return {"runs": runs, "alarmAfter": log["alarmAfter"]}


def differences(reference: dict[str, Any], other: dict[str, Any], tier: str,
                scripts: list[dict[str, Any]]) -> list[str]:
    """Every difference between workerd's record and another tier's, outside the allow-list."""
    found = []
    for script, ref_results, results in zip(scripts, reference["results"], other["results"], strict=True):
        for i, (op, want, got) in enumerate(zip(script["ops"], ref_results, results, strict=True)):
            where = f"{script['object']}[{i}] {_describe(op)}"
            if op["op"] == "counters_twice":
                # counters-before-consuming: frozen (both reads alike), and final after consuming.
                if tier != "pyodide" and got["before"] != got["after"]:
                    found.append(f"{where}: counters not frozen at the first read: {got}")
                continue
            if "error" in want or "error" in got:
                if not ("error" in want and "error" in got and _same_error(want["error"], got["error"], tier)):
                    found.append(f"{where}:\n    workerd: {want}\n    {tier}: {got}")
                continue
            if op.get("query", "").lstrip().upper().startswith("DROP"):
                want, got = ({k: v for k, v in r.items() if k != "rowsRead"} for r in (want, got))  # drop-reads
            if _comparable(want, tier) != _comparable(got, tier):
                found.append(f"{where}:\n    workerd: {want}\n    {tier}: {got}")
    if _alarm_log(reference.get("alarm")) != _alarm_log(other.get("alarm")):
        found.append(f"alarm log:\n    workerd: {reference.get('alarm')}\n    {tier}: {other.get('alarm')}")
    return found


def replay_differences(scripts: list[dict[str, Any]], workerd: dict[str, Any]) -> tuple[list[str], dict]:
    """The library's statements: the embedded runtime's counts and errors against workerd's.

    Returns every difference and the totals of both.
    """
    found = []
    totals = {"statements": 0, "distinct": len({" ".join(op["query"].split()) for s in scripts for op in s["ops"]}),
              "workerd_read": 0, "embedded_read": 0, "workerd_written": 0, "embedded_written": 0}
    for script, results in zip(scripts, workerd["results"], strict=True):
        for i, (op, got) in enumerate(zip(script["ops"], results, strict=True)):
            want = op["expect"]
            where = f"{script['object']}[{i}] {_describe(op)}"
            totals["statements"] += 1
            if "error" in want or "error" in got:
                if ("error" in want) != ("error" in got):
                    found.append(f"{where}:\n    workerd: {got}\n    embedded: {want}")
                continue
            for side, record in (("workerd", got), ("embedded", want)):
                totals[f"{side}_read"] += record["rowsRead"]
                totals[f"{side}_written"] += record["rowsWritten"]
            if (want["rowsRead"], want["rowsWritten"]) != (got["rowsRead"], got["rowsWritten"]):
                found.append(f"{where}: workerd read {got['rowsRead']} wrote {got['rowsWritten']}, "
                             f"embedded read {want['rowsRead']} wrote {want['rowsWritten']}")
    return found, totals


def _describe(op: dict[str, Any]) -> str:
    text = " ".join((op.get("query") or op["op"]).split())
    return f"{text[:160]!r} {op.get('bindings', '')}"
