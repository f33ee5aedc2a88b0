"""durability: durable building blocks for Cloudflare Python Workers' Durable Objects.

Lives here: the public names of the library. The deployed Worker imports
only this package, the standard library and the ``workers`` SDK;
``durability.testing`` (the embedded runtime) is for tests and demos.
"""

from .jobs.consumer import JobConsumer
from .jobs.handoff import QueueHandoff
from .jobs.records import KeptOutcomes
from .jobs.retention import JobRetention
from .jobs.runner import Durability, DurabilityJobs, JobContext, JobEvent, NonRetryableError, current_job
from .outbox import DurabilityOutbox, OutboxChannel, OutboxMessage
from .retry import Backoff
from .scheduler.alarm import DurabilityScheduler, Timer

__all__ = [
    "Backoff",
    "Durability",
    "DurabilityJobs",
    "DurabilityOutbox",
    "DurabilityScheduler",
    "JobConsumer",
    "JobContext",
    "JobEvent",
    "JobRetention",
    "KeptOutcomes",
    "NonRetryableError",
    "OutboxChannel",
    "OutboxMessage",
    "QueueHandoff",
    "Timer",
    "current_job",
]
