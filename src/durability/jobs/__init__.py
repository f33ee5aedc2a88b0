"""Durable jobs: each run to completion or final failure, retried with backoff, kept a while, then purged.

Lives here: the runner (``runner``) and what callers hand jobs in with
(``run_call``), attempts run by a Queue consumer (``handoff``, ``consumer``;
the runner's side in ``handed_off``),
a job's record and its vocabulary (``records``), which finished jobs go and when (``retention``, pure) and
the purge that deletes them (``purge``). Must not know: what a handler
does, or who calls ``run``.
"""

from .consumer import JobConsumer as JobConsumer
from .handoff import QueueHandoff as QueueHandoff
from .records import (
    JobContext as JobContext,
    JobEvent as JobEvent,
    JobEventType as JobEventType,
    JobStatus as JobStatus,
    KeptOutcomes as KeptOutcomes,
    NonRetryableError as NonRetryableError,
    current_job as current_job,
)
from .retention import JobRetention as JobRetention
from .runner import Durability as Durability, DurabilityJobs as DurabilityJobs
