"""Late and replayed reports never charge a lease again, at any age."""

import asyncio

import pytest

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
