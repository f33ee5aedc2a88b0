"""A queue's client id: its object's own id, so that two objects never speak to a holder as one.

The pure naming rules, then the holders Worker on the embedded runtime:
two shards given one label keep the limit in ground truth (``WORLD``),
the documented ``ctx.id.toString()`` speaks as before, and a queue that
held work under a label before the rule keeps that id until it holds
nothing, every permit coming back.
"""

import asyncio

import pytest

import durability.semaphore.queue.shell as queue_module
from durability.semaphore.identity import client_label, wire_identity
from durability.semaphore.messages import MAX_ID_LENGTH
from support import as_made_before_queue_version_9, has_table, holders_runtime, queue_jobs as jobs

OBJECT_ID = "ab" * 32  # 64 hex digits, as Cloudflare's ids


def test_a_queue_speaks_as_its_object_with_its_label_in_front():
    assert wire_identity(OBJECT_ID) == OBJECT_ID
    assert wire_identity(OBJECT_ID, OBJECT_ID) == OBJECT_ID  # the form the docs showed: unchanged on the wire
    assert wire_identity(OBJECT_ID, "shard-1") == f"shard-1@{OBJECT_ID}"
    assert wire_identity(OBJECT_ID, "same") != wire_identity("cd" * 32, "same")
    assert client_label(f"shard-1@{OBJECT_ID}") == "shard-1" and client_label(f"a@b@{OBJECT_ID}") == "a@b"
    assert client_label(OBJECT_ID) == OBJECT_ID
    longest = "x" * (MAX_ID_LENGTH - 65)
    assert len(wire_identity(OBJECT_ID, longest)) == MAX_ID_LENGTH
    for bad in (longest + "x", "", 7):
        with pytest.raises(ValueError, match="client_id"):
            wire_identity(OBJECT_ID, bad)


def run_two_shards_under_one_label(runtime):
    """Limit 2, shards s1 and s2 both given the client id ``same``, 4 jobs of 10 s (grants)."""
    runtime.module.CONFIG.update(limit=2, client_id="same")

    async def scenario():
        await runtime.env.SHARD.getByName("s1").submit(jobs("a", 2, ms=10_000))
        await runtime.env.SHARD.getByName("s2").submit(jobs("b", 2, ms=10_000))
        await asyncio.sleep(60)
        return await runtime.env.HOLDER.getByName("holder").usage()

    return runtime.run(scenario())


def test_two_objects_given_one_client_id_keep_the_limit_in_ground_truth():
    with holders_runtime(seed=1) as runtime:
        usage = run_two_shards_under_one_label(runtime)
        world = runtime.module.WORLD
        print(f"\npeak running with s1 and s2 both given client id 'same', limit 2: {world['max_running']}")
        assert world["max_running"] == 2 and world["violations"] == []  # 4 before: both claimed one grant
        assert len(world["completed"]) == 4 and usage["outstanding"] == 0
        ids = {runtime.env.SHARD.idFromName(name).toString() for name in ("s1", "s2")}
        assert world["speakers"] == {f"same@{object_id}" for object_id in ids}


def test_the_documented_client_id_speaks_as_before_and_writes_no_row():
    with holders_runtime(seed=1) as runtime:
        runtime.module.CONFIG.update(client_id=runtime.env.SHARD.idFromName("s1").toString())

        async def scenario():
            await runtime.env.SHARD.getByName("s1").submit(jobs("a", 1, ms=1_000))
            await asyncio.sleep(10)

        runtime.run(scenario())
        assert runtime.module.WORLD["speakers"] == {runtime.env.SHARD.idFromName("s1").toString()}
        host = runtime.host_of(runtime.env.SHARD.getByName("s1"))
        assert not has_table(host.db, "durability_queue_spoken_as_given")  # (made new: not even the table)


def test_a_queue_that_held_work_under_its_label_keeps_it_until_it_holds_nothing(monkeypatch):
    with holders_runtime(seed=1) as runtime:
        runtime.module.CONFIG.update(limit=2, keep_done_ms=0)
        shard = runtime.env.SHARD.getByName("s1")
        derived = f"s1@{runtime.env.SHARD.idFromName('s1').toString()}"
        # An older version: the queue speaks as the client_id it is given.
        monkeypatch.setattr(queue_module, "wire_identity", lambda object_id, label=None: label)

        async def scenario():
            await shard.submit(jobs("a", 3, ms=8_000))
            await asyncio.sleep(3)  # two run on permits the holder charges to "s1"
            storage = runtime.host_of(shard).instance.ctx.storage
            as_made_before_queue_version_9(storage)
            sql = storage.sql
            sql.exec("DROP TABLE durability_queue_spoken_as_given")
            sql.exec("ALTER TABLE durability_queue_items DROP COLUMN record")  # (version 8's)
            sql.exec("UPDATE durability_schema SET version = 5 WHERE component = 'semaphore-queue'")
            monkeypatch.undo()  # the upgrade
            await asyncio.sleep(0.1)  # the writes above reach storage before the eviction
            runtime.evict(shard)
            await shard.status("a0")  # a new instance, on the new version
            await asyncio.sleep(40)
            during = set(runtime.module.WORLD["speakers"])
            for _ in range(2):  # its first ask finds nothing held and forgets the key; the next start speaks anew
                runtime.evict(shard)
                await shard.status("a0")
                await asyncio.sleep(5)
            await shard.submit(jobs("b", 1, ms=1_000))
            await asyncio.sleep(10)
            return during, await runtime.env.HOLDER.getByName("holder").usage()

        during, usage = runtime.run(scenario())
        world = runtime.module.WORLD
        assert during == {"s1"}  # what it held under "s1" was reported under "s1": nothing refused
        assert world["speakers"] == {"s1", derived}
        assert len(world["completed"]) == 4 and world["violations"] == [] and usage["outstanding"] == 0
        host = runtime.host_of(shard)
        assert host.db.inspect("SELECT * FROM durability_queue_spoken_as_given") == []


def test_an_instance_reached_by_its_id_alone_speaks_under_the_label_kept():
    # A holder calls a client back through its id when it knows no name: the
    # instance that starts then has no ctx.id.name to make a label from.
    with holders_runtime(seed=1) as runtime:
        named = runtime.env.SHARD.getByName("s1")
        object_id = runtime.env.SHARD.idFromName("s1").toString()

        async def scenario():
            await named.submit(jobs("a", 1, ms=1_000))
            await asyncio.sleep(10)
            runtime.evict(named)
            nameless = runtime.env.SHARD.get(runtime.env.SHARD.idFromString(object_id))
            await nameless.submit(jobs("b", 1, ms=1_000))
            await asyncio.sleep(10)
            return runtime.host_of(named)

        host = runtime.run(scenario())
        assert host.instance.queue.client_id == f"s1@{object_id}"
        assert runtime.module.WORLD["speakers"] == {f"s1@{object_id}"}  # one client, not two
        assert host.db.inspect("SELECT label FROM durability_queue_label") == [{"label": "s1"}]


def test_a_label_refused_is_not_kept():
    with holders_runtime(seed=1) as runtime:
        runtime.module.CONFIG.update(client_id="x" * MAX_ID_LENGTH)  # too long to speak as
        shard = runtime.env.SHARD.getByName("s1")
        with pytest.raises(Exception, match="client_id"):
            runtime.run(shard.states())
        runtime.module.CONFIG.update(client_id=None)
        # An instance with no name and no label given: nothing was kept for it.
        object_id = runtime.env.SHARD.idFromName("s1").toString()
        runtime.run(runtime.env.SHARD.get(runtime.env.SHARD.idFromString(object_id)).states())
        host = runtime.host_of(shard)
        assert host.db.inspect("SELECT label FROM durability_queue_label") == []
        assert host.instance.queue.client_id == object_id
