"""Fault injection: each fault does what production's would, and a seed replays a run."""

import asyncio

import pytest

from durability.testing import Faults, JsException, Outage
from support import probe_runtime


def run_with(faults, scenario_factory, seed=0):
    runtime = probe_runtime(faults=faults, seed=seed)
    try:
        return runtime.run(scenario_factory(runtime)), runtime
    finally:
        runtime.close()


async def entries_without_faults(runtime, name="a"):
    with runtime.no_faults():
        return await runtime.env.PROBE.getByName(name).entries()


def test_a_lost_request_never_reaches_the_callee():
    def scenario(runtime):
        async def go():
            with pytest.raises(JsException, match="Network connection lost"):
                await runtime.env.PROBE.getByName("a").record("x")
            return await entries_without_faults(runtime)
        return go()

    entries, _ = run_with(Faults(lost_request=1.0, external=True), scenario)
    assert entries == []


def test_a_lost_reply_means_the_callee_ran_and_committed():
    def scenario(runtime):
        async def go():
            with pytest.raises(JsException, match="Network connection lost"):
                await runtime.env.PROBE.getByName("a").record("x")
            return await entries_without_faults(runtime)
        return go()

    entries, _ = run_with(Faults(lost_reply=1.0, external=True), scenario)
    assert entries == ["x"]


def test_a_duplicate_runs_the_callee_twice():
    def scenario(runtime):
        async def go():
            assert await runtime.env.PROBE.getByName("a").record("x") == 1
            await asyncio.sleep(1)
            return await entries_without_faults(runtime)
        return go()

    entries, _ = run_with(Faults(duplicate=1.0, external=True), scenario)
    assert entries == ["x", "x"]


def test_latency_reorders_concurrent_calls_and_takes_virtual_time():
    def scenario(runtime):
        async def go():
            stub = runtime.env.PROBE.getByName("a")
            start = runtime.now_ms()
            await asyncio.gather(*(stub.record(str(i)) for i in range(20)))
            elapsed = runtime.now_ms() - start
            return elapsed, await entries_without_faults(runtime)
        return go()

    (elapsed, entries), _ = run_with(Faults(latency_ms=(1, 50), external=True), scenario)
    assert sorted(entries, key=int) == [str(i) for i in range(20)]
    assert entries != sorted(entries, key=int)  # some arrived out of order
    assert 2 <= elapsed <= 100


def test_eviction_faults_drop_instances_while_they_serve():
    def scenario(runtime):
        async def go():
            stub = runtime.env.PROBE.getByName("a")
            outcomes = []
            for i in range(10):
                try:
                    await stub.slow_record(str(i), 0.1)
                    outcomes.append("ok")
                except JsException:
                    outcomes.append("reset")
                    stub = runtime.env.PROBE.getByName("a")
            return outcomes
        return go()

    outcomes, runtime = run_with(Faults(evict=0.5, evict_window_ms=200, external=True), scenario)
    assert "reset" in outcomes and "ok" in outcomes
    assert runtime.hosts()[0].stats.evictions >= outcomes.count("reset")


def test_faults_can_be_limited_to_calls_between_objects(probe):
    # The default: calls from the test itself are not subject to faults.
    def scenario(runtime):
        async def go():
            return await runtime.env.PROBE.getByName("a").record("x")
        return go()

    result, _ = run_with(Faults(lost_request=1.0), scenario)
    assert result == 1


@pytest.mark.parametrize("bad", [{"lost_reply": 1.5}, {"evict": -0.1}, {"latency_ms": (5, 1)}])
def test_bad_fault_settings_are_refused(bad):
    with pytest.raises(ValueError):
        Faults(**bad)


FAULTY = Faults(lost_request=0.1, lost_reply=0.1, duplicate=0.1, latency_ms=(0, 20),
                evict=0.05, crash_before_commit=0.05, external=True)


def busy_scenario(runtime):
    async def go():
        async def client(c):
            done = 0
            for i in range(15):
                try:
                    await runtime.env.PROBE.getByName(f"o{c % 3}").record(f"{c}-{i}")
                    done += 1
                except JsException:
                    pass
                await asyncio.sleep(0.01 * (c + 1))
            return done
        return await asyncio.gather(*(client(c) for c in range(6)))
    return go()


def test_the_same_seed_replays_the_same_run():
    first, runtime_a = run_with(FAULTY, busy_scenario, seed=7)
    # Whatever else the process allocated meanwhile (task addresses differ).
    clutter = [object() for _ in range(10_000)]
    second, runtime_b = run_with(FAULTY, busy_scenario, seed=7)
    del clutter
    assert first == second
    assert runtime_a.trace == runtime_b.trace
    assert len(runtime_a.trace) > 100
    assert {event for _, _, event, _ in runtime_a.trace} >= {"call", "lost request", "lost reply", "duplicate"}


def test_another_seed_gives_another_run():
    _, runtime_a = run_with(FAULTY, busy_scenario, seed=7)
    _, runtime_b = run_with(FAULTY, busy_scenario, seed=8)
    assert runtime_a.trace != runtime_b.trace


def test_an_outage_fails_every_alarm_run_until_the_runtime_gives_up_and_keeps_the_instance():
    def scenario(runtime):
        async def go():
            stub = runtime.env.PROBE.getByName("a")
            with runtime.no_faults():
                await stub.set_alarm_in(1_000)
                instance = runtime.host_of(stub).instance
            await asyncio.sleep(600)
            with runtime.no_faults():
                return (await stub.entries(), await stub.get_alarm(),
                        runtime.host_of(stub).instance is instance)
        return go()

    (entries, alarm, same), runtime = run_with(Faults(outages=(Outage("Probe:a", 0, 300_000),)), scenario)
    assert [e for e in entries if e.startswith("alarm")] == []  # no handler ever ran
    assert alarm is None and same
    events = [event for _, name, event, _ in runtime.trace if name == "Probe:a" and "alarm" in event]
    assert events[-1] == "alarm abandoned" and events.count("alarm failed") == 7


def test_an_outage_of_calls_fails_them_for_its_time_only():
    def scenario(runtime):
        async def go():
            stub = runtime.env.PROBE.getByName("b")
            failed = 0
            for _ in range(10):
                try:
                    await runtime.env.PROBE.getByName("b").record("x")
                except JsException:
                    failed += 1
                await asyncio.sleep(10)
            other = await runtime.env.PROBE.getByName("c").record("y")
            return failed, other, stub
        return go()

    outage = Outage("Probe:b", 0, 45_000, alarms=False, calls=True)
    (failed, other, _), _ = run_with(Faults(outages=(outage,), external=True), scenario)
    assert failed == 5 and other == 1  # 0 s to 40 s failed, 50 s on worked; another object was never touched
