#!/usr/bin/env python3
"""Benchmark one DurabilitySemaphore holder under bursty demand from many clients.

    .venv/bin/python scripts/bench_holder.py [--quick] [--seed N] [--scales 100,1000,10000] [--fair-share]
    .venv/bin/python scripts/bench_holder.py --leases [--quick] [--seed N]

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

With ``--leases``: grants only against each lease provisioning mode, on one
bursty workload run through real queues (``DurabilitySemaphoreQueue`` in
client objects, the holder in its own): every client gets bursts of items
arriving one by one over a couple of seconds, each item runs 2 to 8 s and is
released. Prints, per admitted item, RPC calls the holder answered, rows
written and read (all objects: holder and queues), admission latency p50 /
p99 from enqueue to ``admit()`` in virtual time, the share of items drawn
from a lease and how many of those waited for nothing, and the share of the
limit kept busy while work was queued (above 100% for ``over``, whose
leases run above the limit).
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
from itertools import islice
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from durability.semaphore import holder as holder_module, store as store_module  # noqa: E402
from durability.semaphore.messages import MAX_DEMAND_TIMES  # noqa: E402
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
    """Adds ``fn``'s CPU to ``Cpu.<slot>``, less the collections that ran inside
    it: those scan this script's whole heap (every client's state lives in
    it), and they are shown apart, in the ``gc`` column."""
    def timed(*args, **kwargs):
        start, collected = time.process_time(), Cpu.gc
        try:
            return fn(*args, **kwargs)
        finally:
            spent = time.process_time() - start - (Cpu.gc - collected)
            setattr(Cpu, slot, getattr(Cpu, slot) + spent)

    return timed


_whole_round = holder_module.DurabilitySemaphore._run_round


def _timed_round(self, batch):
    # Less the shadow writes on plain sqlite3 made inside it (_timed_write):
    # they are this script's, not the holder's.
    start, shadow = time.process_time(), Cpu.write_plain
    Cpu.in_round = True
    try:
        return _whole_round(self, batch)
    finally:
        Cpu.in_round = False
        Cpu.rounds.append(time.process_time() - start - (Cpu.write_plain - shadow))


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
    start, collected = time.process_time(), Cpu.gc  # less collections, as in _timed
    try:
        return _write(self, changes)
    finally:
        middle, collected_middle = time.process_time(), Cpu.gc
        shadow = _shadow[0]
        shadow.conn.execute("BEGIN")
        _write(SimpleNamespace(sql=shadow), changes)
        shadow.conn.execute("COMMIT")
        if counted:
            Cpu.write += middle - start - (collected_middle - collected)
            Cpu.write_plain += time.process_time() - middle - (Cpu.gc - collected_middle)


_plain = (holder_module.run_round, _write)


def time_the_holder(on: bool) -> None:
    """Time holder rounds from outside (the scale table), or run them untouched."""
    holder_module.DurabilitySemaphore._run_round = _timed_round if on else _whole_round
    holder_module.run_round = _timed(_plain[0], "run_round") if on else _plain[0]
    store_module.HolderStore.write = _timed_write if on else _plain[1]
    if on and _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)
    elif not on and _on_gc in gc.callbacks:
        gc.callbacks.remove(_on_gc)


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
        # As the queue sends it: the enqueue times of the oldest items too.
        demand = [{"group": g, "count": len(q), "oldestAt": q[0], "times": list(islice(q, MAX_DEMAND_TIMES))}
                  for g, q in self.queue.items() if q]
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


# -- grants against leases, through real queues ----------------------------------------------
from workers import DurableObject  # noqa: E402  (the embedded runtime's stand-in, installed above)

from durability import DurabilityScheduler  # noqa: E402
from durability.semaphore import DurabilitySemaphore, DurabilitySemaphoreQueue  # noqa: E402

BURST = (8, 24)  # items in one burst
LEASE_MODES = {
    "grants only": None,
    "strict": {"mode": "strict"},
    "under": {"mode": "under", "reserve": 64},
    "over": {"mode": "over", "extra": {"ratio": 0.5}},
}


class Ground:
    """Truth outside the objects: when each item was enqueued and admitted, and how busy the limit was."""

    def __init__(self) -> None:
        self.enqueued: dict[str, float] = {}
        self.admitted: dict[str, float] = {}
        self.via: dict[str, str] = {}
        self.running = 0
        self.waiting = 0
        self.holder_calls = 0
        self.busy_ms = 0.0  # running items x ms, while something waited for admission
        self.active_ms = 0.0
        self._last = None

    def tick(self, now: float) -> None:
        if self._last is not None and self.waiting:
            self.busy_ms += self.running * (now - self._last)
            self.active_ms += now - self._last
        self._last = now


GROUND = Ground()


class LeaseBenchHolder(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx)
        # One group has a limit of its own (as high as the account's): grants only, leases or not.
        self.semaphore = DurabilitySemaphore(self.scheduler, limit=int(env.LIMIT), leases=env.LEASES,
                                             group_limit={"own-limit": int(env.LIMIT)}.get)

    async def permits(self, message):
        GROUND.holder_calls += 1
        return await self.semaphore.handle(message)

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)


class LeaseBenchClient(DurableObject):
    """Queues items and runs each for the milliseconds its body names, then releases it."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx, max_concurrency=64)
        self.scheduler.register("work", self._work_ends)
        self.queue = DurabilitySemaphoreQueue(
            self.scheduler, client_id=ctx.id.name, admit=self._admit,
            server=DurabilitySemaphore.client(binding="HOLDER").bind(env),
        )

    async def submit(self, items):
        now = time.time() * 1000
        for item in items:
            GROUND.enqueued.setdefault(item["id"], now)
            GROUND.tick(now)
            GROUND.waiting += 1
        await self.queue.enqueue(items)

    async def _admit(self, items):
        now = time.time() * 1000
        for item in items:
            if item.id in GROUND.admitted:
                continue
            GROUND.tick(now)
            GROUND.admitted[item.id], GROUND.via[item.id] = now, item.via
            GROUND.waiting -= 1
            GROUND.running += 1
            self.scheduler.schedule("work", item.id, now + item.body["ms"])
        await self.scheduler.sync()

    async def _work_ends(self, timer):
        GROUND.tick(time.time() * 1000)
        GROUND.running -= 1
        await self.queue.release(timer.key)

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)


def bench_leases(mode: str, clients: int, limit: int, minutes: float, seed: int, per_lease: int = 32,
                 capped_share: float = 0.0) -> dict:
    global GROUND
    GROUND = Ground()
    rng = random.Random(seed)  # the same workload for every mode
    leases = LEASE_MODES[mode]
    options = (None if leases is None
               else {"provisioning": leases, "permits_per_lease": per_lease, "ttl_ms": 10 * 60_000})
    runtime = Runtime(sys.modules[__name__], {"HOLDER": "LeaseBenchHolder", "CLIENT": "LeaseBenchClient"},
                      vars={"LIMIT": limit, "LEASES": options}, seed=seed)
    plan = []  # (at s, client, item id, group, ms): bursts arriving over 2 s, every 20-60 s
    for c in range(clients):
        at = rng.uniform(0, 30)
        while at < minutes * 60:
            group = "own-limit" if rng.random() < capped_share else "jobs"
            for _ in range(rng.randint(BURST[0], BURST[1])):
                plan.append((at + rng.uniform(0, 2), f"client-{c:03d}", f"c{c}-{len(plan)}", group,
                             rng.randint(2_000, 8_000)))
            at += rng.uniform(20, 60)
    plan.sort()

    async def scenario():
        start = runtime.loop.time()
        for at, client, item_id, group, ms in plan:
            delay = at - (runtime.loop.time() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            stub = runtime.env.CLIENT.getByName(client)
            await stub.submit([{"id": item_id, "key": "account", "group": group, "body": {"ms": ms}}])
        give_up = runtime.loop.time() + 3_600
        while (len(GROUND.admitted) < len(plan) or GROUND.running) and runtime.loop.time() < give_up:
            await asyncio.sleep(5)

    runtime.run(scenario())
    totals = runtime.totals()
    errors = list(runtime.errors)
    runtime.close()
    if errors:
        raise RuntimeError(f"{mode}: {len(errors)} errors in the objects, first: {errors[0]!r}")
    admitted = len(GROUND.admitted)
    waits = sorted(GROUND.admitted[i] - GROUND.enqueued[i] for i in GROUND.admitted)
    drawn = [i for i, via in GROUND.via.items() if via == "lease"]
    return {
        "mode": mode, "items": len(plan), "admitted": admitted,
        "rpc": GROUND.holder_calls / admitted,
        "written": totals["rows_written"] / admitted, "read": totals["rows_read"] / admitted,
        "awake": totals["awake_s"] / admitted,  # every object's seconds awake (duration is billed)
        "p50": waits[len(waits) // 2], "p99": waits[min(len(waits) - 1, int(0.99 * len(waits)))],
        "drawn": len(drawn) / admitted,
        # Within a millisecond: the admission's own alarm turn, no call to the holder.
        "drawn_at_once": sum(1 for i in drawn if GROUND.admitted[i] - GROUND.enqueued[i] < 1) / max(1, len(drawn)),
        "busy": GROUND.busy_ms / (limit * GROUND.active_ms) if GROUND.active_ms else 0.0,
    }


def lease_table(title: str, clients: int, limit: int, minutes: float, per_lease: int, capped_share: float,
                seed: int) -> list[dict]:
    print(f"\n{title}: {clients} clients, limit {limit}, {minutes} virtual minutes, {per_lease} permits per lease; "
          f"{capped_share:.0%} of bursts in a group with its own limit (grants only); "
          f"under keeps limit/4, over adds {LEASE_MODES['over']['extra']['ratio']:.0%}")
    print(f"{'mode':>12} {'items':>6} | {'rpc/item':>8} {'wrote/item':>10} {'read/item':>9} {'awake/item':>10} | "
          f"{'p50 ms':>7} {'p99 ms':>7} | {'drawn':>6} {'at once':>7} | {'busy':>5}")
    LEASE_MODES["under"] = {"mode": "under", "reserve": limit // 4}
    results = [bench_leases(mode, clients, limit, minutes, seed, per_lease, capped_share) for mode in LEASE_MODES]
    for r in results:
        print(f"{r['mode']:>12} {r['admitted']:>6} | {r['rpc']:>8.3f} {r['written']:>10.2f} {r['read']:>9.1f} "
              f"{r['awake']:>9.2f}s | "
              f"{r['p50']:>7.0f} {r['p99']:>7.0f} | {r['drawn']:>6.0%} {r['drawn_at_once']:>7.0%} | {r['busy']:>5.0%}")
    base = results[0]
    print("RPC calls per admitted item, grants only / leases: " + ", ".join(
        f"{r['mode']} x{base['rpc'] / r['rpc']:.1f}" for r in results[1:]))
    return results


def main_leases(args: argparse.Namespace) -> None:
    clients, minutes = (10, 3) if args.quick else (20, 10)
    clients = args.clients or clients
    per_lease = args.per_lease
    print(f"grants against leases, through real queues: bursts of {BURST[0]}-{BURST[1]} items arriving over 2 s, "
          "every 20-60 s per client; items run 2-8 s")
    lease_table("bursty, with headroom (each client can hold a full lease)", clients,
                args.limit or clients * per_lease, minutes, per_lease, 0.0, args.seed)
    contended = (args.limit or clients * per_lease) // 6
    lease_table("contended (a sixth of that limit), with grants-only demand", clients,
                contended, minutes, per_lease, 0.2, args.seed)
    lease_table("the same, with leases sized to the limit (limit / clients)", clients,
                contended, minutes, max(1, contended // clients), 0.2, args.seed)
    print("""
rpc/item: calls the holder answered (requests and syncs) per admitted item
wrote/item, read/item: rows written and read per admitted item, holder and queues together
p50, p99: virtual ms from enqueue to admit(); drawn: items admitted from a lease;
at once: of those, admitted within 1 ms of their enqueue (no holder round trip)
busy: running items over the limit, while any item waited for admission (over: can pass 100%)""")


# -- one scale --------------------------------------------------------------------------------
def bench(n: int, rounds: int, seed: int, burst: int = 4, fair_share: bool = False) -> dict:
    rng = random.Random(seed)
    limit = 3 * n
    module = load_worker_module(WORKER)
    Cpu.reset()
    _shadow[:] = [_PlainSql()]
    # The load model is lifted: every client asks within the same second of a
    # round, and this measures what a round costs, not where one object
    # overloads (scripts/bench_tree.py shows that).
    runtime = Runtime(module, {"HOLDER": "HolderBench"},
                      vars={"LIMIT": limit, "GROUP_LIMITS": LIMITED, "FAIR_SHARE": fair_share},
                      seed=seed, max_requests_per_s=None)
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
    parser.add_argument("--fair-share", action="store_true",
                        help="share the limit between four tenants (weights, a floor, two priority classes)")
    parser.add_argument("--leases", action="store_true",
                        help="instead: grants only against each lease mode, through real queues")
    parser.add_argument("--clients", type=int, default=None, help="with --leases: client objects")
    parser.add_argument("--limit", type=int, default=None,
                        help="with --leases: the holder's limit in the first table (default clients x per-lease)")
    parser.add_argument("--per-lease", type=int, default=32, help="with --leases: permits_per_lease")
    args = parser.parse_args()
    if args.leases:
        time_the_holder(False)
        main_leases(args)
        return
    time_the_holder(True)

    if args.quick:
        plan = {100: 3, 1_000: 3}
    else:
        plan = {100: 12, 1_000: 12, 10_000: 12}
    if args.scales:
        wanted = [int(s) for s in args.scales.split(",")]
        plan = {n: plan.get(n, 3 if args.quick else 6) for n in wanted}

    print(f"holder benchmark: seed {args.seed}; limit = 3 x clients; demand in 1-5 of {len(GROUPS)} groups, "
          f"{len(LIMITED)} of them capped at {next(iter(LIMITED.values()))}; "
          f"a burst of 1-{args.burst} items per group for 25% of clients each round; items run 2-8 s"
          + ("; shared by four tenants (--fair-share)" if args.fair_share else ""))
    print("rounds per scale: " + ", ".join(f"{n:,}: {r}" for n, r in plan.items())
          + ("  (--quick smoke run)" if args.quick else "  (the same at every scale, so rounds compare)"))
    print(f"{'clients':>8} {'rounds':>6} {'req/rnd':>7} {'admitted':>9} | {'round':>8} {'max':>7} {'alloc':>7} "
          f"{'write':>7} {'sqlite':>7} {'gc':>6} {'holder':>8} | {'read/p':>6} {'wrote/p':>7} {'rpc/p':>6} | "
          f"{'grants':>6} {'wall':>5}")
    results = []
    for n, rounds in plan.items():
        r = bench(n, rounds, args.seed, args.burst, args.fair_share)
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
        sqlite: the same writes on a bare sqlite3 connection;  gc: collections during
        rounds (of this script's whole heap, every client's state in it), which alloc,
        write and sqlite leave out
holder: round - write - gc + sqlite: the holder's own CPU, without emulator overheads
read/p, wrote/p, rpc/p: the holder's billed rows read, rows written (incl. alarm writes)
        and requests (RPC calls and alarms) per admitted (claimed) permit
grants: grant rows open at the end""")

    for a, b in zip(results, results[1:]):
        growth = b["n"] / a["n"]
        nlogn = growth * math.log(b["n"]) / math.log(a["n"])

        def ratio(key):  # called only in this iteration
            return b[key] / a[key] if a[key] else float("nan")  # noqa: B023

        print(f"{b['n']:>6,} vs {a['n']:,} clients: round x{ratio('cpu_round_ms'):.1f}, "
              f"holder x{ratio('holder_ms'):.1f}, run_round x{ratio('cpu_alloc_ms'):.1f}, "
              f"requests x{ratio('requests_per_round'):.1f}; n x{growth:.0f}, n log n x{nlogn:.1f}")


if __name__ == "__main__":
    main()
