#!/usr/bin/env python3
"""Benchmark one DurabilitySemaphore holder under bursty demand from many clients.

    .venv/bin/python scripts/bench_holder.py [--quick] [--seed N] [--scales 100,1000,10000]

Runs the holder Worker in scripts/bench_workers/holder_bench.py on the
embedded runtime (virtual time), with 100, 1,000 and 10,000 clients whose
demand falls in 1 to 5 groups each. Every round some clients get a burst of
work; every client with something queued or something to report sends one
``request``: its queued count per group, and cumulative ``claimed`` /
``released`` reports for its grants. A client claims what it is granted at
once and releases each item 2 to 8 s (virtual) later.

Prints per scale: the holder's CPU per round (``time.process_time`` around
the whole holder round, and the part of it spent in ``allocation.run_round``
and in the store's write), and rows read, rows written (rows plus alarm
writes, as billed) and RPC calls (requests plus alarm invocations) per
admitted permit, from the runtime's billing counters; then how per-round CPU
grows from scale to scale against n and n log n.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import random
import sqlite3
import sys
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from durability.semaphore import holder as holder_module  # noqa: E402
from durability.semaphore import store as store_module  # noqa: E402
from durability.testing import Runtime, load_worker_module  # noqa: E402

WORKER = Path(__file__).resolve().parent / "bench_workers" / "holder_bench.py"
GROUPS = [f"wf{i:02d}" for i in range(50)]
LIMITED = {g: 40 for g in GROUPS[:5]}  # five groups carry a ceiling of their own
ROUND_GAP_S = 2.0  # the holder's default round period: clients ask again every 2 s


# -- timing the holder's rounds from outside -----------------------------------------
class Cpu:
    """CPU seconds spent inside holder rounds, by part; reset per scale."""

    rounds: list[float] = []
    run_round = 0.0  # allocation.run_round: the pure decision
    write = 0.0  # HolderStore.write on the embedded runtime's SQL (with its billing emulation)
    write_plain = 0.0  # the same statements on a plain in-memory sqlite3, for comparison
    gc = 0.0  # garbage collection that happened during rounds
    in_round = False
    _gc_start = 0.0

    @classmethod
    def reset(cls) -> None:
        cls.rounds, cls.run_round, cls.write, cls.write_plain, cls.gc = [], 0.0, 0.0, 0.0, 0.0


def _timed(fn, slot):
    def timed(*args, **kwargs):
        start = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            setattr(Cpu, slot, getattr(Cpu, slot) + time.process_time() - start)

    return timed


_whole_round = holder_module.DurabilitySemaphore._run_round


def _timed_round(self, batch):
    start = time.process_time()
    Cpu.in_round = True
    try:
        return _whole_round(self, batch)
    finally:
        Cpu.in_round = False
        Cpu.rounds.append(time.process_time() - start)


def _on_gc(phase, info):
    if not Cpu.in_round:
        return
    if phase == "start":
        Cpu._gc_start = time.process_time()
    else:
        Cpu.gc += time.process_time() - Cpu._gc_start


class _PlainSql:
    """Just enough of ``Sql`` for ``HolderStore.write``, on a bare sqlite3 connection."""

    def __init__(self) -> None:
        self.conn = sqlite3.connect(":memory:", isolation_level=None)
        for statement in store_module._SCHEMA[1]:
            self.conn.execute(statement)

    def exec(self, query, *bindings):
        return self.conn.execute(query, bindings)


_write = store_module.HolderStore.write
_shadow: list[_PlainSql] = []


def _timed_write(self, changes):
    counted = Cpu.in_round  # alarm reclaims write too, outside rounds
    start = time.process_time()
    try:
        return _write(self, changes)
    finally:
        middle = time.process_time()
        shadow = _shadow[0]
        shadow.conn.execute("BEGIN")
        _write(SimpleNamespace(sql=shadow), changes)
        shadow.conn.execute("COMMIT")
        if counted:
            Cpu.write += middle - start
            Cpu.write_plain += time.process_time() - middle


holder_module.DurabilitySemaphore._run_round = _timed_round
holder_module.run_round = _timed(holder_module.run_round, "run_round")
store_module.HolderStore.write = _timed_write
gc.callbacks.append(_on_gc)


# -- the clients ------------------------------------------------------------------------
class Client:
    def __init__(self, client_id: str, groups: list[str]) -> None:
        self.id = client_id
        self.groups = groups
        self.queue = {g: deque() for g in groups}  # enqueue times of items no claim covers
        self.grants: dict[str, dict] = {}  # grantId -> group, permits, claimed, released, confirmed
        self.running: list[tuple[float, str]] = []  # (finishes at, grantId)
        self.claimed = 0
        self.errors = 0

    def burst(self, rng: random.Random, now: float, most: int) -> None:
        for group in rng.sample(self.groups, rng.randint(1, len(self.groups))):
            self.queue[group].extend([now] * rng.randint(1, most))

    def finish(self, now: float) -> None:
        still = []
        for finishes_at, grant_id in self.running:
            if finishes_at <= now:
                self.grants[grant_id]["released"] += 1
            else:
                still.append((finishes_at, grant_id))
        self.running = still

    def message(self) -> dict | None:
        demand = [{"group": g, "count": len(q), "oldestAt": q[0]} for g, q in self.queue.items() if q]
        reports = [
            {"grantId": gid, "claimed": g["claimed"], "released": g["released"]}
            for gid, g in self.grants.items() if (g["claimed"], g["released"]) != g["confirmed"]
        ][:256]
        if not demand and not reports:
            return None
        return {"type": "request", "v": 1, "clientId": self.id, "demand": demand, "grants": reports}

    def receive(self, reply: dict, now: float, rng: random.Random) -> None:
        if reply.get("type") != "grants":
            self.errors += 1
            return
        for report in reply["reports"]:
            grant = self.grants.get(report["grantId"])
            if grant is None:
                continue
            if report["status"] == "not_found":
                del self.grants[report["grantId"]]
                continue
            grant["confirmed"] = (report["claimed"], report["released"])
            if report["released"] >= report["permits"] and grant["released"] >= grant["claimed"]:
                del self.grants[report["grantId"]]  # settled
        for offered in reply["grants"]:
            grant = self.grants.setdefault(offered["grantId"], {
                "group": offered["group"], "permits": offered["permits"], "claimed": offered["claimed"],
                "released": 0, "confirmed": (offered["claimed"], 0),
            })
            queue = self.queue[grant["group"]]
            take = min(grant["permits"] - grant["claimed"], len(queue))
            for _ in range(take):
                queue.popleft()
                self.running.append((now + rng.uniform(2_000, 8_000), offered["grantId"]))
            grant["claimed"] += take
            self.claimed += take


async def one_call(stub, client: Client, now: float, rng: random.Random) -> int:
    client.finish(now)
    message = client.message()
    if message is None:
        return 0
    client.receive(await stub.permits(message), now, rng)
    return 1


# -- one scale --------------------------------------------------------------------------------
def bench(n: int, rounds: int, seed: int, burst: int = 4) -> dict:
    rng = random.Random(seed)
    limit = 3 * n
    module = load_worker_module(WORKER)
    Cpu.reset()
    _shadow[:] = [_PlainSql()]
    runtime = Runtime(module, {"HOLDER": "HolderBench"}, vars={"LIMIT": limit, "GROUP_LIMITS": LIMITED},
                      seed=seed)
    clients = [Client(f"client-{i:05d}", rng.sample(GROUPS, rng.randint(1, 5))) for i in range(n)]
    holder = runtime.env.HOLDER.getByName("account-1")
    calls = []
    wall = time.perf_counter()

    async def scenario():
        for _ in range(rounds):
            now = runtime.now_ms()
            for client in clients:
                if rng.random() < 0.25:
                    client.burst(rng, now, burst)
            # Everyone asks at the same instant: the holder serves them in one round.
            sent = await asyncio.gather(*(one_call(holder, c, now, rng) for c in clients))
            calls.append(sum(sent))
            await asyncio.sleep(ROUND_GAP_S / 2)  # the reply came at the round; ask again 2 s after it
        return await holder.usage()

    usage = runtime.run(scenario())
    wall = time.perf_counter() - wall
    host = runtime.host_of(holder)
    cpu = Cpu.rounds
    admitted = sum(c.claimed for c in clients)
    result = {
        "n": n, "rounds": len(cpu), "limit": limit, "admitted": admitted,
        "requests_per_round": sum(calls) / max(1, len(calls)),
        "cpu_round_ms": 1000 * sum(cpu) / max(1, len(cpu)),
        "cpu_round_max_ms": 1000 * max(cpu, default=0),
        "cpu_alloc_ms": 1000 * Cpu.run_round / max(1, len(cpu)),
        "cpu_write_ms": 1000 * Cpu.write / max(1, len(cpu)),
        "cpu_write_plain_ms": 1000 * Cpu.write_plain / max(1, len(cpu)),
        "cpu_gc_ms": 1000 * Cpu.gc / max(1, len(cpu)),
        "rows_read": host.db.rows_read,
        "rows_written": host.db.rows_written + host.stats.alarm_writes,
        "rpc": host.stats.requests,  # RPC calls and alarm invocations alike
        "outstanding": usage["outstanding"], "grants": usage["grants"],
        "errors": sum(c.errors for c in clients) + len(runtime.errors),
        "wall_s": wall,
    }
    runtime.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run: few rounds, smaller scales")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scales", default=None, help="comma-separated client counts")
    parser.add_argument("--burst", type=int, default=4, help="items per group in one burst: 1 to this")
    args = parser.parse_args()

    if args.quick:
        plan = {100: 3, 1_000: 3}
    else:
        plan = {100: 12, 1_000: 12, 10_000: 12}
    if args.scales:
        wanted = [int(s) for s in args.scales.split(",")]
        plan = {n: plan.get(n, 3 if args.quick else 6) for n in wanted}

    print(f"holder benchmark: seed {args.seed}; limit = 3 x clients; demand in 1-5 of {len(GROUPS)} groups, "
          f"{len(LIMITED)} of them capped at {next(iter(LIMITED.values()))}; a burst of 1-{args.burst} items per group for "
          "25% of clients each round; items run 2-8 s")
    print("rounds per scale: " + ", ".join(f"{n:,}: {r}" for n, r in plan.items())
          + ("  (--quick smoke run)" if args.quick else "  (the same at every scale, so rounds compare)"))
    print(f"{'clients':>8} {'rounds':>6} {'req/rnd':>7} {'admitted':>9} | {'round':>8} {'max':>7} {'alloc':>7} "
          f"{'write':>7} {'sqlite':>7} {'gc':>6} {'holder':>8} | {'read/p':>6} {'wrote/p':>7} {'rpc/p':>6} | "
          f"{'grants':>6} {'wall':>5}")
    results = []
    for n, rounds in plan.items():
        r = bench(n, rounds, args.seed, args.burst)
        # The holder's own CPU: the round without the embedded SQL's billing emulation (it counts
        # a table's rows on every upsert, O(table)) and without collections of the whole process
        # heap (this script's clients live in it), but with the same writes on plain sqlite3.
        r["holder_ms"] = r["cpu_round_ms"] - r["cpu_write_ms"] - r["cpu_gc_ms"] + r["cpu_write_plain_ms"]
        results.append(r)
        per = max(1, r["admitted"])
        print(f"{r['n']:>8,} {r['rounds']:>6} {r['requests_per_round']:>7.0f} {r['admitted']:>9,} | "
              f"{r['cpu_round_ms']:>6.1f}ms {r['cpu_round_max_ms']:>5.0f}ms {r['cpu_alloc_ms']:>5.1f}ms "
              f"{r['cpu_write_ms']:>5.1f}ms {r['cpu_write_plain_ms']:>5.1f}ms {r['cpu_gc_ms']:>4.0f}ms "
              f"{r['holder_ms']:>6.1f}ms | {r['rows_read'] / per:>6.3f} {r['rows_written'] / per:>7.3f} "
              f"{r['rpc'] / per:>6.3f} | {r['grants']:>6,} {r['wall_s']:>4.1f}s"
              + (f"  ERRORS {r['errors']}" if r["errors"] else ""))
    print("""
round:  CPU of the whole holder round on the embedded runtime (limits, allocation, the
        transaction, replies), mean per round; max: the slowest round
alloc:  of which allocation.run_round;  write: HolderStore.write on the embedded SQL,
        whose billing emulation counts the table's rows around every upsert (O(grants));
        sqlite: the same writes on a bare sqlite3 connection;  gc: collections during rounds
holder: round - write - gc + sqlite: the holder's own CPU, without emulator overheads
read/p, wrote/p, rpc/p: the holder's billed rows read, rows written (incl. alarm writes)
        and requests (RPC calls and alarms) per admitted (claimed) permit
grants: grant rows open at the end""")

    for a, b in zip(results, results[1:]):
        growth = b["n"] / a["n"]
        nlogn = growth * math.log(b["n"]) / math.log(a["n"])

        def ratio(key):
            return b[key] / a[key] if a[key] else float("nan")

        print(f"{b['n']:>6,} vs {a['n']:,} clients: round x{ratio('cpu_round_ms'):.1f}, "
              f"holder x{ratio('holder_ms'):.1f}, run_round x{ratio('cpu_alloc_ms'):.1f}, "
              f"requests x{ratio('requests_per_round'):.1f}; n x{growth:.0f}, n log n x{nlogn:.1f}")


if __name__ == "__main__":
    main()
