"""Duration, billed as production bills it: an object is awake while an event runs,
while it awaits anything, and while a timer its code set is pending; never for its alarm alone."""

import asyncio

import pytest

from support import probe_runtime


@pytest.fixture
def runtime():
    with probe_runtime() as rt:
        yield rt


def awake(runtime, name):
    return runtime.host_of(runtime.env.PROBE.getByName(name)).awake_s()


def test_a_request_held_open_bills_the_object_holding_it_and_its_caller_for_the_time_held(runtime):
    async def scenario():
        await runtime.env.PROBE.getByName("caller").call_other("callee", "x")  # the callee holds it 1 s
        await asyncio.sleep(60)

    runtime.run(scenario())
    assert awake(runtime, "caller") == pytest.approx(1.0, abs=0.01)
    assert awake(runtime, "callee") == pytest.approx(1.0, abs=0.01)
    periods = runtime.host_of(runtime.env.PROBE.getByName("callee")).stats.awake_periods
    assert len(periods) == 1 and periods[0][1] - periods[0][0] == pytest.approx(1.0, abs=0.01)


def test_an_object_with_only_its_alarm_set_bills_nothing(runtime):
    stub = runtime.env.PROBE.getByName("a")

    async def scenario():
        await stub.set_alarm_in(3_600_000)  # an hour away
        await asyncio.sleep(600)
        return await stub.get_alarm()

    assert runtime.run(scenario()) is not None
    assert awake(runtime, "a") < 0.01


def test_a_pending_sleep_or_timer_bills_until_it_ends_or_is_cancelled(runtime):
    async def scenario():
        await runtime.env.PROBE.getByName("sleeper").background("slept")  # a waitUntil task sleeps 1 s
        await runtime.env.PROBE.getByName("timer").set_timer(30)  # a bare timer, 30 s away
        await runtime.env.PROBE.getByName("cancelled").set_timer(30)
        await asyncio.sleep(10)
        await runtime.env.PROBE.getByName("cancelled").cancel_timer()
        await asyncio.sleep(60)
        return await runtime.env.PROBE.getByName("timer").entries()

    assert runtime.run(scenario()) == ["timer fired"]
    assert awake(runtime, "sleeper") == pytest.approx(1.0, abs=0.01)
    assert awake(runtime, "timer") == pytest.approx(30.0, abs=0.01)
    assert awake(runtime, "cancelled") == pytest.approx(10.0, abs=0.01)


def test_an_alarm_bills_while_its_handler_runs_and_an_eviction_ends_the_bill(runtime):
    async def scenario():
        await runtime.env.PROBE.getByName("alarmed").set_alarm_in(1_000, 0, 5)  # its handler sleeps 5 s
        await runtime.env.PROBE.getByName("evicted").set_timer(600)
        await asyncio.sleep(20)
        runtime.evict(runtime.env.PROBE.getByName("evicted"))
        await asyncio.sleep(600)
        return await runtime.env.PROBE.getByName("evicted").entries()

    assert runtime.run(scenario()) == []  # the timer went with its instance
    assert awake(runtime, "alarmed") == pytest.approx(5.0, abs=0.01)
    assert awake(runtime, "evicted") == pytest.approx(20.0, abs=0.01)


def test_the_totals_sum_every_object_s_awake_seconds_and_their_gb_seconds(runtime):
    async def scenario():
        await runtime.env.PROBE.getByName("caller").call_other("callee", "x")

    runtime.run(scenario())
    totals = runtime.totals()
    assert totals["awake_s"] == pytest.approx(2.0, abs=0.02)
    assert totals["gb_s"] == pytest.approx(totals["awake_s"] * 0.128)


def test_an_object_with_nothing_pending_for_ten_seconds_hibernates_and_loses_only_its_memory():
    with probe_runtime(hibernate_after_ms=10_000) as runtime:
        idle, timed = runtime.env.PROBE.getByName("idle"), runtime.env.PROBE.getByName("timed")

        async def scenario():
            await idle.record("kept")
            await timed.record("kept")
            await timed.set_timer(30)  # a pending timer keeps it awake, and in memory
            await asyncio.sleep(9)
            before = runtime.host_of(idle).instance is not None  # looked at without a call
            await asyncio.sleep(2)  # idle for 10 s now
            return before, await idle.remembered(), await idle.entries(), await timed.remembered()

        before, after, entries, timed_memory = runtime.run(scenario())
        assert before and after == [] and entries == ["kept"]
        assert timed_memory == ["kept"]
        host = runtime.host_of(idle)
        assert host.stats.hibernations == 1 and host.stats.evictions == 0
        assert ("hibernated", "Probe:idle") in [(e, name) for _, name, e, _ in runtime.trace]


def test_a_hibernated_object_s_alarm_starts_a_new_instance():
    with probe_runtime(hibernate_after_ms=10_000) as runtime:
        stub = runtime.env.PROBE.getByName("a")

        async def scenario():
            await stub.set_alarm_in(60_000)
            await asyncio.sleep(61)
            return [e for e in await stub.entries() if e.startswith("alarm")]

        assert len(runtime.run(scenario())) == 1
        assert runtime.host_of(stub).stats.hibernations >= 1
        assert runtime.host_of(stub).stats.instances_created == 2  # the call's, then the alarm's
