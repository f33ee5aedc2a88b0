"""Cloudflare Queues in the embedded runtime: producers, batches, acks, retries, dead letters, faults."""

import asyncio
from pathlib import Path

import pytest

from durability.testing import Faults, JsDict, JsException, QueueConsumer, Runtime, load_worker_module

QUEUES = Path(__file__).resolve().parents[1] / "workers" / "queues.py"


def queue_runtime(*consumers, **options):
    module = load_worker_module(QUEUES)
    module.DELIVERIES.clear()
    consumers = consumers or (QueueConsumer("jobs"),)
    return Runtime(module, {"SENDER": "Sender"}, queues={"JOBS": "jobs"}, consumers=consumers, **options)


def delivered(runtime, queue="jobs"):
    """(body's n, attempts, seconds since the start) for each delivery of ``queue``."""
    start = runtime.loop.epoch_ms
    return [(body.get("n"), attempts, round((at - start) / 1000, 3))
            for name, _, body, attempts, at in runtime.module.DELIVERIES if name == queue]


def send_all(runtime, bodies, then_s=60):
    async def scenario():
        for body in bodies:
            await runtime.call_entrypoint("send", body)
        await asyncio.sleep(then_s)

    runtime.run(scenario())


def test_batches_form_when_full_or_when_the_oldest_message_has_waited_the_batch_timeout():
    runtime = queue_runtime(QueueConsumer("jobs", max_batch_size=3, max_batch_timeout=5))
    send_all(runtime, [{"n": n} for n in range(7)])
    assert delivered(runtime) == [(0, 1, 0.0), (1, 1, 0.0), (2, 1, 0.0), (3, 1, 0.0), (4, 1, 0.0), (5, 1, 0.0),
                                  (6, 1, 5.0)]
    stats = runtime.queues["jobs"].stats
    assert (stats.batches, stats.sent, stats.acked, stats.deliveries) == (3, 7, 7, 7)
    assert stats.operations == 3 * 7  # a write, a read and a delete each
    assert runtime.totals()["queue_operations"] == 21
    assert runtime.worker_stats.by_kind == {"rpc": 7, "queue": 3}  # one request per batch handled


def test_a_message_sent_with_a_delay_is_not_delivered_before_it():
    runtime = queue_runtime(QueueConsumer("jobs", max_batch_size=1))

    async def scenario():
        await runtime.call_entrypoint("send", {"n": 1}, {"delaySeconds": 30})
        await runtime.env.SENDER.getByName("s").send({"n": 2})  # an object sends as well
        await asyncio.sleep(60)

    runtime.run(scenario())
    assert delivered(runtime) == [(2, 1, 0.0), (1, 1, 30.0)]


def test_a_late_delivery_fault_holds_a_message_back_that_much_and_nothing_else():
    runtime = queue_runtime(QueueConsumer("jobs", max_batch_size=1),
                            faults=Faults(late_delivery=1.0, late_delivery_ms=(40_000, 40_000)))
    send_all(runtime, [{"n": 1}], then_s=30)
    assert delivered(runtime) == []  # not yet
    runtime = queue_runtime(QueueConsumer("jobs", max_batch_size=1),
                            faults=Faults(late_delivery=1.0, late_delivery_ms=(40_000, 40_000)))
    send_all(runtime, [{"n": 1}], then_s=60)
    assert delivered(runtime) == [(1, 1, 40.0)] and runtime.queues["jobs"].stats.late == 1
    with pytest.raises(ValueError, match="late_delivery_ms"):
        Faults(late_delivery_ms=(2.0, 1.0))


def test_a_retried_message_comes_again_after_its_delay_with_one_more_attempt_and_the_first_word_counts():
    runtime = queue_runtime(QueueConsumer("jobs", max_batch_size=1, retry_delay=7))
    send_all(runtime, [{"n": 1, "do": "retry", "delay": 2}, {"n": 2, "do": "retry_then_ack"}], then_s=3)
    assert delivered(runtime)[:4] == [(1, 1, 0.0), (2, 1, 0.0), (2, 2, 1.0), (1, 2, 2.0)]
    runtime = queue_runtime(QueueConsumer("jobs", max_batch_size=1, retry_delay=7))
    send_all(runtime, [{"n": 1, "do": "raise"}], then_s=10)
    assert delivered(runtime)[:2] == [(1, 1, 0.0), (1, 2, 7.0)]  # no word of its own: the consumer's retry_delay


def test_a_handler_that_raises_retries_what_it_did_not_ack_and_one_that_returns_acks_the_rest():
    runtime = queue_runtime(QueueConsumer("jobs", max_batch_size=3, max_retries=0))
    send_all(runtime, [{"n": 1, "do": "ack"}, {"n": 2}, {"n": 3, "do": "raise"}])
    stats = runtime.queues["jobs"].stats
    assert [n for n, _, _ in delivered(runtime)] == [1, 2, 3]
    assert (stats.acked, stats.retried, stats.dropped) == (1, 2, 2)  # past max_retries 0, with no dead letters

    runtime = queue_runtime(QueueConsumer("jobs", max_batch_size=2))
    send_all(runtime, [{"n": 1}, {"n": 2}])
    assert runtime.queues["jobs"].stats.acked == 2


def test_past_max_retries_a_message_goes_to_the_dead_letter_queue_and_its_consumer():
    runtime = queue_runtime(QueueConsumer("jobs", max_batch_size=1, max_retries=2, dead_letter_queue="dead"),
                            QueueConsumer("dead", max_batch_size=1))
    send_all(runtime, [{"n": 1, "do": "retry"}])
    assert delivered(runtime) == [(1, 1, 0.0), (1, 2, 0.0), (1, 3, 0.0)]  # the first delivery and two retries
    # The dead-letter queue's consumer retries it too (same body), until its own max_retries (3) drop it;
    # there it keeps its id and counts its attempts anew.
    assert delivered(runtime, "dead") == [(1, 1, 0.0), (1, 2, 0.0), (1, 3, 0.0), (1, 4, 0.0)]
    assert len({message_id for _, message_id, _, _, _ in runtime.module.DELIVERIES}) == 1
    assert runtime.queues["jobs"].stats.dead_lettered == 1 and runtime.queues["dead"].stats.dropped == 1


def test_a_word_about_a_message_outranks_one_about_its_batch_whichever_came_first():
    runtime = queue_runtime(QueueConsumer("jobs", max_batch_size=3, max_retries=1))
    # Batch 1: n 1 retried by its own word although ackAll() followed; n 2 and n 3 acked by ackAll().
    # Batch 2: n 5 acked by its own word; n 4 and n 6 retried by retryAll(), after its 3 s, although
    # the handler raised. n 1, ready again at once, waits for a full batch: theirs, at 3 s.
    send_all(runtime, [{"n": 1, "do": "retry"}, {"n": 2}, {"n": 3, "do": "ack_all"},
                       {"n": 4, "do": "retry_all"}, {"n": 5, "do": "ack"}, {"n": 6, "do": "raise"}], then_s=10)
    assert sorted(delivered(runtime)) == [(1, 1, 0.0), (1, 2, 3.0), (2, 1, 0.0), (3, 1, 0.0), (4, 1, 0.0),
                                          (4, 2, 3.0), (5, 1, 0.0), (6, 1, 0.0), (6, 2, 3.0)]
    assert runtime.queues["jobs"].stats.acked == 3


def test_a_handler_that_does_not_take_env_and_ctx_fails_as_it_does_in_production():
    runtime = queue_runtime(QueueConsumer("jobs", max_batch_size=1, max_retries=0))

    class Default(runtime.module.Default):
        async def queue(self, batch):  # workerd calls it with (batch, env, ctx)
            batch.ackAll()

    runtime.entrypoint.cls = Default
    send_all(runtime, [{"n": 1}])
    stats = runtime.queues["jobs"].stats
    assert (stats.acked, stats.dropped) == (0, 1)
    assert any(event == "queue consumer failed" and "TypeError" in detail for _, _, event, detail in runtime.trace)


def test_max_concurrency_bounds_the_batches_handled_at_once():
    runtime = queue_runtime(QueueConsumer("jobs", max_batch_size=1, max_concurrency=2))
    send_all(runtime, [{"n": n, "do": "work", "ms": 1_000} for n in range(5)])
    assert [at for _, _, at in delivered(runtime)] == [0.0, 0.0, 1.0, 1.0, 2.0]


def test_bodies_are_copied_at_the_send_and_arrive_as_the_sdk_gives_them():
    runtime = queue_runtime(QueueConsumer("jobs", max_batch_size=1))
    body = {"n": 1, "nested": {"x": 2.0}}

    async def scenario():
        await runtime.env.JOBS.send(body)
        body["n"] = 99  # too late: the message is what was sent
        await asyncio.sleep(1)

    runtime.run(scenario())
    (_, message_id, got, attempts, _), = runtime.module.DELIVERIES
    assert got == {"n": 1, "nested": {"x": 2}} and isinstance(got, JsDict) and type(got["nested"]["x"]) is int
    assert message_id and attempts == 1


def test_sends_that_break_a_limit_fail_for_their_sender_and_queue_nothing():
    runtime = queue_runtime()
    producer = runtime.env.JOBS

    async def refused(call):
        with pytest.raises(JsException) as error:
            await call
        return str(error.value)

    async def scenario():
        return [
            await refused(producer.send("x" * (128 * 1024 + 1))),
            await refused(producer.send({"n": 1}, {"delaySeconds": 43_201})),
            await refused(producer.send({"n": 1}, contentType="yaml")),
            await refused(producer.sendBatch([{"body": n} for n in range(101)])),
            await refused(producer.sendBatch([{"body": "x" * 100_000}] * 3)),
            await refused(producer.sendBatch([{"body": 1}, {"nobody": 2}])),
            await refused(producer.send(object())),
        ]

    errors = runtime.run(scenario())
    assert "exceeds limit" in errors[0] and "delaySeconds" in errors[1] and "content type" in errors[2]
    assert "101 messages" in errors[3] and "bytes exceeds" in errors[4] and "messages[1]" in errors[5]
    assert "serialize" in errors[6]
    assert runtime.queues["jobs"].stats.sent == 0 and runtime.queues["jobs"].waiting() == 0


def test_a_message_an_object_sends_waits_for_its_writes_and_goes_nowhere_if_they_are_lost():
    runtime = queue_runtime(QueueConsumer("jobs", max_batch_size=1),
                            faults=Faults(crash_before_commit=1.0, targets={"Sender"}))

    async def scenario():
        with pytest.raises(JsException):
            await runtime.env.SENDER.getByName("s").record_and_send({"n": 1})
        await asyncio.sleep(5)

    runtime.run(scenario())
    assert runtime.queues["jobs"].stats.sent == 0 and delivered(runtime) == []


def test_under_faults_delivery_is_at_least_once_and_a_seed_replays_the_same_run():
    def run_with(seed):
        runtime = queue_runtime(QueueConsumer("jobs", max_batch_size=4),
                                faults=Faults(consumer_crash=0.3, lost_ack=0.2, evict_window_ms=500), seed=seed)
        send_all(runtime, [{"n": n, "do": "work", "ms": 100} for n in range(40)], then_s=600)
        return runtime, delivered(runtime)

    runtime, deliveries = run_with(5)
    stats = runtime.queues["jobs"].stats
    assert {n for n, _, _ in deliveries} == set(range(40))  # every message handled
    assert stats.crashed_invocations > 0 and stats.acks_lost > 0
    assert len(deliveries) > 40 and max(attempts for _, attempts, _ in deliveries) > 1
    assert stats.deliveries >= len(deliveries)  # (a handler that died did not reach all of its batch)
    assert stats.acked >= 40 and stats.dropped == 0
    assert run_with(5)[1] == deliveries
    assert run_with(6)[1] != deliveries


def test_consumer_invocations_are_billed_as_worker_requests_with_their_cpu():
    runtime = queue_runtime(QueueConsumer("jobs", max_batch_size=10))
    send_all(runtime, [{"n": n} for n in range(25)])
    totals = runtime.totals()
    assert runtime.worker_stats.by_kind["queue"] == 3
    assert totals["worker_requests"] == 25 + 3 and totals["worker_cpu_ms"] > 0


def test_from_wrangler_reads_the_queues_producers_and_consumers(tmp_path):
    (tmp_path / "worker.py").write_text(QUEUES.read_text())
    (tmp_path / "wrangler.toml").write_text(
        'main = "worker.py"\n'
        '[[queues.producers]]\nbinding = "JOBS"\nqueue = "jobs"\n'
        '[[queues.consumers]]\nqueue = "jobs"\nmax_batch_size = 2\nmax_batch_timeout = 1\nmax_retries = 1\n'
        'dead_letter_queue = "dead"\n')
    runtime = Runtime.from_wrangler(tmp_path / "wrangler.toml")
    consumer = runtime.queues["jobs"].consumer
    assert (consumer.max_batch_size, consumer.max_batch_timeout, consumer.max_retries) == (2, 1, 1)
    assert runtime.queues["jobs"].dead_letters is runtime.queues["dead"]
    send_all(runtime, [{"n": 1}])
    assert runtime.queues["jobs"].stats.acked == 1
    (tmp_path / "wrangler.toml").write_text('main = "worker.py"\n[[queues.consumers]]\nqueue = "jobs"\nbatch = 2\n')
    with pytest.raises(ValueError, match="unknown keys"):
        Runtime.from_wrangler(tmp_path / "wrangler.toml")
    with pytest.raises(ValueError, match="max_batch_size"):
        QueueConsumer("jobs", max_batch_size=101)
