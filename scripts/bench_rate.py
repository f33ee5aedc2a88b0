#!/usr/bin/env python3
"""A start rate next to concurrency, on the example Worker: exact in every window, and used while work waits.

    uv run scripts/bench_rate.py [--rate 60/min] [--minutes 10] [--shards 24] [--seed N] [--faults]
                                 [--quick] [--json] [--plot PATH]

Floods one account at ten times its rate for ``--minutes`` (jobs of 1 to
5 s, arriving evenly, each to one of ``--shards`` shards) on the embedded
runtime in virtual time, and runs it three ways on exactly the same
arrivals, each until every job is done:

- ``rate``: ``ACCOUNT_RATE`` set, concurrency 1,000: the rate binds;
- ``both``: the same rate, concurrency 2 with jobs of 5 to 10 s: the
  concurrency binds (about 16 starts a minute), and the rate must hold all
  the same;
- ``no rate``: concurrency 1,000 alone: what the same admissions cost
  without a rate.

Prints per run, from ground truth outside the objects (a job starts when
its shard's queue admits it: the admission is written, its permit taken,
and its run begins right after): the most starts in any window of the period
(``max_in_any_window``) against ``limit + burst``, the windows over it,
the starts per period achieved while work waited (``achieved_per_period``)
and its share of the limit (``busy_while_waiting``), how late a start came
after the rate allowed it (``p99_start_delay_ms``), the most jobs running
at once, the permits the holder still counts once every job is done
(leaked), and rows written and requests per admitted job. ``--faults``
adds the demo's faults (calls lost, duplicated and delayed, evictions,
crashes, alarm failures, 5% of releases lost). ``--quick``: two minutes
of flood. ``--plot`` writes a PNG: per run, the starts in the window of
the period that ends at each second, against ``limit + burst``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT), str(ROOT / "scripts")]

from bench_vs_naive import SETTLE_MS, faults_of  # noqa: E402

from bench import measure, rates  # noqa: E402
from bench.workload import LostReleases  # noqa: E402
from durability.semaphore.holder.pure.rate import Rate  # noqa: E402
from durability.testing import HIBERNATE_AFTER_MS, JsException, Runtime  # noqa: E402

ACCOUNT = "account-0"
RUNS = {"rate": (True, 1_000, (1_000, 5_000)), "both": (True, 2, (5_000, 10_000)),
        "no rate": (False, 1_000, (1_000, 5_000))}


def flood(rate: Rate, minutes: float, seed: int, work_ms: tuple[int, int]) -> list[tuple[float, dict]]:
    """Ten times the rate, evenly, for ``minutes``: (arrival ms, job)."""
    rng = random.Random(seed)
    gap = rate.period_ms / (10 * rate.limit)
    count = int(minutes * 60_000 / gap)
    return [(k * gap, {"id": f"job-{k:05d}", "account": ACCOUNT, "workflow": "wf-0",
                       "work_ms": rng.randint(*work_ms), "fail": False}) for k in range(count)]


@contextlib.contextmanager
def admissions(runtime: Runtime, runtime_now, into: dict[str, float]):
    """Record when each item is first admitted (the queue writes it admitted)."""
    store = sys.modules["durability.semaphore.queue.store"].QueueStore
    real_move = store.move_item

    def move_item(self, item, to, *args, **kwargs):
        result = real_move(self, item, to, *args, **kwargs)
        if to == "admitted":
            into.setdefault(item.id, runtime_now())
        return result

    store.move_item = move_item
    try:
        yield
    finally:
        store.move_item = real_move


def runtime_for(args, rated: bool, concurrency: int, ledger: measure.Ledger) -> Runtime:
    runtime = Runtime.from_wrangler(ROOT / "wrangler.toml", seed=args.seed, faults=faults_of(args.faults),
                                    hibernate_after_ms=HIBERNATE_AFTER_MS, vars={
        "ACCOUNT_CONCURRENCY": str(concurrency), "ACCOUNT_RATE": args.rate if rated else "",
        "SHARDS": str(args.shards)})
    real_run_job = runtime.module.run_job

    async def run_job(env, job):
        ledger.started(job["id"], runtime.now_ms())
        try:
            return await real_run_job(env, job)
        finally:
            ledger.ended(job["id"], runtime.now_ms())

    runtime.module.run_job = run_job
    return runtime


async def drive(runtime: Runtime, work: list[tuple[float, dict]], ledger: measure.Ledger, concurrency: int) -> int:
    """Submit the flood, wait until every job is done; the permits the holder still counts then."""
    start = runtime.now_ms()
    for at, job in work:
        await asyncio.sleep(max(0.0, start + at - runtime.now_ms()) / 1000)
        ledger.submitted(job["id"], job["account"], job["work_ms"], runtime.now_ms())
        while True:  # idempotent on the job id: retried until it lands
            try:
                await runtime.call_entrypoint("submit_job", job)
                break
            except JsException:
                await asyncio.sleep(0.5)
    # (Where the concurrency binds, the jobs take their work over it: six hours at ten minutes of flood.)
    deadline = runtime.now_ms() + SETTLE_MS + 2 * sum(job["work_ms"] for _, job in work) / concurrency
    while len(ledger.ended_at) < len(work) and runtime.now_ms() < deadline:
        await asyncio.sleep(10)
    await asyncio.sleep(120)  # the last releases reach the holder
    while True:  # (under faults the read itself may fail: read again)
        try:
            return (await runtime.env.ACCOUNT_LIMIT.getByName(ACCOUNT).usage())["outstanding"]
        except JsException:
            await asyncio.sleep(1)


def run(name: str, args, rate: Rate) -> dict:
    rated, concurrency, work_ms = RUNS[name]
    ledger = measure.Ledger()
    runtime = runtime_for(args, rated, concurrency, ledger)
    work = flood(rate, args.minutes, args.seed, work_ms)
    lost = LostReleases(runtime.module.DurabilitySemaphoreQueue, 0.05, random.Random(args.seed + 1)) \
        if args.faults else contextlib.nullcontext()
    began = time.perf_counter()
    starts: dict[str, float] = {}
    with runtime, lost, admissions(runtime, runtime.now_ms, starts):
        leaked = runtime.run(drive(runtime, work, ledger, concurrency))
        totals = runtime.totals()
    jobs = len(ledger.started_at)
    delays = rates.start_delays_ms(ledger.submitted_at, starts, rate.most, rate.period_ms)
    achieved = rates.achieved_per_period(ledger.submitted_at, starts, rate.period_ms)
    return {
        "run": name, "limit": rate.limit, "burst": rate.burst, "period_ms": rate.period_ms,
        "concurrency": concurrency, "jobs": len(work), "admitted": jobs,
        "max_in_any_window": rates.most_in_any_window(list(starts.values()), rate.period_ms),
        "windows_over": rates.windows_over(list(starts.values()), rate.period_ms, rate.most) if rated else None,
        "achieved_per_period": round(achieved, 2) if rated else None,
        "busy_while_waiting": round(achieved / rate.limit, 4) if rated else None,
        # (where the concurrency binds, starts come later than the rate allows: not the rate's delay)
        "p99_start_delay_ms": round(measure.percentile(delays, 0.99)) if name == "rate" else None,
        "max_running": ledger.max_running.get(ACCOUNT, 0), "leaked_permits": leaked,
        "all_done": len(ledger.ended_at) == len(work),
        "rows_written_per_admission": round(totals["rows_written"] / max(jobs, 1), 2),
        "requests_per_admission": round(totals["requests"] / max(jobs, 1), 2),
        "real_seconds": round(time.perf_counter() - began, 1),
        "_starts": sorted(starts.values()),
    }


COLUMNS = [("run", "run"), ("max_in_any_window", "most in a window"), ("windows_over", "windows over"),
           ("achieved_per_period", "starts / period while waiting"), ("busy_while_waiting", "of the rate"),
           ("p99_start_delay_ms", "start delay p99 ms"), ("max_running", "most running"), ("leaked_permits", "leaked"),
           ("rows_written_per_admission", "rows / job"), ("requests_per_admission", "requests / job")]


def in_window_each_second(starts: list[float], period_ms: float) -> tuple[list[float], list[int]]:
    """(minutes since the first start, starts in the window ending then), one point per second."""
    if not starts:
        return [], []
    first, points, counts = starts[0], [], []
    for second in range(int((starts[-1] - first) / 1000) + 2):
        at = first + second * 1000
        points.append(second / 60)
        counts.append(bisect.bisect_right(starts, at) - bisect.bisect_right(starts, at - period_ms))
    return points, counts


def plot(rows: list[dict], rate: Rate, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rated = [row for row in rows if row["windows_over"] is not None]
    figure, axes = plt.subplots(len(rated), 1, figsize=(10, 2.6 * len(rated)), constrained_layout=True,
                                squeeze=False)
    for axis, row in zip(axes[:, 0], rated):
        minutes, counts = in_window_each_second(row["_starts"], rate.period_ms)
        axis.plot(minutes, counts, linewidth=0.7, label="starts in the window ending then")
        axis.axhline(rate.most, color="tab:red", linewidth=0.8, linestyle="--", label="limit + burst")
        axis.set_title(f"{row['run']}: most in a window {row['max_in_any_window']}, "
                       f"{row['windows_over']} windows over", fontsize=9)
        axis.set_ylabel("starts per window")
        axis.set_ylim(0, rate.most * 1.2)
        axis.legend(fontsize=7, loc="lower right")
    axes[-1, 0].set_xlabel("virtual minutes since the first start")
    figure.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join("" if row[key] is None else str(row[key]) for key, _ in COLUMNS) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", default="60/min", help="the account's ACCOUNT_RATE (default 60/min)")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the flood lasts")
    parser.add_argument("--shards", type=int, default=24)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", action="store_true", help="the demo's faults")
    parser.add_argument("--quick", action="store_true", help="two minutes of flood")
    parser.add_argument("--run", action="append", choices=list(RUNS), help="only these runs")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--plot", type=Path, help="write starts per window over time to this PNG")
    args = parser.parse_args()
    if args.quick:
        args.minutes = 2.0
    rate = Rate.parse(args.rate)
    rows = [run(name, args, rate) for name in args.run or RUNS]
    title = (f"rate {args.rate}, {args.minutes:g} minutes of flood at ten times it, {args.shards} shards, "
             f"seed {args.seed}{', faults' if args.faults else ''}; most allowed in a window: {rate.most}")
    if args.plot:
        plot(rows, rate, args.plot, title)
    if args.json:
        print(json.dumps([{k: v for k, v in row.items() if not k.startswith("_")} for row in rows], indent=1))
    else:
        print(title)
        print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
