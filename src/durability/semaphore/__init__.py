"""durability.semaphore: one shared concurrency budget held by one Durable Object per key.

Lives here: the public names. ``DurabilitySemaphore`` runs in the holder
object; ``SemaphoreClient`` (made by ``DurabilitySemaphore.client(...)``)
reaches it from client objects.
"""

from .allocation import Grant
from .client import SemaphoreClient, SemaphoreClientFactory
from .holder import DurabilitySemaphore
from .messages import (
    EXPIRED,
    GROUP_LIMIT,
    LIMIT,
    LIMIT_RESOLUTION_ERROR,
    NOT_FOUND,
    NOT_PERMITTED,
    OK,
    VERSION,
    Demand,
    ProtocolError,
    Report,
    Request,
    Sync,
)

__all__ = [
    "EXPIRED", "GROUP_LIMIT", "LIMIT", "LIMIT_RESOLUTION_ERROR", "NOT_FOUND", "NOT_PERMITTED", "OK",
    "VERSION", "Demand", "DurabilitySemaphore", "Grant", "ProtocolError", "Report", "Request",
    "SemaphoreClient", "SemaphoreClientFactory", "Sync",
]
