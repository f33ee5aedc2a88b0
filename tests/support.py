"""Helpers shared by the tests: runtimes over the probe Worker and the example Worker."""

import asyncio
from functools import partial
from pathlib import Path

import pytest

from durability.testing import Runtime, load_worker_module

ROOT = Path(__file__).resolve().parent.parent
PROBE = Path(__file__).resolve().parent / "workers" / "probe.py"


def probe_runtime(**options) -> Runtime:
    return Runtime(load_worker_module(PROBE), {"PROBE": "Probe"}, **options)


def example_runtime(**options) -> Runtime:
    return Runtime.from_wrangler(ROOT / "wrangler.toml", vars={"API_TOKEN": "t0ken"}, **options)

TIMERS = Path(__file__).resolve().parent / "workers" / "timers.py"


def timers_runtime(**options) -> Runtime:
    return Runtime(load_worker_module(TIMERS), {"TIMERS": "Timers", "INBOX": "Inbox"}, **options)

HOLDERS = Path(__file__).resolve().parent / "workers" / "holders.py"


def holders_runtime(**options) -> Runtime:
    return Runtime(load_worker_module(HOLDERS), {"HOLDER": "Holder", "SIM": "SimClient", "SHARD": "Shard"},
                   **options)

LOCKS = Path(__file__).resolve().parent / "workers" / "locks.py"


def locks_runtime(**options) -> Runtime:
    return Runtime(load_worker_module(LOCKS), {"SLOTS": "Slots", "UPLOADER": "Uploader"}, **options)


def queue_jobs(prefix, n, ms=3_000, group="g", key="holder"):
    """Items for a Shard of the holders Worker: each runs ``ms`` once admitted."""
    return [{"id": f"{prefix}{i}", "key": key, "group": group, "body": {"ms": ms}} for i in range(n)]


async def released_then_evicted(runtime: Runtime, shard, measure, settle_s: float):
    """Run one job (``a0``, 5 s) on a holders ``Shard`` until it is released,
    its report not sent yet; evict the shard and wait ``settle_s``. Returns
    ``await measure()`` from before the eviction and from after the wait."""
    await shard.submit(queue_jobs("a", 1, ms=5_000))
    while "a0" not in runtime.module.WORLD["completed"]:
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)  # released; its report waits for its delay
    before = await measure()
    runtime.evict(shard)
    await asyncio.sleep(settle_s)  # the alarm the old instance set wakes the new one
    return before, await measure()


#: Virtual times may end a few microseconds past the moment waited for (see durability._clock).
approx = partial(pytest.approx, abs=0.01)


@pytest.fixture(name="runtime")
def locks_runtime_fixture():
    """A ``runtime`` fixture for the lock tests: the locks Worker, no faults."""
    with locks_runtime() as rt:
        yield rt
