"""An embedded Durable Objects runtime for CPython: run a Worker module in tests.

Lives here: the public face of the test double (``Runtime``, ``Faults`` and
the JavaScript-shaped values user code meets). Importing this package puts
a CPython stand-in for the ``workers`` SDK module in ``sys.modules``, so a
Worker module that does ``from workers import DurableObject`` imports.

    from durability.testing import Runtime

    with Runtime.from_wrangler("wrangler.toml", seed=1) as runtime:
        async def scenario():
            stub = runtime.env.COUNTER.getByName("a")
            return await stub.add(1)
        assert runtime.run(scenario()) == 1

``python -m durability.testing serve`` serves a Worker over HTTP on real
time, offline (``serve``, ``LocalServer``).

Must not be imported by a deployed Worker: production is Cloudflare's runtime.
"""

from ._clock import DEFAULT_EPOCH_MS, Deadlock, RealClockLoop, VirtualClockLoop
from ._dev_vars import parse_dev_vars
from ._faults import Faults, Outage
from ._host import ALARM_MAX_RETRIES, HIBERNATE_AFTER_MS, ObjectHost, ObjectStats, current_object
from ._queue_values import MessageBatch, QueueConsumer, WorkerStats
from ._queues import QueueBroker, QueueStats
from ._runtime import DurableObjectNamespace, DurableObjectStub, Runtime, load_worker_module
from ._serve import LocalServer, local_runtime, serve
from ._storage import DurableObjectId
from ._values import JsDict, JsException
from ._workers_standin import install_workers_standin

install_workers_standin()

__all__ = [
    "ALARM_MAX_RETRIES",
    "current_object",
    "DEFAULT_EPOCH_MS",
    "HIBERNATE_AFTER_MS",
    "Deadlock",
    "DurableObjectId",
    "DurableObjectNamespace",
    "DurableObjectStub",
    "Faults",
    "JsDict",
    "JsException",
    "LocalServer",
    "MessageBatch",
    "ObjectHost",
    "ObjectStats",
    "Outage",
    "QueueBroker",
    "QueueConsumer",
    "QueueStats",
    "RealClockLoop",
    "Runtime",
    "VirtualClockLoop",
    "WorkerStats",
    "install_workers_standin",
    "load_worker_module",
    "local_runtime",
    "parse_dev_vars",
    "serve",
]
