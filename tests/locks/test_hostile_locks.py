"""The lock semaphore's holder against generated hostile messages (Hypothesis), on the embedded runtime.

Every example starts a fresh holder for one key with a limit of 1: ``h1``
holds the place and ``h2`` waits in line for it. A hostile sender then
calls one of the holder's four methods (acquire, renew, release, cancel)
with a generated message, ``h1`` releases, and ``h2`` must get the place.
For every example: no call raises. When the message is refused, the reply
is the documented error shape, and ``h2``'s reply, the places table and
``usage()`` are exactly what they are when nothing hostile is sent. When it
is accepted (a message of valid shape with ids of its own or forged
tokens), no more places are held than the largest limit in line allows.

CI runs 5,000 examples (``CI`` is set); elsewhere 1,000.
"""

from __future__ import annotations

import asyncio
import os

from hypothesis import HealthCheck, given, settings, strategies as st

from hostile import Tally, arbitrary, mutated
from support import locks_runtime

EXAMPLES = 5_000 if os.environ.get("CI") else 1_000
METHODS = ["semaphore_acquire", "semaphore_renew", "semaphore_release", "semaphore_cancel"]
NOTHING = object()  #: nothing hostile is sent (None is a message a sender may send)
FORGED_TOKEN = "0" * 32


def acquire(request_id, limit=1, wait_ms=0, **extra):
    return {"v": 1, "requestId": request_id, "limit": limit, "ttlMs": 30_000, "waitMs": wait_ms, **extra}


BASES = {
    "semaphore_acquire": [acquire("x1"), acquire("x2", limit=1_000, wait_ms=50, maxHoldMs=60_000),
                          acquire("x3", wait_ms=5_000, more=True)],
    "semaphore_renew": [{"v": 1, "token": FORGED_TOKEN}],
    "semaphore_release": [{"v": 1, "token": FORGED_TOKEN}],
    "semaphore_cancel": [{"v": 1, "requestId": "x9"}],
}


def slots(runtime):
    return runtime.env.SLOTS.getByName("uploads:u")


def places(runtime):
    db = runtime.host_of(slots(runtime)).db
    rows = db.inspect("SELECT * FROM durability_lock_places ORDER BY request_id")
    return [{k: v for k, v in row.items() if k != "token"} for row in rows]  # tokens are random


async def exchange(runtime, method=None, message=NOTHING):
    stub = slots(runtime)
    first = await stub.semaphore_acquire(acquire("h1"))
    waiting = asyncio.ensure_future(stub.semaphore_acquire(acquire("h2", wait_ms=10_000)))
    await asyncio.sleep(1)
    hostile = None
    if message is not NOTHING:  # alongside the honest calls: an accepted acquire may wait in line
        hostile = asyncio.ensure_future(getattr(stub, method)(message))
    await asyncio.sleep(1)
    released = await stub.semaphore_release({"v": 1, "token": first["token"]})
    second = await waiting
    if hostile is not None:
        hostile = await hostile
    usage = await stub.semaphore_usage()
    second = {k: v for k, v in second.items() if k != "token"}
    return hostile, released, second, usage


def h_alone():
    with locks_runtime(seed=3) as runtime:
        _, released, second, usage = runtime.run(exchange(runtime))
        return released, second, usage, places(runtime)


ALONE = h_alone()


@st.composite
def hostile_case(draw):
    method = draw(st.sampled_from(METHODS))
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "forged", "arbitrary"]))
    if kind == "arbitrary":
        return method, draw(arbitrary)
    base = draw(st.sampled_from(BASES[method]))
    return method, base if kind == "forged" else draw(mutated(base))


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=hostile_case())
def test_a_hostile_message_fails_only_its_sender(case):
    method, message = case
    with locks_runtime(seed=3) as runtime:
        try:
            hostile, released, second, usage = runtime.run(exchange(runtime, method, message))
        except Exception:
            Tally.count("lock holder", "crashed")
            raise
        after = places(runtime)
    assert released["status"] == "released"
    if isinstance(hostile, dict) and hostile.get("type") == "error":
        Tally.count("lock holder", "refused")
        assert set(hostile) == {"type", "v", "code", "message"}
        assert isinstance(hostile["code"], str) and isinstance(hostile["message"], str)
        assert (released, second, usage, after) == ALONE
        return
    Tally.count("lock holder", "accepted")
    assert isinstance(hostile, dict) and isinstance(hostile.get("status"), str)
    assert second["status"] == "granted"  # h2 was first in line: nothing jumps it
    limits = [place["lim"] for place in after]
    assert len(after) <= max(limits, default=0)
