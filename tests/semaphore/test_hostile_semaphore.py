"""The semaphore holder against generated hostile messages (Hypothesis), on the embedded runtime.

Every example starts a fresh holder in one of two setups (grants only, or
strict leases), in which an honest client ``h`` and a hostile client ``x``
already hold grants or leases. Then ``x`` sends one generated message in the
same round as an honest request of ``h``. For every example: no call
raises; ``h`` gets a well-formed reply. When ``x`` is refused, the reply is
the documented error shape, and ``h``'s reply, every table of the holder
and ``usage()`` are exactly what they are when ``x`` sends nothing. When
``x`` is accepted (a valid message, a replayed or reordered report of its
own), counts only move forward and nothing of ``h``'s is touched.

CI runs 5,000 examples (``CI`` is set); elsewhere 1,000.
"""

from __future__ import annotations

import asyncio
import os

from hypothesis import HealthCheck, given, settings, strategies as st

from durability.semaphore.holder.store import GRANT_ROWS
from durability.semaphore.messages import parse_reply
from hostile import Tally, arbitrary, mutated
from support import holders_runtime

EXAMPLES = 5_000 if os.environ.get("CI") else 1_000
LEASES = {"provisioning": {"mode": "strict"}, "permits_per_lease": 2, "ttl_ms": 60_000}
SETUPS = {"grants": None, "leases": LEASES}
T0 = 1_000.0


def request(client, demand=(), grants=(), lease_reports=(), leases=False, wait=0):
    return {
        "type": "request", "v": 1, "clientId": client, "wait": wait, "leases": leases,
        "demand": [{"group": g, "count": n, "oldestAt": t} for g, n, t in demand],
        "grants": [{"grantId": i, "claimed": c, "released": r} for i, c, r in grants],
        "leaseReports": [{"leaseId": i, "group": g, "permits": p, "drawn": d, "released": r, "stopped": s}
                         for i, g, p, d, r, s in lease_reports],
    }


def sync(client, grants=(), lease_reports=()):
    message = request(client, (), grants, lease_reports)
    for name in ("demand", "wait", "leases"):
        del message[name]
    message["type"] = "sync"
    return message


def holder(runtime):
    return runtime.env.HOLDER.getByName("holder")


async def set_up(runtime, leases):
    """``h`` and ``x`` each hold a grant (and, with leases, a lease) with one permit claimed."""
    runtime.module.CONFIG.update(limit=6, leases=leases)
    on_leases = leases is not None
    h, x = await asyncio.gather(holder(runtime).permits(request("h", [("g", 2, T0)], leases=on_leases)),
                                holder(runtime).permits(request("x", [("g", 2, T0 + 1)], leases=on_leases)))
    held = {}
    for client, reply in (("h", h), ("x", x)):
        grants = [(g["grantId"], 1, 0) for g in reply["grants"]]
        drawn = [(lease["leaseId"], lease["group"], lease["permits"], 1, 0, False) for lease in reply["leases"]]
        await holder(runtime).permits(sync(client, grants, drawn))
        held[client] = {"grants": grants, "leases": drawn}
    return held


def honest(held):
    return request("h", [("g", 3, T0)], held["h"]["grants"], held["h"]["leases"], leases=True)


def hostile_bases(held):
    """Valid messages of ``x``, and forged ones: replays, reordering, ids of ``h`` and never issued."""
    x, h = held["x"], held["h"]
    own_grant = [(i, 1, 1) for i, _, _ in x["grants"]]
    own_lease = [(i, g, p, 1, 1, True) for i, g, p, _, _, _ in x["leases"]]
    stale = [(i, 0, 0) for i, _, _ in x["grants"]]
    forged = [(i, 1, 1) for i, _, _ in h["grants"]] or [("g-unknown", 1, 1)]
    forged_leases = [(i, g, p, 1, 1, True) for i, g, p, _, _, _ in h["leases"]]
    never = [(i.rsplit("-", 1)[0] + "-999", "g", 2, 1, 0, False) for i, *_ in h["leases"]]
    return [
        request("x", [("g", 4, T0 - 5)], own_grant, own_lease, leases=True, wait=30_000),
        sync("x", own_grant, own_lease),
        sync("x", stale),
        request("x", [("g", 1, T0)], stale),
        sync("x", forged),
        sync("x", lease_reports=forged_leases or [("lfeed-1", "g", 3, 2, 0, False)]),
        sync("x", lease_reports=never or [("lfeed-2", "g", 3, 3, 3, True)]),
        request("h", [("g", 1, T0)], forged),
    ]


def state(runtime):
    db = runtime.host_of(holder(runtime)).db
    tables = [row["name"] for row in db.inspect(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'durability%' ORDER BY name")]
    state = {table: db.inspect(f"SELECT * FROM {table} ORDER BY 1, 2") for table in tables}
    state["grants"] = db.inspect(f"SELECT * FROM ({GRANT_ROWS}) ORDER BY grant_id")
    return state


NOTHING = object()  #: x sends nothing (None is a message x may send)


async def exchange(runtime, setup, hostile=NOTHING, hostile_first=True):
    """Set up, then ``h``'s request and ``x``'s message (if any) in one round."""
    held = await set_up(runtime, SETUPS[setup])
    calls = {"h": holder(runtime).permits(honest(held))}
    if hostile is not NOTHING:
        calls["x"] = holder(runtime).permits(hostile)
    order = sorted(calls, reverse=hostile_first)  # "x" first, or "h" first
    replies = dict(zip(order, await asyncio.gather(*(calls[name] for name in order))))
    return held, replies["h"], replies.get("x"), await holder(runtime).usage()


def h_alone(setup):
    """``h`` alone: the setup is the same in every example (one seed)."""
    with holders_runtime(seed=7) as runtime:
        held, reply, _, usage = runtime.run(exchange(runtime, setup))
        return held, reply, usage, state(runtime)


ALONE = {setup: h_alone(setup) for setup in SETUPS}


@st.composite
def hostile_case(draw):
    setup = draw(st.sampled_from(sorted(SETUPS)))
    bases = hostile_bases(ALONE[setup][0])
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "forged", "arbitrary"]))
    if kind == "arbitrary":
        return setup, draw(arbitrary)
    base = draw(st.sampled_from(bases))
    return setup, base if kind == "forged" else draw(mutated(base))


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=hostile_case(), hostile_first=st.booleans())
def test_a_hostile_message_fails_only_its_sender(case, hostile_first):
    setup, hostile = case
    _, expected_reply, expected_usage, expected_state = ALONE[setup]
    with holders_runtime(seed=7) as runtime:
        try:
            held, reply, hostile_reply, usage = runtime.run(exchange(runtime, setup, hostile, hostile_first))
        except Exception:
            Tally.count("semaphore holder", "crashed")
            raise
        after = state(runtime)
    parse_reply(reply, "grants")  # h is always answered, well formed
    refused = isinstance(hostile_reply, dict) and hostile_reply.get("type") == "error"
    if refused:
        Tally.count("semaphore holder", "refused")
        assert set(hostile_reply) == {"type", "v", "code", "message"}
        assert isinstance(hostile_reply["code"], str) and isinstance(hostile_reply["message"], str)
        assert reply == expected_reply
        assert usage == expected_usage
        assert after == expected_state
        return
    Tally.count("semaphore holder", "accepted")
    assert isinstance(hostile_reply, dict) and hostile_reply.get("type") in ("grants", "synced")
    # Counts only move forward, and h's grants and leases stay h's. (A message
    # sent as h, which the holder cannot tell from h, may settle one of them:
    # released in full, its row goes.)
    as_h = isinstance(hostile, dict) and hostile.get("clientId") == "h"
    grants = {row["grant_id"]: row for row in after["grants"]}
    for grant_id, claimed, _ in held["h"]["grants"]:
        row = grants.get(grant_id)
        if row is None and as_h:
            continue
        assert row is not None and row["client_id"] == "h" and row["claimed"] >= claimed
    leases = {row["lease_id"]: row for row in after["durability_semaphore_leases"]}
    for lease_id, *_ in held["h"]["leases"]:
        assert leases[lease_id]["client_id"] == "h"
    for row in after["grants"]:
        assert 0 <= row["released"] <= row["claimed"] <= row["permits"]
    for row in after["durability_semaphore_leases"]:
        assert 0 <= row["released"] <= row["drawn"] <= row["permits"]
