"""The example Worker (src/entry.py) as deployed: RPC, HTTP, and exact totals under faults."""

import ast
import asyncio
import json
import subprocess
import sys

import pytest

from durability.testing import Faults, JsException
from support import ROOT, example_runtime


def test_wrangler_toml_bindings_and_vars_are_loaded(example):
    assert set(example.namespaces) == {"COUNTER", "TALLY", "ACCOUNT_LIMIT", "JOB_SHARD", "UPLOAD_SLOTS"}
    assert example.env.ACCOUNT_CONCURRENCY == "10"
    assert example.env.API_TOKEN == "t0ken"


def test_rpc_adds_and_totals(example):
    async def scenario():
        assert await example.call_entrypoint("add", "c1", "t", 5) == 5
        assert await example.call_entrypoint("add", "c1", "t", 2) == 7
        assert await example.call_entrypoint("add", "c2", "t", 1) == 1
        await asyncio.sleep(5)
        return await example.call_entrypoint("total", "t")

    assert example.run(scenario()) == 8


@pytest.mark.parametrize(
    "args", [("", "t", 1), ("c", "", 1), ("c", "t", 0), ("c", "t", True), ("c", "t", 1.5), ("c", "t", "1")]
)
def test_bad_rpc_input_gets_a_clear_error_and_changes_nothing(example, args):
    async def scenario():
        with pytest.raises(JsException) as caught:
            await example.call_entrypoint("add", *args)
        return caught.value, example.totals()["rows_written"]

    error, written = example.run(scenario())
    assert "ValueError" in error.message
    assert written == 0


def test_http_needs_the_bearer_token(example):
    async def scenario():
        responses = [
            await example.fetch("https://w.test/tallies/t"),
            await example.fetch("https://w.test/tallies/t", headers={"Authorization": "Bearer wrong"}),
        ]
        return [r.status for r in responses]

    assert example.run(scenario()) == [401, 401]


@pytest.mark.parametrize("path", ["/counters/c1/add", "/jobs", "/users/u1/uploads"])
@pytest.mark.parametrize("body", ["{not json", "[1]", "3", "\"text\"", "", "\udcff"], ids=[
    "broken", "list", "number", "string", "empty", "lone-surrogate"])
def test_a_body_that_is_not_a_json_object_is_a_400_and_changes_nothing(example, path, body):
    auth = {"Authorization": "Bearer t0ken"}
    raw = body.encode("utf-8", "surrogateescape")  # bytes that are not UTF-8 for the last case

    async def scenario():
        response = await example.fetch(f"https://w.test{path}", method="POST", headers=auth, body=raw)
        return response.status, await response.json()

    status, reply = example.run(scenario())
    assert status == 400 and "JSON object" in reply["error"]
    assert [event for event in example.trace if event[2] == "call"] == []  # no object was asked


def test_http_routes(example):
    auth = {"Authorization": "Bearer t0ken"}

    async def scenario():
        added = await example.fetch("https://w.test/counters/c1/add", method="POST", headers=auth,
                                    body=json.dumps({"tally": "t", "amount": 3}))
        bad = await example.fetch("https://w.test/counters/c1/add", method="POST", headers=auth,
                                  body=json.dumps({"tally": "t", "amount": -3}))
        not_json = await example.fetch("https://w.test/counters/c1/add", method="POST", headers=auth,
                                       body="[1]")
        missing = await example.fetch("https://w.test/nowhere", headers=auth)
        await asyncio.sleep(5)
        total = await example.fetch("https://w.test/tallies/t", headers=auth)
        return [(r.status, await r.json()) for r in (added, bad, not_json, missing, total)]

    results = example.run(scenario())
    assert results[0] == (200, {"count": 3})
    assert results[1][0] == 400 and "amount" in results[1][1]["error"]
    assert results[2][0] == 400
    assert results[3] == (404, {"error": "not found"})
    assert results[4] == (200, {"total": 3})


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_tallies_are_exact_under_faults(seed):
    # Counters are evicted in the middle of their alarms (while they await a
    # tally), tallies while they serve a report; lost and duplicated reports.
    faults = Faults(lost_request=0.1, lost_reply=0.1, duplicate=0.1, latency_ms=(0, 50), evict=0.1,
                    crash_before_commit=0.03, alarm_failure=0.1, duplicate_alarm=0.1)
    runtime = example_runtime(seed=seed, faults=faults)

    async def scenario():
        expected = {}
        for round_ in range(30):
            for counter in ("a", "b", "c"):
                tally = f"t{round_ % 2}"
                try:
                    await runtime.env.COUNTER.getByName(counter).add(tally, round_ + 1)
                except JsException:
                    with runtime.no_faults():  # learn whether it applied
                        now = await runtime.env.COUNTER.getByName(counter).count(tally)
                    if now != expected.get((counter, tally), 0) + round_ + 1:
                        continue
                expected[(counter, tally)] = expected.get((counter, tally), 0) + round_ + 1
            await asyncio.sleep(0.3)
        await asyncio.sleep(300)
        with runtime.no_faults():
            totals = {t: await runtime.env.TALLY.getByName(t).total() for t in ("t0", "t1")}
        want = {t: sum(v for (_, tt), v in expected.items() if tt == t) for t in ("t0", "t1")}
        return totals, want

    totals, want = runtime.run(scenario())
    assert totals == want and sum(want.values()) > 0
    events = {event for _, _, event, _ in runtime.trace}
    assert {"lost request", "lost reply", "duplicate"} <= events
    counters = [h for h in runtime.hosts() if h.class_name == "Counter"]
    assert sum(h.stats.evictions for h in counters) > 0
    runtime.close()


def test_the_demo_command_reports_exact_tallies():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo_outbox.py"), "--json", "--counters", "4", "--increments", "15"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["exact"] is True and summary["increments"] == 60
    assert summary["faults"]["evictions"] > 0


def _imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module.split(".")[0]


def test_the_deployed_code_imports_only_the_standard_library_and_the_sdk():
    worker_modules = list((ROOT / "src").glob("*.py"))  # entry.py and the modules beside it
    deployed = worker_modules + [
        p for p in (ROOT / "src" / "durability").rglob("*.py") if "testing" not in p.parts
    ]
    allowed = set(sys.stdlib_module_names) | {"workers", "durability"} | {p.stem for p in worker_modules}
    for path in deployed:
        foreign = set(_imports(path)) - allowed
        assert not foreign, f"{path.relative_to(ROOT)} imports {foreign}"


def test_the_main_demo_keeps_every_promise_on_a_small_workload():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py"), "--json", "--jobs", "80", "--shards", "4",
         "--seed", "3", "--fault-rate", "0.05"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    for field in ("submitted", "admitted", "completed", "limit", "max_running", "p50_wait_s", "p99_wait_s",
                  "rows_written_per_admission", "rows_read_per_admission", "rpc_per_admission",
                  "leaked_permits"):
        assert field in summary
    assert summary["submitted"] == summary["admitted"] == 80
    assert summary["completed"] + summary["failed"] == 80
    assert all(summary["max_running"][a] <= summary["limit"][a] for a in summary["limit"])
    assert summary["leaked_permits"] == 0 and summary["jobs_run_twice_at_once"] == 0
    assert summary["evictions"] > 0


@pytest.mark.parametrize("verbose", [False, True])
def test_the_main_demo_prints_its_progress_and_summary_only_and_the_log_with_verbose(verbose):
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py"), "--jobs", "60", "--shards", "4", "--seed", "3",
         "--fault-rate", "0.05", *(["--verbose"] if verbose else [])],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    # stderr carries the progress bar, redrawn in place with \r, and with --verbose the log.
    logged = [line for line in result.stderr.replace("\r", "\n").splitlines() if line and not line.startswith("[")]
    assert "faults injected:" in result.stdout
    if verbose:
        assert any("failed" in line for line in logged) and "warnings logged" not in result.stdout
    else:
        assert logged == [] and "warnings logged" in result.stdout and "by cause:" in result.stdout
