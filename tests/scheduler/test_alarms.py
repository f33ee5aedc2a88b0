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


def test_retries_stop_after_six_and_the_runtime_says_it_gave_up(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        await stub.set_alarm_in(0, 100)
        await asyncio.sleep(3_600)
        return alarm_entries(await stub.entries()), await stub.get_alarm()

    fired, left = probe.run(scenario())
    assert len(fired) == 1 + ALARM_MAX_RETRIES
    assert left is None
    times = [int(fields(e)["at"]) for e in fired]
    for gap, base in zip([b - a for a, b in zip(times, times[1:])], (2_000, 4_000, 8_000, 16_000, 32_000, 64_000)):
        assert base <= gap <= base * 1.25 + 1  # exponential from 2 s, with jitter
    events = [(event, detail) for _, name, event, detail in probe.trace if name == "Probe:a" and "alarm" in event]
    assert events[-1] == ("alarm abandoned", f"after {ALARM_MAX_RETRIES} retries")
    assert [e for e, _ in events].count("alarm failed") == 1 + ALARM_MAX_RETRIES


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


# -- Cron Triggers -----------------------------------------------------------------

def test_a_cron_trigger_runs_default_scheduled_at_its_times():
    runtime = probe_runtime(crons=["*/5 * * * *"])
    try:
        async def scenario():
            start = runtime.now_ms()
            await asyncio.sleep(16 * 60)
            return start, await runtime.env.PROBE.getByName("cron").entries()

        start, runs = runtime.run(scenario())
    finally:
        runtime.close()
    times = [float(entry.split()[-1]) for entry in runs]
    assert len(times) == 3 and all(t % 300_000 == 0 for t in times)  # on the minute, every 5 minutes
    assert start < times[0] <= start + 300_000 and [b - a for a, b in zip(times, times[1:])] == [300_000, 300_000]
    assert all(entry.startswith("*/5 * * * * ") for entry in runs)


@pytest.mark.parametrize("cron, after, expected", [
    ("* * * * *", "2026-01-01T00:00:30", "2026-01-01T00:01:00"),
    ("*/15 * * * *", "2026-01-01T00:15:00", "2026-01-01T00:30:00"),
    ("0 3 * * *", "2026-01-01T03:00:00", "2026-01-02T03:00:00"),
    ("30 9 1 * *", "2026-01-02T00:00:00", "2026-02-01T09:30:00"),
    ("0 0 * * 1-5", "2026-01-03T12:00:00", "2026-01-05T00:00:00"),  # Saturday 3 Jan: on to Monday
    ("0 0 13 * 5", "2026-02-01T00:00:00", "2026-02-06T00:00:00"),  # the 13th or a Friday, as cron has it
    ("5,10 0 * * 7", "2026-01-04T00:05:00", "2026-01-04T00:10:00"),  # 7 is Sunday too
])
def test_a_cron_schedule_fires_next_when_cron_says(cron, after, expected):
    import datetime

    from durability.testing._cron import CronSchedule

    def ms(text):
        return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC).timestamp() * 1000

    assert CronSchedule.parse(cron).next_after(ms(after)) == ms(expected)


@pytest.mark.parametrize("cron", ["* * * *", "60 * * * *", "* * * * MON", "*/0 * * * *", "5-1 * * * *"])
def test_a_cron_expression_it_cannot_read_is_refused(cron):
    from durability.testing._cron import CronSchedule

    with pytest.raises(ValueError, match="cron"):
        CronSchedule.parse(cron)


def test_an_alarm_run_past_fifteen_minutes_is_cut_off_with_its_instance_and_retried(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        await stub.set_alarm_in(1_000, 0, 20 * 60)  # each run of the handler sleeps 20 minutes
        await stub.record("in memory")
        await asyncio.sleep(15 * 60 + 30)  # past the first run's limit and into the second run
        return alarm_entries(await stub.entries()), await stub.remembered()

    fired, remembered = probe.run(scenario())
    assert [fields(e)["retry"] for e in fired] == ["0", "1"]  # no "alarm-done": the run was cut off
    first, second = (int(fields(e)["at"]) for e in fired)
    assert 15 * 60_000 + 2_000 <= second - first <= 15 * 60_000 + 2_500 + 1  # retried after the first backoff
    assert remembered == []  # the instance went with the run
    events = [(e, d) for _, name, e, d in probe.trace if name == "Probe:a" and e in ("alarm failed", "evicted")]
    assert events[0] == ("evicted", "Durable Object alarm exceeded its 15-minute wall-time limit and was reset.")
    assert events[1][0] == "alarm failed" and "15-minute" in events[1][1]


def test_an_alarm_handler_within_fifteen_minutes_ends_normally(probe):
    stub = probe.env.PROBE.getByName("a")

    async def scenario():
        await stub.set_alarm_in(1_000, 0, 14 * 60)
        await asyncio.sleep(15 * 60)
        return await stub.entries()

    entries = probe.run(scenario())
    assert [e.split()[0] for e in alarm_entries(entries)] == ["alarm", "alarm-done"]
