"""A start rate on the lock semaphore: "three at once, sixty a minute" in one open, exact across restarts."""

import asyncio

import pytest

from bench.rates import most_in_any_window
from durability.locks import InvalidOption, messages as m, semaphore
from durability.locks.line import RATE_START_MS, Line
from support import locks_runtime_fixture  # noqa: F401  (the runtime fixture)

PERIOD_MS = 10_000


def holder(runtime, key, name="uploads"):
    return runtime.env.SLOTS.getByName(f"{name}:{key}")




def granted_times(runtime):
    world = runtime.module.WORLD
    return [world["admitted_at"][hold["token"]] for hold in world["holds"]]


def test_a_rate_is_an_option_of_the_open_and_a_bad_one_is_refused(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=3, rate="60/min")
    assert (uploads.options.rate.limit, uploads.options.rate.period_ms) == (60, 60_000)
    for bad in ("60/fortnight", (0, 1_000), (5, 0), (5, 1_000, -1), "lots"):
        with pytest.raises(InvalidOption):
            semaphore(runtime.env.SLOTS, "uploads", limit=3, rate=bad)


def test_an_acquire_carries_its_rate_and_a_bad_one_is_refused_whole():
    wire = m.Acquire("r1", 3, 30_000, 0, False, None, m.Rate(5, 1_000, 2)).to_wire()
    assert wire["rate"] == [5, 1_000, 2] and m.parse_acquire(wire).rate == m.Rate(5, 1_000.0, 2)
    assert "rate" not in m.Acquire("r1", 3, 30_000, 0, False, None).to_wire()
    for bad in ([5, 1_000], [0, 1_000, 0], [5, -1, 0], "5/s", [5, 1_000, True]):
        with pytest.raises(m.ProtocolError):
            m.parse_acquire({**wire, "rate": bad})


def test_the_line_lets_the_head_in_only_while_its_window_has_room():
    line, rate, tokens = Line(), m.Rate(2, PERIOD_MS), iter(f"t{n}" for n in range(99))
    for n in range(4):
        line.join(f"r{n}", limit=10, ttl_ms=30_000, max_hold_ms=None, now=0, leave_at=10**9, rate=rate)
    granted = line.settle(0, lambda: next(tokens)).granted
    assert [p.request_id for p in granted] == ["r0", "r1"]
    line.release(granted[0].token)  # gone, and still counted in its window
    assert line.settle(5_000, lambda: next(tokens)).granted == []
    assert line.next_wakeup(5_000) == RATE_START_MS + PERIOD_MS
    assert [p.request_id for p in line.settle(RATE_START_MS + PERIOD_MS, lambda: next(tokens)).granted] == [
        "r2", "r3"]
    assert line.reusable(RATE_START_MS + PERIOD_MS) is granted[0]


async def run_uploads(runtime, count, rate, limit=10, work_ms=200, spread_ms=0, key="u"):
    async def one(n):
        await asyncio.sleep(n * spread_ms / 1000)
        return await runtime.env.UPLOADER.getByName(f"up-{n % 3}").upload(
            {"id": f"{key}{n}", "key": key, "limit": limit, "rate": rate, "work_ms": work_ms})
    return await asyncio.gather(*(one(n) for n in range(count)))


def test_holds_start_at_most_the_rate_in_any_window_and_all_of_them_run(runtime):
    results = runtime.run(run_uploads(runtime, 10, [3, PERIOD_MS]))
    assert [r["status"] for r in results] == ["done"] * 10
    times = granted_times(runtime)
    assert most_in_any_window(times, PERIOD_MS) == 3
    assert max(times) - min(times) < 4 * (PERIOD_MS + RATE_START_MS)  # three windows' wait, no more


def test_a_restarted_holder_counts_the_window_its_rows_keep(runtime):
    async def scenario():
        first = await run_uploads(runtime, 3, [3, PERIOD_MS])
        runtime.evict(holder(runtime, "u"))  # the new instance reads the gone places back
        return first + await run_uploads(runtime, 3, [3, PERIOD_MS])

    results = runtime.run(scenario())
    assert [r["status"] for r in results] == ["done"] * 6
    assert most_in_any_window(granted_times(runtime), PERIOD_MS) == 3


def test_a_steady_flow_at_the_rate_writes_no_more_rows_than_without_it(runtime):
    def rows_written(key):
        return runtime.host_of(holder(runtime, key)).db.rows_written

    runtime.run(run_uploads(runtime, 6, None, spread_ms=4_000, key="a"))
    runtime.run(run_uploads(runtime, 6, [1, 3_000], spread_ms=4_000, key="b"))  # each takes over a gone row
    assert rows_written("b") == rows_written("a")
    assert most_in_any_window(granted_times(runtime)[6:], 3_000) == 1


class _LateReplies:
    """A namespace whose first acquire reply reaches the client ``late_ms`` after the holder sent it."""

    def __init__(self, namespace, late_ms):
        self.namespace, self.late_ms, self.replies = namespace, late_ms, []

    def getByName(self, name):
        stub, outer = self.namespace.getByName(name), self

        class Stub:
            def __getattr__(self, method):
                real = getattr(stub, method)

                async def call(*args):
                    reply = await real(*args)
                    if method == "semaphore_acquire":
                        outer.replies.append(reply)
                        if len(outer.replies) == 1:
                            await asyncio.sleep(outer.late_ms / 1000)
                    return reply
                return call

        return Stub()


def test_a_place_that_reaches_its_client_too_late_to_start_in_its_window_is_given_back(runtime):
    late = _LateReplies(runtime.env.SLOTS, RATE_START_MS + 500)
    uploads = semaphore(late, "uploads", limit=3, rate=(5, PERIOD_MS))

    async def scenario():
        async with uploads.hold("u") as permit:
            return permit._token, await holder(runtime, "u").semaphore_usage()

    token, usage = runtime.run(scenario())
    first, second = late.replies[0], late.replies[1]
    assert first["status"] == second["status"] == "granted" and first["startByMs"] <= RATE_START_MS
    assert token == second["token"] != first["token"]  # the late place went back, a new one was taken
    assert usage["held"] == 1


def test_a_gone_place_is_kept_for_the_longest_window_any_open_counted_it_in():
    line, tokens = Line(), iter(f"t{n}" for n in range(99))
    slow, fast = m.Rate(2, 100_000), m.Rate(5, 1_000)

    def hold(request_id, at, rate):
        line.join(request_id, limit=10, ttl_ms=30_000, max_hold_ms=None, now=at, leave_at=at + 10**9, rate=rate)
        granted = line.settle(at, lambda: next(tokens)).granted
        return granted[0] if granted else None

    line.release(hold("a0", 0, slow).token)
    line.release(hold("b0", 1_000, fast).token)
    assert line.reusable(3_000) is None  # out of fast's window, not of slow's
    assert hold("b1", 3_000, fast) is not None
    assert hold("a1", 3_500, slow) is None  # three started in slow's window: it waits
