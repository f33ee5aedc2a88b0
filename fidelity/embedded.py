"""What a scenario drives the Worker through, on the embedded runtime.

Lives here: ``EmbeddedDriver``, the CPython twin of the Pyodide host's
driver (entrypoint calls, HTTP requests, ``env``, virtual time, the Worker module,
queues settled).
Must not know: any scenario.
"""

from __future__ import annotations

import asyncio
from typing import Any

from durability.testing import Runtime


class EmbeddedDriver:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.module = runtime.module
        self.env = runtime.env

    async def call(self, method: str, *args: Any) -> Any:
        return await self.runtime.call_entrypoint(method, *args)

    async def fetch(self, url: str, method: str = "GET", headers: dict | None = None,
                    body: str | None = None) -> tuple[int, str]:
        response = await self.runtime.fetch(url, method=method, headers=headers or {}, body=body)
        return int(response.status), await response.text()

    def now_ms(self) -> float:
        return self.runtime.now_ms()

    async def settle_queues(self) -> dict[str, dict[str, int]]:
        """Wait until every queue has handled what it holds; per queue, its
        counts (sent, acked, retried, dropped)."""
        brokers = self.runtime.queues.brokers
        for _ in range(3_600):
            if all(broker.waiting() == 0 and broker.handling() == 0 for broker in brokers.values()):
                break
            await asyncio.sleep(1)
        return {name: {k: getattr(broker.stats, k) for k in ("sent", "acked", "retried", "dropped")}
                for name, broker in brokers.items()}

    def lose_alarm(self, class_name: str, name: str) -> None:
        """As if the runtime gave up on the object's alarm and evicted it."""
        namespace = next(n for n in self.runtime.namespaces.values() if n.class_name == class_name)
        host = self.runtime.host_of(namespace.getByName(name))
        host.alarm_at = None
        host._arm_alarm_timer()
        host.evict()
