"""A Worker module for scripts/bench_fairness.py: one semaphore holder whose limit is shared by a fair-share policy.

The holder reads its limit from ``env.LIMIT``, its rounds from
``env.ROUND_WAIT_MS`` and ``env.ROUND_PERIOD_MS`` and its policy from ``env.POLICY`` (JSON: empty
for oldest first, else ``{"weights": {tenant: w}, "floors": {tenant: n},
"priorities": {tenant: p}}``); a group's tenant is the part of its name
before ``/``. This class is what an application would write.
"""

import json

from workers import DurableObject

from durability import DurabilityScheduler
from durability.semaphore import DurabilitySemaphore


class FairBenchHolder(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx)
        self.policy = json.loads(env.POLICY or "null")
        fair_share = None if self.policy is None else {
            "key": lambda group: group.split("/")[0],
            "weight": lambda tenant: self.policy.get("weights", {}).get(tenant, 1),
            "floor": lambda tenant: self.policy.get("floors", {}).get(tenant, 0),
            "priority": lambda tenant: self.policy.get("priorities", {}).get(tenant, 0),
        }
        self.semaphore = DurabilitySemaphore(self.scheduler, limit=lambda: int(self.env.LIMIT),
                                             round_period_ms=float(env.ROUND_PERIOD_MS),
                                             round_wait_ms=float(env.ROUND_WAIT_MS), fair_share=fair_share)

    async def permits(self, message):
        return await self.semaphore.handle(message)

    async def usage(self):
        return self.semaphore.usage()

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)
