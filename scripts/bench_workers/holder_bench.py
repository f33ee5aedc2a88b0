"""A Worker module for scripts/bench_holder.py: one semaphore holder class.

The holder reads its limit from ``env.LIMIT`` and its group ceilings from
``env.GROUP_LIMITS`` (a dict of group -> ceiling; groups not in it have none).
The benchmark times the holder's rounds from outside, so this class is
exactly what an application would write.
"""

from workers import DurableObject

from durability import DurabilityScheduler
from durability.semaphore import DurabilitySemaphore


class HolderBench(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx)
        group_limits = dict(getattr(env, "GROUP_LIMITS", None) or {})
        self.semaphore = DurabilitySemaphore(
            self.scheduler,
            limit=lambda: int(self.env.LIMIT),
            group_limit=group_limits.get,
        )

    async def permits(self, message):
        return await self.semaphore.handle(message)

    async def usage(self):
        return self.semaphore.usage()

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)
