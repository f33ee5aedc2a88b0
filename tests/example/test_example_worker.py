"""The example Worker (src/entry.py) as deployed: RPC, HTTP, and exact totals under faults."""

import ast
import asyncio
import json
import subprocess
import sys
import zlib
from urllib.parse import quote

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
        for round_ in range(40):  # (enough calls that every kind of fault is all but sure to strike)
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
    assert "duplicate" in events and events & {"lost request", "lost reply"}  # reports lost and repeated
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


# -- liveness: the sweep ---------------------------------------------------------------

@pytest.mark.parametrize("crons", [None, []], ids=["with the sweep", "without it"])
def test_a_shard_whose_alarm_the_runtime_gave_up_on_resumes_at_the_sweep_or_a_read(crons):
    # Jobs queued while their holder cannot be reached (its first minute), so
    # the asks their enqueues make in their own events fail, and every alarm
    # run of their shard fails for five minutes: the runtime tries seven
    # times and gives up. Nothing calls the shard again. The Worker's sweep
    # (every 30 minutes) does; without it the jobs wait until a read comes,
    # which resumes them (the alarm is long overdue).
    from durability.testing import Outage

    job_ids = ["job-3", "job-16", "job-21", "job-40"]  # all on shard-3 of 16
    shard = "shard-3"
    assert {f"shard-{zlib.crc32(j.encode()) % 16}" for j in job_ids} == {shard}
    options = {} if crons is None else {"crons": crons}
    faults = Faults(outages=(Outage(f"JobShard:{shard}", 0, 300_000),
                             Outage("AccountLimit:acme", 0, 60_000, alarms=False, calls=True)))
    with example_runtime(faults=faults, **options) as runtime:
        async def states():
            with runtime.no_faults():
                return [(await runtime.call_entrypoint("job_status", j))["state"] for j in job_ids]

        async def scenario():
            for job_id in job_ids:
                await runtime.call_entrypoint("submit_job", {"id": job_id, "account": "acme", "work_ms": 1_000})
            await asyncio.sleep(40 * 60)
            first = await states()
            await asyncio.sleep(60)
            return first, await states()

        start = runtime.now_ms()
        first, then = runtime.run(scenario())
        gave_up = [at for at, name, event, _ in runtime.trace
                   if name == f"JobShard:{shard}" and event == "alarm abandoned"]
    assert len(gave_up) == 1 and gave_up[0] < start + 300_000
    assert first == (["released"] * 4 if crons is None else ["queued"] * 4)
    assert then == ["released"] * 4


ODD_IDS = ["job one", "a/b", "a\\b", "50%", "%41", "é ü", "a?b#c", "..x", "+plus", "日本"]


def test_every_id_the_api_accepts_reads_back_through_its_route_decoded_once(example):
    auth = {"Authorization": "Bearer t0ken"}

    async def scenario():
        read = {}
        for n, job_id in enumerate(ODD_IDS):
            account = f"acct {job_id}"
            job = {"id": job_id, "account": account, "work_ms": 600_000}
            submitted = await example.fetch("https://w.test/jobs", method="POST", headers=auth, body=json.dumps(job))
            assert submitted.status == 202, await submitted.text()
            await example.fetch(f"https://w.test/counters/{quote(job_id, safe='')}/add", method="POST",
                                headers=auth, body=json.dumps({"tally": job_id, "amount": n + 1}))
        await asyncio.sleep(5)
        for job_id in ODD_IDS:
            encoded = quote(job_id, safe="")
            status = await example.fetch(f"https://w.test/jobs/{encoded}", headers=auth)
            usage = await example.fetch(f"https://w.test/accounts/{quote(f'acct {job_id}', safe='')}/usage",
                                        headers=auth)
            total = await example.fetch(f"https://w.test/tallies/{encoded}", headers=auth)
            read[job_id] = ((status.status, await status.json()), (usage.status, await usage.json()),
                            (total.status, await total.json()))
        return read

    for n, (job_id, (status, usage, total)) in enumerate(example.run(scenario()).items()):
        assert status[0] == 200 and status[1]["id"] == job_id and status[1]["state"] == "admitted", (job_id, status)
        assert status[1]["key"] == f"acct {job_id}"
        assert usage[0] == 200 and usage[1]["outstanding"] == 1, (job_id, usage)  # the account's own holder
        assert total == (200, {"total": n + 1}), (job_id, total)


@pytest.mark.parametrize("name", [".", ".."])
def test_a_name_no_url_path_can_carry_is_refused_at_submit(example, name):
    auth = {"Authorization": "Bearer t0ken"}

    async def scenario():
        replies = []
        for job in ({"id": name, "account": "a"}, {"id": "j", "account": name}):
            response = await example.fetch("https://w.test/jobs", method="POST", headers=auth, body=json.dumps(job))
            replies.append((response.status, await response.json()))
        return replies

    field = {0: "id", 1: "account"}
    for n, (status, reply) in enumerate(example.run(scenario())):
        assert status == 400 and reply["error"] == f"{field[n]} must not be {name!r}: no URL path can carry it"


def test_a_path_not_utf_8_once_decoded_is_a_400(example):
    async def scenario():
        response = await example.fetch("https://w.test/jobs/%FF", headers={"Authorization": "Bearer t0ken"})
        return response.status, await response.json()

    assert example.run(scenario()) == (400, {"error": "the path must be UTF-8 once percent-decoded"})


def test_a_job_running_when_its_shard_is_evicted_reads_pending_until_it_ends():
    # Its admitted item is its record until it settles: a read that starts
    # the new instance, before the queue hands the job in again, finds no
    # row of it and still says it runs.
    with example_runtime() as runtime:
        shard = runtime.env.JOB_SHARD.getByName("shard-3")  # job-3's

        async def scenario():
            await runtime.call_entrypoint("submit_job", {"id": "job-3", "account": "acme", "work_ms": 5_000})
            await asyncio.sleep(2)
            running = await runtime.call_entrypoint("job_status", "job-3")
            runtime.evict(shard)
            after = await runtime.call_entrypoint("job_status", "job-3")
            await asyncio.sleep(60)
            return running, after, await runtime.call_entrypoint("job_status", "job-3")

        running, after, done = runtime.run(scenario())
    assert (running["state"], running["job"]) == ("admitted", {"status": "pending"})
    assert (after["state"], after["job"]) == ("admitted", {"status": "pending"})
    assert done["job"]["status"] == "completed"
