"""DurabilityScheduler: many durable timers on one alarm, each run at least once."""

import asyncio
import types

import pytest

from durability._common.sql import Sql
from durability.scheduler.timer_stores import SqlTimers
from durability.testing import Faults, JsException
from support import SchemaStorage, timers_runtime


@pytest.fixture
def runtime():
    with timers_runtime() as rt:
        yield rt


def test_interleaved_timers_share_one_alarm_that_follows_the_earliest(runtime):
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        start = runtime.now_ms()
        alarms = []
        for key, delay in (("c", 5_000), ("a", 1_000), ("b", 3_000), ("d", 3_000)):
            await stub.schedule(key, delay)
            alarms.append(await stub.alarm_time() - start)
        seen = []
        for _ in range(3):
            await asyncio.sleep(2)
            seen.append(await stub.alarm_time())
        return start, alarms, seen, await stub.runs()

    start, alarms, seen, runs = runtime.run(scenario())
    assert alarms == [5_000, 1_000, 1_000, 1_000]
    assert [s - start if s else None for s in seen] == [3_000, 5_000, None]
    assert [(r["key"], r["at"] - start) for r in runs] == [
        ("a", 1_000), ("b", 3_000), ("d", 3_000), ("c", 5_000)
    ]


def test_every_due_timer_runs_once(runtime):
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        for i in range(20):
            await stub.schedule(f"k{i}", 1_000)
        await asyncio.sleep(5)
        return await stub.runs(), await stub.timer_count()

    runs, left = runtime.run(scenario())
    assert sorted(r["key"] for r in runs) == sorted(f"k{i}" for i in range(20))
    assert left == 0


def test_a_duplicated_alarm_delivery_is_harmless():
    runtime = timers_runtime(faults=Faults(duplicate_alarm=1.0))
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        await stub.schedule("a", 1_000)
        await stub.schedule("b", 2_000)
        await asyncio.sleep(10)
        return await stub.runs()

    runs = runtime.run(scenario())
    assert [r["key"] for r in runs] == ["a", "b"]
    assert runtime.hosts()[0].stats.alarm_invocations >= 4
    runtime.close()


def test_eviction_between_arming_and_firing_loses_nothing(runtime):
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        await stub.schedule("a", 5_000)
        runtime.evict(stub)
        await asyncio.sleep(10)
        return await runtime.env.TIMERS.getByName("t").runs()

    assert [r["key"] for r in runtime.run(scenario())] == ["a"]


def test_a_committed_timer_always_has_its_alarm_whatever_crashes():
    runtime = timers_runtime(faults=Faults(crash_before_commit=0.5, external=True), seed=5)

    async def scenario():
        with runtime.no_faults():
            await runtime.env.TIMERS.getByName("t").timer_count()  # created, schema committed
        outcomes = []
        for i in range(30):
            try:
                await runtime.env.TIMERS.getByName("t").schedule(f"k{i}", 60_000 - i * 1_000)
                outcomes.append("ok")
            except JsException:
                outcomes.append("crashed")
            host = runtime.host_of(runtime.env.TIMERS.getByName("t"))
            due = host.db.exec("SELECT min(due_at) AS due FROM durability_timers", ()).one()["due"]
            if due is not None:  # every committed timer is covered by the alarm
                assert host.alarm_at is not None and host.alarm_at <= due
        return outcomes

    outcomes = runtime.run(scenario())
    assert "ok" in outcomes and "crashed" in outcomes
    runtime.close()


def test_a_timer_scheduled_again_while_it_runs_is_not_lost(runtime):
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        start = runtime.now_ms()
        await stub.schedule("slow", 1_000)
        await asyncio.sleep(2)  # its handler is running now (it takes 2 s)
        await stub.schedule_by("slow", 5_000)
        await asyncio.sleep(10)
        return start, await stub.runs()

    start, runs = runtime.run(scenario())
    assert [(r["key"], r["at"] - start) for r in runs] == [("slow", 1_000), ("slow", 7_000)]


def test_a_failing_timer_is_retried_with_backoff_and_starves_no_other(runtime):
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        start = runtime.now_ms()
        await stub.schedule("bad", 1_000, 3)
        for i in range(6):
            await stub.schedule(f"good{i}", 1_000 + 1_500 * i)
        await asyncio.sleep(30)
        return start, await stub.runs()

    start, runs = runtime.run(scenario())
    bad = [(r["at"] - start, r["attempt"]) for r in runs if r["key"] == "bad"]
    assert bad == [(1_000, 0), (2_000, 1), (4_000, 2), (8_000, 3)]  # 1 s, 2 s, 4 s
    good = [r["at"] - start for r in runs if r["key"].startswith("good")]
    assert good == [1_000 + 1_500 * i for i in range(6)]


def test_schedule_replaces_schedule_by_keeps_the_earlier_and_cancel_removes(runtime):
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        start = runtime.now_ms()
        await stub.schedule("a", 5_000)
        await stub.schedule("a", 8_000)
        replaced = await stub.alarm_time() - start  # moved later: the alarm is left where it was
        await stub.schedule_by("a", 9_000)
        kept = await stub.alarm_time() - start
        await stub.schedule_by("a", 2_000)
        earlier = await stub.alarm_time() - start
        await stub.cancel("a")
        stale = await stub.alarm_time() - start  # left to fire once, for nothing
        await asyncio.sleep(3)
        return replaced, kept, earlier, stale, await stub.alarm_time(), await stub.runs()

    assert runtime.run(scenario()) == (5_000, 5_000, 2_000, 2_000, None, [])


def test_an_alarm_left_early_fires_for_nothing_and_re_arms_for_the_timer(runtime):
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        start = runtime.now_ms()
        await stub.schedule("a", 5_000)
        await stub.schedule("a", 8_000)
        await asyncio.sleep(6)
        early = (await stub.runs(), await stub.alarm_time() - start)
        await asyncio.sleep(3)
        return early, [r["at"] - start for r in await stub.runs()]

    assert runtime.run(scenario()) == (([], 8_000), [8_000])


def test_a_timer_of_an_unknown_participant_is_kept_and_retried(runtime):
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        await stub.schedule("a", 0)
        host = runtime.host_of(stub)
        host.db.exec(
            "INSERT INTO durability_timers (participant, key, due_at) VALUES ('ghost', 'g', 0)", ()
        )
        await stub.schedule("b", 100)
        await asyncio.sleep(5)
        rows = host.db.exec("SELECT participant, attempt FROM durability_timers", ()).toArray()
        return [r["key"] for r in await stub.runs()], rows

    runs, rows = runtime.run(scenario())
    assert runs == ["a", "b"]
    assert [(r["participant"], r["attempt"] >= 1) for r in rows] == [("ghost", True)]


@pytest.mark.parametrize("key, delay", [("", 1_000), ("k", "soon")])
def test_bad_input_is_refused_and_changes_nothing(runtime, key, delay):
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        with pytest.raises(JsException, match="ValueError|TypeError"):
            await stub.schedule(key, delay)
        fresh = runtime.env.TIMERS.getByName("t")
        return await fresh.timer_count(), await fresh.alarm_time()

    assert runtime.run(scenario()) == (0, None)


def test_scheduling_costs_one_row_and_at_most_one_alarm_write(runtime):
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        await stub.schedule("warm", 60_000)  # first use: schema and first alarm
        host = runtime.host_of(stub)
        before = host.db.rows_written, host.stats.alarm_writes
        await stub.schedule("later", 90_000)  # later than the alarm: no alarm write
        after_later = host.db.rows_written, host.stats.alarm_writes
        await stub.schedule("sooner", 30_000)  # earlier: the alarm moves
        after_sooner = host.db.rows_written, host.stats.alarm_writes
        return before, after_later, after_sooner

    before, later, sooner = runtime.run(scenario())
    assert (later[0] - before[0], later[1] - before[1]) == (1, 0)
    assert (sooner[0] - later[0], sooner[1] - later[1]) == (1, 1)


def test_a_timer_that_comes_due_while_another_runs_starts_at_its_time(runtime):
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        start = runtime.now_ms()
        await stub.schedule("slow", 1_000)  # its handler takes 2 s
        await stub.schedule("quick", 1_500)
        await asyncio.sleep(1.2)
        await runtime.env.TIMERS.getByName("t").schedule("now", 0)  # scheduled during the alarm
        await asyncio.sleep(5)
        return start, await runtime.env.TIMERS.getByName("t").runs()

    start, runs = runtime.run(scenario())
    # A wait ends a few microseconds past its moment (see durability._clock).
    assert sorted((r["key"], round(r["at"] - start, 2)) for r in runs) == [
        ("now", 1_200), ("quick", 1_500), ("slow", 1_000)]
    assert runtime.hosts()[0].stats.alarm_invocations == 1  # one alarm dispatched all three


def test_a_timer_due_within_two_ms_is_waited_for_without_spinning(runtime, monkeypatch):
    # Pyodide runs a wait of 2 ms or less at once and workerd's clock does
    # not move meanwhile: a dispatcher that waited that little would spin.
    waits = []
    real_wait = asyncio.wait

    async def counted_wait(*args, timeout=None, **kwargs):
        waits.append(timeout)
        if len(waits) > 1_000:
            raise AssertionError(f"the dispatcher spins: last timeouts {waits[-3:]}")
        return await real_wait(*args, timeout=timeout, **kwargs)

    monkeypatch.setattr(asyncio, "wait", counted_wait)
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        start = runtime.now_ms()
        await stub.schedule("slow", 1_000)  # its handler takes 2 s
        await stub.schedule("soon-after", 1_001.5)
        await asyncio.sleep(5)
        return start, await runtime.env.TIMERS.getByName("t").runs()

    start, runs = runtime.run(scenario())
    assert sorted(r["key"] for r in runs) == ["slow", "soon-after"]
    assert len(waits) < 10


def test_timers_outlive_an_alarm_whose_retries_run_out(runtime):
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        await stub.schedule("slow", 1_000)  # each run takes 2 s
        host = runtime.host_of(stub)
        for _ in range(8):  # more failures in a row than the runtime retries
            seen, give_up = host.stats.alarm_invocations, runtime.now_ms() + 120_000
            while host.stats.alarm_invocations == seen and runtime.now_ms() < give_up:
                await asyncio.sleep(0.25)
            await asyncio.sleep(0.5)
            host.evict()
        await asyncio.sleep(600)
        fresh = runtime.env.TIMERS.getByName("t")
        return await fresh.timer_count(), len(await fresh.runs())

    left, runs = runtime.run(scenario())
    assert left == 0 and runs >= 2  # cut short again and again, then finished


# -- timers in memory (participants registered with durable=False) ----------
def test_a_memory_timer_writes_no_row_and_runs_at_its_time(runtime):
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        await stub.schedule("warm", 60_000)  # schema and first alarm
        host = runtime.host_of(stub)
        start, before = runtime.now_ms(), host.db.rows_written
        await stub.plan("p", 1_000)
        written = host.db.rows_written - before  # the "planned" row only
        alarm = await stub.alarm_time() - start
        await asyncio.sleep(2)
        return written, alarm, await stub.timer_count(), [(r["key"], round(r["at"] - start)) for r in await stub.runs()]

    written, alarm, rows, runs = runtime.run(scenario())
    assert written == 1 and alarm == 1_000 and rows == 1  # the durable "warm" timer's row
    assert runs == [("p", 1_000)]


def test_a_memory_timer_is_derived_again_by_a_new_instance(runtime):
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        start = runtime.now_ms()
        await stub.plan("p", 5_000)
        runtime.evict(stub)
        await asyncio.sleep(6)
        return [(r["key"], round(r["at"] - start)) for r in await runtime.env.TIMERS.getByName("t").runs()]

    assert runtime.run(scenario()) == [("p", 5_000)]


def test_a_memory_timer_outlives_an_alarm_whose_retries_run_out(runtime):
    # The platform gave up on the alarm and the instance went: a read is the
    # next call, and the new instance it starts sets the alarm again for the
    # timers it derived. (Before, only a call that synced did.)
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        await stub.plan("p", 1_000)
        await stub.forget_alarm()
        runtime.evict(stub)
        await asyncio.sleep(5)
        before = await runtime.env.TIMERS.getByName("t").runs()  # a read starts the new instance
        await asyncio.sleep(1)
        return before, [r["key"] for r in await runtime.env.TIMERS.getByName("t").runs()]

    before, after = runtime.run(scenario())
    assert before == [] and after == ["p"]


def test_a_new_instance_whose_alarm_is_in_place_writes_nothing_to_check_it(runtime):
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        await stub.plan("p", 60_000)
        runtime.evict(stub)
        host = runtime.host_of(stub)
        writes, alarm_writes = host.db.rows_written, host.stats.alarm_writes
        await runtime.env.TIMERS.getByName("t").runs()  # a new instance, checked
        await asyncio.sleep(1)
        return host.db.rows_written - writes, host.stats.alarm_writes - alarm_writes

    assert runtime.run(scenario()) == (0, 0)


@pytest.mark.parametrize("call", ["wake", "peek", "schedule"])
def test_a_live_instance_whose_alarm_was_lost_resumes_at_a_wake_a_read_or_a_write(runtime, call):
    # The instance lives on, and believes its alarm is set. A sweep's wake()
    # checks at once; a read through the library (resume_if_overdue) or a sync, once the
    # alarm is overdue.
    from durability.scheduler.alarm import OVERDUE_MS

    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        await stub.plan("p", 1_000)
        host = runtime.host_of(stub)
        host.alarm_at = None  # the runtime dropped it; the instance was not told
        host._arm_alarm_timer()
        await asyncio.sleep(2)
        missed = len(await stub.runs())
        if call != "wake":
            await asyncio.sleep(OVERDUE_MS / 1000)
        if call == "schedule":
            await stub.schedule("later", 600_000)
        else:
            await getattr(stub, call)()
        await asyncio.sleep(1)
        return missed, [r["key"] for r in await stub.runs()]

    missed, runs = runtime.run(scenario())
    assert missed == 0 and runs == ["p"]


def test_an_object_whose_alarm_keeps_failing_sets_it_again_once_per_overdue_period_not_per_call():
    # Every alarm run fails for 20 minutes. Reads and writes keep coming, every
    # 10 s: each overdue alarm is set again once (the runtime then retries it
    # and gives up again), not once per call.
    from durability.scheduler.alarm import OVERDUE_MS
    from durability.testing import Outage

    with timers_runtime(faults=Faults(outages=(Outage("Timers:t", 0, 1_200_000),))) as runtime:
        stub = runtime.env.TIMERS.getByName("t")

        async def scenario():
            with runtime.no_faults():
                await stub.plan("p", 1_000)
            host = runtime.host_of(stub)
            writes = host.stats.alarm_writes
            for n in range(90):  # 15 minutes
                await stub.peek()
                await stub.schedule(f"later-{n}", 3_600_000)  # a sync; its timer is an hour away
                await asyncio.sleep(10)
            return host.stats.alarm_writes - writes

        written = runtime.run(scenario())
    assert 1 <= written <= 900_000 // OVERDUE_MS + 1


def test_a_failed_alarm_run_counts_as_an_alarm_owed_that_a_read_notices_once_given_up():
    # alarm() itself fails (its dispatch raises), then every retry fails
    # before its handler runs and the runtime gives up. A read three minutes
    # later still notices: the run that failed left an alarm owed.
    from durability.scheduler.alarm import OVERDUE_MS
    from durability.testing import Outage

    with timers_runtime(faults=Faults(outages=(Outage("Timers:t", 1_500, 300_000),))) as runtime:
        stub = runtime.env.TIMERS.getByName("t")

        async def scenario():
            await stub.plan("p", 1_000)
            scheduler = runtime.host_of(stub).instance.scheduler

            async def broken(started):
                raise RuntimeError("the dispatch fails")

            scheduler._dispatch = broken  # the first run, at 1 s, fails in alarm() itself
            await asyncio.sleep(400)  # the outage (from 1.5 s) fails every retry: given up
            del scheduler._dispatch
            given_up = [e for _, name, e, _ in runtime.trace if name == "Timers:t"].count("alarm abandoned")
            await asyncio.sleep(OVERDUE_MS / 1000)
            await stub.peek()
            await asyncio.sleep(1)
            return given_up, [r["key"] for r in await stub.runs()]

        assert runtime.run(scenario()) == (1, ["p"])


def test_a_read_before_the_alarm_is_overdue_writes_nothing(runtime):
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        await stub.plan("p", 600_000)
        host = runtime.host_of(stub)
        alarm_writes = host.stats.alarm_writes
        for _ in range(5):
            await stub.peek()
            await stub.wake()
        return host.stats.alarm_writes - alarm_writes

    assert runtime.run(scenario()) == 0


def test_a_failing_memory_timer_is_retried_with_backoff(runtime):
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        start = runtime.now_ms()
        await stub.plan("p", 0, 2)
        await asyncio.sleep(10)
        return [(r["attempt"], round(r["at"] - start)) for r in await stub.runs()]

    assert runtime.run(scenario()) == [(0, 0), (1, 1_000), (2, 3_000)]


def test_a_row_written_for_a_participant_now_in_memory_runs_once_and_goes(runtime):
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        await stub.write_old_timer_row("derived", "old")
        await stub.schedule("kick", 0)  # any sync arms the alarm for it
        await asyncio.sleep(2)
        return [r["key"] for r in await stub.runs()], await stub.timer_count()

    runs, rows = runtime.run(scenario())
    assert sorted(runs) == ["kick", "old"] and rows == 0


def alarm_counts(host, since=(0, 0)):
    """(alarms set, alarm runs) of an object so far, or since an earlier reading."""
    return host.stats.alarm_writes - since[0], host.stats.alarm_invocations - since[1]


def alarm_into_a_new_instance(runtime, setup, then_s=0):
    """``setup(stub)`` plans timers; the instance goes, and 6 s on (the first
    alarm, at 5 s, delivered to a new instance): (alarms set, alarm runs,
    (key, ms from the start) of the runs, the alarm's time from the start),
    and the runs again ``then_s`` later."""
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        start = runtime.now_ms()
        await setup(stub)
        runtime.evict(stub)
        host = runtime.host_of(stub)
        before = alarm_counts(host)
        await asyncio.sleep(6)
        early = (*alarm_counts(host, since=before), [(r["key"], round(r["at"] - start)) for r in await stub.runs()],
                 await stub.alarm_time() - start)
        await asyncio.sleep(then_s)
        return early, [(r["key"], round(r["at"] - start)) for r in await stub.runs()]

    return runtime.run(scenario())


def test_a_new_instance_its_own_alarm_starts_leaves_that_alarm_alone(runtime):
    # The alarm comes due with the instance gone: the runtime starts a new
    # one to deliver it, whose check of the alarm reads none. Setting it
    # again for the timer the run is about to take wrote a row for nothing.
    async def setup(stub):
        await stub.plan("p", 5_000)
        await stub.plan("later", 60_000)

    (writes, runs, ran, alarm), _ = alarm_into_a_new_instance(runtime, setup)
    assert ran == [("p", 5_000)] and runs == 1
    assert writes == 1 and alarm == 60_000  # set for "later" as the run ends, not for "p" as it started


def test_an_alarm_a_new_instance_set_as_its_early_alarm_came_is_not_set_again_by_that_run(runtime):
    # The alarm comes due with the instance gone, for a timer since put off:
    # the new instance its delivery starts reads no alarm and sets one for
    # the later time before the run starts. That alarm is still set when the
    # run (which finds nothing due) ends: setting it again wrote a row.
    async def setup(stub):
        await stub.plan("p", 5_000)
        await stub.put_off("p", 60_000)

    (writes, runs, ran, alarm), later = alarm_into_a_new_instance(runtime, setup, then_s=55)
    assert runs == 1 and ran == [] and alarm == 60_000
    assert writes == 1  # the new instance's, once
    assert later == [("p", 60_000)]  # and it fires then


@pytest.mark.parametrize("forward_info", [True, False])
def test_a_run_that_fails_after_the_schedulers_part_leaves_every_timer_its_alarm(runtime, forward_info):
    # The run sets the alarm for the next timer as it ends, then the object's
    # own code fails: the runtime retries the run sooner, in place of that
    # alarm. The retry must not take the alarm the failed run set for one
    # still in place (it was kept on a new instance's first run only).
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        start = runtime.now_ms()
        await stub.plan("p", 5_000)
        await stub.plan("later", 60_000)
        await stub.fail_after_next_alarm(forward_info)
        await stub.schedule("now", 0)
        await asyncio.sleep(70)
        return {r["key"]: round(r["at"] - start, -3) for r in await stub.runs()}

    ran = runtime.run(scenario())
    assert ran.get("p") == 5_000 and ran.get("later") == 60_000, ran


@pytest.mark.parametrize("key", ["p", "duty-p"])
def test_a_call_that_starts_an_instance_as_a_lost_alarms_timer_comes_due_still_gets_it_run(runtime, key):
    # The runtime gave up on the alarm; a call starts a new instance just as
    # a timer comes due. A timer an earlier alarm covered is taken for that
    # alarm's delivery at first, and the next read through the library, once
    # no run came, sets the alarm again; a timer for the new instance's own
    # work (no alarm need ever have covered it) gets its alarm at once.
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        await stub.plan(key, 2_000)
        await stub.forget_alarm()
        runtime.evict(stub)
        await asyncio.sleep(2.2)
        fresh = runtime.env.TIMERS.getByName("t")
        await fresh.runs()  # a call starts the new instance (a plain read)
        await asyncio.sleep(2)
        ran_before_read = [r["key"] for r in await fresh.runs()]
        await fresh.peek()  # a read through the library
        await asyncio.sleep(1)
        return ran_before_read, [r["key"] for r in await fresh.runs()]

    ran_before_read, ran = runtime.run(scenario())
    assert ran == [key]
    if key == "duty-p":
        assert ran_before_read == [key]
    else:
        assert ran_before_read == []  # left for the alarm it took for one under way, until the read


def test_a_new_instances_check_overtaken_by_its_alarm_leaves_the_alarm_to_re_arm(runtime):
    # Calls start a new instance and make a timer due now: the alarm they set
    # fires while the instance's own check of the alarm waits its turn. The
    # check then finds the alarm spent and the running timer earliest;
    # arming for it fired a second alarm for nothing, and wrote a row.
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        await stub.plan("later", 60_000)
        runtime.evict(stub)
        host = runtime.host_of(stub)
        before = alarm_counts(host)
        fresh = runtime.env.TIMERS.getByName("t")
        await asyncio.gather(fresh.schedule("slow", 0), fresh.wake(), fresh.wake())
        await asyncio.sleep(5)
        return (*alarm_counts(host, since=before), [r["key"] for r in await stub.runs()])

    writes, runs, ran = runtime.run(scenario())
    assert ran == ["slow"]
    assert runs == 1 and writes == 2  # armed for "slow", then again for "later" as the run ends


def test_a_timer_an_event_runs_itself_sets_no_alarm_and_runs_once(runtime):
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        start = runtime.now_ms()
        ran = await stub.run_now("k")
        return start, ran, await stub.runs(), await stub.alarm_time(), await stub.run_now("k")

    start, ran, runs, alarm, again = runtime.run(scenario())
    assert ran and [r["key"] for r in runs] == ["k"]
    assert alarm is None or alarm >= start + 3_600_000  # only its backstop, never now
    assert again  # (planned again: a new timer, run again)
    assert runtime.hosts()[0].stats.alarm_invocations == 0


def test_an_alarm_leaves_a_timer_an_event_is_running_alone_and_runs_it_once_it_is_done(runtime):
    # The run sets its timer due again at once and goes on for 5 s: the alarm
    # that comes meanwhile (for w) must neither start a second run of it nor set
    # itself again and again for it (it did, every millisecond, until the
    # run ended); the timer runs again once the first run is over.
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        start = runtime.now_ms()
        await stub.schedule("w", 1_000)  # an alarm comes while k runs
        await stub.run_now("k", 1)
        await asyncio.sleep(10)
        return start, await stub.runs()

    start, runs = runtime.run(scenario())
    assert [(r["key"], round((r["at"] - start) / 1000)) for r in runs] == [("k", 0), ("w", 1), ("k", 5)]
    assert runtime.hosts()[0].stats.alarm_invocations <= 3


def test_the_earliest_durable_timer_is_read_once_until_a_write_and_a_rolled_back_one_is_not_kept(runtime):
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        await stub.schedule("a", 5_000)
        host = runtime.host_of(stub)
        scheduler, start = host.instance.scheduler, runtime.now_ms()
        before = host.db.rows_read
        for _ in range(3):
            await scheduler.sync()  # each sync asks for the earliest timer
        reads = host.db.rows_read - before

        def scheduled_then_failed():
            scheduler.schedule("work", "ghost", start + 1_000)
            assert scheduler._rows.earliest() == [start + 1_000]  # read inside: the ghost is earliest
            raise RuntimeError("rolled back")

        with pytest.raises(RuntimeError):
            scheduler.transaction(scheduled_then_failed)
        await scheduler.sync()
        return reads, await stub.alarm_time() - start

    reads, alarm = runtime.run(scenario())
    assert reads == 0  # read by the schedule's own sync, kept since: no write came
    assert alarm == 5_000  # the timer the transaction rolled back moved nothing


def sql_timers(storage=None):
    storage = storage or SchemaStorage()
    sql = Sql(types.SimpleNamespace(storage=storage))
    return storage, sql, SqlTimers(sql)


def test_an_object_with_no_durable_participant_makes_no_timer_table_and_reads_nothing():
    storage, _, timers = sql_timers()
    assert "durability_timers" not in storage.tables()
    assert (timers.due(1e15), timers.earliest(), timers.of("p"), timers.get("p", "k")) == ([], [], [], None)
    timers.cancel("p", "k")  # nothing to delete: no table made for it either
    assert "durability_timers" not in storage.tables()
    timers.make()  # a durable participant registers
    timers.upsert("p", "k", 5.0, earlier_only=False, always=False)
    assert [t["key"] for t in timers.due(10.0)] == ["k"] and timers.earliest() == [5.0]


def test_a_table_made_in_a_transaction_that_rolls_back_is_not_taken_to_be_there():
    _, sql, timers = sql_timers()

    def made_then_failed():
        timers.make()
        raise RuntimeError("the transaction fails")

    with pytest.raises(RuntimeError):
        sql.transaction(made_then_failed)
    assert timers.earliest() == [] and timers.due(1e15) == []  # (read as not there: no "no such table")


def test_an_object_that_had_durable_timers_reads_them_with_no_durable_participant_now():
    storage, _, older = sql_timers()
    older.make()
    older.upsert("gone", "k", 5.0, earlier_only=False, always=False)
    _, _, timers = sql_timers(storage)  # a new instance of newer code: nothing registers as durable
    assert [t["participant"] for t in timers.due(10.0)] == ["gone"]


def test_scheduling_for_a_participant_not_registered_is_refused(runtime):
    stub = runtime.env.TIMERS.getByName("t")

    async def scenario():
        with pytest.raises(JsException, match="not registered"):
            await stub.schedule_for("nobody", "k", 1_000)
        return await runtime.env.TIMERS.getByName("t").timer_count()

    assert runtime.run(scenario()) == 0
