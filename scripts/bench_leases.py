#!/usr/bin/env python3
"""Lease modes against grants: admission latency on a key nobody contends, and work while its holder is down.

    uv run scripts/bench_leases.py [--jobs N] [--seed N] [--shards N] [--limit N] [--permits-per-lease N]
                                   [--outage-s S] [--system NAME ...] [--json]

Runs the example Worker (``src/entry.py``) on the embedded runtime in virtual
time, with grants and with leases in each provisioning mode (the systems of
``scripts/bench_vs_naive.py``), on one account whose limit is never reached:
one job at a time, every 1 to 4 s, each working 0.5 to 3 s, in 3 workflows
(a lease is per client and group). By default the limit (64) covers a full
lease for every shard and workflow (4 shards x 3 x 4 permits per lease):
with fewer permits than that, strict leases contend for the limit even
while little work runs (try ``--limit 8``). Two runs per system, on the
same arrivals:

- uncontended: the latency of admission, from the job's submission to the
  queue's ``admit()`` call for it, p50 and p99, and the share of jobs
  admitted from a lease, with no call to the holder (a grant needs the
  holder's answer, which comes at once when the key has room: its holder
  runs the round as the request arrives);
- holder down: the account's holder object refuses every call and runs no
  alarm for ``--outage-s`` seconds from a third of the way in; how many jobs
  were admitted while it was down, how many were submitted then, and the
  most that ran at once (never above the limit, or limit + extra with
  ``over``).

Also per system: requests and rows written per admitted job and dollars per
million jobs in the uncontended run (``bench/measure.py``'s prices). All
figures are ground truth measured outside the objects. Fails (exit 1) if
work ever ran above what its mode lets run, or a job ran twice at once.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT), str(ROOT / "scripts")]

from bench_vs_naive import LEASE_MODES, ceilings_of, drive, example_runtime  # noqa: E402

from bench import measure, tables  # noqa: E402
from bench.workload import Arrival  # noqa: E402
from durability.testing import Faults, Outage  # noqa: E402

SYSTEMS = ["grants", *LEASE_MODES]
ACCOUNT = "account-0"


def quiet_arrivals(seed: int, jobs: int) -> list[Arrival]:
    """One job at a time, every 1 to 4 s, working 0.5 to 3 s: the account's limit is never reached."""
    rng = random.Random(seed)
    found, at = [], 0.0
    for n in range(jobs):
        found.append(Arrival(at, {"id": f"job-{n:05d}", "account": ACCOUNT, "workflow": f"wf-{rng.randint(0, 2)}",
                                  "work_ms": rng.randint(500, 3_000), "fail": False}))
        at += rng.uniform(1_000, 4_000)
    return found


def run(system: str, args, work: list[Arrival], outage: tuple[float, float] | None) -> dict:
    """One run of ``system`` on ``work``; ``outage``: (from, for) ms, the holder down meanwhile."""
    limits = {ACCOUNT: args.limit}
    # (bench_vs_naive.example_runtime reads args.faults)
    args.faults = False if outage is None else Faults(outages=(Outage(f"AccountLimit:{ACCOUNT}", *outage, calls=True),))
    ledger, admitted_at, drawn = measure.Ledger(), {}, set()
    runtime = example_runtime(system, args, limits, ledger)
    shard_class = runtime.module.JobShard
    real_admit = shard_class._admit

    async def admit(shard, items):  # the moment the queue calls admit(), per item
        for item in items:
            admitted_at.setdefault(item.id, runtime.now_ms())
            if item.via == "lease":
                drawn.add(item.id)
        return await real_admit(shard, items)

    shard_class._admit = admit
    try:
        with runtime:
            runtime.run(drive(runtime, system, args, work, ledger))
            totals = runtime.totals()
    finally:
        shard_class._admit = real_admit
    jobs = len(ledger.started_at)
    latencies = [admitted_at[j] - ledger.submitted_at[j] for j in admitted_at]
    ceiling = ceilings_of(system, limits)[ACCOUNT]
    found = {"admitted": jobs, "latencies_ms": latencies, "drawn": len(drawn & set(admitted_at)),
             "over_limit": ledger.max_running.get(ACCOUNT, 0) > ceiling, "run_twice_at_once": ledger.overlaps,
             "max_running": ledger.max_running.get(ACCOUNT, 0), "ceiling": ceiling,
             "requests_per_job": totals["requests"] / max(jobs, 1),
             "rows_written_per_job": totals["rows_written"] / max(jobs, 1),
             "dollars_per_million_jobs": measure.dollars_per_million(totals, jobs),
             "awake_s_per_job": totals["awake_s"] / max(jobs, 1),
             "all_in_dollars_per_million_jobs": measure.dollars_per_million(totals, jobs)
             + measure.awake_dollars_per_million(totals["awake_s"], jobs)}
    if outage is not None:
        start = min(ledger.submitted_at.values())
        down = (start + outage[0], start + outage[0] + outage[1])
        found["admitted_while_down"] = sum(down[0] <= at < down[1] for at in admitted_at.values())
        found["submitted_while_down"] = sum(down[0] <= at < down[1] for at in ledger.submitted_at.values())
    return found


def row_of(system: str, args, work: list[Arrival]) -> dict:
    quiet = run(system, args, work, None)
    span = work[-1].at_ms
    outage_ms = args.outage_s * 1_000
    down = run(system, args, work, (span / 3, outage_ms))
    latencies = quiet["latencies_ms"]
    return {
        "system": system, "admitted": quiet["admitted"],
        "admission_p50_ms": round(measure.percentile(latencies, 0.5), 1),
        "admission_p99_ms": round(measure.percentile(latencies, 0.99), 1),
        "admitted_from_a_lease": round(quiet["drawn"] / max(len(latencies), 1), 4),
        "requests_per_job": round(quiet["requests_per_job"], 2),
        "rows_written_per_job": round(quiet["rows_written_per_job"], 2),
        "dollars_per_million_jobs": round(quiet["dollars_per_million_jobs"], 2),
        "awake_s_per_job": round(quiet["awake_s_per_job"], 2),
        "all_in_dollars_per_million_jobs": round(quiet["all_in_dollars_per_million_jobs"], 2),
        "outage_s": args.outage_s, "submitted_while_down": down["submitted_while_down"],
        "admitted_while_down": down["admitted_while_down"],
        "max_running": max(quiet["max_running"], down["max_running"]), "ceiling": quiet["ceiling"],
        "over_limit": quiet["over_limit"] or down["over_limit"],
        "run_twice_at_once": quiet["run_twice_at_once"] + down["run_twice_at_once"],
    }


def table(rows: list[dict]) -> str:
    columns = ("system", "admission p50 / p99 (ms)", "admitted from a lease", "requests / job",
               "rows + requests $/M", "awake (object-s / job)", "all in $/M",
               "admitted while the holder is down", "most running / ceiling")
    return tables.markdown(columns, ((
        r["system"], f"{r['admission_p50_ms']} / {r['admission_p99_ms']}", f"{r['admitted_from_a_lease']:.0%}",
        r["requests_per_job"], r["dollars_per_million_jobs"], r["awake_s_per_job"],
        r["all_in_dollars_per_million_jobs"],
        f"{r['admitted_while_down']} of {r['submitted_while_down']}", f"{r['max_running']} / {r['ceiling']}",
    ) for r in rows))


def main() -> int:
    logging.disable(logging.WARNING)  # an unreachable holder makes every retry warn
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--limit", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--permits-per-lease", type=int, default=4, help="the most one lease holds")
    parser.add_argument("--outage-s", type=float, default=120.0, help="how long the holder is down")
    parser.add_argument("--system", action="append", choices=SYSTEMS, help="only these (repeat it)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = quiet_arrivals(args.seed, args.jobs)
    rows = []
    for system in args.system or SYSTEMS:
        rows.append(row_of(system, args, work))
        print(f"{system}: done", file=sys.stderr)
    title = (f"{args.jobs} jobs one at a time, limit {args.limit}, {args.shards} shards, seed {args.seed}, "
             f"the holder down {args.outage_s:g} s")
    print(json.dumps(rows, indent=2) if args.json else f"{title}\n\n{table(rows)}")
    return 0 if all(not r["over_limit"] and r["run_twice_at_once"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
