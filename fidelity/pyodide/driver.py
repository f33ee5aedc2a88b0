"""What a scenario drives the Worker through, inside Pyodide.

Lives here: ``PyodideDriver`` (entrypoint calls made as a service binding
makes them, HTTP requests to ``fetch``, ``env`` wrapped by the real SDK,
virtual time, the Worker module for instrumentation) and JSON output. Must not know: any scenario.
The embedded runtime's twin is ``fidelity.embedded.EmbeddedDriver``.
"""

import json

from workers import _EnvWrapper, python_from_rpc, python_to_rpc


class PyodideDriver:
    def __init__(self, host, module, now_ms):
        self._host = host
        self._now_ms = now_ms
        self.module = module
        self.env = _EnvWrapper(host.env)

    async def call(self, method, *args):
        reply = await self._host.callEntrypoint(method, python_to_rpc(list(args)))
        return python_from_rpc(reply)

    async def fetch(self, url, method="GET", headers=None, body=None):
        """An HTTP request to ``Default.fetch``: ``(status, body text)``."""
        from js import Object
        from pyodide.ffi import to_js

        init = {"url": url, "method": method, "headers": headers or {}, "body": body}
        reply = await self._host.fetchEntrypoint(to_js(init, dict_converter=Object.fromEntries))
        return int(reply.status), str(reply.body)

    def now_ms(self):
        return float(self._now_ms())

    async def settle_queues(self):
        """Deliver what every queue holds until nothing is left; per queue, its
        counts (sent, acked, retried, dropped)."""
        stats = (await self._host.settleQueues()).to_py()
        return {name: {k: int(counts[k]) for k in ("sent", "acked", "retried", "dropped")}
                for name, counts in stats.items()}

    def lose_alarm(self, class_name, name):
        """As if the runtime gave up on the object's alarm and evicted it."""
        self._host.loseAlarm(class_name, name)


async def run_scenario(scenario, driver, args_json):
    return await scenario(driver, **json.loads(args_json))


def to_json(value):
    return json.dumps(value, sort_keys=True)
