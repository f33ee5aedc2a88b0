"""What a benchmark measures from ground truth: each job's submission, start and end, outside the objects.

Lives here: ``Ledger`` (what every system under test reports: a job
submitted, started, ended, and in which object it ran) and the figures every
benchmark prints the same way (``docs/design.md``, cost model): the busy
share while jobs wait, the out-of-order share, waits, the makespan against
its lower bound, the dollars per million jobs (rows and requests, the
Worker invocations and queue operations a system makes by itself), and the
objects' awake time split into the jobs' own run and coordination. Must not know: which system
ran the jobs.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

from durability.testing import WorkerStats, current_object

#: Durable Objects' prices per million rows and requests
PRICE_PER_MILLION = {"rows_written": 1.00, "rows_read": 0.001, "requests": 0.15}
#: and per million GB-s awake, at 128 MB an object: $1.60 per million object-seconds
PRICE_PER_MILLION_GB_S = 12.50
OBJECT_GB = 0.128
#: a stateless Worker's prices per million requests and CPU milliseconds, and Queues' per million operations
#: (a message written, read and deleted is three)
WORKER_REQUEST, WORKER_CPU_MS, QUEUE_OPERATION = 0.30, 0.02, 0.40
#: the Worker invocations a system makes by itself (its Cron Trigger's sweeps, its queues' batches); the
#: submissions every system receives alike, through whatever entrypoint, are left out of its bill
OWN_INVOCATIONS = ("scheduled", "queue")


@dataclass
class Ledger:
    """Ground truth per job: its account, work, and when it was submitted, started and ended."""

    account: dict[str, str] = field(default_factory=dict)
    work_ms: dict[str, float] = field(default_factory=dict)
    submitted_at: dict[str, float] = field(default_factory=dict)
    started_at: dict[str, float] = field(default_factory=dict)
    ended_at: dict[str, float] = field(default_factory=dict)
    overlaps: int = 0  #: a job started while a run of it was still going
    ran_in: dict[str, str] = field(default_factory=dict)  #: job -> the object that ran it ("Class:name")
    running: dict[str, set[str]] = field(default_factory=dict)
    max_running: dict[str, int] = field(default_factory=dict)
    runs: dict[str, int] = field(default_factory=dict)  #: job -> how many times its work started

    def submitted(self, job_id: str, account: str, work_ms: float, at: float) -> None:
        self.account[job_id], self.work_ms[job_id] = account, work_ms
        self.submitted_at.setdefault(job_id, at)

    def started(self, job_id: str, at: float, where: str | None = None) -> None:
        if where is not None:
            self.ran_in[job_id] = where
        account = self.account[job_id]
        running = self.running.setdefault(account, set())
        if job_id in running:
            self.overlaps += 1
        running.add(job_id)
        self.max_running[account] = max(self.max_running.get(account, 0), len(running))
        self.started_at.setdefault(job_id, at)
        self.runs[job_id] = self.runs.get(job_id, 0) + 1

    def ended(self, job_id: str, at: float) -> None:
        self.running.get(self.account[job_id], set()).discard(job_id)
        self.ended_at[job_id] = at


def busy_share(ledger: Ledger, limits: dict[str, int]) -> tuple[float, dict[str, float]]:
    """Per account, the mean of running ÷ limit over the time at least one of its
    jobs waited to start; and that mean over all accounts' waiting time."""
    per_account, total_busy, total_time = {}, 0.0, 0.0
    for account, limit in limits.items():
        changes = []  # (time, change in waiting, change in running)
        for job_id, owner in ledger.account.items():
            if owner == account and job_id in ledger.started_at:
                changes += [(ledger.submitted_at[job_id], 1, 0), (ledger.started_at[job_id], -1, 1),
                            (ledger.ended_at.get(job_id, float("inf")), 0, -1)]
        waiting = running = 0
        busy = span = 0.0
        last = None
        for at, d_waiting, d_running in sorted(changes):
            if last is not None and waiting > 0 and at > last:
                span += at - last
                busy += (at - last) * min(running, limit) / limit
            last = at
            waiting += d_waiting
            running += d_running
        per_account[account] = busy / span if span else 1.0
        total_busy, total_time = total_busy + busy, total_time + span
    return (total_busy / total_time if total_time else 1.0), per_account


def refills_ms(ledger: Ledger) -> list[float]:
    """For each job that ended while another job of its account waited to
    start, how long until the account's next job started: how long a freed
    permit idles while work waits (ground truth, each end counted once)."""
    gaps = []
    by_account: dict[str, list[str]] = {}
    for job_id, account in ledger.account.items():
        if job_id in ledger.started_at:
            by_account.setdefault(account, []).append(job_id)
    for jobs in by_account.values():
        starts = sorted(ledger.started_at[j] for j in jobs)
        for job_id in jobs:
            end = ledger.ended_at.get(job_id)
            if end is None:
                continue
            waiting = any(ledger.submitted_at[j] <= end < ledger.started_at[j] for j in jobs)
            later = bisect.bisect_left(starts, end)
            if waiting and later < len(starts):
                gaps.append(starts[later] - end)
    return gaps


def out_of_order_share(ledger: Ledger, slack_ms: float = 0.0, together_ms: float = 0.0) -> float:
    """The share of starts made while an older job of the same account still
    waited (older by more than ``slack_ms``: 0 counts any). A job that
    started within ``together_ms`` after another counts as started with it:
    the replies of one decision land a few milliseconds apart.

    A job started at s is late if a job submitted before it started after
    s + together_ms: with an account's jobs in order of start, that is the
    earliest submission among the jobs started after then (a suffix
    minimum, found by bisection), so the count takes a sort, not a
    comparison of every pair.
    """
    late = 0
    by_account: dict[str, list[str]] = {}
    for job_id in ledger.started_at:
        by_account.setdefault(ledger.account[job_id], []).append(job_id)
    for jobs in by_account.values():
        jobs.sort(key=lambda j: ledger.started_at[j])
        starts = [ledger.started_at[j] for j in jobs]
        earliest_from = [float("inf")] * (len(jobs) + 1)  # earliest submission among jobs[k:]
        for k in range(len(jobs) - 1, -1, -1):
            earliest_from[k] = min(earliest_from[k + 1], ledger.submitted_at[jobs[k]])
        for k, job_id in enumerate(jobs):
            after = bisect.bisect_right(starts, starts[k] + together_ms)
            late += earliest_from[after] < ledger.submitted_at[job_id] - slack_ms
    return late / max(len(ledger.started_at), 1)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0


def waits_s(ledger: Ledger) -> list[float]:
    return [(ledger.started_at[j] - ledger.submitted_at[j]) / 1000 for j in ledger.started_at]


def makespan(ledger: Ledger, limits: dict[str, int]) -> tuple[float, float]:
    """The last end after the first submission, and its lower bound: per account,
    its work over its limit, or its last arrival plus that job's work."""
    first = min(ledger.submitted_at.values())
    span = max(ledger.ended_at.values(), default=first) - first
    bound = 0.0
    for account, limit in limits.items():
        jobs = [j for j, owner in ledger.account.items() if owner == account]
        if not jobs:
            continue
        work = sum(ledger.work_ms[j] for j in jobs) / limit
        last = max(ledger.submitted_at[j] - first + ledger.work_ms[j] for j in jobs)
        bound = max(bound, work, last)
    return span, bound


def dollars_per_million(totals: dict[str, float], jobs: int) -> float:
    """What Cloudflare bills for rows and requests per million admitted jobs at these totals."""
    return sum(totals[name] * price for name, price in PRICE_PER_MILLION.items()) / max(jobs, 1)


def awake_dollars_per_million(object_seconds: float, jobs: int) -> float:
    """What Cloudflare bills for ``object_seconds`` awake, per million admitted jobs."""
    return object_seconds * OBJECT_GB * PRICE_PER_MILLION_GB_S / max(jobs, 1)


def stateless_dollars_per_million(worker: WorkerStats, queue_operations: int, jobs: int) -> float:
    """What Cloudflare bills per million admitted jobs for the Worker invocations a
    system makes by itself (requests and their CPU) and its queues' operations."""
    requests = sum(worker.by_kind.get(kind, 0) for kind in OWN_INVOCATIONS)
    cpu_ms = 1000 * sum(worker.cpu_s_by_kind.get(kind, 0.0) for kind in OWN_INVOCATIONS)
    return (requests * WORKER_REQUEST + cpu_ms * WORKER_CPU_MS + queue_operations * QUEUE_OPERATION) / max(jobs, 1)


def running_object() -> str | None:
    """The object whose code runs now, as the trace names it ("Class:name"): where a job ran."""
    host = current_object()
    return f"{host.class_name}:{host.name}" if host is not None else None


def awake_split(awake: dict[str, list[tuple[float, float]]], ledger: Ledger,
                to_s: Callable[[float], float]) -> tuple[float, float]:
    """Seconds awake, all objects together, split in two: while the object ran
    admitted work (the jobs' own run, from ``ledger.ran_in``) and the rest (the
    seconds spent coordinating). ``awake`` maps each object to its awake
    periods in seconds; ``to_s`` turns the ledger's milliseconds into those."""
    work: dict[str, list[tuple[float, float]]] = {}
    for job_id, where in ledger.ran_in.items():
        if job_id in ledger.started_at:
            end = ledger.ended_at.get(job_id, float("inf"))
            work.setdefault(where, []).append((to_s(ledger.started_at[job_id]), to_s(end)))
    total = sum(end - start for periods in awake.values() for start, end in periods)
    inside = sum(overlap(periods, _merged(work.get(name, []))) for name, periods in awake.items())
    return inside, total - inside


def _merged(periods: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(periods):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """The length of the intersection of two sorted lists of disjoint periods."""
    i = j = 0
    found = 0.0
    while i < len(a) and j < len(b):
        found += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return found
