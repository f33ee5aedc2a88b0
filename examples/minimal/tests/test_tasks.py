"""The minimal Worker on the embedded runtime (durability.testing): tasks
run once admitted, bad input changes nothing, and under faults no tenant
ever has more tasks running at once than its limit."""

import asyncio
from pathlib import Path

import pytest

from durability.testing import Faults, JsException, Runtime

WRANGLER = Path(__file__).resolve().parent.parent / "wrangler.toml"


def call_entrypoint(runtime, method, *args):
    return runtime.run(runtime.call_entrypoint(method, *args))


def test_a_task_runs_once_admitted_and_its_permit_comes_back():
    with Runtime.from_wrangler(WRANGLER, seed=1) as runtime:
        assert call_entrypoint(runtime, "submit", {"id": "t1", "tenant": "acme", "work_ms": 500}) == {
            "id": "t1", "state": "queued"}
        runtime.advance(30)
        status = call_entrypoint(runtime, "status", "t1")
        assert status["result"] == {"status": "completed", "result": {"worked_ms": 500}}
        usage = call_entrypoint(runtime, "usage", "acme")
        assert usage["limit"] == 2 and usage["outstanding"] == 0


@pytest.mark.parametrize("task, why", [
    ({"id": "t1"}, "tenant must be a string"),
    ({"id": "", "tenant": "acme"}, "id must be a string"),
    ({"id": "t1", "tenant": "acme", "work_ms": -1}, "work_ms must be an integer"),
    ({"id": "t1", "tenant": "acme", "work_ms": True}, "work_ms must be an integer"),
    ({"id": "t1", "tenant": "acme", "priority": 1}, "a task is an object"),
    (["t1", "acme"], "a task is an object"),
])
def test_a_bad_task_gets_a_clear_error_and_changes_nothing(task, why):
    with Runtime.from_wrangler(WRANGLER, seed=1) as runtime:
        with pytest.raises(JsException, match=f"ValueError: {why}"):  # as it crosses RPC
            call_entrypoint(runtime, "submit", task)
        assert runtime.hosts() == []  # no object was reached


def _count_running(runtime):
    """Patch the Worker's task function to measure, outside the objects, how
    many tasks of each tenant run at once; return the peaks and run counts."""
    running, peaks, runs = {}, {}, {}
    real_task = runtime.module.do_task

    async def measured(task):
        tenant = task["tenant"]
        running[tenant] = running.get(tenant, 0) + 1
        peaks[tenant] = max(peaks.get(tenant, 0), running[tenant])
        runs[task["id"]] = runs.get(task["id"], 0) + 1
        try:
            return await real_task(task)
        finally:
            running[tenant] -= 1

    runtime.module.do_task = measured
    return peaks, runs


async def _submit_all(runtime, tasks):
    for task in tasks:
        while True:  # a repeated submit of an id is a no-op, so retrying is safe
            try:
                await runtime.call_entrypoint("submit", task)
                break
            except JsException:
                await asyncio.sleep(0.1)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_limit_holds_under_faults(seed):
    # Calls between objects are lost, duplicated, delayed and reordered;
    # objects are evicted, lose writes, and their alarms fail.
    faults = Faults(lost_request=0.05, lost_reply=0.05, duplicate=0.05, latency_ms=(0, 40), evict=0.05,
                    crash_before_commit=0.02, alarm_failure=0.05)
    tasks = [{"id": f"task-{n}", "tenant": ("acme", "globex")[n % 2], "work_ms": 200 + 97 * n % 1_500}
             for n in range(40)]
    with Runtime.from_wrangler(WRANGLER, seed=seed, faults=faults) as runtime:
        peaks, runs = _count_running(runtime)

        async def scenario():
            await _submit_all(runtime, tasks)
            await asyncio.sleep(600)
            with runtime.no_faults():
                statuses = [await runtime.call_entrypoint("status", task["id"]) for task in tasks]
                usage = {tenant: await runtime.call_entrypoint("usage", tenant) for tenant in peaks}
            return statuses, usage

        statuses, usage = runtime.run(scenario())
    assert peaks == {"acme": 2, "globex": 2}  # the limit was reached, never passed
    # Every task ended; one whose three attempts were all cut short by an eviction failed.
    ended = [s["result"]["status"] for s in statuses]
    assert set(ended) <= {"completed", "failed"} and ended.count("completed") >= len(tasks) - 2
    assert set(runs) == {task["id"] for task in tasks}
    assert all(u["outstanding"] == 0 for u in usage.values())
    events = {event for _, _, event, _ in runtime.trace}
    assert {"lost request", "lost reply", "duplicate"} <= events


@pytest.mark.parametrize("seed", range(1, 11))
def test_every_task_ends_when_left_alone_after_heavy_faults(seed):
    # Heavy faults while 20 tasks of one tenant are submitted and for five
    # minutes after; then nothing calls the Worker for an hour. Alarms that
    # fail seven times in a row are given up by the runtime: the shards'
    # sweep (Default.scheduled, every 15 minutes) sets them again, so no
    # task stays queued.
    faults = Faults(lost_request=0.3, lost_reply=0.3, duplicate=0.3, evict=0.15, crash_before_commit=0.15,
                    alarm_failure=0.3, duplicate_alarm=0.3)
    tasks = [{"id": f"task-{n}", "tenant": "acme", "work_ms": 1_000 + 250 * n} for n in range(20)]
    with Runtime.from_wrangler(WRANGLER, seed=seed, faults=faults) as runtime:
        peaks, runs = _count_running(runtime)

        async def scenario():
            await _submit_all(runtime, tasks)
            await asyncio.sleep(300)
            runtime.faults.enabled = False  # faults stop; nothing calls the Worker for an hour
            await asyncio.sleep(3_600)
            statuses = [await runtime.call_entrypoint("status", task["id"]) for task in tasks]
            return statuses, await runtime.call_entrypoint("usage", "acme")

        statuses, usage = runtime.run(scenario())
    assert peaks == {"acme": 2}
    # Every task ran to its end (one whose three attempts were all cut short failed).
    assert {s["result"]["status"] for s in statuses} <= {"completed", "failed"}
    assert set(runs) == {task["id"] for task in tasks}
    assert usage["outstanding"] == 0
