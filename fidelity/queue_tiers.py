"""One queue consumer's deliveries on real workerd and on the embedded runtime, compared.

Lives here: the messages of ``scenarios.queue_consumer`` sent to a
JavaScript consumer under miniflare (``workerd/queues.mjs``) and to the
Python consumer of ``tests/workers/queues.py`` on the embedded runtime, and
each tier's deliveries in one comparable shape: the body as JSON, the
attempt, the id's kind and length, the timestamp's kind. Must not know:
pytest, or what either tier is expected to deliver.
"""

from __future__ import annotations

import json
from typing import Any

from durability.testing import QueueConsumer, Runtime, load_worker_module

from .embedded import EmbeddedDriver
from .node_tools import run_json
from .pyodide_host import ROOT
from .scenarios import queue_consumer

QUEUES_RUNNER = ROOT / "fidelity" / "workerd" / "queues.mjs"
PYTHON_CONSUMER = ROOT / "tests" / "workers" / "queues.py"
TIMESTAMP_KINDS = {"Date": "date", "datetime": "date"}  # JavaScript's Date is the SDK's datetime


def _delivery(body: Any, attempts: int, id_kind: str, id_length: int, timestamp: str) -> tuple:
    return (json.dumps(body, sort_keys=True), attempts, id_kind, id_length, TIMESTAMP_KINDS.get(timestamp, timestamp))


def run_workerd(max_retries: int) -> dict[str, Any]:
    """The JavaScript consumer's deliveries, sorted, and whether its queue went quiet."""
    consumer = {"maxBatchSize": 1, "maxBatchTimeout": 0, "maxRetries": max_retries}
    report = run_json(QUEUES_RUNNER, {"messages": queue_consumer.MESSAGES, "consumer": consumer,
                                      "quiet_ms": 5_000, "timeout_ms": 60_000})
    seen = [_delivery(s["body"], s["attempts"], "str" if s["id"] == "string" else s["id"], s["idLength"],
                      s["timestamp"]) for s in report["seen"]]
    return {"seen": sorted(seen), "settled": report["settled"]}


def run_embedded(max_retries: int) -> dict[str, Any]:
    """The Python consumer's deliveries on the embedded runtime, sorted, and each count of its queue."""
    module = load_worker_module(PYTHON_CONSUMER)
    module.SEEN.clear()
    consumer = QueueConsumer(queue="jobs", max_batch_size=1, max_batch_timeout=0, max_retries=max_retries)
    with Runtime(module, {"SENDER": "Sender"}, queues={"JOBS": "jobs"}, consumers=[consumer]) as runtime:
        driver = EmbeddedDriver(runtime)

        async def send_and_settle() -> dict[str, dict[str, int]]:
            for body, options in queue_consumer.MESSAGES:
                await driver.call("send", body, options)
            return await driver.settle_queues()

        counts = runtime.run(send_and_settle())
    seen = [_delivery(body, attempts, type(message_id).__name__, len(message_id), timestamp)
            for _, message_id, body, attempts, timestamp in module.SEEN]
    return {"seen": sorted(seen), "counts": counts}
