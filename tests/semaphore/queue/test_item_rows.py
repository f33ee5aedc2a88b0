"""A queue reads its items once per instance (queue/item_rows), and what it keeps of them stays true to the table."""

import asyncio

from durability.semaphore.queue.item_rows import COLUMNS, ItemRows
from support import holders_runtime, queue_jobs as jobs


def items_read_by_a_new_instance(queued: int) -> int:
    """Rows a shard holding ``queued`` items (3 of them admitted) reads when a
    new instance of it takes one more item and asks its holder for it."""
    with holders_runtime(seed=5) as runtime:
        async def scenario():
            shard = runtime.env.SHARD.getByName("s1")
            await shard.submit(jobs("a", queued, ms=3_600_000))
            await asyncio.sleep(5)  # asked, admitted up to the limit, the rest in line
            runtime.evict(shard)
            db = runtime.host_of(shard).db
            before = db.rows_read
            await shard.submit(jobs("b", 1, ms=3_600_000))
            await asyncio.sleep(5)  # the new instance's ask, its reply, and what the reply admits
            return db.rows_read - before

        return runtime.run(scenario())


def test_a_new_instance_reads_each_item_once_however_many_questions_it_asks_of_them():
    # Each item more costs one row read: the one scan. Answered from the
    # table, the questions (the key's demand, the admitted items, the counts
    # per grant, the keys with work, the next seq, the oldest done item)
    # each scanned it: about seven rows per item.
    extra = items_read_by_a_new_instance(60) - items_read_by_a_new_instance(20)
    assert 40 <= extra < 60, extra


def test_the_rows_kept_are_read_again_after_a_transaction_rolls_back():
    with holders_runtime(seed=5) as runtime:
        async def scenario():
            shard = runtime.env.SHARD.getByName("s1")
            await shard.submit(jobs("a", 5, ms=3_600_000))
            await asyncio.sleep(5)
            [host] = [h for h in runtime.hosts() if h.class_name == "Shard"]
            store = host.instance.queue.store

            def insert_then_fail():
                store.insert("ghost", "holder", "g", "{}", 0.0)
                raise RuntimeError("rolled back")

            try:
                store.sql.transaction(insert_then_fail)
            except RuntimeError:
                pass
            table = ItemRows(store.sql.exec(f"SELECT {COLUMNS} FROM durability_queue_items"))
            return store.rows.get("ghost"), store.rows.in_state("queued"), table.in_state("queued"), \
                store.rows.in_state("admitted"), table.in_state("admitted")

        ghost, queued, table_queued, admitted, table_admitted = runtime.run(scenario())
    assert ghost is None
    assert (queued, admitted) == (table_queued, table_admitted)
    assert len(queued) == 2 and len(admitted) == 3
