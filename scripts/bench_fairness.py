#!/usr/bin/env python3
"""Benchmark how one key's limit is shared when one tenant floods it: oldest first against fair-share policies.

    .venv/bin/python scripts/bench_fairness.py [--limit 1000] [--seed N] [--round-period-ms 500]
                                               [--policy NAME ...] [--plot PATH] [--json] [--quick]

Runs, on the embedded runtime in virtual time, one holder
(``scripts/bench_workers/fair_bench.py``) with a limit of 1,000, rounds
500 ms apart (``round_period_ms``; the library's default is 2 s: a freed
permit idles until the next round, see ``docs/semaphore.md``), and the
same arrivals under each policy. The flood: a deep backlog of six limits'
worth of items, all queued at the start, spread over 40 groups of one
tenant (``flood``), one client each. From 60 s to 240 s, four small
tenants (``small-a`` to ``small-d``, five clients each, one group each)
get items as a Poisson stream, each at a rate that keeps 15% of the limit
busy. Items run 20 to 80 s. Clients speak the wire protocol as a queue
would (``bench_tree``'s driver: a long poll, grants come claimed, releases
reported half a second after an item ends).

Policies: ``oldest`` (oldest first, the default), ``weighted`` (weights:
flood 2, each small tenant 1), ``floors`` (equal weights, each small tenant
a floor of 15% of the limit) and ``priorities`` (equal weights, the small
tenants one class above the flood). Every policy is measured against the
``weighted`` split: at every second of the run while some item waits, each
tenant with work has a weight-proportional share (the limit water-filled
by weight, none above its running plus waiting work); its gap is the mean
of its share of the limit minus the mean of that target over those
seconds. Prints per policy: the largest gap (points), each tenant's mean
share and target, the small tenants' p50 and p99 waits, their p99 over the
p99 they wait alone (the same small arrivals with no flood), the busy
share of the limit while items wait, and the longest a small tenant took
to reach the floor the ``floors`` policy gives it (or its work, if less)
from any moment it held less, sampled every 100 ms: all ground truth,
outside the objects.

``--plot PATH`` writes a PNG: each tenant's share of the limit over time
per policy, with its target dashed. ``--json`` prints a JSON list, one
object per policy, with the keys policy, share_error_points,
small_p99_over_alone, busy_while_waiting (and small_p50_s, small_p99_s,
floor_reached_within_s, tenants). ``--quick``: a limit of 100 and the small tenants for 60 s.
"""

from __future__ import annotations

import argparse
import bisect
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT), str(ROOT / "scripts")]

from bench_tree import KEY, WORK_MS, Client, Driver, play  # noqa: E402

from bench import measure, tables  # noqa: E402
from durability.testing import Runtime, load_worker_module  # noqa: E402

WORKER = Path(__file__).resolve().parent / "bench_workers" / "fair_bench.py"
FLOOD, FLOOD_GROUPS, FLOOD_LIMITS = "flood", 40, 6  # its backlog: six limits' worth of items
SMALL = ["small-a", "small-b", "small-c", "small-d"]
SMALL_CLIENTS, SMALL_BUSY = 5, 0.15  # each small tenant keeps this share of the limit busy
SMALL_FROM_S = 60
WEIGHTS = {FLOOD: 2, **{tenant: 1 for tenant in SMALL}}
POLICIES = {
    "oldest": None,
    "weighted": {"weights": WEIGHTS},
    "floors": {"floors": {tenant: 0.15 for tenant in SMALL}},  # shares of the limit, made counts per run
    "priorities": {"priorities": {tenant: 1 for tenant in SMALL}},
}
GIVE_UP_S = 1_200


def tenant_of(item_id: str) -> str:
    return item_id.split("/")[0]


def arrivals(limit: int, small_until_s: float, seed: int, flood: bool = True) -> list[tuple[float, int, str, int]]:
    """(at s, client index, item id, work ms): the flood's backlog at the
    start (clients 0-39), then the small tenants' Poisson streams (clients
    40 on, five per tenant)."""
    rng = random.Random(seed)
    plan = []
    if flood:
        plan = [(0.0, n % FLOOD_GROUPS, f"{FLOOD}/{n}", rng.randint(*WORK_MS)) for n in range(FLOOD_LIMITS * limit)]
    rate = SMALL_BUSY * limit / (sum(WORK_MS) / 2 / 1000)
    for t, tenant in enumerate(SMALL):
        at = SMALL_FROM_S + rng.random()
        while at < small_until_s:
            client = FLOOD_GROUPS + t * SMALL_CLIENTS + rng.randrange(SMALL_CLIENTS)
            plan.append((at, client, f"{tenant}/{len(plan)}", rng.randint(*WORK_MS)))
            at += rng.expovariate(rate)
    plan.sort()
    return plan


def clients() -> list[Client]:
    flood = [Client(f"{FLOOD}-{g:02d}", f"{FLOOD}/{g:02d}") for g in range(FLOOD_GROUPS)]
    return flood + [Client(f"{tenant}-{c}", f"{tenant}/jobs") for tenant in SMALL for c in range(SMALL_CLIENTS)]


def policy_vars(name: str, limit: int) -> str:
    policy = POLICIES[name]
    if policy is None:
        return ""
    if "floors" in policy:
        policy = {"floors": {tenant: round(share * limit) for tenant, share in policy["floors"].items()}}
    return json.dumps(policy)


def run(policy: str, limit: int, small_until_s: float, seed: int, round_period_ms: float,
        flood: bool = True) -> tuple[measure.Ledger, float]:
    """One run; the ledger of ground truth (each item's submission, start and end), and the
    holder's seconds awake (duration is billed)."""
    runtime = Runtime(load_worker_module(WORKER), {"HOLDER": "FairBenchHolder"},
                      vars={"LIMIT": limit, "POLICY": policy_vars(policy, limit),
                            "ROUND_PERIOD_MS": round_period_ms, "ROUND_WAIT_MS": min(1_000, round_period_ms / 2)},
                      seed=seed)
    driver = Driver(runtime, None, 0, limit)
    driver.clients = clients()
    plan = arrivals(limit, small_until_s, seed, flood)

    with runtime:
        runtime.run(play(driver, plan, GIVE_UP_S))
        awake_s = runtime.totals()["awake_s"]
    if driver.errors or len(driver.ledger.ended_at) < len(plan):
        raise AssertionError(f"{policy}: {len(driver.ledger.ended_at)} of {len(plan)} done; {driver.errors[:2]}")
    if driver.ledger.max_running.get(KEY, 0) > limit:
        raise AssertionError(f"{policy}: {driver.ledger.max_running[KEY]} ran at once, over the limit {limit}")
    return driver.ledger, awake_s


class Timeline:
    """Per tenant, its items running and waiting at any moment, by bisection over sorted times."""

    def __init__(self, ledger: measure.Ledger) -> None:
        self.start = min(ledger.submitted_at.values())
        self.times: dict[str, tuple[list[float], list[float], list[float]]] = {}
        for tenant in [FLOOD, *SMALL]:
            mine = [j for j in ledger.submitted_at if tenant_of(j) == tenant]
            self.times[tenant] = tuple(sorted(at[j] - self.start for j in mine) for at in (
                ledger.submitted_at, ledger.started_at, ledger.ended_at))
        self.end = max(ends[-1] for _, _, ends in self.times.values() if ends)

    def at(self, tenant: str, t: float) -> tuple[int, int]:
        """(running, waiting) at ``t`` ms after the start."""
        submitted, started, ended = (bisect.bisect_right(times, t) for times in self.times[tenant])
        return started - ended, submitted - started


def water_fill(limit: int, caps: dict[str, int], weights: dict[str, float]) -> dict[str, float]:
    """The weight-proportional split of ``limit``, none above its cap (its work)."""
    target, left, open_ = {}, float(limit), dict(caps)
    while open_:
        total = sum(weights[t] for t in open_)
        full = {t: c for t, c in open_.items() if c <= left * weights[t] / total}
        if not full:
            target.update({t: left * weights[t] / total for t in open_})
            break
        for tenant, cap in full.items():
            target[tenant] = cap
            left -= cap
            del open_[tenant]
    return target


def shares_over_time(ledger: measure.Ledger, limit: int) -> dict[str, list[tuple[float, float, float]]]:
    """Per tenant, (second, share, target share) at every second while some item waits and it has work."""
    timeline = Timeline(ledger)
    found: dict[str, list[tuple[float, float, float]]] = {tenant: [] for tenant in timeline.times}
    for second in range(int(timeline.end / 1000) + 1):
        state = {tenant: timeline.at(tenant, second * 1000.0) for tenant in timeline.times}
        if not any(waiting for _, waiting in state.values()):
            continue
        caps = {tenant: running + waiting for tenant, (running, waiting) in state.items() if running + waiting}
        target = water_fill(limit, caps, WEIGHTS)
        for tenant in caps:
            found[tenant].append((second, state[tenant][0] / limit, target[tenant] / limit))
    return found


def floor_reached_within_s(ledger: measure.Ledger, limit: int, step_ms: float = 100.0) -> float:
    """The longest a small tenant took, from any moment it held less than
    min(its floor under the ``floors`` policy, its work), to hold that many
    (or have nothing left waiting), in seconds, sampled every ``step_ms``."""
    timeline = Timeline(ledger)
    floor = round(POLICIES["floors"]["floors"][SMALL[0]] * limit)
    longest = 0.0
    for tenant in SMALL:
        samples = [timeline.at(tenant, n * step_ms) for n in range(int(timeline.end / step_ms) + 1)]
        for n, (running, waiting) in enumerate(samples):
            wanted = min(floor, running + waiting)
            if not waiting or running >= wanted:
                continue
            reached = next((m for m in range(n, len(samples)) if samples[m][0] >= wanted or not samples[m][1]),
                           len(samples))
            longest = max(longest, (reached - n) * step_ms / 1000)
    return longest


def row_of(policy: str, run_of: tuple[measure.Ledger, float], alone_p99_s: float, limit: int) -> dict:
    ledger, awake_s = run_of
    over_time = shares_over_time(ledger, limit)
    tenants = {}
    for tenant, samples in over_time.items():
        if samples:
            share = sum(s for _, s, _ in samples) / len(samples)
            target = sum(t for _, _, t in samples) / len(samples)
            tenants[tenant] = {"share": round(share, 4), "target": round(target, 4)}
    waits = [(ledger.started_at[j] - ledger.submitted_at[j]) / 1000 for j in ledger.started_at
             if tenant_of(j) in SMALL]
    p99 = measure.percentile(waits, 0.99)
    return {"policy": policy,
            "share_error_points": round(max(abs(t["share"] - t["target"]) * 100 for t in tenants.values()), 1),
            "small_p50_s": round(measure.percentile(waits, 0.5), 2), "small_p99_s": round(p99, 2),
            "small_p99_over_alone": round(p99 / alone_p99_s, 2) if alone_p99_s else None,
            "busy_while_waiting": round(measure.busy_share(ledger, {KEY: limit})[0], 4),
            "floor_reached_within_s": round(floor_reached_within_s(ledger, limit), 1),
            "awake_s_per_admission": round(awake_s / max(1, len(ledger.started_at)), 4),
            "tenants": tenants, "over_time": over_time}


def table(rows: list[dict], alone_p99_s: float) -> str:
    columns = ("policy", "largest gap (points)", "flood share / target", "small shares / targets",
               "small p50 / p99 wait (s)", f"small p99 / alone ({alone_p99_s:.1f} s)", "busy while waiting",
               "floor reached within (s)", "holder awake (s / admission)")
    return tables.markdown(columns, ((
        r["policy"], r["share_error_points"], _share(r["tenants"][FLOOD]),
        ", ".join(_share(r["tenants"][t]) for t in SMALL if t in r["tenants"]),
        f"{r['small_p50_s']} / {r['small_p99_s']}", r["small_p99_over_alone"], f"{r['busy_while_waiting']:.1%}",
        r["floor_reached_within_s"], r["awake_s_per_admission"],
    ) for r in rows))


def _share(tenant: dict) -> str:
    return f"{tenant['share']:.0%} / {tenant['target']:.0%}"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows), figsize=(5 * len(rows), 4), sharey=True, squeeze=False)
    for axis, row in zip(axes[0], rows):
        for n, (tenant, samples) in enumerate(sorted(row["over_time"].items())):
            color = f"C{n}"
            seconds = [s for s, _, _ in samples]
            axis.plot(seconds, [share for _, share, _ in samples], color=color, linewidth=1, label=tenant)
            axis.plot(seconds, [target for _, _, target in samples], color=color, linewidth=0.8, linestyle="--")
        axis.set_title(f"{row['policy']}: gap {row['share_error_points']} pts, "
                       f"small p99 x{row['small_p99_over_alone']}")
        axis.set_xlabel("virtual seconds")
    axes[0][0].set_ylabel("share of the limit (dashed: weight-proportional target)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--round-period-ms", type=float, default=500,
                        help="the holder's round period (its round wait: half of it, at most 1 s)")
    parser.add_argument("--policy", action="append", choices=list(POLICIES), help="only these (repeat it)")
    parser.add_argument("--quick", action="store_true", help="limit 100, the small tenants for 60 s")
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    limit = 100 if args.quick else args.limit
    until = SMALL_FROM_S + (60 if args.quick else 180)
    alone, _ = run("oldest", limit, until, args.seed, args.round_period_ms, flood=False)
    alone_p99_s = measure.percentile([(alone.started_at[j] - alone.submitted_at[j]) / 1000
                                      for j in alone.started_at], 0.99)
    rows = []
    for policy in args.policy or list(POLICIES):
        rows.append(row_of(policy, run(policy, limit, until, args.seed, args.round_period_ms), alone_p99_s, limit))
        print(f"{policy}: done", file=sys.stderr, flush=True)
    if args.plot:
        plot(rows, args.plot)
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if k != "over_time"} for r in rows], indent=1))
        return
    print(f"one key, limit {limit:,}, round period {args.round_period_ms:g} ms, seed {args.seed}: a flood of "
          f"{FLOOD_LIMITS * limit:,} items over {FLOOD_GROUPS} groups at the start, four small tenants "
          f"from {SMALL_FROM_S} s to {until:g} s (each {SMALL_BUSY:.0%} of the limit); targets: weights "
          f"flood {WEIGHTS[FLOOD]}, small 1 each\n")
    print(table(rows, alone_p99_s))


if __name__ == "__main__":
    main()
