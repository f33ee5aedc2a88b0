"""A Worker module for scripts/bench_tree.py: one semaphore holder class, a root or a child.

The holder reads its limit from ``env.LIMIT`` (and its round period from
``env.ROUND_PERIOD_MS``, 2 s unless set); with ``env.TREE`` set it is
part of a budget tree (``parent=``): the object named for the key is the
root, and the objects the clients reach through ``fan_out`` are children.
This class is exactly what an application would write. ``BenchClient`` is
a client object a holder can call back (``semaphore_reply``), as a queue's
shard is; the benchmark's driver plays what it does.
"""

from workers import DurableObject

from durability import DurabilityScheduler
from durability.semaphore import DurabilitySemaphore


class TreeBenchHolder(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx)
        parent = DurabilitySemaphore.client(binding="HOLDER").bind(env) if env.TREE else None
        # Clients that can be called (``BenchClient``) are parked: answered at once, called back.
        self.semaphore = DurabilitySemaphore(self.scheduler, limit=lambda: int(self.env.LIMIT), parent=parent,
                                             clients=getattr(env, "CLIENTS", None),
                                             round_period_ms=int(getattr(env, "ROUND_PERIOD_MS", 2_000)))

    async def permits(self, message):
        return await self.semaphore.handle(message)

    async def usage(self):
        return self.semaphore.usage()

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)


#: the benchmark's driver, which plays every client (set by scripts/bench_tree.py)
DRIVER = None


class BenchClient(DurableObject):
    """A client a holder can call back: what a queue's shard does, played by the driver."""

    async def semaphore_reply(self, key, reply):
        return DRIVER.called(self.ctx.id.name, key, reply)
