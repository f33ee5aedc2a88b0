#!/usr/bin/env python3
"""What the example Worker's retention costs, and what it leaves: rows per finished job past the window.

    uv run scripts/bench_retention.py [--jobs N] [--accounts N]

Runs the example Worker (``src/entry.py``) on the embedded runtime in
virtual time: ``--jobs`` jobs of 1 s over ``--accounts`` accounts (one in
ten fails for good), all done within ten minutes; then the example's
window (``JOBS_KEPT_MS``, a day) passes but for four hours, and then six
more hours (past it, and the hour the purge may wait). Prints, per finished
job, the rows written while the objects idle inside the window (the alarms
set for the purge as each object went idle, and anything else) and the
rows written by the purge (the last ten hours), both
alarms included, over every object (and the rows read meanwhile: the
purge's scans, and the sweep's calls every 30 minutes); and the rows left per finished job past the window in
every table of every object, leaving out the rows that stand for an object
or a key (``durability_schema``, ``durability_semaphore_lease_ids``,
``durability_queue_pacing``; ``tests/example/test_example_retention.py``). Fails
(exit 1) if any row per job is left.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from durability.testing import Runtime  # noqa: E402

HOUR_S = 3_600
FIXED = {"durability_schema", "durability_semaphore_lease_ids", "durability_queue_pacing"}


def rows_by_table(runtime: Runtime) -> dict[str, int]:
    """table -> rows, summed over every object."""
    counts: dict[str, int] = {}
    for host in runtime.hosts():
        for table in host.db.inspect("SELECT name FROM sqlite_master WHERE type = 'table'"):
            name = table["name"]
            counts[name] = counts.get(name, 0) + host.db.inspect(f'SELECT count(*) AS n FROM "{name}"')[0]["n"]
    return {name: n for name, n in counts.items() if n}


def measure(jobs: int, accounts: int) -> dict:
    work = [{"id": f"job-{n}", "account": f"acct-{n % accounts}", "work_ms": 1_000, "fail": n % 10 == 0}
            for n in range(jobs)]
    awake_in_window = {"s": 0.0}
    with Runtime.from_wrangler(ROOT / "wrangler.toml", vars={"API_TOKEN": "t"}) as runtime:
        async def scenario():
            for job in work:
                await runtime.call_entrypoint("submit_job", job)
            await asyncio.sleep(600)
            idle, idle_awake = runtime.totals()["rows_written"], runtime.totals()["awake_s"]
            await asyncio.sleep(runtime.module.JOBS_KEPT_MS / 1000 - 4 * HOUR_S)
            within, totals = rows_by_table(runtime), runtime.totals()
            awake_in_window["s"] = totals["awake_s"] - idle_awake
            await asyncio.sleep(6 * HOUR_S)  # past the window, and the hour the purge may wait (slack_ms)
            purge = {name: runtime.totals()[name] - totals[name] for name in ("rows_written", "rows_read")}
            return within, totals["rows_written"] - idle, purge, rows_by_table(runtime)

        within, idle_rows, purge, after = runtime.run(scenario())
    per_job_left = sum(n for name, n in after.items() if name not in FIXED)
    return {
        "jobs": jobs,
        "job_rows_within_window": within.get("durability_jobs", 0),
        "rows_written_while_idle_in_window_per_job": round(idle_rows / jobs, 4),
        # Object-seconds awake over those idle hours, every object together (duration is billed):
        # the purge waits on the alarm, asleep.
        "awake_s_while_idle_in_window": round(awake_in_window["s"], 3),
        "rows_written_by_purge_per_job": round(purge["rows_written"] / jobs, 4),
        "rows_read_meanwhile_per_job": round(purge["rows_read"] / jobs, 1),
        "rows_left_per_job_past_window": per_job_left / jobs,
        "rows_left_standing_for_objects_or_keys": {n: c for n, c in after.items() if n in FIXED},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--accounts", type=int, default=3)
    args = parser.parse_args()
    figures = measure(args.jobs, args.accounts)
    print(json.dumps(figures, indent=2))
    return 1 if figures["rows_left_per_job_past_window"] else 0


if __name__ == "__main__":
    sys.exit(main())
