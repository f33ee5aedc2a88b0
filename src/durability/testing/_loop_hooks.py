"""What the runtime's event loop asks about objects: whose is a step, a timer, a task.

Lives here: the hooks the runtime sets on its loop: the meter a step run in
an object's context (or a stateless invocation's) charges its CPU to, the object a timer keeps awake,
and the task factory that gives every task an object's code starts to that
object's instance, so that eviction stops it. Must not know: the clock or
the runtime; each hook finds the object in the context (``current_host``,
``current_generation``).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from typing import Any

from ._host import ObjectHost, current_generation, current_host
from ._queue_values import current_invocation


def _cpu_meter(context: contextvars.Context) -> Callable[[float], None] | None:
    """Each step run in an object's context is charged to that object, and
    one run in a stateless invocation of the Worker to the Worker."""
    host = context.get(current_host)
    if host is not None:
        return host.charge_cpu
    return context.get(current_invocation)


def _timer_owner(context: contextvars.Context | None) -> ObjectHost | None:
    """A timer set by an object's live instance keeps that object awake."""
    host = current_host.get() if context is None else context.get(current_host)
    generation = current_generation.get() if context is None else context.get(current_generation, -1)
    return host if host is not None and generation == host.generation else None


def _task_factory(loop: asyncio.AbstractEventLoop, coroutine: Any,
                  context: contextvars.Context | None = None) -> asyncio.Task[Any]:
    """Every task an object's code starts belongs to that object's instance,
    so that eviction stops it, as it stops everything in production."""
    task = asyncio.Task(coroutine, loop=loop, context=context)
    source = context if context is not None else contextvars.copy_context()
    host = source.get(current_host)
    if host is not None:
        # Context.get ignores the variable's own default; that default, -1, is no instance's.
        host.adopt(task, source.get(current_generation, -1))
    return task
