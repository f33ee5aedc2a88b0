"""DurabilityOutbox: messages commit with their change and are sent until acknowledged."""

import asyncio

import pytest

from durability.testing import Faults, JsException
from support import timers_runtime


@pytest.fixture
def runtime():
    with timers_runtime() as rt:
        yield rt


def stubs(runtime):
    return runtime.env.TIMERS.getByName("t"), runtime.env.INBOX.getByName("inbox")


def test_a_message_is_delivered_after_its_change_commits(runtime):
    source, inbox = stubs(runtime)

    async def scenario():
        await source.change("a", 1)
        await asyncio.sleep(1)
        return await source.state(), await inbox.received(), await source.pending()

    assert runtime.run(scenario()) == ({"a": 1}, ["a=1"], [])


def test_a_message_and_its_change_commit_together_or_not_at_all(runtime):
    source, inbox = stubs(runtime)

    async def scenario():
        with pytest.raises(JsException, match="the change fails"):
            await source.change("a", 1, True)
        await asyncio.sleep(5)
        source_again, _ = stubs(runtime)  # a stub is broken after an error
        return await source_again.state(), await source_again.pending(), await inbox.received()

    assert runtime.run(scenario()) == ({}, [], [])


def test_a_bad_message_is_refused_and_nothing_is_enqueued(runtime):
    source, _ = stubs(runtime)

    async def scenario():
        with pytest.raises(JsException, match="must be JSON"):
            await source.bad_message()
        return await stubs(runtime)[0].pending()

    assert runtime.run(scenario()) == []


def test_coalescing_keeps_only_the_newest_unsent_message_per_key(runtime):
    source, inbox = stubs(runtime)

    async def scenario():
        await inbox.go_down(10)
        for value in (1, 2, 3):
            await source.change("a", value)
        await source.change("b", 7)
        queued = await source.pending()
        await asyncio.sleep(60)
        return queued, await inbox.received()

    queued, received = runtime.run(scenario())
    assert queued == [{"key": "a", "value": 3}, {"key": "b", "value": 7}]
    assert received == ["a=3", "b=7"]


def test_unkeyed_messages_go_out_in_order_in_batches(runtime):
    source, inbox = stubs(runtime)

    async def scenario():
        await inbox.go_down(5)
        for value in range(8):
            await source.change("a", value, False, False)
        await asyncio.sleep(60)
        return await inbox.received()

    assert runtime.run(scenario()) == [f"a={v}" for v in range(8)]


def test_a_failing_receiver_is_retried_with_backoff_until_it_accepts(runtime):
    source, inbox = stubs(runtime)

    async def scenario():
        await inbox.go_down(20)
        start = runtime.now_ms()
        await source.change("a", 1)
        while not await inbox.received():
            await asyncio.sleep(0.5)
        return runtime.now_ms() - start

    elapsed = runtime.run(scenario())
    # Down for 20 s; retries 1, 2, 4, 8, 16 s apart (jitter off) reach it at 31 s.
    assert 20_000 <= elapsed <= 32_000


def test_eviction_before_publishing_loses_nothing(runtime):
    source, inbox = stubs(runtime)

    async def scenario():
        await inbox.go_down(3)
        await source.change("a", 1)
        await source.change("b", 2)
        runtime.evict(source)
        await asyncio.sleep(30)
        return await inbox.received()

    assert runtime.run(scenario()) == ["a=1", "b=2"]


def test_lost_and_duplicated_deliveries_still_deliver_every_message_at_least_once():
    faults = Faults(lost_request=0.3, lost_reply=0.3, duplicate=0.3, latency_ms=(0, 30),
                    targets=frozenset({"Inbox"}))
    runtime = timers_runtime(faults=faults, seed=3)
    source, inbox = stubs(runtime)

    async def scenario():
        for value in range(30):
            await source.change(f"k{value}", value, False, False)
        await asyncio.sleep(600)
        with runtime.no_faults():
            return await inbox.received(), await source.pending()

    received, pending = runtime.run(scenario())
    assert pending == []
    assert set(received) == {f"k{v}={v}" for v in range(30)}
    assert len(received) > 30  # some arrived more than once
    events = {event for _, _, event, _ in runtime.trace}
    assert {"lost request", "lost reply", "duplicate"} <= events
    runtime.close()


def test_unkeyed_message_ids_never_repeat_across_instances(runtime):
    source, inbox = stubs(runtime)

    async def scenario():
        first = await source.change("a", 1, False, False)
        await asyncio.sleep(2)  # delivered; the outbox table is empty again
        runtime.evict(source)
        second = await stubs(runtime)[0].change("a", 2, False, False)
        return first, second

    first, second = runtime.run(scenario())
    assert first != second and first.startswith("#") and second.startswith("#")


def test_keys_may_not_look_like_generated_ids(runtime):
    source, _ = stubs(runtime)

    async def scenario():
        with pytest.raises(JsException, match="not starting with '#'"):
            await source.change("#x", 1)

    runtime.run(scenario())


def test_steady_writes_do_not_turn_one_alarm_into_endless_sends():
    from support import example_runtime

    runtime = example_runtime(faults=Faults(latency_ms=(20, 20), targets=frozenset({"Tally"})))

    async def scenario():
        counter = runtime.env.COUNTER.getByName("c")
        for _ in range(1_000):  # one add every 10 ms for 10 s
            await counter.add("t", 1)
            await asyncio.sleep(0.01)
        await asyncio.sleep(5)
        return await runtime.env.TALLY.getByName("t").total()

    assert runtime.run(scenario()) == 1_000
    reports = sum(1 for _, _, event, detail in runtime.trace if event == "call" and detail == "report")
    # The channel waits delay_ms = 1 s between sends: about one report a second.
    assert reports <= 20
    runtime.close()


def test_a_late_acknowledgement_never_deletes_a_newer_message(runtime):
    source, _ = stubs(runtime)

    async def scenario():
        return await source.stale_acknowledgement()

    assert runtime.run(scenario()) == [{"key": "k", "value": 2}]
