"""SemaphoreHolder: the Durable Object class a Worker exports to hold a semaphore's places.

Lives here: the class users subclass (``class UploadSlots(SemaphoreHolder)``)
and its RPC methods, each a thin call into ``PlaceKeeper``. Must not know:
the line's rules or the wire format. It is the only module of
``durability.locks`` that imports the ``workers`` SDK.
"""

from __future__ import annotations

from typing import Any

from workers import DurableObject

from .holder import PlaceKeeper


class SemaphoreHolder(DurableObject):
    """One instance per (semaphore name, key), reached with ``getByName(f"{name}:{key}")``.

    Declare a subclass as a SQLite-backed Durable Object class in
    ``wrangler.toml`` and give the semaphore its binding:
    ``semaphore(env.UPLOADS, "uploads", limit=3)``. A subclass that defines
    ``__init__`` must call ``super().__init__(ctx, env)`` first.
    """

    def __init__(self, ctx: Any, env: Any) -> None:
        super().__init__(ctx, env)
        self.semaphore_places = PlaceKeeper(self.ctx)

    async def semaphore_acquire(self, message: Any) -> dict[str, Any]:
        return await self.semaphore_places.acquire(message)

    async def semaphore_renew(self, message: Any) -> dict[str, Any]:
        return await self.semaphore_places.renew(message)

    async def semaphore_release(self, message: Any) -> dict[str, Any]:
        return await self.semaphore_places.release(message)

    async def semaphore_cancel(self, message: Any) -> dict[str, Any]:
        return await self.semaphore_places.cancel(message)

    async def semaphore_usage(self) -> dict[str, Any]:
        return self.semaphore_places.usage()
