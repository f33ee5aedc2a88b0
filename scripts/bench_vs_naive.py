#!/usr/bin/env python3
"""The example Worker against what users would write instead, on the demo's workload.

    uv run scripts/bench_vs_naive.py [--jobs N] [--seed N] [--shards N] [--short] [--faults]
                                     [--plot PATH] [--json] [--record PATH]

Runs, on the embedded runtime in virtual time and on exactly the same
arrivals: the example Worker with grants (each job's attempt run by the
consumer of its job-attempts queue), the same with each attempt run inside
its shard ("grants, jobs in the shard": ``JOBS_RUN_IN = "shard"``), the
example Worker with leases in each provisioning mode (strict; under,
reserving 2 permits for grants; over, letting work reach limit + half of
it, against which its busy share and safety are measured), the example
Worker as it ran before its holders called shards back, its requests held
and its jobs run in the shard ("grants, requests held":
``ACCOUNT_CALLS_SHARDS = "false"``), and the naive Worker of
``bench/naive.py`` polling every 5 s and every 1 s (its jobs run inside its
shards). Every object
hibernates after 10 s with nothing pending but its alarm, as in
production. Prints, per system, rows written, rows read and requests per
admitted job, dollars per million jobs (rows written $1, rows read $0.001,
requests $0.15, per million), every object's seconds awake per job (billed
at 128 MB, $12.50 per million GB-s) split into those inside the jobs' own
run and those spent coordinating (with, below the table, the same per
object class, with requests, alarms run, rows written and alarms set,
and instances hibernated), the coordination bill (rows, requests and that
time) and the bill all in, the share of the limit kept busy while jobs
wait, how long a freed permit waits for its next job (refill p50 and p99),
the share of admissions made out of oldest-first order, p50 and p99
wait, and the makespan against its lower bound; all from ground truth
measured outside the objects. ``--faults`` adds the demo's faults (2% of
calls lost, duplicated, delayed, those of a queue's consumer included;
evictions, crashes; 2% of consumer invocations dying partway and of acks
lost; 5% of releases lost) to every system. ``--plot`` writes a PNG (running ÷ limit over time per
account for each system, and dollars per million jobs as bars).
``--record`` writes every semaphore message a queue sent and the reply or
failure it got, one JSON line each, in order: a refactor that keeps the
wire must leave the file byte-identical.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from bench import measure, tables  # noqa: E402
from bench.breakdown import WriteBreakdown  # noqa: E402
from bench.workload import LostReleases, arrivals, limits_of, shard_of  # noqa: E402
from durability.testing import HIBERNATE_AFTER_MS, Faults, JsException, Runtime, load_worker_module  # noqa: E402

NAIVE = ROOT / "bench" / "naive.py"
SETTLE_MS = 4 * 3_600_000
LEASE_MODES = {"strict leases": {"mode": "strict"}, "under leases": {"mode": "under", "reserve": 2},
               "over leases": {"mode": "over", "extra": {"ratio": 0.5}}}
#: the example as it ran before its holders called shards back: each shard's request held open (a long poll)
HELD = "grants, requests held"
#: the example with each job's attempt run inside its shard instead of the queue's consumer (JOBS_RUN_IN)
IN_SHARD = "grants, jobs in the shard"
SYSTEMS = ["grants", IN_SHARD, *LEASE_MODES, HELD, "naive, polling every 5 s", "naive, polling every 1 s"]


def leases_of(system: str, permits_per_lease: int = 2) -> dict | None:
    mode = LEASE_MODES.get(system)
    return None if mode is None else {"provisioning": mode, "permits_per_lease": permits_per_lease,
                                      "ttl_ms": 10 * 60_000}


def ceilings_of(system: str, limits: dict) -> dict:
    """What work may reach per account: the limit, or limit + extra with leases over."""
    return {a: limit + limit // 2 if system == "over leases" else limit for a, limit in limits.items()}


def faults_of(on: bool | Faults) -> Faults | None:
    """The demo's faults if ``on`` is true; faults given as such are taken as they are."""
    if isinstance(on, Faults):
        return on
    rate = 0.02
    return Faults(lost_request=rate, lost_reply=rate, duplicate=rate, latency_ms=(1, 30), evict=rate / 2,
                  crash_before_commit=rate / 4, alarm_failure=rate, consumer_crash=rate, lost_ack=rate) if on else None


def example_runtime(system: str, args, limits: dict, ledger: measure.Ledger) -> Runtime:
    runtime = Runtime.from_wrangler(ROOT / "wrangler.toml", seed=args.seed, faults=faults_of(args.faults),
                                    hibernate_after_ms=HIBERNATE_AFTER_MS, vars={
        "ACCOUNT_LIMITS": json.dumps(limits), "SHARDS": str(args.shards),
        "ACCOUNT_LEASES": json.dumps(leases_of(system, getattr(args, "permits_per_lease", 2))),
        "ACCOUNT_CALLS_SHARDS": "false" if system == HELD else "true",
        "JOBS_RUN_IN": "shard" if system in (HELD, IN_SHARD) else "queue"})
    module = runtime.module
    real_run_job = module.run_job

    async def run_job(env, job):
        ledger.started(job["id"], runtime.now_ms(), where=measure.running_object())
        try:
            return await real_run_job(env, job)
        finally:
            ledger.ended(job["id"], runtime.now_ms())

    module.run_job = run_job
    return runtime


def naive_runtime(poll_ms: float, args, limits: dict, ledger: measure.Ledger, rng: random.Random) -> Runtime:
    module = load_worker_module(NAIVE)
    module.LEDGER, module.POLL_MS = ledger, poll_ms
    module.LOSE_RELEASES, module.RNG = (0.05 if args.faults else 0.0), rng
    return Runtime(module, {"NAIVE_LIMIT": "NaiveLimit", "NAIVE_SHARD": "NaiveShard"}, seed=args.seed,
                   faults=faults_of(args.faults), vars={"ACCOUNT_LIMITS": json.dumps(limits)},
                   hibernate_after_ms=HIBERNATE_AFTER_MS)


async def drive(runtime: Runtime, system: str, args, work, ledger: measure.Ledger) -> None:
    start = runtime.now_ms()
    for arrival in work:
        await asyncio.sleep(max(0.0, start + arrival.at_ms - runtime.now_ms()) / 1000)
        job = arrival.job
        ledger.submitted(job["id"], job["account"], job["work_ms"], runtime.now_ms())
        while True:  # submitting is idempotent on the job id: retry until it lands
            try:
                if system.startswith("naive"):
                    await runtime.env.NAIVE_SHARD.getByName(shard_of(job["id"], args.shards)).submit(job)
                else:
                    await runtime.call_entrypoint("submit_job", job)
                break
            except JsException:
                await asyncio.sleep(0.5)
    deadline = runtime.now_ms() + SETTLE_MS
    while len(ledger.ended_at) < len(work) and runtime.now_ms() < deadline:
        await asyncio.sleep(10)
    await asyncio.sleep(120)  # the last releases reach their holders; sweeps run


@contextlib.contextmanager
def recording(path: Path | None, system: str):
    """Append each queue's semaphore messages and their replies to ``path``."""
    if path is None:
        yield
        return
    from durability.semaphore.client import SemaphoreClient

    real = {name: getattr(SemaphoreClient, name) for name in ("request", "sync")}

    def recorded(name):
        async def call(self, key, message):
            line = {"system": system, "call": name, "key": key, "message": message}
            try:
                line["reply"] = await real[name](self, key, message)
            except BaseException as error:
                line["failed"] = type(error).__name__
                raise
            finally:
                with path.open("a") as out:
                    out.write(json.dumps(line, sort_keys=True) + "\n")
            return line["reply"]
        return call

    for name in real:
        setattr(SemaphoreClient, name, recorded(name))
    try:
        yield
    finally:
        for name, method in real.items():
            setattr(SemaphoreClient, name, method)


def run_system(system: str, args, work, limits: dict) -> dict:
    ledger = measure.Ledger()
    rng = random.Random(args.seed + 1)
    if system.startswith("naive"):
        runtime = naive_runtime(5_000 if "5 s" in system else 1_000, args, limits, ledger, rng)
    else:
        runtime = example_runtime(system, args, limits, ledger)
    started = time.perf_counter()
    lost = contextlib.nullcontext()
    if args.faults and not system.startswith("naive"):  # the naive Worker loses its own (bench/naive.py)
        lost = LostReleases(runtime.module.DurabilitySemaphoreQueue, 0.05, rng)
    with runtime, WriteBreakdown() as writes, lost, recording(args.record, system):
        runtime.run(drive(runtime, system, args, work, ledger))
        totals = runtime.totals()
        awake = {f"{host.class_name}:{host.name}": host.awake_periods() for host in runtime.hosts()}
        in_jobs_s, coordinating_s = measure.awake_split(awake, ledger, runtime.loop.loop_time_for)
        by_class = awake_by_class(awake, ledger, runtime.loop.loop_time_for)
        bills = bills_by_class(runtime.hosts(), len(ledger.started_at))
        stateless = measure.stateless_dollars_per_million(runtime.worker_stats, totals["queue_operations"],
                                                          len(ledger.started_at))
    jobs = len(ledger.started_at)
    refills = measure.refills_ms(ledger)
    rows_and_requests = measure.dollars_per_million(totals, jobs)
    coordinating = rows_and_requests + measure.awake_dollars_per_million(coordinating_s, jobs)
    alarms = sum(host.stats.alarm_writes for host in runtime.hosts())
    ceilings = ceilings_of(system, limits)  # busy share and safety are against what work may reach
    busy, busy_per_account = measure.busy_share(ledger, ceilings)
    span, bound = measure.makespan(ledger, ceilings)
    waits = measure.waits_s(ledger)
    return {
        "system": system, "admitted": jobs,
        "rows_written_per_job": round(totals["rows_written"] / max(jobs, 1), 2),
        "rows_read_per_job": round(totals["rows_read"] / max(jobs, 1), 1),
        "requests_per_job": round(totals["requests"] / max(jobs, 1), 2),
        "dollars_per_million_jobs": round(rows_and_requests, 2),
        "awake_coordinating_s_per_job": round(coordinating_s / max(jobs, 1), 3),
        "awake_in_jobs_s_per_job": round(in_jobs_s / max(jobs, 1), 3),
        #: per object class, object-seconds awake per job: [coordinating, in the jobs' own run]
        "awake_by_class_s_per_job": {name: [round(s / max(jobs, 1), 3) for s in split]
                                     for name, split in by_class.items()},
        "coordination_dollars_per_million_jobs": round(coordinating, 2),
        #: the Worker invocations the system makes by itself (sweeps, queue batches) and queue operations
        "workers_and_queues_dollars_per_million_jobs": round(stateless, 2),
        "all_in_dollars_per_million_jobs": round(
            coordinating + stateless + measure.awake_dollars_per_million(in_jobs_s, jobs), 2),
        "bills_by_class_per_job": bills,
        "busy_while_waiting": round(busy, 4), "busy_per_account": {a: round(b, 4) for a, b in busy_per_account.items()},
        "refill_p50_ms": round(measure.percentile(refills, 0.5)),
        "refill_p99_ms": round(measure.percentile(refills, 0.99)),
        "out_of_order": round(measure.out_of_order_share(ledger), 4),
        "p50_wait_s": round(measure.percentile(waits, 0.5), 1), "p99_wait_s": round(measure.percentile(waits, 0.99), 1),
        "makespan_s": round(span / 1000, 1), "makespan_bound_s": round(bound / 1000, 1),
        "over_limit": {a: ledger.max_running.get(a, 0) > ceilings[a] for a in limits},
        "run_twice_at_once": ledger.overlaps, "real_seconds": round(time.perf_counter() - started, 1),
        #: runs beyond each job's first: retries of failed attempts, and runs repeated (a redelivery, a crash)
        "runs_beyond_one_per_job": sum(n - 1 for n in ledger.runs.values()),
        "rows_written_by_table": [list(row) for row in writes.rows(jobs)]
                                 + [["setAlarm", "", round(alarms / max(jobs, 1), 2)]],
        "rows_read_by_statement": [list(row) for row in writes.reads(jobs)],
        "_timeline": timeline(ledger, ceilings),
    }


def awake_by_class(awake: dict[str, list[tuple[float, float]]], ledger: measure.Ledger,
                   to_s) -> dict[str, tuple[float, float]]:
    """Per object class: (seconds coordinating, seconds in the jobs' own run), all its objects together."""
    found = {}
    for name in sorted({where.partition(":")[0] for where in awake}):
        mine = {where: periods for where, periods in awake.items() if where.partition(":")[0] == name}
        inside, coordinating = measure.awake_split(mine, ledger, to_s)
        found[name] = (coordinating, inside)
    return found


def class_table(rows: list[dict]) -> str:
    columns = ("system", "object class", "awake coordinating (object-s / job)", "awake in the jobs' run",
               "requests / job", "alarms run / job", "rows written / job (alarms set)", "hibernated / job")
    return tables.markdown(columns, (
        (r["system"], name, split[0], split[1], *r["bills_by_class_per_job"].get(name, ("",) * 4))
        for r in rows for name, split in r["awake_by_class_s_per_job"].items()))


def bills_by_class(hosts, jobs: int) -> dict[str, tuple]:
    """Per object class, per job: requests, alarms run, rows written (the
    alarms set among them) and instances hibernated."""
    sums: dict[str, list[int]] = {}
    for host in hosts:
        s = sums.setdefault(host.class_name, [0, 0, 0, 0, 0])
        stats = host.stats
        s[0] += stats.requests
        s[1] += stats.alarm_invocations
        s[2] += host.db.rows_written + stats.alarm_writes
        s[3] += stats.alarm_writes
        s[4] += stats.hibernations
    per = max(jobs, 1)
    return {name: (round(s[0] / per, 2), round(s[1] / per, 2), f"{s[2] / per:.2f} ({s[3] / per:.2f})",
                   round(s[4] / per, 2)) for name, s in sums.items()}


def timeline(ledger: measure.Ledger, limits: dict) -> dict[str, list[tuple[float, float]]]:
    """Running ÷ limit per account, as (minutes, share) steps, for the plot."""
    first = min(ledger.submitted_at.values())
    found = {}
    for account, limit in limits.items():
        changes = sorted([(ledger.started_at[j], 1) for j, a in ledger.account.items()
                          if a == account and j in ledger.started_at]
                         + [(ledger.ended_at[j], -1) for j, a in ledger.account.items()
                            if a == account and j in ledger.ended_at])
        running, points = 0, [(0.0, 0.0)]
        for at, step in changes:
            running += step
            points.append(((at - first) / 60_000, running / limit))
        found[account] = points
    return found


def table(rows: list[dict]) -> str:
    columns = ("system", "rows written / job", "rows read / job", "requests / job", "rows + requests $/M",
               "awake coordinating (object-s / job)", "coordination $/M (rows, requests, that time)",
               "awake in the jobs' run (object-s / job)", "Workers, Queues $/M", "all in $/M",
               "busy while jobs wait", "refill p50 / p99 (ms)", "out of oldest-first order", "p50 / p99 wait (s)",
               "makespan / bound (s)")
    return tables.markdown(columns, ((
        r["system"], r["rows_written_per_job"], r["rows_read_per_job"], r["requests_per_job"],
        r["dollars_per_million_jobs"], r["awake_coordinating_s_per_job"], r["coordination_dollars_per_million_jobs"],
        r["awake_in_jobs_s_per_job"], r["workers_and_queues_dollars_per_million_jobs"],
        r["all_in_dollars_per_million_jobs"],
        f"{r['busy_while_waiting']:.1%}", f"{r['refill_p50_ms']} / {r['refill_p99_ms']}", f"{r['out_of_order']:.1%}",
        f"{r['p50_wait_s']} / {r['p99_wait_s']}", f"{r['makespan_s']} / {r['makespan_bound_s']}") for r in rows))


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(rows) + 1, 1, figsize=(10, 2.4 * (len(rows) + 1)), constrained_layout=True)
    for axis, row in zip(axes, rows):
        for account, points in row["_timeline"].items():
            axis.step([p[0] for p in points], [p[1] for p in points], where="post", label=account, linewidth=0.8)
        axis.set_title(f"{row['system']}: busy while jobs wait {row['busy_while_waiting']:.1%}", fontsize=9)
        axis.set_ylabel("running ÷ limit")
        axis.set_ylim(0, 1.15)
        axis.legend(fontsize=7, loc="lower right")
    axes[-2].set_xlabel("virtual minutes")
    bars = axes[-1]
    labels = [r["system"].replace(", ", ",\n") for r in rows]  # two lines: six systems fit side by side
    bars.bar(labels, [r["dollars_per_million_jobs"] for r in rows], color="tab:gray")
    bars.set_ylabel("$ per million jobs")
    figure.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main() -> int:
    logging.disable(logging.WARNING)  # faults make every retry warn
    logging.getLogger("durability.jobs").setLevel(logging.CRITICAL)  # jobs that fail as asked give up loudly
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--accounts", type=int, default=3)
    parser.add_argument("--shards", type=int, default=24)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--short", action="store_true", help="jobs of 100 ms to 2 s instead of 1 to 30 s")
    parser.add_argument("--faults", action="store_true", help="the demo's faults, for every system")
    parser.add_argument("--system", action="append", choices=SYSTEMS, help="only these (repeat it)")
    parser.add_argument("--plot", type=Path, help="write a PNG here")
    parser.add_argument("--breakdown", action="store_true",
                        help="rows written per job, by table and kind, and rows read, by statement")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--record", type=Path, help="append every semaphore message and reply here (JSON lines)")
    args = parser.parse_args()
    accounts = [f"account-{i}" for i in range(args.accounts)]
    limits = limits_of(accounts)
    work = arrivals(args.seed, args.jobs, accounts, short=args.short)
    rows = []
    for system in args.system or SYSTEMS:
        rows.append(run_system(system, args, work, limits))
        print(f"{system}: done in {rows[-1]['real_seconds']} s", file=sys.stderr)
    title = (f"{args.jobs} {'short ' if args.short else ''}jobs, limits {list(limits.values())}, {args.shards} shards, "
             f"seed {args.seed}, {'with' if args.faults else 'no'} faults")
    if args.plot:
        plot(rows, args.plot, title)
    public = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    print(json.dumps(public, indent=2) if args.json else f"{title}\n\n{table(rows)}\n\n{class_table(rows)}")
    if args.breakdown and not args.json:
        for row in rows:
            print(f"\n{row['system']}: rows written per job, by table")
            for name, kind, per_job in row["rows_written_by_table"]:
                print(f"  {per_job:>6}  {name} {kind}")
            print(f"\n{row['system']}: rows read per job, the statements that read most")
            for statement, per_job in row["rows_read_by_statement"]:
                print(f"  {per_job:>7}  {statement[:150]}")
    healthy = all(not any(r["over_limit"].values()) and r["run_twice_at_once"] == 0 for r in rows)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
