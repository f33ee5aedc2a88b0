"""Late and replayed reports never charge a lease again, at any age."""

import asyncio
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from support import holders_runtime

TTL = 60_000
LEASES = {"provisioning": {"mode": "strict"}, "permits_per_lease": 4, "ttl_ms": TTL}
FOREIGN = "l0123456789ab-7"  # issued by this key's holder before its storage was reset


@pytest.fixture
def runtime():
    with holders_runtime(seed=1) as rt:
        rt.module.CONFIG.update(limit=10, leases=LEASES)
        yield rt


def holder(runtime):
    return runtime.env.HOLDER.getByName("holder")


def sync(client, lease_reports=(), grants=()):
    return {"type": "sync", "v": 1, "clientId": client,
            "grants": [{"grantId": i, "claimed": c, "released": r} for i, c, r in grants],
            "leaseReports": [dict(zip(("leaseId", "group", "permits", "drawn", "released", "stopped"), r))
                             for r in lease_reports]}


@pytest.mark.parametrize("late_s", [5 * 60, 10.5 * 60, 24 * 3600])
def test_a_late_duplicate_of_a_settled_foreign_lease_charges_nothing_at_any_age(runtime, late_s):
    first = (FOREIGN, "g", 4, 0, 0, False)

    async def scenario():
        charged = await holder(runtime).permits(sync("a", [first]))
        settled = await holder(runtime).permits(sync("a", [(FOREIGN, "g", 4, 0, 0, True)]))
        await asyncio.sleep(late_s)
        late = await holder(runtime).permits(sync("a", [first]))  # the first report, delivered again
        return charged, settled, late, await holder(runtime).usage()

    charged, settled, late, usage = runtime.run(scenario())
    assert [o["status"] for o in charged["leaseReports"]] == ["retired"]
    assert [o["status"] for o in settled["leaseReports"]] == ["settled"]
    assert [o["status"] for o in late["leaseReports"]] == ["settled"], usage
    assert (usage["outstanding"], usage["leaseFootprint"], usage["leases"]) == (0, 0, 0)


# -- by property: every report replayed at random ages, across restarts --------------------------

MINUTE_MS = 60_000
WEEK_MS = 7 * 24 * 60 * MINUTE_MS
REPLAY_TTL = 10 * MINUTE_MS
OLD_EPOCH = "0123456789ab"  # leases a client got from this holder before its storage was reset
#: The ages a replay takes (ms): any, spread by order of magnitude, and near each memory's end.
EDGES = (REPLAY_TTL / 2, REPLAY_TTL, 10 * MINUTE_MS, 2 * REPLAY_TTL)
REPLAYS_PER_REPORT = 100
TRIED = {"replays": 0, "answered": 0, "after_settling": 0, "charged_after_settling": 0, "evictions": 0,
         "histories": 0, "grants": 0, "leases": 0, "leases_of_an_earlier_epoch": 0}


def replay_age(rng):
    kind = rng.randrange(3)
    if kind == 0:
        return rng.uniform(0, WEEK_MS)
    if kind == 1:
        return min(WEEK_MS, 10 ** rng.uniform(0, 8.8))  # 1 ms to a week
    return max(0.0, rng.choice(EDGES) + rng.uniform(-MINUTE_MS, MINUTE_MS))


class History:
    """One honest client's life with the holder: every message that carried a
    report, when it was sent, and when each grant and lease it names settled."""

    def __init__(self, runtime, client, rng):
        self.runtime, self.client, self.rng = runtime, client, rng
        self.sent = []  #: (ms, message)
        self.settled_at = {}  #: grant or lease id -> ms its settlement was answered

    async def call(self, message, record=True):
        while True:
            try:
                reply = await holder(self.runtime).permits(message)
            except Exception:  # the holder was evicted under the call: ask again
                await asyncio.sleep(1)
                continue
            assert reply["type"] != "error", reply
            if record:
                self.sent.append((self.runtime.now_ms(), message))
            return reply

    async def live(self, foreign_leases):
        ask = {"type": "request", "v": 1, "clientId": self.client, "claims": True, "leases": True,
               "demand": [{"group": "free", "count": 3, "oldestAt": 0}, {"group": "capped", "count": 2, "oldestAt": 0}]}
        reply = await self.call(ask, record=False)
        leases = {e["leaseId"]: (e["group"], e["permits"]) for e in reply["leases"]}
        grants = {g["grantId"]: g["claimed"] for g in reply["grants"]}
        TRIED["grants"] += len(grants)
        TRIED["leases"] += len(leases)
        TRIED["leases_of_an_earlier_epoch"] += foreign_leases
        for n in range(foreign_leases):  # reported within the first ttl, as one live at a reset is
            leases[f"l{OLD_EPOCH}-{self.client}{n + 1}"] = ("free", self.rng.randint(1, 4))
        drawn = {lease_id: self.rng.randint(0, permits) for lease_id, (_, permits) in leases.items()}
        for step in range(3):  # draws and releases reported, then every lease stopped and all released
            await asyncio.sleep(self.rng.uniform(5, 60))
            last = step == 2
            released = {i: d if last else self.rng.randint(0, d) // (3 - step) for i, d in drawn.items()}
            message = {"type": "sync", "v": 1, "clientId": self.client,
                       "grants": [{"grantId": i, "claimed": c, "released": c if last else c // (3 - step)}
                                  for i, c in grants.items()],
                       "leaseReports": [{"leaseId": i, "group": g, "permits": p, "drawn": drawn[i],
                                         "released": released[i], "stopped": last}
                                        for i, (g, p) in leases.items()]}
            reply = await self.call(message)
        statuses = [o["status"] for o in reply["reports"] + reply["leaseReports"]]
        assert set(statuses) <= {"settled", "not_found", "ok"}, reply
        for i in [*leases, *grants]:
            self.settled_at[i] = self.runtime.now_ms()


async def replay(runtime, message, at, settled_at):
    await asyncio.sleep(max(0.0, at - runtime.now_ms()) / 1000)
    if TRIED["replays"] % 2:  # half of them ride a request, through a round
        message = {**message, "type": "request", "demand": []}
    TRIED["replays"] += 1
    try:
        reply = await holder(runtime).permits(message)
    except Exception:  # sent while the holder was evicted: lost on the way
        return
    TRIED["answered"] += 1
    named = [o.get("leaseId", o.get("grantId")) for o in reply["reports"] + reply["leaseReports"]]
    if all(settled_at.get(i, math.inf) < runtime.now_ms() for i in named):
        TRIED["after_settling"] += 1
        statuses = {o["status"] for o in reply["reports"] + reply["leaseReports"]}
        if statuses - {"settled", "not_found", "expired"}:
            TRIED["charged_after_settling"] += 1


@settings(max_examples=10, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), clients=st.integers(2, 4), foreign=st.integers(0, 2),
       evictions=st.integers(0, 12))
def replays_at_every_age(seed, clients, foreign, evictions):
    rng = random.Random(seed)
    with holders_runtime(seed=seed) as runtime:
        runtime.module.CONFIG.update(limit=20, group_limits={"capped": 4}, leases=dict(LEASES, ttl_ms=REPLAY_TTL))

        async def scenario():
            histories = [History(runtime, f"c{i}", rng) for i in range(clients)]
            await asyncio.gather(*(h.live(foreign) for h in histories))
            settled_at = {i: at for h in histories for i, at in h.settled_at.items()}
            sent = [(t, m) for h in histories for t, m in h.sent]
            replays = [replay(runtime, message, t + replay_age(rng), settled_at)
                       for t, message in sent for _ in range(REPLAYS_PER_REPORT)]

            async def evict():
                for at in sorted(rng.uniform(0, WEEK_MS) for _ in range(evictions)):
                    await asyncio.sleep(max(0.0, at - runtime.now_ms()) / 1000)
                    runtime.evict(holder(runtime))
                    TRIED["evictions"] += 1

            await asyncio.gather(evict(), *replays)
            await asyncio.sleep(2 * REPLAY_TTL / 1000)  # every memory and bound has run out
            runtime.evict(holder(runtime))  # and a new instance reads what is left
            return await holder(runtime).usage()

        usage = runtime.run(scenario())
        TRIED["histories"] += clients
        assert (usage["outstanding"], usage["leaseFootprint"], usage["leases"], usage["grants"]) == (0, 0, 0, 0), usage


def test_reports_replayed_at_any_age_across_restarts_leave_nothing_charged():
    for key in TRIED:
        TRIED[key] = 0
    replays_at_every_age()
    counts = ", ".join(f"{n} {what}" for what, n in TRIED.items())
    print(f"\nreplayed reports: {counts}")
    assert TRIED["replays"] >= 5_000 and min(TRIED["grants"], TRIED["leases_of_an_earlier_epoch"]) > 0, counts
    assert TRIED["charged_after_settling"] == 0, counts


def test_a_holder_from_before_epochs_had_a_start_keeps_charging_another_epochs_lease_until_its_report(runtime):
    async def scenario():
        await holder(runtime).permits(sync("a", [(FOREIGN, "g", 4, 2, 0, False)]))
        sql = runtime.host_of(holder(runtime)).instance.ctx.storage.sql
        epoch = list(sql.exec("SELECT epoch, issued FROM durability_semaphore_lease_ids"))[0]
        # As a version 3 holder left it: no start, and the lease's expiry when it was charged.
        sql.exec("DROP TABLE durability_semaphore_lease_ids")
        sql.exec("CREATE TABLE durability_semaphore_lease_ids (epoch TEXT PRIMARY KEY, issued INTEGER NOT NULL)"
                 " WITHOUT ROWID")
        sql.exec("INSERT INTO durability_semaphore_lease_ids VALUES (?, ?)", epoch["epoch"], epoch["issued"])
        sql.exec("UPDATE durability_semaphore_leases SET expires_at = ?", runtime.now_ms())
        sql.exec("UPDATE durability_schema SET version = 3 WHERE component = 'semaphore'")
        await asyncio.sleep(0.1)  # the writes reach storage
        runtime.evict(holder(runtime))
        await asyncio.sleep(3 * TTL / 1000)
        kept = await holder(runtime).usage()
        heard = await holder(runtime).permits(sync("a", [(FOREIGN, "g", 4, 2, 1, False)]))
        await asyncio.sleep(TTL / 1000 + 1)  # unheard for a ttl since that report
        return kept, heard, await holder(runtime).usage()

    kept, heard, later = runtime.run(scenario())
    assert kept["leaseFootprint"] == 4  # still charged, as before the upgrade
    assert [o["status"] for o in heard["leaseReports"]] == ["retired"]
    assert (later["leaseFootprint"], later["leases"]) == (0, 0)
