"""Leases end to end on the embedded runtime: a holder that leases and queues that draw from them."""

import asyncio
import json

import pytest

from durability.semaphore.holder.store import GRANT_ROWS
from durability.testing import Faults
from support import (
    as_made_before_queue_version_9,
    assert_back_in_line_with_the_release,
    has_table,
    holders_runtime,
    queue_jobs as jobs,
    released_then_evicted,
    served_behind_the_line,
)

TTL = 60_000


@pytest.fixture
def runtime():
    with holders_runtime(seed=1) as rt:
        rt.module.CONFIG.update(limit=8, leases={"provisioning": {"mode": "strict"}, "permits_per_lease": 4,
                                                 "ttl_ms": TTL})
        yield rt


def shard(runtime, name="s1"):
    return runtime.env.SHARD.getByName(name)


def holder(runtime):
    return runtime.env.HOLDER.getByName("holder")


def lease_table(runtime, name="s1"):
    """The shard's lease rows as stored, or None: a queue made new (schema
    version 9 on) has no lease table, and keeps no row for a lease."""
    db = runtime.host_of(shard(runtime, name)).db
    return db.inspect("SELECT lease_id FROM durability_queue_leases") if has_table(db, "durability_queue_leases") \
        else None


def requests_from(runtime, client):
    return [t for t, c in runtime.module.WORLD["requests"] if c == client]


def test_drawn_items_are_admitted_at_once_with_no_round_trip(runtime):
    world = runtime.module.WORLD

    async def scenario():
        await shard(runtime).submit(jobs("a", 1, ms=60_000))
        await asyncio.sleep(5)
        asked = len(requests_from(runtime, "s1"))
        at = runtime.now_ms()
        await shard(runtime).submit(jobs("b", 3, ms=60_000))
        await asyncio.sleep(0.001)
        return asked, at, await shard(runtime).vias(), await shard(runtime).states()

    asked, at, vias, states = runtime.run(scenario())
    assert asked == 1 and len(requests_from(runtime, "s1")) == 1  # the burst asked nothing
    assert all(world["started"][f"b{i}"] == at for i in range(3))  # admitted in the same instant
    assert set(vias.values()) == {"lease"} and set(states.values()) == {"admitted"}


def test_what_a_reply_s_lease_draws_is_handed_on_in_its_event_with_no_alarm(runtime):
    # A woken queue (its holder calls back) asks in the enqueue's own event;
    # the reply brings a lease and the queue draws from it: admit() gets the
    # items once that commit is done. An alarm set to now for them cost a
    # row, an alarm run and a row to set the alarm back.
    runtime.module.CONFIG.update(calls=True, round_wait_ms=20, round_period_ms=100, request_wait_ms=30_000)
    world = runtime.module.WORLD

    async def scenario():
        start = runtime.now_ms()
        await shard(runtime).submit(jobs("a", 2, ms=60_000))
        await asyncio.sleep(2)
        return start, await shard(runtime).vias(), runtime.host_of(shard(runtime)).stats.alarm_invocations

    start, vias, alarms = runtime.run(scenario())
    assert set(vias.values()) == {"lease"}
    assert world["started"]["a0"] == world["started"]["a1"] < start + 200  # at the holder's round
    assert alarms == 0


def test_a_drawn_permit_is_one_shot(runtime):
    runtime.module.CONFIG["leases"]["permits_per_lease"] = 2

    async def scenario():
        await shard(runtime).submit(jobs("a", 2, ms=1_000))
        await asyncio.sleep(5)  # both ran and were released; the report waits 10 s
        first = await shard(runtime).leases()
        await shard(runtime).submit(jobs("b", 1, ms=1_000))
        await asyncio.sleep(0.1)
        status, during = await shard(runtime).status("b0"), await shard(runtime).leases()
        await asyncio.sleep(30)  # reported and settled
        return first, status, during, lease_table(runtime), await shard(runtime).leases()

    first, status, during, table, settled = runtime.run(scenario())
    lease = first[0]
    assert (lease["permits"], lease["drawn"], lease["released"]) == (2, 2, 2)
    # Releasing gave footprint back, not permits to draw: the new item waits for a new lease.
    assert status["state"] == "queued"
    assert len(during) == 1 and during[0]["lease_id"] == lease["lease_id"] and during[0]["drawn"] == 2
    assert table is None  # no row
    # Settled with every draw released, the lease is forgotten.
    assert lease["lease_id"] not in {row["lease_id"] for row in settled}


def test_a_contended_reply_makes_idle_leases_come_back(runtime):
    runtime.module.CONFIG.update(limit=4)

    async def scenario():
        await shard(runtime, "hog").submit(jobs("h", 1, ms=300_000) + jobs("short", 1, ms=5_000))
        await asyncio.sleep(3)
        hogged = await holder(runtime).usage()
        await shard(runtime, "late").submit(jobs("l", 2, ms=1_000))
        # The hog's next word with the holder (the sync of its release) is answered contended.
        await asyncio.sleep(25)
        return hogged, await shard(runtime, "late").states(), await shard(runtime, "hog").leases()

    hogged, late, hog_leases = runtime.run(scenario())
    assert hogged["leaseFootprint"] == 4  # two items took the whole budget as a lease
    assert set(late.values()) == {"released"}  # served once the hog returned what it had not drawn
    assert hog_leases[0]["stopped"] == 1 and hog_leases[0]["drawn"] == 2


def test_a_lease_with_work_running_is_reported_at_half_its_lifetime(runtime):
    async def scenario():
        await shard(runtime).submit(jobs("a", 1, ms=5 * TTL))
        await asyncio.sleep(4 * TTL / 1000)
        return await holder(runtime).usage(), runtime.trace

    usage, trace = runtime.run(scenario())
    syncs = [t for t, _, event, detail in trace if event == "call" and detail == "permits"]
    assert usage["retiredFootprint"] == 0 and usage["leaseFootprint"] == 4  # kept live: never retired
    assert len(syncs) >= 4  # a heartbeat every half lifetime


def test_an_idle_lease_goes_back_at_half_its_lifetime(runtime):
    async def scenario():
        await shard(runtime).submit(jobs("a", 1, ms=1_000))
        await asyncio.sleep(TTL / 1000)
        return await holder(runtime).usage(), await shard(runtime).leases()

    usage, leases = runtime.run(scenario())
    assert usage["outstanding"] == 0 and usage["leases"] == 0
    assert leases == []  # settled at the holder and here: forgotten


def test_lowering_the_limit_retires_leases_and_the_queue_stops_drawing(runtime):
    config = runtime.module.CONFIG

    async def scenario():
        await shard(runtime, "a").submit(jobs("a", 1, ms=120_000) + jobs("short", 1, ms=6_000))
        await asyncio.sleep(3)
        config["limit"] = 2
        await shard(runtime, "b").submit(jobs("b", 1, ms=1_000))  # a round runs
        await asyncio.sleep(2)
        retired = await holder(runtime).usage()
        # The sync of short0's release is answered retired: the shard stops drawing at once.
        await asyncio.sleep(15)
        await shard(runtime, "a").submit(jobs("late", 1, ms=1_000))
        await asyncio.sleep(0.01)
        return retired, await shard(runtime, "a").status("late0"), await shard(runtime, "a").leases()

    retired, late, leases = runtime.run(scenario())
    assert retired["retiredFootprint"] == 4  # two drawn, and two it might have drawn since
    assert late["state"] == "queued"  # not drawn from the retired lease, although it had permits left
    assert leases[0]["stopped"] == 1 and leases[0]["drawn"] == 2
    assert runtime.module.WORLD["max_running"] <= 8


def test_a_client_cut_off_past_the_ttl_keeps_its_work_counted_until_it_reports():
    runtime = holders_runtime(seed=3, faults=Faults(lost_request=1.0, targets=frozenset({"Holder"})))
    config, world = runtime.module.CONFIG, runtime.module.WORLD
    config.update(limit=4, leases={"provisioning": {"mode": "strict"}, "permits_per_lease": 4, "ttl_ms": TTL})

    async def scenario():
        runtime.faults.enabled = False
        await shard(runtime, "cut").submit(jobs("c", 3, ms=3 * TTL))
        await asyncio.sleep(2)
        runtime.faults.enabled = True  # cut off: nothing reaches the holder
        await asyncio.sleep(2 * TTL / 1000)
        with runtime.no_faults():
            cut_off = await holder(runtime).usage()
            await shard(runtime, "other").submit(jobs("o", 2, ms=1_000))
            await asyncio.sleep(10)
            other_meanwhile = await shard(runtime, "other").states()
        runtime.faults.enabled = False
        await asyncio.sleep(3 * TTL / 1000)
        return cut_off, other_meanwhile, await holder(runtime).usage(), await shard(runtime, "other").states()

    cut_off, meanwhile, end, other = runtime.run(scenario())
    assert cut_off["retiredFootprint"] == 4  # retired, counted in full: it may have drawn more
    assert set(meanwhile.values()) == {"queued"}  # so nothing else may run meanwhile
    assert set(other.values()) == {"released"} and end["outstanding"] == 0
    assert world["violations"] == []
    runtime.close()


def test_a_lease_in_a_lost_reply_reaches_the_client_with_the_next_one():
    runtime = holders_runtime(seed=5, faults=Faults(lost_reply=1.0, targets=frozenset({"Holder"})))
    config, world = runtime.module.CONFIG, runtime.module.WORLD
    config.update(limit=4, leases={"provisioning": {"mode": "strict"}, "permits_per_lease": 4, "ttl_ms": TTL})

    async def scenario():
        await shard(runtime).submit(jobs("a", 2, ms=1_000))
        await asyncio.sleep(3)
        runtime.faults.enabled = False
        await asyncio.sleep(2 * TTL / 1000)
        return await shard(runtime).states(), await holder(runtime).usage()

    states, usage = runtime.run(scenario())
    assert set(states.values()) == {"released"} and usage["outstanding"] == 0 and usage["leases"] == 0
    assert world["violations"] == []
    runtime.close()


def test_a_version_1_holder_migrates_in_place_and_keeps_its_grants(runtime):
    runtime.module.CONFIG["leases"] = None

    async def scenario():
        await holder(runtime).usage()  # the tables, as this version makes them
        # Storage as version 1 left it: the grant table alone, one row per grant.
        sql = runtime.host_of(holder(runtime)).instance.ctx.storage.sql
        for table in ("leases", "lease_ids", "loans", "clients"):
            sql.exec(f"DROP TABLE durability_semaphore_{table}")
        sql.exec("INSERT INTO durability_semaphore_grants (grant_id, client_id, grp, permits, claimed, released, "
                 "claim_deadline, reclaimed) VALUES ('g1', 'c', 'g', 2, 2, 0, 1, 0), ('g2', 'c', 'g', 1, 1, 1, 1, 0), "
                 "('g3', 'd', 'h', 3, 1, 0, 1, 1)")
        sql.exec("UPDATE durability_schema SET version = 1 WHERE component = 'semaphore'")
        await runtime.host_of(holder(runtime)).instance.ctx.storage.sync()  # durable before the eviction
        runtime.evict(holder(runtime))
        usage = await holder(runtime).usage()
        db = runtime.host_of(holder(runtime)).db
        version = db.inspect("SELECT version FROM durability_schema WHERE component = 'semaphore'")[0]["version"]
        rows = db.inspect(f"SELECT grant_id, client_id, grp, permits, claimed, released, reclaimed "
                          f"FROM ({GRANT_ROWS}) ORDER BY grant_id")
        old = db.inspect("SELECT count(*) AS n FROM durability_semaphore_grants")[0]["n"]
        return usage, version, rows, old

    usage, version, rows, old = runtime.run(scenario())
    assert version == 5 and old == 0
    assert [tuple(row.values()) for row in rows] == [
        ("g1", "c", "g", 2, 2, 0, 0), ("g2", "c", "g", 1, 1, 1, 0), ("g3", "d", "h", 3, 1, 0, 1)]
    assert usage["outstanding"] == 2 + 0 + 3 and usage["leases"] == 0


def test_admit_runs_only_once_the_admission_and_its_draw_are_durable(runtime):
    # Work started on an admission whose write batch is then lost would run on
    # a permit nobody counts: admit() must wait for the commit.
    seen = []
    real_admit = runtime.module.Shard._admit

    async def admit(self, items):
        seen.append(runtime.host_of(shard(runtime, self.ctx.id.name)).db.in_batch)
        await real_admit(self, items)

    runtime.module.Shard._admit = admit

    async def scenario():
        await shard(runtime).submit(jobs("a", 2, ms=1_000))  # drawn from a lease in the reply's batch
        await asyncio.sleep(5)
        await shard(runtime).submit(jobs("b", 2, ms=1_000))  # drawn inside enqueue
        await asyncio.sleep(5)

    runtime.run(scenario())
    assert len(seen) >= 2 and not any(seen)


#: A queue as version 1 left it: its two tables as version 1 made them, and
#: rows as it wrote them (no done_at, no draw; a grant row per grant).
VERSION_1 = [
    "CREATE TABLE durability_schema (component TEXT PRIMARY KEY, version INTEGER NOT NULL) WITHOUT ROWID",
    "INSERT INTO durability_schema VALUES ('semaphore-queue', 1)",
    "CREATE TABLE durability_queue_items (id TEXT PRIMARY KEY, key TEXT NOT NULL, grp TEXT NOT NULL, "
    "body TEXT NOT NULL, seq INTEGER NOT NULL, enqueued_at REAL NOT NULL, state TEXT NOT NULL, grant_id TEXT, "
    "via TEXT, admitted_at REAL) WITHOUT ROWID",
    "CREATE TABLE durability_queue_grants (grant_id TEXT PRIMARY KEY, key TEXT NOT NULL, grp TEXT NOT NULL, "
    "permits INTEGER NOT NULL, claimed INTEGER NOT NULL, confirmed INTEGER NOT NULL, released INTEGER NOT NULL, "
    "claim_deadline REAL NOT NULL) WITHOUT ROWID",
    "INSERT INTO durability_queue_items VALUES ('a0', 'holder', 'g', '{\"ms\":1000}', 1, 0, 'queued', NULL, "
    "NULL, NULL)",
    "INSERT INTO durability_queue_items VALUES ('a1', 'holder', 'g', '{\"ms\":1000}', 2, 0, 'queued', NULL, "
    "NULL, NULL)",
    "INSERT INTO durability_queue_items VALUES ('d0', 'holder', 'g', '{\"ms\":1000}', 3, 0, 'released', 'g-old', "
    "'grant', 5)",
    "INSERT INTO durability_queue_items VALUES ('c0', 'holder', 'g', '{\"ms\":1000}', 4, 0, 'cancelled', NULL, "
    "NULL, NULL)",
    "INSERT INTO durability_queue_grants VALUES ('g-old', 'holder', 'g', 1, 1, 1, 1, 0)",
]


def test_a_version_1_queue_migrates_in_place_and_keeps_its_items(runtime):
    db = runtime.host_of(shard(runtime)).db  # no instance has run yet: these rows are all it holds
    for statement in VERSION_1:
        db.exec(statement, ())
    db.commit_batch()

    async def scenario():
        before = await shard(runtime).states()  # the first instance migrates
        await asyncio.sleep(10)
        host = runtime.host_of(shard(runtime))
        version = host.db.inspect("SELECT version FROM durability_schema WHERE component = 'semaphore-queue'")
        columns = {r["name"] for r in host.db.inspect("PRAGMA table_info(durability_queue_items)")}
        spoken = host.db.inspect("SELECT since FROM durability_queue_spoken_as_given")
        statuses = {item: (await shard(runtime).status(item))["state"] for item in ("d0", "c0")}
        return before, version[0]["version"], columns, spoken, statuses, await shard(runtime).states()

    before, version, columns, spoken, statuses, after = runtime.run(scenario())
    assert before == {"a0": "queued", "a1": "queued", "d0": "released", "c0": "cancelled"}
    # The lease table (2), the pacing table (3), the items' done_at (4), draw (5), how it speaks (6),
    # the label it was given (7), the record a released item keeps (8), that it has older tables (9).
    assert version == 9 and {"done_at", "draw", "record"} <= columns
    assert spoken == [{"since": 1}]  # it held items at the upgrade: it speaks as the id it was given
    assert statuses == {"d0": "released", "c0": "cancelled"}
    assert after["a0"] == after["a1"] == "released"  # the queued items ran under the holder, then were released
    assert runtime.module.WORLD["started"].keys() >= {"a0", "a1"} and "d0" not in runtime.module.WORLD["started"]


def test_reports_an_older_version_left_in_the_outbox_are_still_sent(runtime):
    # Older versions queued grant reports on durability.semaphore-queue and
    # lease reports on durability.semaphore-queue.leases; a new instance sends
    # both (here for a grant and a lease the holder no longer knows) and
    # forgets them once answered.
    async def scenario():
        await shard(runtime).submit(jobs("a", 1, ms=1_000))
        await asyncio.sleep(5)
        storage = runtime.host_of(shard(runtime)).instance.ctx.storage
        as_made_before_queue_version_9(storage)
        sql = storage.sql
        for channel, body in (
                ("durability.semaphore-queue", {"key": "holder", "grantId": "g-old", "claimed": 1, "released": 1}),
                ("durability.semaphore-queue.leases", {"key": "holder", "leaseId": "l-old"})):
            sql.exec("INSERT INTO durability_outbox (channel, id, seq, body, created_at, version) "
                     "VALUES (?, ?, 1000000, ?, 0, 1000000)", channel, body.get("grantId") or body["leaseId"],
                     json.dumps(body))
        await asyncio.sleep(0.1)  # the rows commit
        runtime.evict(shard(runtime))
        await shard(runtime).submit(jobs("b", 1, ms=1_000))
        await asyncio.sleep(30)
        host = runtime.host_of(shard(runtime))
        return host.db.inspect("SELECT channel, id FROM durability_outbox")

    assert runtime.run(scenario()) == []


def test_a_settled_lease_goes_at_once_and_a_late_reply_cannot_revive_it(runtime):
    async def scenario():
        await shard(runtime).submit(jobs("a", 2, ms=1_000))
        await asyncio.sleep(3)
        issued = await shard(runtime).leases()
        await asyncio.sleep(TTL / 1000)  # ran and released; at half its ttl the idle lease went back
        settled = await shard(runtime).leases()
        items = await shard(runtime).states()
        revived = await shard(runtime).hear_late_listing("k", issued[0])
        return issued, settled, lease_table(runtime), items, revived

    issued, settled, table, items, revived = runtime.run(scenario())
    assert len(issued) == 1 and issued[0]["drawn"] == 2
    assert settled == [] and table is None and set(items.values()) == {"released"}  # forgotten, no row ever
    assert revived == []  # a reply listing it as first issued is taken for the late reply it is


def test_lease_ids_are_reserved_in_blocks_and_a_new_holder_numbers_past_its_block(runtime):
    runtime.module.CONFIG["leases"] = {"provisioning": {"mode": "strict"}, "permits_per_lease": 1, "ttl_ms": TTL}

    def ids_row():
        return runtime.host_of(holder(runtime)).db.inspect("SELECT issued FROM durability_semaphore_lease_ids")

    async def scenario():
        for n in range(3):  # three shards, three rounds, three leases
            await shard(runtime, f"s{n}").submit(jobs(f"j{n}-", 1, ms=1_000))
            await asyncio.sleep(3)
        first = [lease["lease_id"] for n in range(3) for lease in await shard(runtime, f"s{n}").leases()]
        reserved = ids_row()
        runtime.evict(holder(runtime))
        await shard(runtime, "s9").submit(jobs("k", 1, ms=1_000))
        await asyncio.sleep(3)
        return first, reserved, [lease["lease_id"] for lease in await shard(runtime, "s9").leases()], ids_row()

    first, reserved, after, reserved_after = runtime.run(scenario())
    numbers = [int(lease_id.rsplit("-", 1)[1]) for lease_id in first]
    assert numbers == [1, 2, 3] and reserved == [{"issued": 1 + 64}]  # written once, for the block
    assert int(after[0].rsplit("-", 1)[1]) == 66 and reserved_after == [{"issued": 66 + 64}]


def test_a_lease_release_not_yet_reported_when_its_shard_is_evicted_still_reaches_the_holder(runtime):
    # A lease's report is its items: no row and no outbox row holds it. The
    # new instance knows the lease from them, stops it and reports it at once
    # (the report waited lease_report_delay_ms, 10 s): its release and its
    # three undrawn permits go back, and the lease settles.
    async def footprint():
        return (await holder(runtime).usage())["leaseFootprint"]

    async def scenario():
        before, after = await released_then_evicted(runtime, shard(runtime), footprint, 12)
        return before, after, has_table(runtime.host_of(shard(runtime)).db, "durability_outbox")

    before, after, outbox = runtime.run(scenario())
    assert before == 4 and after == 0 and not outbox  # (a queue made new makes no outbox)


def test_a_lease_draw_reported_without_a_row_stays_counted_across_a_holder_eviction(runtime):
    def holder_rows():
        return runtime.host_of(holder(runtime)).db.inspect(
            "SELECT lease_id, drawn, released FROM durability_semaphore_leases")

    async def scenario():
        await shard(runtime).submit(jobs("a", 2, ms=30_000) + jobs("b", 1, ms=2_000))
        await asyncio.sleep(25)  # drawn, b0 released and reported (by a sync and with requests)
        before = await holder(runtime).usage()
        rows = holder_rows()
        runtime.evict(holder(runtime))
        after = await holder(runtime).usage()
        await asyncio.sleep(60)  # a0, a1 end; every release is reported and the lease settles
        return before, rows, after, await holder(runtime).usage()

    before, rows, after, end = runtime.run(scenario())
    assert before["leaseFootprint"] == 3  # 4 permits, one released
    assert len(rows) == 1 and rows[0]["drawn"] < 3 and rows[0]["released"] == 0  # heard, not written
    assert after["leaseFootprint"] == 4  # the row counts the released permit in use: more, never less
    assert end["leaseFootprint"] == 0 and end["leases"] == 0


def test_a_lease_nothing_was_drawn_from_is_heard_of_again_after_an_eviction_and_goes_back(runtime):
    # No row holds a lease: the key's row makes the new instance ask, and the
    # holder's reply lists the lease, which then goes back as idle. (Done
    # items are kept a second only: no cancelled item tells of the key.)
    runtime.module.CONFIG["keep_done_ms"] = 1_000

    async def scenario():
        await shard(runtime).submit(jobs("a", 1, ms=1_000))
        await asyncio.sleep(0.5)  # asked; the round runs a second after
        await shard(runtime).cancel("a0")  # the lease then comes with nothing to draw
        await asyncio.sleep(3)
        learned = await shard(runtime).leases()
        charged = await holder(runtime).usage()
        assert await shard(runtime).states() == {}  # the cancelled item is gone
        runtime.evict(shard(runtime))
        await asyncio.sleep(3 * TTL / 1000)
        return learned, charged, await holder(runtime).usage()

    learned, charged, end = runtime.run(scenario())
    assert len(learned) == 1 and learned[0]["drawn"] == 0 and charged["leaseFootprint"] == 4
    assert (end["leaseFootprint"], end["leases"], end["retiredFootprint"]) == (0, 0, 0)


def test_with_keep_done_ms_0_a_drawn_item_s_row_goes_at_its_release_and_the_lease_still_settles(runtime):
    runtime.module.CONFIG["keep_done_ms"] = 0

    async def scenario():
        await shard(runtime).submit(jobs("a", 2, ms=1_000))
        await asyncio.sleep(3)  # drawn, ran, released
        mid = await shard(runtime).leases(), await shard(runtime).states()
        await asyncio.sleep(TTL / 1000)  # at half its ttl the idle lease goes back
        return mid, await shard(runtime).leases(), await holder(runtime).usage()

    (leases, items), after, usage = runtime.run(scenario())
    assert items == {}  # no released item is kept: one write per release, not two
    assert [(x["drawn"], x["released"]) for x in leases] == [(2, 2)]  # counted all the same
    assert after == [] and (usage["leaseFootprint"], usage["leases"]) == (0, 0)


@pytest.mark.parametrize("evicted", ["while a draw still runs", "once every draw is released"])
def test_draws_the_holder_heard_of_whose_items_went_at_their_release_are_counted_released_by_a_new_instance(
        runtime, evicted):
    # The holder heard of four draws on the first lease (with the request for
    # b3); three of their items went at their release. A new instance knows
    # the lease from a0's item only, or not at all (the holder's listing
    # names it): either way it counts the missing draws released, and every
    # permit comes back, none early.
    runtime.module.CONFIG["keep_done_ms"] = 0

    async def scenario():
        await shard(runtime).submit(jobs("a", 1, ms=20_000))
        await asyncio.sleep(3)
        await shard(runtime).submit(jobs("b", 4, ms=1_000))
        await asyncio.sleep(5)
        if evicted == "once every draw is released":
            while "a0" not in runtime.module.WORLD["completed"]:
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.3)  # its release not reported yet
        before = await holder(runtime).usage()
        runtime.evict(shard(runtime))
        await asyncio.sleep(3)
        early = await holder(runtime).usage()
        await asyncio.sleep(60)
        return before, early, await holder(runtime).usage(), await shard(runtime).states()

    before, early, end, items = runtime.run(scenario())
    assert before["leaseFootprint"] >= 4 and early == before  # a0's lease counted in full until reported
    assert (end["leaseFootprint"], end["leases"], end["outstanding"]) == (0, 0, 0) and items == {}


def test_a_draw_running_when_its_shard_is_evicted_stays_counted_after_an_earlier_draw_went_at_its_release(runtime):
    # a0 is the lease's first draw: released, its row deleted, its release
    # heard. b0, its second, runs when the shard is evicted. The new instance
    # sees b0's item only: by its number, two draws were made and one is
    # released, so b0 stays counted (a count of the items would say one draw,
    # none released, and the holder, already told one of one released, would
    # settle the lease with b0 running).
    runtime.module.CONFIG["keep_done_ms"] = 0

    async def scenario():
        await shard(runtime).submit(jobs("a", 1, ms=1_000))
        await asyncio.sleep(15)  # a0 ran; its release reported after its delay
        heard = await holder(runtime).usage()
        await shard(runtime).submit(jobs("b", 1, ms=60_000))
        await asyncio.sleep(1)
        runtime.evict(shard(runtime))
        await asyncio.sleep(20)  # the new instance reports the lease it knows from b0
        during = await holder(runtime).usage()
        await asyncio.sleep(60)
        return heard, during, await holder(runtime).usage()

    heard, during, end = runtime.run(scenario())
    assert heard["leaseFootprint"] == 3  # four permits, one released
    assert during["leaseFootprint"] == 1 and during["outstanding"] == 1  # b0, running, and nothing else
    assert (end["leaseFootprint"], end["leases"]) == (0, 0)


def test_a_drawn_item_released_behind_the_line_is_reported_by_its_next_request_alone():
    world = served_behind_the_line(leases={"provisioning": {"mode": "strict"}, "permits_per_lease": 1,
                                           "ttl_ms": 600_000})
    # Drawn from a lease: its release's lease report rode on the request.
    assert world["vias"]["a0"] == "lease"
    assert_back_in_line_with_the_release(world)
