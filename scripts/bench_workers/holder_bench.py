"""A Worker module for scripts/bench_holder.py: one semaphore holder class.

The holder reads its limit from ``env.LIMIT`` and its group ceilings from
``env.GROUP_LIMITS`` (a dict of group -> ceiling; groups not in it have none).
With ``env.FAIR_SHARE`` set, the limit is shared between four tenants (a
group's tenant: its number modulo 4) with weights, a floor and two
priority classes, so that the round runs the fair-share path.
The benchmark times the holder's rounds from outside, so this class is
exactly what an application would write.
"""

from workers import DurableObject

from durability import DurabilityScheduler
from durability.semaphore import DurabilitySemaphore

WEIGHTS, FLOORS, PRIORITIES = {"t0": 3, "t3": 2}, {"t1": 20}, {"t2": 1}
FAIR_SHARE = {"key": lambda group: f"t{int(group[2:]) % 4}", "weight": lambda tenant: WEIGHTS.get(tenant, 1),
              "floor": lambda tenant: FLOORS.get(tenant, 0), "priority": lambda tenant: PRIORITIES.get(tenant, 0)}


class HolderBench(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx)
        group_limits = dict(getattr(env, "GROUP_LIMITS", None) or {})
        self.semaphore = DurabilitySemaphore(
            self.scheduler,
            limit=lambda: int(self.env.LIMIT),
            group_limit=group_limits.get,
            fair_share=FAIR_SHARE if getattr(env, "FAIR_SHARE", None) else None,
        )

    async def permits(self, message):
        return await self.semaphore.handle(message)

    async def usage(self):
        return self.semaphore.usage()

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)
