"""Lock semaphores on the embedded runtime: admission, waiting, leases, losses, restarts, two opens."""

import asyncio

import pytest

from durability.locks import (
    EXPIRED,
    MAX_HOLD,
    RENEWAL_FAILED,
    InvalidOption,
    PlaceLost,
    Tried,
    WaitTimeout,
    WouldBlock,
    semaphore,
)
from durability.testing import JsException
from support import approx, locks_runtime_fixture  # noqa: F401  (the runtime fixture)


class Lossy:
    """A namespace whose stubs lose some calls: ``requests`` never arrive; the first
    ``replies[method]`` calls of a method arrive and run, and their replies are lost."""

    def __init__(self, namespace, requests=(), replies=None):
        self.namespace = namespace
        self.requests = set(requests)
        self.replies = dict(replies or {})

    def getByName(self, name):
        return _LossyStub(self, self.namespace.getByName(name))


class _LossyStub:
    def __init__(self, lossy, stub):
        self._lossy, self._stub = lossy, stub

    def __getattr__(self, method):
        lossy, real = self._lossy, getattr(self._stub, method)

        async def call(*args):
            if method in lossy.requests:
                await asyncio.sleep(0)
                raise lost_connection()
            reply = await real(*args)
            if lossy.replies.get(method, 0) > 0:
                lossy.replies[method] -= 1
                raise lost_connection()
            return reply

        return call


def lost_connection():
    error = JsException("Network connection lost.")
    error.retryable = True
    return error


def calls(runtime, method=None):
    return [e for e in runtime.trace if e[2] == "call" and (method is None or e[3] == method)]


def holder(runtime, key, name="uploads"):
    return runtime.env.SLOTS.getByName(f"{name}:{key}")


async def together(*coroutines, return_exceptions=False):
    return await asyncio.gather(*coroutines, return_exceptions=return_exceptions)


async def usage(runtime, key, name="uploads"):
    return await holder(runtime, key, name).semaphore_usage()


def test_an_uncontended_hold_costs_one_call_each_way_and_two_rows(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=3, ttl="30s")

    async def scenario():
        async with uploads.hold("u1") as permit:
            inside = await usage(runtime, "u1")
            assert not permit.lost() and not permit.signal.is_set()
        return inside, await usage(runtime, "u1")

    inside, after = runtime.run(scenario())
    assert inside["held"] == 1 and after["held"] == 0
    assert [c[3] for c in calls(runtime) if c[3] != "semaphore_usage"] == ["semaphore_acquire", "semaphore_release"]
    store = runtime.host_of(holder(runtime, "u1")).db
    assert store.inspect("SELECT count(*) AS n FROM durability_lock_places")[0]["n"] == 0


def test_run_calls_the_function_with_its_arguments_inside_a_place(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1)

    async def held_now(label):
        return label, (await usage(runtime, "u"))["held"]

    async def scenario():
        done = await uploads.run("u", held_now, "inside")
        plain = await uploads.run("u", lambda: 7)  # a plain function's result is returned as it is
        tried = await uploads.try_run("u", held_now, "tried")
        return done, plain, tried, (await usage(runtime, "u"))["held"]

    assert runtime.run(scenario()) == (("inside", 1), 7, Tried(True, ("tried", 1)), 0)


def test_try_run_says_busy_without_calling_and_passes_the_functions_own_would_block_on(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1)
    others = semaphore(runtime.env.SLOTS, "others", limit=1)
    called = []

    async def nested_try():
        async with others.try_hold("u"):  # full: this WouldBlock is the function's, not try_run's
            called.append("never")

    async def scenario():
        async with uploads.hold("u"):
            busy = await uploads.try_run("u", called.append, "busy")
        async with others.hold("u"):
            with pytest.raises(WouldBlock):
                await uploads.try_run("u", nested_try)
        return busy

    assert runtime.run(scenario()) == Tried(False) and called == []


def test_keys_have_their_own_places(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1)

    async def scenario():
        async with uploads.hold("u1"):
            async with uploads.try_hold("u2") as other:
                return other.key == "u2", (await usage(runtime, "u1"))["held"]

    assert runtime.run(scenario()) == (True, 1)


def test_waiters_are_admitted_first_come_first_served(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=2, ttl="5s")
    order = []

    async def one(i):
        await asyncio.sleep(i / 1000)  # arrive 1 ms apart
        async with uploads.hold("u"):
            order.append(i)
            await asyncio.sleep(3 + (i * 7919 % 5))  # hold for different times

    async def scenario():
        await asyncio.gather(*(one(i) for i in range(12)))

    runtime.run(scenario())
    assert order == list(range(12))


def test_a_waiter_is_admitted_the_moment_a_place_is_released(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1)

    async def first():
        async with uploads.hold("u"):
            await asyncio.sleep(10)
            return runtime.now_ms()

    async def second():
        await asyncio.sleep(0.001)
        async with uploads.hold("u"):
            return runtime.now_ms()

    released, admitted = runtime.run(together(first(), second()))
    assert admitted == released  # no latency configured: the hand-over takes no time


def test_try_hold_takes_the_same_line_as_hold(runtime):
    small = semaphore(runtime.env.SLOTS, "uploads", limit=1)
    large = semaphore(runtime.env.SLOTS, "uploads", limit=3)

    async def scenario():
        async with small.hold("u"):
            waiter = asyncio.ensure_future(small.run("u", runtime.now_ms))
            await asyncio.sleep(1)
            # Its own limit has room, but a waiter stands before it: a try never jumps the line.
            with pytest.raises(WouldBlock):
                async with large.try_hold("u"):
                    pytest.fail("the block ran without a place")
            line = await usage(runtime, "u")
        await waiter
        async with large.try_hold("u") as free:
            return line, free.key

    line, free = runtime.run(scenario())
    assert line == {"held": 1, "waiting": 1, "places": line["places"]} and free == "u"


def test_try_hold_when_full_raises_would_block_runs_no_block_and_changes_nothing(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=2)
    ran = []

    async def scenario():
        async with uploads.hold("u"), uploads.hold("u"):
            with pytest.raises(WouldBlock, match="uploads:u"):
                async with uploads.try_hold("u"):
                    ran.append("block")
            return await uploads.try_run("u", ran.append, "fn"), await usage(runtime, "u")

    tried, seen = runtime.run(scenario())
    assert ran == [] and tried == Tried(False) and (seen["held"], seen["waiting"]) == (2, 0)
    # A try that failed frees nothing and leaves the line as it found it: the next try gets a place.
    assert runtime.run(uploads.try_run("u", lambda: "ran")) == Tried(True, "ran")


def test_wait_times_out_and_leaves_the_line(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1, wait="2s")

    async def scenario():
        async with uploads.hold("u"):
            start = runtime.now_ms()
            with pytest.raises(WaitTimeout):
                async with uploads.hold("u"):
                    pass
            waited = runtime.now_ms() - start
            with pytest.raises(WaitTimeout, match="within 0.5 s"):
                await uploads.run("u", lambda: None, wait=0.5)  # a call's own wait, in seconds
            return waited, runtime.now_ms() - start - waited, await usage(runtime, "u")

    waited, waited_again, seen = runtime.run(scenario())
    assert (waited, waited_again) == (approx(2_000), approx(500)) and seen["waiting"] == 0


def test_a_long_wait_keeps_its_place_in_line_across_calls(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1)
    order = []

    async def holder_for(seconds):
        async with uploads.hold("u"):
            await asyncio.sleep(seconds)

    async def waiter(name, delay):
        await asyncio.sleep(delay)
        async with uploads.hold("u"):
            order.append((name, runtime.now_ms() - start))

    async def scenario():
        await asyncio.gather(holder_for(180), waiter("early", 1), waiter("late", 100))

    start = runtime.now_ms()
    runtime.run(scenario())
    assert order == [("early", 180_000), ("late", 180_000)]
    acquires = len(calls(runtime, "semaphore_acquire"))
    assert acquires == 1 + 4 + 2  # the first waiter called four times (50 s each), the second twice


def test_max_hold_ends_the_place_and_the_next_waiter_gets_it_then(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1, ttl="3s", max_hold="10s")

    async def long_holder():
        async with uploads.hold("u") as permit:
            await permit.signal.wait()
            lost_at = runtime.now_ms()
            await asyncio.sleep(5)  # ignores the signal for a while
            return lost_at, permit.reason

    async def waiter():
        await asyncio.sleep(0.001)
        async with uploads.hold("u"):
            return runtime.now_ms()

    start = runtime.now_ms()
    results = runtime.run(together(long_holder(), waiter(), return_exceptions=True))
    assert isinstance(results[0], PlaceLost) and results[0].reason == MAX_HOLD
    assert results[1] - start == approx(10_000)
    renewals = calls(runtime, "semaphore_renew")
    assert len(renewals) == 7  # every ttl/3 until the renewal at 7 s reached max_hold (7 + 3 = 10 s)


def test_a_stalled_holder_is_told_lost_and_its_place_is_freed_only_at_expiry(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1, ttl="3s")
    stall = runtime.module.stall
    seen = {}

    async def stalled():
        async with uploads.hold("u") as permit:
            seen["granted"] = runtime.now_ms()
            stall(5_000)  # the event loop is blocked for 5 s: nothing renews, nothing else runs
            # Seen at once, before the renewal task or any other has run again.
            seen["after_stall"] = (permit.lost(), permit.reason, permit.signal.is_set())

    async def waiter():
        await asyncio.sleep(0.001)
        async with uploads.hold("u"):
            seen["admitted"] = runtime.now_ms()

    results = runtime.run(together(stalled(), waiter(), return_exceptions=True))
    assert isinstance(results[0], PlaceLost) and results[0].reason == EXPIRED
    assert seen["after_stall"] == (True, EXPIRED, True)
    assert seen["admitted"] >= seen["granted"] + 3_000  # the lease's end, reached only through the stall


def test_failed_renewals_lose_the_place_and_it_is_freed_only_after_expiry(runtime):
    cut_off = semaphore(Lossy(runtime.env.SLOTS, requests={"semaphore_renew"}), "uploads", limit=1, ttl="3s")
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1, ttl="3s")
    seen = {}

    async def unlucky():
        async with cut_off.hold("u") as permit:
            seen["granted"] = runtime.now_ms()
            await asyncio.sleep(2.999)
            seen["just_before"] = (await usage(runtime, "u"), permit.lost())
            await permit.signal.wait()  # every renewal is lost on its way
            seen["lost"] = (runtime.now_ms(), permit.reason)

    async def waiter():
        await asyncio.sleep(0.1)
        async with uploads.hold("u"):
            seen["admitted"] = runtime.now_ms()

    results = runtime.run(together(unlucky(), waiter(), return_exceptions=True))
    assert isinstance(results[0], PlaceLost) and results[0].reason == RENEWAL_FAILED
    assert seen["lost"] == (approx(seen["granted"] + 3_000), RENEWAL_FAILED)
    before, lost_before = seen["just_before"]
    assert (before["held"], before["waiting"], lost_before) == (1, 1, False)
    # Told lost at its lease's end as the client counts it; the holder frees the
    # place at the same moment, and not before: the waiter enters then.
    assert seen["admitted"] == approx(seen["granted"] + 3_000) and seen["admitted"] >= seen["granted"] + 3_000
    assert len(calls(runtime, "semaphore_renew")) == 0  # none arrived


def test_a_lost_reply_to_acquire_finds_the_same_place_on_retry(runtime):
    lossy = Lossy(runtime.env.SLOTS, replies={"semaphore_acquire": 1})
    uploads = semaphore(lossy, "uploads", limit=2)

    async def scenario():
        async with uploads.hold("u"):
            return await usage(runtime, "u"), len(calls(runtime, "semaphore_acquire"))

    seen, acquires = runtime.run(scenario())
    assert acquires == 2 and seen["held"] == 1  # granted once, found again by the retry


def test_a_cancelled_waiter_leaves_the_line(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1)

    async def scenario():
        async with uploads.hold("u"):
            waiter = asyncio.ensure_future(uploads.run("u", lambda: "never"))
            await asyncio.sleep(1)
            waiting = (await usage(runtime, "u"))["waiting"]
            waiter.cancel()
            await asyncio.sleep(0.01)
            return waiting, (await usage(runtime, "u"))["waiting"], waiter.cancelled()

    assert runtime.run(scenario()) == (1, 0, True)


def test_holder_eviction_and_restart_lose_no_place(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=2, ttl="3s")
    stub = holder(runtime, "u")

    async def scenario():
        async with uploads.hold("u") as a, uploads.hold("u") as b:
            waiter = asyncio.ensure_future(uploads.run("u", runtime.now_ms))
            await asyncio.sleep(1)
            runtime.evict(stub)  # the waiter's call fails; the places are in the table
            extra = await uploads.try_run("u", lambda: "a third place")
            await asyncio.sleep(0.5)  # the waiter calls again after a short backoff
            seen = await usage(runtime, "u")
            await asyncio.sleep(20)  # renewals reach the restarted holder
            runtime.evict(stub)
            still = (a.lost(), b.lost(), (await usage(runtime, "u"))["held"])
            released = runtime.now_ms()
        return extra, seen, still, await waiter, released

    extra, seen, still, admitted, released = runtime.run(scenario())
    assert extra == Tried(False) and seen["held"] == 2 and seen["waiting"] == 1  # the waiter called again
    assert still == (False, False, 2)
    assert 0 <= admitted - released <= 200  # its call failed at each eviction; it called again soon after
    assert runtime.host_of(stub).stats.instances_created == 3


def test_two_opens_with_different_limits(runtime):
    three = semaphore(runtime.env.SLOTS, "uploads", limit=3)
    one = semaphore(runtime.env.SLOTS, "uploads", limit=1)
    five = semaphore(runtime.env.SLOTS, "uploads", limit=5)
    log = []

    async def hold(sem, name, seconds, delay=0):
        await asyncio.sleep(delay)
        async with sem.hold("u") as permit:
            log.append((name, "in", runtime.now_ms() - start))
            await asyncio.sleep(seconds)
            assert not permit.lost()  # a smaller limit lets no holder go
        log.append((name, "out", runtime.now_ms() - start))

    async def probe():
        await asyncio.sleep(15)
        return await usage(runtime, "u")

    async def scenario():
        return await together(
            hold(three, "a", 10), hold(three, "b", 20), hold(three, "c", 30),
            hold(one, "small", 1, delay=1),  # waits until every holder is gone
            hold(five, "big", 1, delay=2),  # behind "small" in line, though its limit has room
            probe(),
        )

    start = runtime.now_ms()
    midway = runtime.run(scenario())[-1]
    times = {(name, what): at for name, what, at in log}
    assert (midway["held"], midway["waiting"]) == (2, 2)  # "a" left at 10 s; nobody came in
    assert times["c", "out"] == times["small", "in"] == 30_000  # the last holder of three left
    assert times["big", "in"] == 30_000  # right behind it: 1 held < 5


def test_bad_options_are_clear_errors_and_call_nothing(runtime):
    env = runtime.env
    for bad in (dict(limit=0), dict(limit=1_001), dict(limit="3"), dict(limit=2, ttl="-1s"),
                dict(limit=2, ttl="soon"), dict(limit=2, wait=-5), dict(limit=2, max_hold="0s")):
        with pytest.raises(InvalidOption):
            semaphore(env.SLOTS, "uploads", **bad)
    with pytest.raises(InvalidOption, match="namespace"):
        semaphore("SLOTS", "uploads", limit=1)
    uploads = semaphore(env.SLOTS, "uploads", limit=1)
    with pytest.raises(InvalidOption, match="key"):
        uploads.hold("")
    with pytest.raises(InvalidOption, match="wait"):
        uploads.hold("u", wait="later")
    with pytest.raises(InvalidOption, match="max_hold"):
        uploads.try_hold("u", max_hold=-1)
    assert calls(runtime) == []


def test_bad_messages_and_foreign_tokens_change_nothing(runtime):
    uploads = semaphore(runtime.env.SLOTS, "uploads", limit=1)

    async def scenario():
        async with uploads.hold("u") as permit:
            before = await usage(runtime, "u")
            stub = holder(runtime, "u")
            replies = [
                await stub.semaphore_acquire({"v": 1, "requestId": "r", "limit": 0, "ttlMs": 30_000, "waitMs": 0}),
                await stub.semaphore_acquire({"v": 1, "requestId": "r", "limit": 1, "ttlMs": -1, "waitMs": 0}),
                await stub.semaphore_renew({"v": 1, "token": "not-mine"}),
                await stub.semaphore_renew({"v": 1}),
                await stub.semaphore_release({"v": 1, "token": "not-mine"}),
                await stub.semaphore_cancel({"v": 1, "requestId": "not-mine"}),
                await stub.semaphore_release("everything"),
            ]
            after = await usage(runtime, "u")
            await asyncio.sleep(60)  # renewals still work
            return before, replies, after, permit.lost()

    before, replies, after, lost = runtime.run(scenario())
    assert [r["code"] if r.get("type") == "error" else r["status"] for r in replies] == [
        "invalid_message", "invalid_message", "not_holder", "invalid_message", "not_held", "cancelled",
        "invalid_message"]
    assert "never issued" in replies[2]["message"]
    assert (before["held"], after["held"], lost) == (1, 1, False)
