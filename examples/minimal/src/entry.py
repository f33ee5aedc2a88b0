"""A minimal Worker on the durability-workers package: tasks of many tenants,
at most ``TASKS_PER_TENANT`` of one tenant running at once.

Lives here: one holder class (``TenantLimit``, one instance per tenant), one
shard class (``TaskShard``, which queues tasks and runs each once its
tenant admits it) and the ``Default`` entrypoint other Workers call over a
service binding. Must not know: the embedded runtime; this module runs
unmodified on Cloudflare and in its tests.
"""

import asyncio
import zlib

from workers import DurableObject, WorkerEntrypoint

from durability import Backoff, Durability, DurabilityScheduler
from durability.semaphore import DurabilitySemaphore, DurabilitySemaphoreQueue
from durability.transforms import timeout

MAX_WORK_MS = 60_000


class TenantLimit(DurableObject):
    """The concurrency budget of one tenant, shared by every shard."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx)
        # Read every round: a new value of the var takes effect without a restart.
        self.semaphore = DurabilitySemaphore(self.scheduler, limit=lambda: int(self.env.TASKS_PER_TENANT))

    async def permits(self, message):
        return await self.semaphore.handle(message)

    async def usage(self):
        return self.semaphore.usage()

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)


# The timeout leaves room for the queue's long poll (50 s by default) and a round.
limits = DurabilitySemaphore.client(binding="TENANT_LIMIT").with_(timeout, 60_000)


async def do_task(task):
    """The work of one task: here it waits ``work_ms``; a real Worker calls
    the service that does the work (a model, a webhook, an export)."""
    await asyncio.sleep(task["work_ms"] / 1000)
    return {"worked_ms": task["work_ms"]}


class TaskShard(DurableObject):
    """Queues tasks of many tenants; runs each, with retries, once admitted."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx)
        self.tasks = Durability(
            self.scheduler,
            handlers={"run": lambda task: do_task(task)},  # looked up at each call
            on_lifecycle_event=self._on_task_event,
            retries=Backoff(initial_ms=1_000, max_attempts=3),
        )
        self.permits = DurabilitySemaphoreQueue(
            self.scheduler, client_id=ctx.id.toString(), server=limits.bind(env),
            admit=self._admit, finished=self._finished,
        )

    async def submit(self, task):
        """Queue ``task``; a repeated id is a no-op that answers the task's state."""
        [item] = await self.permits.enqueue([{"id": task["id"], "key": task["tenant"], "body": task}])
        return {"id": item.id, "state": item.state}

    async def status(self, task_id):
        queued = self.permits.status(task_id)
        return {"queued": queued, "result": await self.tasks.run.get_result(task_id)}

    async def _admit(self, items):
        for item in items:  # a task id the runner knows is not run again
            await self.tasks.run(id=item.id, payload=item.body)

    async def _on_task_event(self, event):
        if event.type == "terminal":  # the fast path; _finished() is the safety net
            await self.permits.release(event.id)

    async def _finished(self, ids):
        results = [await self.tasks.run.get_result(task_id) for task_id in ids]
        return [task_id for task_id, result in zip(ids, results) if result["status"] != "pending"]

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)


def _name(value, what):
    if not isinstance(value, str) or not 0 < len(value) <= 256:
        raise ValueError(f"{what} must be a string of 1 to 256 characters")
    return value


def _task(task):
    """A task as submitted, ``{id, tenant, work_ms?}``, or ValueError."""
    if not isinstance(task, dict) or set(task) - {"id", "tenant", "work_ms"}:
        raise ValueError("a task is an object with id, tenant and optionally work_ms")
    work_ms = task.get("work_ms", 0)
    if not isinstance(work_ms, int) or isinstance(work_ms, bool) or not 0 <= work_ms <= MAX_WORK_MS:
        raise ValueError(f"work_ms must be an integer from 0 to {MAX_WORK_MS}")
    return {"id": _name(task.get("id"), "id"), "tenant": _name(task.get("tenant"), "tenant"), "work_ms": work_ms}


def _shard(env, task_id):
    return env.TASK_SHARD.getByName(f"shard-{zlib.crc32(task_id.encode()) % int(env.SHARDS)}")


class Default(WorkerEntrypoint):
    """Other Workers call these over a service binding (RPC)."""

    async def submit(self, task):
        task = _task(task)  # a bad task gets a clear error before any call is made
        return await _shard(self.env, task["id"]).submit(task)

    async def status(self, task_id):
        return await _shard(self.env, _name(task_id, "id")).status(task_id)

    async def usage(self, tenant):
        return await self.env.TENANT_LIMIT.getByName(_name(tenant, "tenant")).usage()
