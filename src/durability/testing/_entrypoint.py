"""The Worker's ``Default`` entrypoint in the embedded runtime: its stateless invocations, each billed.

Lives here: ``Entrypoint``, which makes a fresh ``Default`` for each
invocation (an HTTP request to ``fetch``, a call over a service binding,
a Cron Trigger's ``scheduled``, a queue's batch to ``queue``), hands it
what workerd hands it, and counts each as a Workers request with the CPU
its code runs for (``WorkerStats``). Must not know: objects, queues'
brokers, or the clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from ._errors import python_error
from ._queue_values import WorkerStats, current_invocation, in_consumer
from ._storage import ExecutionContext
from ._values import JsDict, JsException, rpc_copy


class Entrypoint:
    def __init__(self, cls: type | None, module_name: str, env: Any,
                 spawn: Callable[[Awaitable[Any]], Any]) -> None:
        self.cls = cls
        self.module_name = module_name
        self.env = env
        self.spawn = spawn
        #: what the Worker's stateless invocations (fetch, RPC, crons, queue batches) are billed for
        self.stats = WorkerStats()

    def instance(self) -> Any:
        if self.cls is None:
            raise ValueError(f"{self.module_name} has no Default entrypoint class")
        return self.cls(ExecutionContext(self.spawn), self.env)

    def _handler(self, name: str) -> Any:
        handler = getattr(self.instance(), name, None)
        if handler is None:
            raise ValueError(f"{self.module_name}: Default has no {name}() handler")
        return handler

    @contextlib.contextmanager
    def invocation(self, kind: str) -> Iterator[None]:
        """A stateless invocation: a request billed, and the CPU its code runs for in this task."""
        token = current_invocation.set(self.stats.count(kind))
        try:
            yield
        finally:
            with contextlib.suppress(ValueError):  # (closed from another context: a loop closing on it)
                current_invocation.reset(token)

    async def scheduled(self, cron: str, when: float) -> None:
        handler = self._handler("scheduled")
        controller = JsDict(cron=cron, scheduledTime=when, type="scheduled")
        with self.invocation("scheduled"):
            await _called(handler, [controller, self.env, ExecutionContext(self.spawn)])

    async def queue(self, batch: Any) -> None:
        """``Default.queue(batch, env, ctx)`` on one batch, as workerd calls a
        class entrypoint's handler: with all three arguments, env and ctx
        None (they are on ``self``), so a handler must take them."""
        handler = self._handler("queue")
        token = in_consumer.set(True)
        try:
            with self.invocation("queue"):
                result = handler(batch, None, None)
                if inspect.isawaitable(result):
                    await result
        finally:
            with contextlib.suppress(ValueError):  # (closed from another context: a loop closing on it)
                in_consumer.reset(token)

    async def call(self, method: str, *args: Any) -> Any:
        instance = self.instance()
        if method.startswith("_") or not callable(getattr(type(instance), method, None)):
            raise JsException(f"Method {method} does not exist", name="TypeError")
        try:
            with self.invocation("rpc"):
                result = getattr(instance, method)(*[rpc_copy(a) for a in args])
                if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                    result = await result
            return rpc_copy(result)
        except JsException:
            raise
        except Exception as error:
            raise python_error(error) from None

    async def fetch(self, request: Any) -> Any:
        instance = self.instance()
        with self.invocation("fetch"):
            return await instance.fetch(request)


async def _called(handler: Any, args: list[Any]) -> None:
    """Call a handler with as many of ``args`` as it takes (at least one), as
    the Python runtime calls ``scheduled`` and ``queue``."""
    try:
        taken = len(inspect.signature(handler).parameters)
    except (TypeError, ValueError):
        taken = len(args)
    result = handler(*args[:max(1, taken)])
    if inspect.isawaitable(result):
        await result
