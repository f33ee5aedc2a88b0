"""Direct calls through the lock-style semaphore (durability.locks) on the
embedded runtime: at most CALLS_PER_TENANT of one tenant at once, under
faults too, a try that finds every place taken says so, and every place
comes back."""

import asyncio
from pathlib import Path

import pytest

from durability.locks import WouldBlock, semaphore
from durability.testing import Faults, JsException, Runtime

WRANGLER = Path(__file__).resolve().parent.parent / "wrangler.toml"
LIMIT = 3  # CALLS_PER_TENANT in wrangler.toml


def _count_calls(runtime):
    """Patch the Worker's call function to measure, outside the objects, how
    many direct calls of each tenant run at once; return the peaks."""
    running, peaks = {}, {}
    real_call = runtime.module.do_call

    async def measured(call):
        tenant = call["tenant"]
        running[tenant] = running.get(tenant, 0) + 1
        peaks[tenant] = max(peaks.get(tenant, 0), running[tenant])
        try:
            return await real_call(call)
        finally:
            running[tenant] -= 1

    runtime.module.do_call = measured
    return peaks


def test_calls_beyond_the_limit_wait_in_line_and_a_try_is_refused():
    with Runtime.from_wrangler(WRANGLER, seed=1) as runtime:
        peaks = _count_calls(runtime)

        async def scenario():
            call = runtime.call_entrypoint
            waiting = [asyncio.ensure_future(call("call", "acme", 2_000)) for _ in range(LIMIT + 1)]
            await asyncio.sleep(0.5)
            refused = await call("call_now", "acme", 100)  # every place taken, one call in line
            other = await call("call_now", "globex", 100)  # another tenant's places are its own
            usage = await call("call_usage", "acme")
            return await asyncio.gather(*waiting), refused, other, usage

        done, refused, other, usage = runtime.run(scenario())
        assert done == [{"status": "done", "worked_ms": 2_000}] * (LIMIT + 1)  # the last one waited
        assert refused == {"status": "busy"}
        assert other == {"status": "done", "worked_ms": 100}
        assert usage == {"held": LIMIT, "waiting": 1}
        assert peaks == {"acme": LIMIT, "globex": 1}
        assert runtime.run(runtime.call_entrypoint("call_usage", "acme")) == {"held": 0, "waiting": 0}


def test_try_hold_raises_would_block_when_every_place_is_taken():
    with Runtime.from_wrangler(WRANGLER, seed=1) as runtime:
        slots = semaphore(runtime.env.CALL_SLOTS, "calls", limit=LIMIT)  # as the Worker opens them

        async def scenario():
            held = [asyncio.ensure_future(runtime.call_entrypoint("call", "acme", 2_000)) for _ in range(LIMIT)]
            await asyncio.sleep(0.5)
            with pytest.raises(WouldBlock):
                async with slots.try_hold("acme"):
                    raise AssertionError("the block ran without a place")
            await asyncio.gather(*held)
            async with slots.try_hold("acme"):  # free again
                return "ran"

        assert runtime.run(scenario()) == "ran"


def test_a_bad_call_gets_a_clear_error_and_changes_nothing():
    with Runtime.from_wrangler(WRANGLER, seed=1) as runtime:
        for args, why in [(("", 10), "tenant must be a string"), (("acme", -1), "work_ms must be an integer"),
                          (("acme", "10"), "work_ms must be an integer")]:
            with pytest.raises(JsException, match=f"ValueError: {why}"):
                runtime.run(runtime.call_entrypoint("call", *args))
        assert runtime.hosts() == []  # no object was reached


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_call_limit_holds_under_faults(seed):
    # external=True: the Default entrypoint runs in no object, and its calls
    # to the holder are faulted only with it. Lost, repeated, delayed calls;
    # the holder is evicted and loses write batches.
    faults = Faults(lost_request=0.05, lost_reply=0.05, duplicate=0.05, latency_ms=(0, 40), evict=0.05,
                    crash_before_commit=0.02, external=True, targets={"CallSlots"})
    calls = [(("acme", "globex")[n % 2], 300 + 137 * n % 1_200) for n in range(30)]
    with Runtime.from_wrangler(WRANGLER, seed=seed, faults=faults) as runtime:
        peaks = _count_calls(runtime)

        async def scenario():
            replies = await asyncio.gather(*[runtime.call_entrypoint("call", *call) for call in calls],
                                           return_exceptions=True)
            await asyncio.sleep(60)  # a place whose release was lost comes back when its lease ends
            with runtime.no_faults():
                usage = [await runtime.call_entrypoint("call_usage", tenant) for tenant in ("acme", "globex")]
            return replies, usage

        replies, usage = runtime.run(scenario())
    assert peaks == {"acme": LIMIT, "globex": LIMIT}  # the limit was reached, never passed
    # Each call got its place within its 10 s wait: retries after lost replies found their place.
    assert replies == [{"status": "done", "worked_ms": work_ms} for _, work_ms in calls]
    assert usage == [{"held": 0, "waiting": 0}] * 2
    events = {event for _, name, event, _ in runtime.trace if name.startswith("CallSlots:")}
    assert {"lost request", "lost reply", "duplicate", "evicted"} <= events
