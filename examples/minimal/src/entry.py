"""A minimal Worker on the durability-workers package: tasks of many tenants,
at most ``TASKS_PER_TENANT`` of one tenant running at once, and direct calls,
at most ``CALLS_PER_TENANT`` of one tenant at once.

Lives here: one holder class (``TenantLimit``, one instance per tenant), one
shard class (``TaskShard``, which queues tasks and runs each once its
tenant admits it), the lock-style semaphore's holder class (``CallSlots``,
the places of direct calls) and the ``Default`` entrypoint other Workers
call over a service binding, whose ``scheduled`` handler (a Cron Trigger)
calls every shard's ``wake`` every 15 minutes: a shard whose alarm the
runtime gave up on resumes its tasks within that, even if nothing else
calls it. Must not know: the embedded runtime; this module runs
unmodified on Cloudflare and in its tests.
"""

import asyncio
import zlib

from workers import DurableObject, WorkerEntrypoint

from durability import Backoff, DurabilityJobs, DurabilityScheduler, locks
from durability.locks import WaitTimeout, WouldBlock, semaphore
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
        self.tasks = DurabilityJobs(
            self.scheduler,
            handlers={"run": lambda task: do_task(task)},  # looked up at each call
            on_lifecycle_event=self._on_task_event,
            retries=Backoff(initial_ms=1_000, max_attempts=3),
        )
        self.permits = DurabilitySemaphoreQueue(
            self.scheduler, server=limits.bind(env),
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

    async def wake(self):
        """The sweep's call: sets the alarm again if the runtime gave up on it (writes nothing if
        not); with keep_done_ms=0 an idle key would also ask its holder what it holds (docs/queue.md)."""
        await self.permits.resume()

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)


class CallSlots(locks.SemaphoreHolder):
    """The places of direct calls: one object per tenant holds that tenant's.
    (The module, not the class, is imported: workerd would export an imported
    ``SemaphoreHolder`` as one more Durable Object.)"""


async def do_call(call):
    """The work of one direct call: here it waits ``work_ms``; a real Worker
    calls the service the limit protects, while its caller waits."""
    await asyncio.sleep(call["work_ms"] / 1000)
    return {"worked_ms": call["work_ms"]}


def _call_slots(env):
    # A separate budget from the tasks' (docs/queue.md of the library shows one for both).
    # Opening checks the options and calls nothing; `wait` bounds how long `hold` stands in line.
    return semaphore(env.CALL_SLOTS, "calls", limit=int(env.CALLS_PER_TENANT), ttl=30, wait=10)


def _name(value, what):
    if not isinstance(value, str) or not 0 < len(value) <= 256:
        raise ValueError(f"{what} must be a string of 1 to 256 characters")
    return value


def _work_ms(value):
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_WORK_MS:
        raise ValueError(f"work_ms must be an integer from 0 to {MAX_WORK_MS}")
    return value


def _task(task):
    """A task as submitted, ``{id, tenant, work_ms?}``, or ValueError."""
    if not isinstance(task, dict) or set(task) - {"id", "tenant", "work_ms"}:
        raise ValueError("a task is an object with id, tenant and optionally work_ms")
    work_ms = _work_ms(task.get("work_ms", 0))
    return {"id": _name(task.get("id"), "id"), "tenant": _name(task.get("tenant"), "tenant"), "work_ms": work_ms}


def _shard(env, task_id):
    return env.TASK_SHARD.getByName(f"shard-{zlib.crc32(task_id.encode()) % int(env.SHARDS)}")


class Default(WorkerEntrypoint):
    """Other Workers call these over a service binding (RPC)."""

    async def scheduled(self, controller, env=None, ctx=None):
        """The sweep: every shard once, one request each."""
        for n in range(int(self.env.SHARDS)):
            try:
                await self.env.TASK_SHARD.getByName(f"shard-{n}").wake()
            except Exception:
                pass  # the next sweep calls it again

    async def submit(self, task):
        task = _task(task)  # a bad task gets a clear error before any call is made
        return await _shard(self.env, task["id"]).submit(task)

    async def status(self, task_id):
        return await _shard(self.env, _name(task_id, "id")).status(task_id)

    async def usage(self, tenant):
        return await self.env.TENANT_LIMIT.getByName(_name(tenant, "tenant")).usage()

    async def call(self, tenant, work_ms):
        """Run a direct call in one of the tenant's places, waiting up to 10 s
        in line for one; ``{"status": "busy"}`` when none came free."""
        call = {"tenant": _name(tenant, "tenant"), "work_ms": _work_ms(work_ms)}
        try:
            async with _call_slots(self.env).hold(tenant):  # PlaceLost at the end if the lease ended
                return {"status": "done", **await do_call(call)}
        except WaitTimeout:
            return {"status": "busy"}

    async def call_now(self, tenant, work_ms):
        """Run a direct call only if a place is free now and nobody waits for one."""
        call = {"tenant": _name(tenant, "tenant"), "work_ms": _work_ms(work_ms)}
        try:
            async with _call_slots(self.env).try_hold(tenant):
                return {"status": "done", **await do_call(call)}
        except WouldBlock:
            return {"status": "busy"}

    async def call_usage(self, tenant):
        usage = await _call_slots(self.env).usage(_name(tenant, "tenant"))
        return {"held": usage.held, "waiting": usage.waiting}  # RPC carries no tuple
