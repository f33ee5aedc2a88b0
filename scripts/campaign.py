"""The simulation campaign: thousands of generated scenarios per mode, every invariant at every step.

    uv run scripts/campaign.py --seeds 2500                 # every mode, seeds 0..2499
    uv run scripts/campaign.py --seeds 50 --mode strict --json
    uv run scripts/campaign.py --replay 123 --mode over --shrink
    uv run scripts/campaign.py --seeds 20 --mode grants --plant over_grant --shrink
    uv run scripts/campaign.py --seeds 200 --replay-check   # each seed in two processes, traces compared

Each run draws a scenario from its seed and mode (``campaign.scenario``),
runs it on the embedded runtime in virtual time (``campaign.run``) and
checks it against ground truth kept outside the objects
(``campaign.checks``). Runs go over every core. A summary per mode gives
runs, steps checked, violations by invariant and virtual hours simulated;
``--json`` prints them as a JSON list instead. A failing seed replays
exactly with ``--replay``; ``--shrink`` reduces the first failure to a
minimal scenario, printed as a ready-to-paste pytest case. ``--plant``
plants a defect on purpose, to show the checks catch it. ``--replay-check``
runs the seeds twice, in two processes with different ``PYTHONHASHSEED``,
and compares each run's trace (every call, fault and event, with its
virtual time): a run that follows hash order or object addresses shows as
a seed whose traces differ. The exit code is 1 when any run fails, or
when any seed's traces differ.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from bench.progress import Progress  # noqa: E402
from campaign.run import run  # noqa: E402
from campaign.scenario import ALL_MODES, MODES, PLANTS, generate, with_plant  # noqa: E402
from campaign.shrink import as_pytest_case, shrink  # noqa: E402


def one(task: tuple[str, int, str | None]) -> dict:
    mode, seed, plant = task
    try:
        outcome = run(with_plant(generate(seed, mode), plant))
    except Exception as error:  # a run that crashes is a failure too
        return {"mode": mode, "seed": seed, "steps": 0, "virtual_ms": 0.0,
                "violations": {"crash": 1}, "first": {"crash": repr(error)[:300]}, "excused": {}}
    return {"mode": mode, "seed": seed, "steps": outcome.steps, "virtual_ms": outcome.virtual_ms,
            "violations": dict(outcome.violations.counts), "first": outcome.violations.first,
            "excused": dict(outcome.excused), "digest": outcome.digest}


def summarize(results: list[dict], modes: list[str]) -> list[dict]:
    summary = []
    for mode in modes:
        mine = [r for r in results if r["mode"] == mode]
        by_invariant, excused = collections.Counter(), collections.Counter()
        for r in mine:
            by_invariant.update(r["violations"])
            excused.update({k: 1 for k in r["excused"]})  # runs
        failing = sorted(r["seed"] for r in mine if r["violations"])
        summary.append({
            "mode": mode, "runs": len(mine), "steps_checked": sum(r["steps"] for r in mine),
            "violations": sum(by_invariant.values()),
            "virtual_hours": round(sum(r["virtual_ms"] for r in mine) / 3.6e6, 2),
            "by_invariant": dict(by_invariant), "failing_seeds": failing[:20], "excused_runs": dict(excused),
        })
    return summary


def print_summary(summary: list[dict], seconds: float, jobs: int) -> None:
    print(f"{'mode':<8} {'runs':>6} {'steps checked':>14} {'violations':>11} {'virtual hours':>14}  by invariant")
    for row in summary:
        print(f"{row['mode']:<8} {row['runs']:>6} {row['steps_checked']:>14} {row['violations']:>11} "
              f"{row['virtual_hours']:>14}  {row['by_invariant'] or '-'}")
        if row["failing_seeds"]:
            print(f"         failing seeds: {row['failing_seeds']}")
        for what, runs in row["excused_runs"].items():
            print(f"         not counted, as the spec allows: {what} ({runs} runs)")
    print(f"{sum(r['runs'] for r in summary)} runs in {seconds:.0f} s on {jobs} processes")


def shrink_and_print(mode: str, seed: int, plant: str | None) -> None:
    scenario = with_plant(generate(seed, mode), plant)
    first = run(scenario)
    invariants = sorted(first.violations.counts)
    if not invariants:
        print(f"{mode} seed {seed} passes: nothing to shrink")
        return
    print(f"{mode} seed {seed} fails {invariants}: {first.violations.first}", file=sys.stderr)
    smallest, runs = shrink(scenario, lambda s: bool(set(run(s).violations.counts) & set(invariants)))
    print(f"shrunk from size {scenario.size()} to {smallest.size()} in {runs} runs:", file=sys.stderr)
    print(as_pytest_case(smallest, invariants))


#: the two hash seeds of --replay-check: 0 turns hash randomization off, the other is any other
HASH_SEEDS = ("0", "1729")


def replay_check(args: argparse.Namespace, modes: list[str]) -> int:
    """Every seed run in two processes whose strings hash differently; their traces compared."""
    command = [sys.executable, __file__, "--seeds", str(args.seeds), "--start", str(args.start), "--digests",
               "--jobs", str(max(1, args.jobs // 2)), *(f"--mode={mode}" for mode in modes)]
    started = time.time()
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONHASHSEED": hash_seed}) for hash_seed in HASH_SEEDS]
    first, second = ({(r["mode"], r["seed"]): r["digest"] for r in json.loads(p.communicate()[0])}
                     for p in processes)
    if first.keys() != second.keys() or not first:
        print("replay check: the two processes did not run the same seeds", file=sys.stderr)
        return 1
    rows = []
    for mode in modes:
        seeds = sorted(seed for (m, seed) in first if m == mode)
        differing = [seed for seed in seeds if first[mode, seed] != second[mode, seed]]
        rows.append({"mode": mode, "runs": len(seeds), "identical": len(seeds) - len(differing),
                     "differing_seeds": differing})
    if args.json:
        print(json.dumps(rows))
    else:
        print(f"{'mode':<8} {'seeds':>6} {'identical traces':>17}  "
              f"(PYTHONHASHSEED {' against '.join(HASH_SEEDS)})")
        for row in rows:
            print(f"{row['mode']:<8} {row['runs']:>6} {row['identical']:>17}  "
                  + (f"differing seeds: {row['differing_seeds'][:20]}" if row["differing_seeds"] else ""))
        print(f"{2 * len(first)} runs in {time.time() - started:.0f} s")
    return 1 if any(row["differing_seeds"] for row in rows) else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=50, help="runs per mode (seeds start..start+N-1)")
    parser.add_argument("--start", type=int, default=0, help="the first seed")
    parser.add_argument("--mode", action="append", choices=ALL_MODES + ("all",),
                        help="a mode to run (repeat it; default: all)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    parser.add_argument("--json", action="store_true", help="print a JSON list, one object per mode")
    parser.add_argument("--replay", type=int, metavar="SEED", help="run one seed of one --mode and print it")
    parser.add_argument("--shrink", action="store_true", help="shrink the first failure to a pytest case")
    parser.add_argument("--plant", choices=PLANTS, help="plant a defect on purpose (budget modes)")
    parser.add_argument("--replay-check", action="store_true",
                        help="run every seed in two processes with different PYTHONHASHSEED; compare traces")
    parser.add_argument("--digests", action="store_true", help=argparse.SUPPRESS)  # --replay-check's half
    args = parser.parse_args()
    modes = list(MODES) if not args.mode or "all" in args.mode else list(dict.fromkeys(args.mode))
    if args.plant and "locks" in modes:
        modes.remove("locks")  # the planted defects are in the budget's holder and queue

    if args.replay_check:
        return replay_check(args, modes)
    if args.replay is not None:
        if len(modes) != 1:
            parser.error("--replay needs exactly one --mode")
        if args.shrink:
            shrink_and_print(modes[0], args.replay, args.plant)
            return 0
        result = one((modes[0], args.replay, args.plant))
        print(json.dumps(result, indent=2))
        return 1 if result["violations"] else 0

    tasks = [(mode, seed, args.plant) for seed in range(args.start, args.start + args.seeds) for mode in modes]
    started = time.time()
    results, failed = [], 0
    bar = Progress(len(tasks))
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for result in pool.imap_unordered(one, tasks, chunksize=4):
            results.append(result)
            if result["violations"]:
                failed += 1
                bar.note(f"{result['mode']} seed {result['seed']} failed: {result['first']}")
            rate = len(results) / max(time.time() - started, 1e-9)
            bar.show(len(results), f"{len(results)}/{len(tasks)} runs, {failed} failed, {rate:.1f} runs/s")
    bar.end()
    summary = summarize(results, modes)
    if args.digests:
        print(json.dumps([{"mode": r["mode"], "seed": r["seed"], "digest": r["digest"]} for r in results]))
    elif args.json:
        print(json.dumps([{k: row[k] for k in ("mode", "runs", "steps_checked", "violations", "virtual_hours")}
                          for row in summary]))
    else:
        print_summary(summary, time.time() - started, args.jobs)
    if failed and args.shrink:
        first = min((r for r in results if r["violations"]), key=lambda r: (modes.index(r["mode"]), r["seed"]))
        shrink_and_print(first["mode"], first["seed"], args.plant)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
