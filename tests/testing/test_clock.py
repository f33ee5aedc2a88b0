"""The virtual clock: sleeps, time.time() and deadlocks."""

import asyncio
import time

import pytest

from durability.testing import DEFAULT_EPOCH_MS, Deadlock, VirtualClockLoop
from durability.testing._clock import patched_wall_clock


def test_an_hour_of_sleeps_takes_no_real_time():
    loop = VirtualClockLoop()
    started = time.monotonic()

    async def hour():
        for _ in range(3600):
            await asyncio.sleep(1)
        return loop.time()

    assert loop.run_until_complete(hour()) == pytest.approx(3600)
    assert time.monotonic() - started < 5
    loop.close()


def test_time_time_reads_the_virtual_clock_only_inside_the_patch():
    loop = VirtualClockLoop()

    async def read():
        before = time.time()
        await asyncio.sleep(2.5)
        return before, time.time()

    with patched_wall_clock(loop):
        before, after = loop.run_until_complete(read())
    assert before == DEFAULT_EPOCH_MS / 1000
    assert after - before == pytest.approx(2.5)
    assert abs(time.time() - before) > 1  # the real clock is back
    loop.close()


def test_timers_fire_in_order_of_their_deadlines():
    loop = VirtualClockLoop()
    fired = []

    async def scenario():
        for delay in (3, 1, 2):
            loop.call_later(delay, fired.append, delay)
        await asyncio.sleep(5)

    loop.run_until_complete(scenario())
    assert fired == [1, 2, 3]
    loop.close()


def test_waiting_on_nothing_is_reported_as_a_deadlock():
    loop = VirtualClockLoop()

    async def stuck():
        await loop.create_future()

    with pytest.raises(Deadlock):
        loop.run_until_complete(stuck())
    loop.close()
