"""A queue's memory changes only with a commit that succeeds (queue_memory.QueueContext.commit).

Each commit is crashed at every statement it runs, in turn: its rows roll
back, and the queue's memory (its own, its books', its timers) must be
what it was before, as if the commit had never been tried. Past the last
statement the commit succeeds and memory moves, so the comparison can fail.
"""

import asyncio
import dataclasses

import pytest

from durability.semaphore import SemaphoreClient
from durability.semaphore.messages import Reply
from durability.semaphore.queue.item_rows import COLUMNS, ItemRows
from support import holders_runtime, queue_jobs as jobs


class StorageFailure(Exception):
    pass


def memory_of(queue):
    """Everything the queue keeps in memory only, as plain values."""
    return (dataclasses.asdict(queue.ctx.memory), queue.grants.snapshot(), queue.lease_book.snapshot(),
            {timer: (row["due_at"], row["attempt"]) for timer, row in queue.scheduler.memory_snapshot().items()})


def kept_rows_match_the_table(queue):
    """What the store keeps of its items (queue/item_rows) is what the table holds."""
    table = ItemRows(queue.store.sql.exec(f"SELECT {COLUMNS} FROM durability_queue_items"))
    kept = queue.store.rows
    return all(kept.in_state(state) == table.in_state(state) for state in ("queued", "admitted", "released"))


def rows_of(queue):
    sql = queue.store.sql
    return [sql.exec(f"SELECT * FROM {table}") for table in ("durability_queue_items", "durability_queue_pacing")]


def failing_at(queue, statement):
    """Make the ``statement``-th SQL statement from now raise; returns a way to count them."""
    sql, real, count = queue.store.sql, queue.store.sql.exec, [0]

    def exec_(query, *bindings):
        count[0] += 1
        if count[0] == statement:
            raise StorageFailure(f"statement {statement} failed")
        return real(query, *bindings)

    sql.exec = exec_
    return count, lambda: delattr(sql, "exec")


def crashed_at_every_statement(queue, change):
    """Commit ``change`` crashing it at statement 1, 2, ... until it
    succeeds; returns how many statements it ran."""
    statement = 1
    while True:
        before_memory, before_rows = memory_of(queue), rows_of(queue)
        count, restore = failing_at(queue, statement)
        try:
            queue.ctx.commit_now(change)
        except StorageFailure:
            restore()
            assert memory_of(queue) == before_memory, f"memory moved by a commit crashed at statement {statement}"
            assert rows_of(queue) == before_rows
            assert kept_rows_match_the_table(queue)
            statement += 1
            continue
        restore()
        assert kept_rows_match_the_table(queue)
        # The commit that went through changed something, so the checks above could fail.
        assert (memory_of(queue), rows_of(queue)) != (before_memory, before_rows), change
        return statement - 1


@pytest.fixture
def runtime():
    with holders_runtime(seed=3) as rt:
        yield rt


def live_queue(runtime, name):
    [host] = [h for h in runtime.hosts() if h.class_name == "Shard" and h.instance is not None
              and h.instance.ctx.id.name == name]
    return host.instance.queue


@pytest.mark.parametrize("keep_done_ms", [600_000, 0])  # (0: a release deletes, or keeps a record off its grant)
def test_every_commit_crashed_anywhere_leaves_memory_as_it_was(runtime, monkeypatch, keep_done_ms):
    runtime.module.CONFIG["keep_done_ms"] = keep_done_ms
    replies, gate = [], asyncio.Event()
    real_request = SemaphoreClient.request

    async def request(client, key, message):  # the first reply is held back: the test applies it
        reply = await real_request(client, key, message)
        replies.append((key, reply))
        await gate.wait()
        return reply

    monkeypatch.setattr(SemaphoreClient, "request", request)

    async def scenario():
        shard = runtime.env.SHARD.getByName("s1")
        await shard.submit(jobs("a", 5, ms=120_000))
        while not replies:
            await asyncio.sleep(0.1)
        queue = live_queue(runtime, "s1")
        [(key, wire)] = replies
        reply = Reply.parse(wire, "grants")
        statements = {"reply": crashed_at_every_statement(
            queue, lambda: queue.requests.apply_grants_reply(key, reply, queue.claims.due_reports(key)))}
        statements["enqueue"] = crashed_at_every_statement(
            queue, lambda: queue._enqueued({"c0": (key, "g", "{}")}, []))
        admitted = queue.store.admitted()
        statements["release"] = crashed_at_every_statement(queue, lambda: queue._release(admitted[0]))
        statements["release keeping a record"] = crashed_at_every_statement(
            queue, lambda: queue._release(admitted[1], record='{"ran": true}'))
        gate.set()
        return statements, len(admitted)

    statements, admitted = runtime.run(scenario())
    assert admitted == 3  # the reply's grants, admitted by the commit that went through
    assert all(n >= 1 for n in statements.values()), statements  # each commit ran statements to crash at
