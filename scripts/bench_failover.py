#!/usr/bin/env python3
"""Benchmark a key's holder restarted again and again: one holder against a budget tree.

    .venv/bin/python scripts/bench_failover.py [--periods 2,3,5] [--seeds 1,2,3] [--faults 0.03]
                                               [--seconds 150] [--round-period-ms 1000] [--json]

Runs, on the embedded runtime in virtual time, one key with a limit of 10
permits and 40 clients (items of 2 to 6 s arriving 20% faster than the
limit runs them, for ``--seconds``), the clients as ``scripts/bench_tree.py``
plays them (woken queues: answered at once, called back), the holders'
round period 1 s (``--round-period-ms``). The object that
holds the key's budget (the single holder, or the tree's root; a tree has 4
leaves of 10 clients) is evicted every ``--periods`` seconds from 5 s on,
and once without restarts. ``--faults`` adds that share of lost requests,
lost replies and duplicates to every call (the clients' too) and 1 to 5 ms
of latency each way; without it calls take 1 to 5 ms and never fail.

Prints, per restart period and system: items admitted in the window (and
as a share of the same system's run without restarts, and of the single
holder's under the same restarts: the figure that says whether a tree
keeps working), the restarts followed by an admission within 3 s
(anywhere in the key: a tree's leaves start work on the loans they hold
even while their root lends nothing, so this alone would not show a root
that stopped lending), the longest time after a restart with no
admission, and the most items running at once (never above the limit:
ground truth, outside the objects).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT), str(ROOT / "scripts")]

from bench_tree import KEY, WORKER, Driver, play  # noqa: E402

from durability.testing import Faults, Runtime, load_worker_module  # noqa: E402

LIMIT = 10
CLIENTS = 40
FAN_OUT = 4
WORK_MS = (2_000, 6_000)
OVERLOAD = 1.2
ROUND_PERIOD_MS = 1_000  #: the holders' round period (the tests' trees'): a restart every 2 s is every 2 periods
FIRST_RESTART_S = 5.0
SERVED_WITHIN_S = 3.0  #: a restart is served again if an item starts anywhere within this


def arrivals(seconds: float, seed: int) -> list[tuple[float, int, str, int]]:
    """(at s, client index, item id, work ms): Poisson arrivals at random clients."""
    rng = random.Random(seed)
    rate = OVERLOAD * LIMIT / (sum(WORK_MS) / 2 / 1000)
    plan, at = [], 0.0
    while True:
        at += rng.expovariate(rate)
        if at >= seconds:
            return plan
        plan.append((at, rng.randrange(CLIENTS), f"i{len(plan)}", rng.randint(*WORK_MS)))


def faults_of(rate: float) -> Faults:
    return Faults(lost_request=rate, lost_reply=rate, duplicate=rate, latency_ms=(1, 5), external=True)


async def restart_every(runtime: Runtime, period_s: float, until_s: float, restarts: list[float]) -> None:
    """Evict the key's holder (the tree's root) every ``period_s``, from ``FIRST_RESTART_S`` on."""
    start = runtime.loop.time()
    await asyncio.sleep(FIRST_RESTART_S)
    while runtime.loop.time() - start < until_s:
        runtime.evict(runtime.env.HOLDER.getByName(KEY))
        restarts.append(runtime.now_ms())
        await asyncio.sleep(period_s)


def gaps_after(restarts: list[float], starts: list[float], end_ms: float) -> list[float]:
    """Per restart at least ``SERVED_WITHIN_S`` before the window's end, ms until the
    next item started anywhere (until the window's end if none did)."""
    ordered = sorted(starts)
    return [next((s for s in ordered if s >= at), end_ms) - at
            for at in restarts if at <= end_ms - SERVED_WITHIN_S * 1000]


def run(tree: bool, period_s: float | None, seconds: float, fault_rate: float, seed: int,
        round_period_ms: float = ROUND_PERIOD_MS) -> dict:
    module = load_worker_module(WORKER)
    runtime = Runtime(module, {"HOLDER": "TreeBenchHolder", "CLIENTS": "BenchClient"},
                      vars={"LIMIT": LIMIT, "TREE": tree, "ROUND_PERIOD_MS": round_period_ms}, seed=seed,
                      faults=faults_of(fault_rate))
    driver = Driver(runtime, FAN_OUT if tree else None, CLIENTS, LIMIT)
    module.DRIVER = driver
    plan = arrivals(seconds, seed)
    restarts: list[float] = []
    start_ms = runtime.now_ms()

    async def scenario():
        if period_s is not None:
            restarting = asyncio.get_running_loop().create_task(
                restart_every(runtime, period_s, seconds, restarts))
        await play(driver, plan, give_up_s=0)
        if period_s is not None:
            await restarting

    runtime.run(scenario())
    end_ms = start_ms + seconds * 1000
    starts = [at for at in driver.ledger.started_at.values() if at <= end_ms]
    gaps = gaps_after(restarts, starts, end_ms)
    result = {
        "system": "tree" if tree else "single", "period_s": period_s, "seed": seed, "faults": fault_rate,
        "admitted": len(starts), "restarts": len(gaps),
        "served_within": sum(gap <= SERVED_WITHIN_S * 1000 for gap in gaps),
        "longest_gap_s": max(gaps, default=0) / 1000,
        "max_running": driver.ledger.max_running.get(KEY, 0),
    }
    runtime.close()
    if result["max_running"] > LIMIT:
        raise AssertionError(f"{result['max_running']} items ran at once, over the limit of {LIMIT}")
    return result


def table(rows: list[dict]) -> str:
    baseline = {(r["system"], r["seed"]): r["admitted"] for r in rows if r["period_s"] is None}
    single = {(r["period_s"], r["seed"]): r["admitted"] for r in rows if r["system"] == "single"}
    lines = ["| restart every | system | seeds | admitted | of its run without restarts | of the single holder's "
             "| restarts served within 3 s | longest gap after a restart (s) | most running |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["period_s"], row["system"]), []).append(row)
    for (period, system), group in groups.items():
        admitted = sum(r["admitted"] for r in group)
        unrestarted = sum(baseline[(system, r["seed"])] for r in group)
        by_single = sum(single.get((period, r["seed"]), 0) for r in group)
        restarts = sum(r["restarts"] for r in group)
        served = sum(r["served_within"] for r in group)
        lines.append(
            f"| {'never' if period is None else f'{period:g} s'} | {system} | {len(group)} | {admitted} "
            f"| {admitted / max(1, unrestarted):.0%} | {admitted / max(1, by_single):.0%} "
            f"| {f'{served}/{restarts} ({served / restarts:.1%})' if restarts else '-'} "
            f"| {max(r['longest_gap_s'] for r in group):.1f} | {max(r['max_running'] for r in group)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--periods", default="2,3,5", help="restart periods in seconds, comma-separated")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--faults", type=float, default=0.0, help="share of calls lost or duplicated")
    parser.add_argument("--seconds", type=float, default=150.0)
    parser.add_argument("--round-period-ms", type=float, default=ROUND_PERIOD_MS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    periods: list[float | None] = [None] + [float(p) for p in args.periods.split(",") if p]
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for period in periods:
            for tree in (False, True):
                rows.append(run(tree, period, args.seconds, args.faults, seed, args.round_period_ms))
                print(f"{rows[-1]}", file=sys.stderr)
    print(json.dumps(rows, indent=1) if args.json else table(rows))


if __name__ == "__main__":
    main()
