"""The Worker in real Pyodide 0.28.2 with the real `workers` SDK (tier T2).

The example Worker's account composition runs end to end under
``fidelity/pyodide/host.mjs`` and must end as it ends on the embedded
runtime. Variants of the Worker that break only where the real
interpreter and SDK run show that the tier can fail.
"""

import json
import shutil

import pytest
from webhook_receiver import Receiver

from durability.testing import QueueConsumer, Runtime, load_worker_module
from fidelity.embedded import EmbeddedDriver
from fidelity.pyodide_host import ROOT, PyodideHostError, run_host
from fidelity.scenarios import account_jobs, deep_input, http_bodies, queue_consumer, resume, uploads, webhooks

pytestmark = [pytest.mark.pyodide]

LIMITS = {"acct-a": 2, "acct-b": 3}
VARS = {"ACCOUNT_LIMITS": json.dumps(LIMITS), "SHARDS": "3"}
SCENARIO = {"kind": "scenario", "module": "scenarios.account_jobs", "function": "run", "args": {"jobs": 200}}


@pytest.fixture(scope="module")
def pyodide_outcome():
    return run_host(SCENARIO, vars=VARS)


@pytest.fixture(scope="module")
def embedded_outcome():
    with Runtime.from_wrangler(ROOT / "wrangler.toml", vars=VARS) as runtime:
        result = runtime.run(account_jobs.run(EmbeddedDriver(runtime), **SCENARIO["args"]))
        return {"result": result, "alarms": sum(host.stats.alarm_invocations for host in runtime.hosts())}


def check_promises(outcome):
    assert len(outcome["statuses"]) == 200
    for account, limit in LIMITS.items():
        assert 1 <= outcome["max_running"][account] <= limit, account
    assert outcome["overlaps"] == 0
    assert outcome["runs_of_completed"] == [1]
    assert outcome["outstanding_after"] == {"acct-a": 0, "acct-b": 0, account_jobs.GHOST_ACCOUNT: 0}
    # The ghost's grant was out, and only the holder's alarm took it back.
    assert outcome["ghost"] == {"granted": 1, "outstanding_before_reclaim": 1}


def test_composition_runs_in_pyodide(pyodide_outcome):
    check_promises(pyodide_outcome["result"])
    assert pyodide_outcome["result"]["admitted_via"] == {"grant": 200}
    assert pyodide_outcome["background_errors"] == []
    assert pyodide_outcome["stats"]["alarms"] > 0


def test_pyodide_and_embedded_runtime_agree(pyodide_outcome, embedded_outcome):
    embedded = embedded_outcome["result"]
    check_promises(embedded)
    result = pyodide_outcome["result"]
    assert result["statuses"] == embedded["statuses"]
    assert result["limits"] == embedded["limits"] == LIMITS
    # And in time: the same work takes as long, on as many alarms. (The host
    # once ran a call to another object inside its caller's Python step,
    # which carried the caller's contextvars over: 14 virtual minutes here
    # against 1.7; and a month-long alarm fired every millisecond.)
    assert abs(result["virtual_minutes"] - embedded["virtual_minutes"]) <= 0.15 * embedded["virtual_minutes"]
    assert pyodide_outcome["stats"]["alarms"] <= 1.5 * embedded_outcome["alarms"]


def test_composition_with_strict_leases_runs_in_pyodide():
    # Leases cross RPC as the real SDK converts them; shards draw from them locally.
    leases = {"provisioning": {"mode": "strict"}, "permits_per_lease": 2, "ttl_ms": 60_000}
    report = run_host({**SCENARIO, "args": {"jobs": 60}},
                      vars={**VARS, "ACCOUNT_LEASES": json.dumps(leases)})
    outcome = report["result"]
    assert len(outcome["statuses"]) == 60 and outcome["overlaps"] == 0
    assert outcome["admitted_via"].get("lease", 0) > 0
    for account, limit in LIMITS.items():
        assert 1 <= outcome["max_running"][account] <= limit, account
    assert outcome["outstanding_after"] == {"acct-a": 0, "acct-b": 0, account_jobs.GHOST_ACCOUNT: 0}
    assert report["background_errors"] == []


def test_uploads_held_under_a_lock_semaphore_agree_with_the_embedded_runtime():
    in_pyodide = run_host({"kind": "scenario", "module": "scenarios.uploads", "function": "run"})
    with Runtime.from_wrangler(ROOT / "wrangler.toml") as runtime:
        embedded = runtime.run(uploads.run(EmbeddedDriver(runtime)))
    expected = {"ann": {"uploaded": 5}, "bob": {"uploaded": 3, "busy": 3}, "cy": {"uploaded": 2}}
    for outcome in (in_pyodide["result"], embedded):
        assert outcome["statuses"] == expected
        assert outcome["most_at_once"] == {"ann": 3, "bob": 3, "cy": 2}
        assert outcome["left"] == {"ann": [0, 0], "bob": [0, 0], "cy": [0, 0]}
    assert in_pyodide["background_errors"] == []


def test_worker_classes_import_in_pyodide():
    report = run_host({"kind": "import"})
    assert report["result"] == {
        "durableObjects": ["AccountLimit", "Counter", "JobShard", "Tally", "UploadSlots"],
        "workerEntrypoints": ["Default"],
    }


def _variant(tmp_path, replace):
    """A copy of src/ whose entry.py has one edit: a broken Worker, for this test only."""
    variant = tmp_path / "src"
    shutil.copytree(ROOT / "src", variant, ignore=shutil.ignore_patterns("__pycache__"))
    entry = variant / "entry.py"
    old, new = replace
    text = entry.read_text()
    assert old in text
    entry.write_text(text.replace(old, new, 1))
    return variant


def test_a_cpython_only_import_fails(tmp_path):
    # `ssl` is not in Pyodide's standard library.
    variant = _variant(tmp_path, ("import zlib\n", "import zlib\nimport ssl  # noqa: F401\n"))
    with pytest.raises(PyodideHostError, match="ModuleNotFoundError: No module named 'ssl'"):
        run_host({"kind": "import"}, module_dir=variant)


def test_a_reply_rpc_cannot_carry_fails_the_scenario(tmp_path):
    # The real SDK's python_to_rpc refuses a tuple in a reply.
    variant = _variant(tmp_path, ('return {"id": item.id, "state": item.state}',
                                  'return {"id": item.id, "state": item.state, "at": (1, 2)}'))
    with pytest.raises(PyodideHostError, match="cannot be sent over RPC"):
        run_host({**SCENARIO, "args": {"jobs": 5}}, module_dir=variant, vars=VARS)


def on_both_tiers(scenario, vars):
    """A scenario module's ``run`` in Pyodide (the host's report) and on the embedded runtime (its result)."""
    name = scenario.__name__.rpartition(".")[2]
    in_pyodide = run_host({"kind": "scenario", "module": f"scenarios.{name}", "function": "run"}, vars=vars)
    with Runtime.from_wrangler(ROOT / "wrangler.toml", vars=vars) as runtime:
        return in_pyodide, runtime.run(scenario.run(EmbeddedDriver(runtime)))


def test_http_bodies_that_are_not_json_objects_are_400s_in_pyodide_too():
    in_pyodide, embedded = on_both_tiers(http_bodies, {"API_TOKEN": http_bodies.TOKEN})
    outcomes = in_pyodide["result"]
    assert outcomes == embedded
    for path in http_bodies.ROUTES:
        for name in http_bodies.BODIES:
            assert outcomes[f"{path} {name}"] == [400, "the body must be a JSON object"]
    assert outcomes["wrong token"] == [401, None]
    assert outcomes["a good body"] == [200, {"count": 2}]
    assert in_pyodide["background_errors"] == []


def test_deep_values_get_one_clear_error_at_every_depth_in_pyodide_as_on_cpython():
    in_pyodide, embedded = on_both_tiers(deep_input, {"API_TOKEN": deep_input.TOKEN})
    outcomes = in_pyodide["result"]
    assert outcomes == embedded  # the interpreter did not crash, and said the same
    for depth in deep_input.DEPTHS:
        for kind in ("list", "dict"):
            for door, what in (("queue body", "items[0].body"), ("job payload", "job payload"),
                               ("outbox message", "outbox message")):
                refused = f"ValueError: {what} must nest at most 128 lists or dicts deep"
                assert outcomes[f"{depth} {kind} {door}"] == ("accepted" if depth <= 128 else refused)
        assert outcomes[f"{depth} POST /jobs"][0] == 400  # the example's payload: 64 at most
    assert in_pyodide["background_errors"] == []


def test_the_request_s_own_json_fails_with_a_javascript_error_in_pyodide(tmp_path):
    # The route as it was: request.json() on workerd's JavaScript Request.
    variant = _variant(tmp_path, ("text = await request.text()", "text = await request.json()"))
    with pytest.raises(PyodideHostError, match="SyntaxError"):
        run_host({"kind": "scenario", "module": "scenarios.http_bodies", "function": "run"},
                 module_dir=variant, vars={"API_TOKEN": http_bodies.TOKEN})


def test_webhooks_go_through_the_sdk_s_fetch_in_pyodide_as_on_cpython():
    # In Pyodide the SDK's fetch calls the global fetch, stubbed to answer as
    # the receiver on 127.0.0.1 answers the embedded runtime's real requests.
    task = {"kind": "scenario", "module": "scenarios.webhooks", "function": "run",
            "args": {"base": "https://hooks.test"}}
    in_pyodide = run_host(task, vars=VARS, stub_fetch=True)
    with Receiver(LIMITS) as receiver, Runtime.from_wrangler(ROOT / "wrangler.toml", vars=VARS) as runtime:
        embedded = runtime.run(webhooks.run(EmbeddedDriver(runtime), base=receiver.url("")))
    outcomes = in_pyodide["result"]
    assert outcomes == embedded
    fetches = in_pyodide["fetches"]
    for job_id, outcome in outcomes.items():
        kind = job_id.split("-")[0]
        if kind == "gone":
            assert outcome == {"status": "failed", "error": "NonRetryableError: webhook BASE/gone answered 410: "}
        else:
            assert outcome == {"status": "completed", "result": {"worked_ms": 0, "webhook": {"status": 200}}}
        sent = fetches["deliveries"][job_id]
        assert len(sent) == len(receiver.deliveries[job_id]) == (1 if kind in ("ok", "gone") else 2)
        assert {(d["method"], d["redirect"], d["idempotency_key"], d["content_type"]) for d in sent} == {
            ("POST", "manual", job_id, "application/json")}
    assert fetches["peak"]["acct-a"] <= LIMITS["acct-a"]
    assert in_pyodide["background_errors"] == []


def test_a_read_resumes_a_lost_alarm_in_pyodide_as_on_cpython():
    # The scheduler checks its alarm from a task its constructor starts: the
    # loop, the task and getAlarm/setAlarm through the real SDK's storage.
    in_pyodide = run_host({"kind": "scenario", "module": "scenarios.resume", "function": "run"})
    with Runtime.from_wrangler(ROOT / "wrangler.toml") as runtime:
        embedded = runtime.run(resume.run(EmbeddedDriver(runtime)))
    assert in_pyodide["result"] == embedded == {"before": 0, "count": 5, "after": 5}
    assert in_pyodide["background_errors"] == []


def test_a_queue_consumer_meets_its_batches_in_pyodide_as_on_cpython():
    # The real SDK wraps env.JOBS (a WorkerQueue) and the batch workerd hands
    # Default.queue(batch, env, ctx): bodies, attempts, ids, timestamps and
    # every word the handler says come out the same on both tiers.
    workers = ROOT / "tests" / "workers"
    # Batches of one: how messages share a batch depends on when each send lands, which
    # differs between the tiers; the broker's batching has its own tests (test_queues.py).
    consumer = {"queue": "jobs", "max_batch_size": 1, "max_retries": 1}
    worker = {"main": "queues", "module_dir": workers, "vars": {},
              "durableObjects": [{"name": "SENDER", "className": "Sender"}],
              "queues": {"producers": {"JOBS": "jobs"}, "consumers": [consumer]}}
    in_pyodide = run_host({"kind": "scenario", "module": "scenarios.queue_consumer", "function": "run"},
                          worker=worker)["result"]
    module = load_worker_module(workers / "queues.py")
    module.SEEN.clear()
    with Runtime(module, {"SENDER": "Sender"}, queues={"JOBS": "jobs"},
                 consumers=[QueueConsumer(**consumer)]) as runtime:
        embedded = runtime.run(queue_consumer.run(EmbeddedDriver(runtime)))
    assert in_pyodide == embedded
    # 6 (retry), 7 (retryAll) and 9 (the handler raised) come again once, then are dropped (max_retries 1).
    assert embedded["counts"] == {"jobs": {"sent": 10, "acked": 7, "retried": 6, "dropped": 3}}
    kinds = {entry[2] for entry in embedded["seen"]}
    assert kinds == {"JsDict", "str", "int", "list"}
    assert {tuple(entry[3:]) for entry in embedded["seen"]} == {("str", 32, "datetime")}
