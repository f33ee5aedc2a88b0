#!/usr/bin/env python3
"""Run the example Worker on the embedded runtime, under faults, and check it adds up.

    uv run scripts/demo_outbox.py [--seed N] [--counters N] [--tallies N] [--increments N]
                           [--no-faults] [--json]

Clients add amounts to counters; each counter reports its cumulative counts
to the tallies through the durable outbox, while calls between objects are
lost, duplicated, delayed and reordered, objects are evicted and crash
before their writes commit, and alarms fail. At the end every tally must
equal exactly what the counters counted. Prints what it cost, in the units
Cloudflare bills: rows written, rows read and requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter as Tallies
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from durability.testing import Faults, JsException, Runtime  # noqa: E402

FAULTS = Faults(
    lost_request=0.05, lost_reply=0.05, duplicate=0.05, latency_ms=(1, 40),
    evict=0.03, crash_before_commit=0.02, alarm_failure=0.05, duplicate_alarm=0.05,
)


async def client(runtime: Runtime, counter: str, tallies: list[str], increments: int,
                 rng: random.Random, expected: Tallies) -> int:
    """Add to one counter; after an error, read the count back to learn whether it applied."""
    errors = 0
    for _ in range(increments):
        tally, amount = rng.choice(tallies), rng.randint(1, 100)
        before = expected[(counter, tally)]
        while True:
            try:
                await runtime.env.COUNTER.getByName(counter).add(tally, amount)
                break
            except JsException:
                errors += 1
                with runtime.no_faults():
                    now = await runtime.env.COUNTER.getByName(counter).count(tally)
                if now == before + amount:
                    break  # it applied; only the reply was lost
        expected[(counter, tally)] = before + amount
        await asyncio.sleep(rng.uniform(0, 0.5))
    return errors


async def scenario(runtime: Runtime, args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    counters = [f"counter-{i}" for i in range(args.counters)]
    tallies = [f"tally-{i}" for i in range(args.tallies)]
    expected: Tallies = Tallies()
    errors = await asyncio.gather(*(
        client(runtime, c, tallies, args.increments, random.Random(rng.random()), expected)
        for c in counters
    ))
    added_at = runtime.now_ms()
    # Let the outboxes drain: faults go on meanwhile.
    while True:
        await asyncio.sleep(5)
        with runtime.no_faults():
            totals = {t: await runtime.env.TALLY.getByName(t).total() for t in tallies}
        want = {t: sum(v for (_, tt), v in expected.items() if tt == t) for t in tallies}
        if totals == want or runtime.now_ms() - added_at > 3_600_000:
            break
    return {
        "client_errors": sum(errors),
        "expected": want,
        "totals": totals,
        "settled_after_ms": round(runtime.now_ms() - added_at),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--counters", type=int, default=8)
    parser.add_argument("--tallies", type=int, default=3)
    parser.add_argument("--increments", type=int, default=40)
    parser.add_argument("--no-faults", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one JSON summary")
    args = parser.parse_args()
    if min(args.counters, args.tallies, args.increments) < 1:
        parser.error("--counters, --tallies and --increments must be at least 1")

    started = time.perf_counter()
    runtime = Runtime.from_wrangler(ROOT / "wrangler.toml", seed=args.seed,
                                    faults=None if args.no_faults else FAULTS)
    with runtime:
        outcome = runtime.run(scenario(runtime, args))
        totals = runtime.totals()
    increments = args.counters * args.increments
    events = Tallies(event for _, _, event, _ in runtime.trace)
    summary = {
        "seed": args.seed,
        "increments": increments,
        "exact": outcome["totals"] == outcome["expected"],
        "tallies": outcome["totals"],
        "faults": {k: events[k] for k in ("lost request", "lost reply", "duplicate", "alarm failed")}
        | {"evictions": totals["evictions"]},
        "client_errors": outcome["client_errors"],
        "settled_after_virtual_ms": outcome["settled_after_ms"],
        "virtual_seconds": round(runtime.loop.time(), 1),
        "real_seconds": round(time.perf_counter() - started, 2),
        "per_increment": {
            "rows_written": round(totals["rows_written"] / increments, 2),
            "rows_read": round(totals["rows_read"] / increments, 2),
            "requests": round(totals["requests"] / increments, 2),
        },
        "background_errors": len(runtime.errors),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"{increments} increments from {args.counters} counters into {args.tallies} tallies, seed {args.seed}")
        print(f"faults injected: {summary['faults']}")
        print(f"tallies: {summary['tallies']}")
        print(f"exact: {'yes' if summary['exact'] else 'NO'} "
              f"(settled {summary['settled_after_virtual_ms']} ms of virtual time after the last add)")
        per = summary["per_increment"]
        print(f"per increment: {per['rows_written']} rows written, {per['rows_read']} rows read, "
              f"{per['requests']} requests")
        print(f"{summary['virtual_seconds']} s of virtual time in {summary['real_seconds']} s")
    return 0 if summary["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
