"""durability.semaphore: one shared concurrency budget held by one Durable Object per key.

Lives here: the public names. ``DurabilitySemaphore`` runs in the holder
object; ``DurabilitySemaphoreQueue`` runs in the client objects that queue
work, and reaches the holder through a ``SemaphoreClient`` (made by
``DurabilitySemaphore.client(...)``).
"""

from .client import SemaphoreClient, SemaphoreClientFactory
from .holder.pure.allocation import Grant
from .holder.pure.leases import Lease, LeasePolicy
from .holder.shell import DurabilitySemaphore
from .identity import client_label
from .messages import (
    EXPIRED,
    GROUP_LIMIT,
    LIMIT,
    LIMIT_RESOLUTION_ERROR,
    NOT_FOUND,
    NOT_PERMITTED,
    OK,
    RETIRED,
    SETTLED,
    VERSION,
    Demand,
    GroupUsage,
    LeaseReport,
    ProtocolError,
    Reply,
    Report,
    Request,
    Sync,
    Usage,
    WaitingUsage,
)
from .queue.shell import AdmittedItem, DurabilitySemaphoreQueue, QueueEvent

__all__ = [
    "EXPIRED", "GROUP_LIMIT", "LIMIT", "LIMIT_RESOLUTION_ERROR", "NOT_FOUND", "NOT_PERMITTED", "OK",
    "RETIRED", "SETTLED", "VERSION", "AdmittedItem", "Demand", "DurabilitySemaphore", "DurabilitySemaphoreQueue",
    "QueueEvent", "Grant", "GroupUsage", "Lease", "LeasePolicy", "LeaseReport", "ProtocolError", "Reply", "Report",
    "Request", "SemaphoreClient", "SemaphoreClientFactory", "Sync", "Usage", "WaitingUsage", "client_label",
]
