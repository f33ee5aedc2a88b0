"""The one alarm per object: set, get, delete, delivery and retries as in production."""

import asyncio

import pytest

from durability.testing import ALARM_MAX_RETRIES, Faults
from support import probe_runtime


def alarm_entries(entries):
    return [e for e in entries if e.startswith("alarm")]


def fields(entry):
    return dict(part.split("=") for part in entry.split()[1:])


def test_set_get_delete(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        start = probe.now_ms()
        armed = await stub.set_alarm_in(5_000)
        await stub.delete_alarm()
        deleted = await stub.get_alarm()
        await asyncio.sleep(10)
        return start, armed, deleted, await stub.entries()

    start, armed, deleted, entries = probe.run(scenario())
    assert armed == start + 5_000 and type(armed) is int
    assert deleted is None
    assert alarm_entries(entries) == []  # a deleted alarm never fires


def test_alarm_fires_at_its_time_and_reads_none_inside_the_handler(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        start = probe.now_ms()
        await stub.set_alarm_in(5_000)
        await asyncio.sleep(4.9)
        early = alarm_entries(await stub.entries())
        await asyncio.sleep(0.2)
        return start, early, alarm_entries(await stub.entries()), await stub.get_alarm()

    start, early, fired, after = probe.run(scenario())
    assert early == []
    assert len(fired) == 1
    assert fields(fired[0]) == {"retry": "0", "seen": "None", "at": str(int(start + 5_000))}
    assert after is None  # a successful alarm is gone unless the handler set a new one


def test_an_alarm_in_the_past_fires_at_once(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        start = probe.now_ms()
        await stub.set_alarm_in(-1_000)
        await asyncio.sleep(0.001)
        return start, alarm_entries(await stub.entries())

    start, fired = probe.run(scenario())
    assert len(fired) == 1 and int(fields(fired[0])["at"]) == int(start)


def test_a_throwing_handler_is_retried_with_backoff_from_2s(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        start = probe.now_ms()
        await stub.set_alarm_in(0, 3)  # fail three times, then succeed
        await asyncio.sleep(120)
        return start, alarm_entries(await stub.entries())

    start, fired = probe.run(scenario())
    assert [fields(e)["retry"] for e in fired] == ["0", "1", "2", "3"]
    times = [int(fields(e)["at"]) for e in fired]
    gaps = [b - a for a, b in zip(times, times[1:])]
    # 2 s, 4 s, 8 s, each with up to 25% jitter (workerd's alarm scheduler).
    for gap, base in zip(gaps, (2_000, 4_000, 8_000)):
        assert base <= gap <= base * 1.25 + 1


def test_retries_stop_after_six(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        await stub.set_alarm_in(0, 100)
        await asyncio.sleep(3_600)
        return alarm_entries(await stub.entries()), await stub.get_alarm()

    fired, left = probe.run(scenario())
    assert len(fired) == 1 + ALARM_MAX_RETRIES
    assert left is None


def test_eviction_during_the_handler_is_a_failure_and_is_retried(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        await stub.set_alarm_in(1_000, 0, 5)  # the handler sleeps 5 s
        await asyncio.sleep(3)  # it is now inside that sleep
        probe.evict(stub)
        await asyncio.sleep(30)
        return [e for e in await probe.env.PROBE.getByName("a").entries() if "alarm" in e]

    fired = probe.run(scenario())
    assert [e.split()[0] for e in fired] == ["alarm", "alarm", "alarm-done"]
    assert [fields(e)["retry"] for e in fired[:2]] == ["0", "1"]


def test_alarm_delivery_is_at_least_once():
    runtime = probe_runtime(faults=Faults(duplicate_alarm=1.0))
    stub = runtime.env.PROBE.getByName("a")

    async def scenario():
        await stub.set_alarm_in(1_000)
        await asyncio.sleep(5)
        return alarm_entries(await stub.entries())

    assert len(runtime.run(scenario())) == 2
    runtime.close()


def test_bad_alarm_times_are_refused(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        from durability.testing import JsException

        with pytest.raises(JsException):
            await stub.set_alarm_in("soon")

    probe.run(scenario())
