"""Back in line after a failure: a shard's failed request is made again at
once, a holder restarted while busy waits for its shards before its first
round, and a round that hands out nothing opens no transaction.

Before, every failed request backed off from 1 s, doubling: with the demo's
faults more than half of all admissions left oldest-first order, almost all
within a minute of a holder's restart (docs/design.md, liveness).
"""

import asyncio

import pytest

from durability.semaphore.queue.pure.core import AT_ONCE_IN_A_ROW, REACHED_MS, ask_again_at_once
from durability.testing import Faults
from support import holders_runtime, queue_jobs as jobs


@pytest.fixture
def runtime():
    with holders_runtime(seed=1) as rt:
        yield rt


@pytest.mark.parametrize("retryable, in_flight_ms, timed_out, failures, at_once", [
    (True, 0, False, 0, True),  # the first failure in a row, lost on the way
    (True, 0, False, 1, False),  # the second in a row that never reached the holder: the backoff
    (True, REACHED_MS, False, 1, True),  # it reached the holder and failed there: the holder is reachable
    (True, REACHED_MS - 1, False, 1, False),
    (True, 250_000, True, 1, False),  # timed out: the holder may hang, it did not answer
    (True, 250_000, True, 0, True),  # ... though a first failure goes again at once
    (True, REACHED_MS, False, AT_ONCE_IN_A_ROW - 1, True),
    (True, REACHED_MS, False, AT_ONCE_IN_A_ROW, False),  # a holder that fails every request it takes
    (False, REACHED_MS, False, 0, False),  # not a failure of the call: the backoff
])
def test_when_a_failed_request_is_made_again_at_once(retryable, in_flight_ms, timed_out, failures, at_once):
    assert ask_again_at_once(retryable, in_flight_ms, timed_out, failures) is at_once


def requests_of(world, client):
    return [at for at, who in world["requests"] if who == client]


def test_a_request_held_when_its_holder_restarts_is_made_again_at_once(runtime):
    world = runtime.module.WORLD
    holder = runtime.env.HOLDER.getByName("holder")

    async def scenario():
        world_limit = runtime.module.CONFIG
        world_limit["limit"] = 1
        await runtime.env.SHARD.getByName("a").submit(jobs("a", 1, ms=60_000))
        await asyncio.sleep(5)
        await runtime.env.SHARD.getByName("b").submit(jobs("b", 1))  # blocked: held at the holder
        await asyncio.sleep(10)
        evicted_at = runtime.now_ms()
        runtime.evict(holder)
        await asyncio.sleep(5)
        return evicted_at, requests_of(world, "b")

    evicted_at, asked = runtime.run(scenario())
    again = [at for at in asked if at >= evicted_at]
    assert len(asked) - len(again) >= 1 and again  # held before, asked again after
    assert again[0] - evicted_at < 100  # at once: not after the backoff's first second


def test_a_request_lost_on_the_way_is_made_again_at_once_once_then_backs_off():
    faults = Faults(lost_request=1.0, targets={"Holder"})
    with holders_runtime(seed=1, faults=faults) as runtime:
        async def scenario():
            await runtime.env.SHARD.getByName("a").submit(jobs("a", 1))
            await asyncio.sleep(10)

        runtime.run(scenario())
        lost = [at for at, name, event, detail in runtime.trace
                if name == "Holder:holder" and event == "lost request"]
    gaps = [b - a for a, b in zip(lost, lost[1:])]
    assert gaps[0] < 50  # the first failure: at once
    assert 1_000 <= gaps[1] <= 1_200 and 2_000 <= gaps[2] <= 2_400  # then the backoff, 1 s doubling


@pytest.mark.parametrize("busy", [True, False])
def test_a_holder_restarted_while_busy_waits_for_its_shards_before_its_first_round(runtime, busy):
    config, world = runtime.module.CONFIG, runtime.module.WORLD
    config.update(limit=2, round_wait_ms=20, round_period_ms=100)
    holder = runtime.env.HOLDER.getByName("holder")

    async def scenario():
        if busy:
            await runtime.env.SHARD.getByName("a").submit(jobs("a", 1, ms=60_000))  # one permit out
            await asyncio.sleep(2)
        runtime.evict(holder)
        await asyncio.sleep(1)
        sent = runtime.now_ms()
        await runtime.env.SHARD.getByName("b").submit(jobs("b", 1))  # its request starts the new instance
        await asyncio.sleep(3)
        return world["started"]["b0"] - sent

    waited = runtime.run(scenario())
    if busy:  # rejoin_wait_ms: the shards whose requests the old instance held are back first
        assert 1_000 <= waited < 1_200
    else:  # nothing was out: nobody can have been in line
        assert waited < 200


def test_a_round_that_hands_out_nothing_opens_no_transaction(runtime):
    runtime.module.CONFIG["limit"] = 1
    holder = runtime.env.HOLDER.getByName("holder")

    async def scenario():
        await runtime.env.SHARD.getByName("a").submit(jobs("a", 1, ms=60_000))
        await asyncio.sleep(3)
        await runtime.env.SHARD.getByName("b").submit(jobs("b", 1))  # blocked: held over, round after round
        await asyncio.sleep(3)
        host = runtime.host_of(holder)
        batches, requests = host.batch_mark(), len(runtime.module.WORLD["requests"])
        first_round = host.instance.semaphore._last_round_at
        await asyncio.sleep(20)
        rounds_for = host.instance.semaphore._last_round_at - first_round
        return host.batch_mark() - batches, len(runtime.module.WORLD["requests"]) - requests, rounds_for

    opened, new_requests, rounds_for = runtime.run(scenario())
    assert rounds_for >= 18_000  # rounds went on, one per period, holding b's request over
    assert (opened, new_requests) == (0, 0)  # and none of them wrote or opened a batch
