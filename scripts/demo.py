#!/usr/bin/env python3
"""Run the account-concurrency composition of the example Worker on the embedded runtime.

    uv run scripts/demo.py [--jobs N] [--accounts N] [--shards N] [--seed N]
                           [--fault-rate R] [--lost-releases R] [--leases strict|under|over] [--json]
                           [--verbose]

Jobs of random durations arrive in bursts for a few accounts with small
limits; tens of shards queue them; each account's holder admits them oldest
first; the consumer of the job-attempts queue runs each admitted job and
reports to its shard; some jobs fail, some releases are lost, calls
between objects are lost, duplicated, delayed and reordered while objects
are evicted, and consumers die mid-batch and lose acks. All
of it runs in virtual time. The summary checks the promises against ground
truth (jobs actually running, measured outside the objects) and prints what
it cost in the units Cloudflare bills. With ``--leases``, each account's
holder also hands out leases (``ACCOUNT_LEASES``), which shards draw from
without asking; ``over`` lets work reach limit + extra (half the limit,
rounded down), and the check uses that ceiling.

The terminal shows a progress bar and the summary; the faults injected and
the retries they caused are counted there by kind and by cause.
``--verbose`` also prints every warning the objects log as it happens.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from bench import measure  # noqa: E402
from bench.progress import Progress  # noqa: E402
from bench.workload import LostReleases  # noqa: E402
from durability.testing import Faults, JsException, Runtime  # noqa: E402

LIMITS = [3, 5, 8, 4, 6, 2]
PROVISIONING = {
    "strict": {"mode": "strict"},
    "under": {"mode": "under", "reserve": 2},
    "over": {"mode": "over", "extra": {"ratio": 0.5}},
}
PERMITS_PER_LEASE = 2
LEASE_TTL_MS = 10 * 60_000


def ceiling(limit: int, leases: str | None) -> int:
    """What work may really reach: the limit, or limit + extra for leases "over"."""
    return limit + limit // 2 if leases == "over" else limit
FAULT_EVENTS = ("lost request", "lost reply", "duplicate", "alarm failed", "queue consumer died",
                "queue ack lost")  #: runtime trace events


class LogCounter(logging.Handler):
    """Counts the warnings the objects log, by logger and message template,
    instead of printing them: a run with faults logs thousands of retries."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: collections.Counter[str] = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        # The template up to the error it reports, then the error's type:
        # "timer …/… failed (attempt …): ProtocolError".
        template = str(record.msg).split("%r")[0]
        for placeholder in ("%s", "%d"):
            template = template.replace(placeholder, "…")
        args = record.args if isinstance(record.args, tuple) else ()
        errors = [type(a).__name__ for a in args if isinstance(a, BaseException)]
        self.counts[f"{record.name}: {template.strip()} {''.join(errors[:1])}".strip()] += 1


SETTLE_MS = 4 * 3_600_000  # give up waiting for jobs and permits after this much virtual time


class Ledger:
    """Ground truth outside the objects: which jobs run now, and when each started."""

    def __init__(self, accounts: list[str]) -> None:
        self.running = {a: set() for a in accounts}
        self.max_running = {a: 0 for a in accounts}
        self.submitted_at: dict[str, float] = {}
        self.first_start: dict[str, float] = {}
        self.succeeded: dict[str, int] = {}  # runs that returned, per job
        self.overlaps = 0  # a job started while a run of it was still going
        self.outcome: dict[str, str] = {}  # job id -> completed | failed
        self.via: dict[str, str] = {}  # job id -> the path that admitted it ("grant" or "lease")
        self.truth = measure.Ledger()  # submissions, starts and ends, for the busy share

    def instrument(self, runtime: Runtime) -> None:
        module = runtime.module
        real_run_job = module.run_job

        async def run_job(env, job):
            account, job_id = job["account"], job["id"]
            self.first_start.setdefault(job_id, runtime.now_ms())
            if job_id in self.running[account]:
                self.overlaps += 1
            self.running[account].add(job_id)
            self.max_running[account] = max(self.max_running[account], len(self.running[account]))
            self.truth.started(job_id, runtime.now_ms(), where=measure.running_object())
            try:
                result = await real_run_job(env, job)
            finally:
                self.running[account].discard(job_id)
                self.truth.ended(job_id, runtime.now_ms())
            self.succeeded[job_id] = self.succeeded.get(job_id, 0) + 1
            return result

        module.run_job = run_job
        real_admit = module.JobShard._admit

        async def admit(shard, items):
            for item in items:  # admit() may be called again for an item: count each once
                self.via[item.id] = item.via
            return await real_admit(shard, items)

        module.JobShard._admit = admit


async def workload(runtime: Runtime, args: argparse.Namespace, ledger: Ledger, accounts: list[str]) -> dict:
    rng = random.Random(args.seed)
    submitted = 0
    # Bursts: every few seconds a batch of jobs arrives, over the first minutes.
    while submitted < args.jobs:
        burst = min(args.jobs - submitted, rng.randint(5, 60))
        for _ in range(burst):
            job_id = f"job-{submitted:05d}"
            account = rng.choice(accounts)
            job = {"id": job_id, "account": account, "workflow": f"wf-{rng.randint(0, 2)}",
                   "work_ms": rng.randint(1_000, 30_000), "fail": rng.random() < 0.05}
            ledger.submitted_at[job_id] = runtime.now_ms()
            ledger.truth.submitted(job_id, account, job["work_ms"], runtime.now_ms())
            while True:  # submitting is idempotent on the job id: retry until it lands
                try:
                    await runtime.call_entrypoint("submit_job", job)
                    break
                except JsException:
                    await asyncio.sleep(0.5)
            submitted += 1
        await asyncio.sleep(rng.uniform(1, 8))
    # Wait for every job to end, then for the finished() sweep to return lost permits.
    deadline = runtime.now_ms() + SETTLE_MS
    last_report = 0.0
    bar = Progress(args.jobs, width=40)
    while runtime.now_ms() < deadline:
        await asyncio.sleep(30)
        ended = await ended_jobs(runtime, ledger)
        if not args.json and runtime.now_ms() - last_report >= 60_000:
            last_report = runtime.now_ms()
            progress(bar, len(ended), args.jobs, runtime)
        if len(ended) == args.jobs:
            usages = await account_usages(runtime, accounts)
            if all(u["outstanding"] == 0 for u in usages.values()):
                break
    if not args.json:
        progress(bar, len(ledger.outcome), args.jobs, runtime)
        bar.end()
    return await account_usages(runtime, accounts)


async def account_usages(runtime: Runtime, accounts: list[str]) -> dict:
    """Each holder's books; looking must not be hit by the faults the run injects."""
    with runtime.no_faults():
        return {a: await runtime.call_entrypoint("account_usage", a) for a in accounts}


async def ended_jobs(runtime: Runtime, ledger: Ledger) -> dict[str, str]:
    """Read job states straight from the shards' storage: observing is not billed."""
    for host in runtime.hosts():
        if host.class_name == "JobShard":
            for row in host.db.inspect(  # a job that ended in its first attempt keeps its outcome in its item
                "SELECT id, status FROM durability_jobs WHERE status IN ('completed', 'failed') UNION ALL "
                "SELECT id, record ->> 'status' FROM durability_queue_items WHERE record IS NOT NULL"
            ):
                ledger.outcome[row["id"]] = row["status"]
    return ledger.outcome


def progress(bar: Progress, done: int, total: int, runtime: Runtime) -> None:
    minutes, seconds = divmod(int(runtime.loop.time()), 60)
    bar.show(done, f"{done}/{total} jobs ended, {minutes}m{seconds:02d}s virtual")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--accounts", type=int, default=3, help=f"at most {len(LIMITS)}")
    parser.add_argument("--shards", type=int, default=24)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fault-rate", type=float, default=0.02, help="share of calls lost, duplicated...")
    parser.add_argument("--lost-releases", type=float, default=0.05, help="share of releases dropped")
    parser.add_argument("--leases", choices=sorted(PROVISIONING), default=None,
                        help="let holders hand out leases, provisioned this way")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--verbose", action="store_true", help="print the objects' warnings as they happen")
    args = parser.parse_args()
    if args.jobs < 1 or args.shards < 1 or not 1 <= args.accounts <= len(LIMITS):
        parser.error(f"--jobs and --shards must be at least 1, --accounts from 1 to {len(LIMITS)}")
    if not (0 <= args.fault_rate <= 0.5 and 0 <= args.lost_releases <= 1):
        parser.error("--fault-rate must be from 0 to 0.5 and --lost-releases from 0 to 1")

    accounts = [f"account-{i}" for i in range(args.accounts)]
    limits = dict(zip(accounts, LIMITS))
    rate = args.fault_rate
    faults = Faults(lost_request=rate, lost_reply=rate, duplicate=rate, latency_ms=(1, 30),
                    evict=rate / 2, crash_before_commit=rate / 4, alarm_failure=rate,
                    consumer_crash=rate, lost_ack=rate) if rate else None
    logs = LogCounter()
    logging.getLogger().addHandler(logging.StreamHandler() if args.verbose else logs)
    started = time.perf_counter()
    runtime = Runtime.from_wrangler(
        ROOT / "wrangler.toml", seed=args.seed, faults=faults,
        vars={"ACCOUNT_LIMITS": json.dumps(limits), "SHARDS": str(args.shards),
              "ACCOUNT_LEASES": json.dumps(lease_options(args.leases))},
    )
    ledger = Ledger(accounts)
    ledger.instrument(runtime)
    lost = LostReleases(runtime.module.DurabilitySemaphoreQueue, args.lost_releases, random.Random(args.seed + 1))
    with runtime, lost:
        usages = runtime.run(workload(runtime, args, ledger, accounts))
        totals = runtime.totals()
        vias = admitted_via(ledger)
        awake = {f"{host.class_name}:{host.name}": host.awake_periods() for host in runtime.hosts()}
        in_jobs_s, coordinating_s = measure.awake_split(awake, ledger.truth, runtime.loop.loop_time_for)
    ceilings = {a: ceiling(limits[a], args.leases) for a in accounts}
    waits = [(ledger.first_start[j] - ledger.submitted_at[j]) / 1000 for j in ledger.first_start]
    admitted = len(ledger.first_start)
    outcomes = list(ledger.outcome.values())
    summary = {
        "submitted": args.jobs,
        "admitted": admitted,
        "completed": outcomes.count("completed"),
        "failed": outcomes.count("failed"),
        "leases": args.leases,
        "limit": limits,
        "ceiling": ceilings,
        "max_running": ledger.max_running,
        "over_limit": {a: ledger.max_running[a] > ceilings[a] for a in accounts},
        "admitted_via": vias,
        # Releases the application asked for and lost: only the queue's
        # finished() sweep returned those permits.
        "releases_lost": lost.lost,
        "lease_footprint_left": sum(u["leaseFootprint"] for u in usages.values()),
        # Two runs of one job at once: never. Work that completed but whose
        # outcome was lost in a crash before it committed runs again: the
        # runner is at least once, so handlers must be idempotent on job id.
        "jobs_run_twice_at_once": ledger.overlaps,
        "work_repeated_after_crash": sum(1 for n in ledger.succeeded.values() if n > 1),
        # Mean of running ÷ limit while jobs of the account waited (bench/measure.py).
        "busy_while_waiting": round(measure.busy_share(ledger.truth, limits)[0], 4),
        "p50_wait_s": round(measure.percentile(waits, 0.50), 1),
        "p99_wait_s": round(measure.percentile(waits, 0.99), 1),
        "rows_written_per_admission": round(totals["rows_written"] / max(admitted, 1), 2),
        "rows_read_per_admission": round(totals["rows_read"] / max(admitted, 1), 2),
        "rpc_per_admission": round(totals["requests"] / max(admitted, 1), 2),
        # Every object's seconds awake (duration is billed), outside and inside the jobs' own run.
        "awake_coordinating_s_per_admission": round(coordinating_s / max(admitted, 1), 3),
        "awake_in_jobs_s_per_admission": round(in_jobs_s / max(admitted, 1), 3),
        "rows_and_requests_dollars_per_million": round(measure.dollars_per_million(totals, admitted), 2),
        # ... and the Worker invocations it makes by itself (the queue's consumer, the sweep) and
        # the queue's operations (bench/measure.py).
        "all_in_dollars_per_million": round(measure.dollars_per_million(totals, admitted)
                                            + measure.awake_dollars_per_million(in_jobs_s + coordinating_s,
                                                                                admitted)
                                            + measure.stateless_dollars_per_million(
                                                runtime.worker_stats, totals["queue_operations"], admitted), 2),
        "leaked_permits": sum(u["outstanding"] for u in usages.values())
        - sum(len(r) for r in ledger.running.values()),
        "evictions": totals["evictions"],
        "faults": dict(collections.Counter(event for _, _, event, _ in runtime.trace if event in FAULT_EVENTS)),
        "logged": dict(logs.counts.most_common()),  # empty with --verbose: printed instead
        "virtual_minutes": round(runtime.loop.time() / 60, 1),
        "real_seconds": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(summary, indent=2) if args.json else human(summary))
    healthy = (not any(summary["over_limit"].values()) and summary["leaked_permits"] == 0
               and summary["jobs_run_twice_at_once"] == 0)
    return 0 if healthy else 1


def lease_options(mode: str | None) -> dict | None:
    if mode is None:
        return None
    return {"provisioning": PROVISIONING[mode], "permits_per_lease": PERMITS_PER_LEASE, "ttl_ms": LEASE_TTL_MS}


def admitted_via(ledger: Ledger) -> dict[str, int]:
    """How many jobs each path admitted, as admit() was told (the shards
    delete done items after a while, so their tables no longer say)."""
    counts = {"grant": 0, "lease": 0}
    for via in ledger.via.values():
        counts[via] = counts.get(via, 0) + 1
    return counts


def human(s: dict) -> str:
    lines = [
        f"{s['submitted']} jobs submitted, {s['admitted']} admitted, {s['completed']} completed, "
        f"{s['failed']} failed (as asked), in {s['virtual_minutes']} virtual minutes ({s['real_seconds']} s real)",
    ]
    for account, limit in s["limit"].items():
        extra = f" (ceiling {s['ceiling'][account]} with leases over)" if s["ceiling"][account] != limit else ""
        lines.append(f"  {account}: limit {limit}{extra}, at most {s['max_running'][account]} running at once")
    if s["leases"]:
        lines.append(f"leases ({s['leases']}): {s['admitted_via']['lease']} jobs drawn from leases, "
                     f"{s['admitted_via']['grant']} admitted by grants")
    lines.append(f"wait from submit to start: p50 {s['p50_wait_s']} s, p99 {s['p99_wait_s']} s; "
                 f"limit busy while jobs wait: {s['busy_while_waiting']:.1%}")
    lines.append(f"per admission: {s['rows_written_per_admission']} rows written, "
                 f"{s['rows_read_per_admission']} rows read, {s['rpc_per_admission']} requests")
    lines.append(f"awake, every object together, per admission: {s['awake_coordinating_s_per_admission']} "
                 f"object-s coordinating, {s['awake_in_jobs_s_per_admission']} in the jobs' own run; "
                 f"$ per million admissions: {s['rows_and_requests_dollars_per_million']} rows and requests, "
                 f"{s['all_in_dollars_per_million']} all in (duration at 128 MB, $12.50 per million GB-s; "
                 "Workers requests and CPU; Queues operations)")
    lines.append("  (rows as Durable Object SQLite bills them: every row a query scans is read, so the "
                 "queue's scans of its items read many; a million reads cost what a thousand writes do)")
    lines.append(f"jobs run twice at once: {s['jobs_run_twice_at_once']}; work repeated after a crash lost "
                 f"its outcome: {s['work_repeated_after_crash']}")
    lines.append(f"releases lost: {s['releases_lost']}, returned by the finished() sweep; "
                 f"leaked permits after the sweep: {s['leaked_permits']}; evictions: {s['evictions']}")
    if s["faults"]:
        lines.append("faults injected: " + ", ".join(f"{n} {kind}" for kind, n in sorted(s["faults"].items())))
    if s["logged"]:
        lines.append(f"warnings logged ({sum(s['logged'].values())}, printed with --verbose): the objects "
                     "noting the faults above (a call lost, a timer retried, a crash) as they recover from "
                     "each; none is a broken promise (those are the lines above); by cause:")
        lines += [f"  {n:6}  {cause}" for cause, n in s["logged"].items()]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
