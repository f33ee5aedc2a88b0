"""A Worker module for the budget tree's tests: holders of one class, root and children, and
queue shards that reach their leaf through ``fan_out``; ``WORLD`` is the ground truth of what runs.

``CONFIG`` is read when an object starts (the limit on every round).
"""

import time

from workers import DurableObject

from durability import DurabilityScheduler
from durability.semaphore import DurabilitySemaphore, DurabilitySemaphoreQueue

CONFIG = {"limit": 4, "fan_out": 4, "depth": 1, "round_wait_ms": 200, "round_period_ms": 1_000, "cut": set(),
          "group_limit": None, "fair_share": None, "woken": False}
WORLD = {"running": set(), "max_running": 0, "violations": [], "admitted": {}, "done": set(), "starts": []}


def reset(**config):
    CONFIG.update({"limit": 4, "fan_out": 4, "depth": 1, "round_wait_ms": 200, "round_period_ms": 1_000,
                   "cut": set(), "group_limit": None, "fair_share": None, "woken": False}, **config)
    WORLD.update(running=set(), max_running=0, violations=[], admitted={}, done=set(), starts=[])


class TreeHolder(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx)
        self.semaphore = DurabilitySemaphore(
            self.scheduler, limit=lambda: CONFIG["limit"], group_limit=self._group_limit,
            round_wait_ms=CONFIG["round_wait_ms"], round_period_ms=CONFIG["round_period_ms"],
            parent=DurabilitySemaphore.client(binding="HOLDER").with_(self._unless_cut).bind(env),
            fair_share=CONFIG["fair_share"],
            # With "woken", the leaves call their shards back (the shards' queues are woken=True).
            clients=env.SHARD if CONFIG["woken"] else None,
        )

    @staticmethod
    def _group_limit(group):
        """``CONFIG["group_limit"]``: None (no ceiling of its own) or a callable of the group."""
        return None if CONFIG["group_limit"] is None else CONFIG["group_limit"](group)

    async def _unless_cut(self, call):
        """A holder named in ``CONFIG["cut"]`` cannot reach its parent or its children."""
        if self.ctx.id.name in CONFIG["cut"]:
            raise ConnectionError(f"{self.ctx.id.name} is cut off")
        return await call()

    async def permits(self, message):
        return await self.semaphore.handle(message)

    async def usage(self):
        return self.semaphore.usage()

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)


class Shard(DurableObject):
    """Queues items; runs each for the ms its body names, then releases it."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx, max_concurrency=64)
        self.scheduler.register("work", self._work_ends)
        server = DurabilitySemaphore.client(binding="HOLDER", fan_out=CONFIG["fan_out"], depth=CONFIG["depth"])
        self.queue = DurabilitySemaphoreQueue(self.scheduler, client_id=ctx.id.name, admit=self._admit,
                                              server=server.bind(env), woken=CONFIG["woken"])

    async def semaphore_reply(self, key, reply):
        return await self.queue.hear(key, reply)

    async def submit(self, items):
        await self.queue.enqueue(items)

    async def _admit(self, items):
        now = time.time() * 1000
        for item in items:
            if item.id not in WORLD["running"] and item.id not in WORLD["done"]:
                WORLD["running"].add(item.id)
                WORLD["admitted"].setdefault(item.id, now)
                WORLD["max_running"] = max(WORLD["max_running"], len(WORLD["running"]))
                WORLD["starts"].append((now, len(WORLD["running"])))
                if len(WORLD["running"]) > CONFIG["limit"]:
                    WORLD["violations"].append((now, len(WORLD["running"])))
            self.scheduler.schedule("work", item.id, now + item.body["ms"])
        await self.scheduler.sync()

    async def _work_ends(self, timer):
        if timer.key in WORLD["running"]:
            WORLD["running"].discard(timer.key)
            WORLD["done"].add(timer.key)
        await self.queue.release(timer.key)

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)
