"""A Worker module for the lock semaphore's tests: a holder class and an uploader that holds places.

``WORLD`` is the ground truth outside the objects: every hold with the
moment its code began and the moment it stopped being surely its holder's
(release, loss of the lease, or its code stopping), the limit of the open
that admitted it, and the moment the holder object admitted it.
"""

import asyncio
import time

from workers import DurableObject

from durability.locks import PlaceLost, SemaphoreHolder, WaitTimeout, WouldBlock, semaphore

WORLD = {"holds": [], "admitted_at": {}, "admission_seq": {}}


def now_ms():
    return time.time() * 1000


def stall(ms):
    """Let ``ms`` pass without running anything, as a blocked event loop would.

    Every object of the embedded runtime shares one loop, so they all stall
    together: other holders lose their places too, and the holder objects'
    timers run late (which only keeps places longer).
    """
    asyncio.get_running_loop()._virtual_now += ms / 1000


class Slots(SemaphoreHolder):
    """The holder objects of every semaphore in these tests (one per name and key)."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        store = self.semaphore_places.store
        insert = store.insert

        def insert_and_record(place, over=None):  # when the holder admitted it, by its own clock
            WORLD["admitted_at"][place.token] = place.granted_at
            # Two admissions at one instant (sub-2 ms waits do not move the
            # clock, as in Pyodide) are told apart by their order.
            WORLD["admission_seq"].setdefault(place.token, len(WORLD["admission_seq"]))
            insert(place, over)

        store.insert = insert_and_record


class Uploader(DurableObject):
    """Runs uploads, each inside a place of its key."""

    async def upload(self, job):
        uploads = semaphore(self.env.SLOTS, job.get("name", "uploads"), limit=job.get("limit", 3),
                            ttl=job.get("ttl", 30), wait=job.get("wait"), max_hold=job.get("max_hold"),
                            rate=job.get("rate"))
        held = uploads.try_hold(job["key"]) if job.get("try") else uploads.hold(job["key"])
        record = {"id": job["id"], "key": job["key"], "limit": uploads.options.limit, "asked": now_ms()}
        try:
            async with held as permit:
                record["start"] = now_ms()
                record["token"] = permit._token  # to find when the holder admitted it
                WORLD["holds"].append(record)
                try:
                    await self._work(job, permit)
                finally:
                    # Surely its holder's until now, or until its lease ran out.
                    record["end"] = min(now_ms(), permit.valid_until)
                    record["ran_until"] = now_ms()  # past "end": its code outran its lease
                    record["reason"] = permit.reason
        except WouldBlock:
            return {"id": job["id"], "status": "busy"}
        except WaitTimeout:
            return {"id": job["id"], "status": "timeout", "waited_ms": now_ms() - record["asked"]}
        except PlaceLost as error:
            return {"id": job["id"], "status": "lost", "reason": error.reason}
        return {"id": job["id"], "status": "done", "waited_ms": record["start"] - record["asked"]}

    async def _work(self, job, permit):
        left = job.get("work_ms", 0)
        if job.get("stall_ms"):
            stall(job["stall_ms"])
        while left > 0 and not permit.lost():  # a careful holder stops once its place is lost
            step = min(left, 500)
            await asyncio.sleep(step / 1000)
            left -= step
