#!/usr/bin/env python3
"""Benchmark one key's budget shared by many clients: one holder against a budget tree.

    .venv/bin/python scripts/bench_tree.py [--scales 1000,10000,100000] [--limit 10000] [--seed N]
                                           [--plot PATH] [--json] [--quick] [--held]

Runs, on the embedded runtime in virtual time, one key with a limit of
10,000 permits shared by 1,000, 10,000 and 100,000 clients, each scale on
the same kind of arrivals: a limit's worth of items in the first second,
then items at random clients 20% faster than the limit can run them (items
run 20 to 80 s), for 180 s, then the backlog drains. Each
client speaks the semaphore's wire protocol through
``DurabilitySemaphore.client(...)`` as a woken queue would: a request for
what it has queued, which its holder answers at once and parks (its wait,
240 s, is only its fallback), and the holder's call (``BenchClient``, an
object the holder reaches by name) when a round has permits for it,
answered with what it still waits for; it takes what it is granted at
once (grants come claimed), and sends a ``sync`` with its releases half a
second after an item ends. With ``--held`` the clients cannot be called:
each holds one request open at its holder while nothing is granted (a
long poll), and the holder stays awake for it.

Each scale runs twice: a single holder, and a tree (a leaf per 250
clients, at most 64, under one root: ``shape``; ``--fan-out`` and
``--depth`` set another shape). The runtime refuses an object's
requests past 1,000 per second ("overloaded"), as production does; clients
back off on a refusal. Prints per run: clients, holder objects, the peak
requests per second any one object took, calls refused as overloaded, the
share of the limit kept busy while work waited, the share of admissions
made while an older item waited, rows written and requests per admission
(all holder objects), and the highest number of items running at once
(never above the limit: ground truth, outside the objects).

``--plot PATH`` writes a PNG of per-object requests per second over time
for the largest tree (each object's line; the root in black), and with the
single holder for comparison. ``--json`` prints a JSON list with one object
per tree scale, with the keys clients, objects, fan_out, depth,
peak_requests_per_s_per_object, busy_while_waiting, out_of_order_share
(strict), out_of_order_by_a_round (the "by 2 s" column),
rows_written_per_admission and requests_per_admission (and the single
holder's figures under ``single``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from bench import measure  # noqa: E402
from durability.semaphore import DurabilitySemaphore  # noqa: E402
from durability.semaphore.identity import SEPARATOR  # noqa: E402
from durability.semaphore.messages import MAX_DEMAND_TIMES  # noqa: E402
from durability.testing import JsException, Runtime, load_worker_module  # noqa: E402

WORKER = Path(__file__).resolve().parent / "bench_workers" / "tree_bench.py"
KEY = "account"
GROUP = "jobs"
WORK_MS = (20_000, 80_000)  # long against a round period (2 s): the busy share measures the design, not the rounds
ARRIVALS_S = 180
OVERLOAD = 1.2  # arrivals per second, over what the limit can run
CLIENTS_PER_LEAF = 250
WIDEST = 64  # leaves at most: the root takes a request or two per child per round period
WAIT_MS = 240_000  # how long a holder may hold a client's request (the queue's own default)
RELEASE_DELAY_S = 0.5  # a client reports its releases this long after one, in one sync
GIVE_UP_S = 600  # virtual seconds after the arrivals end
ROUND_PERIOD_MS = 2_000  # the holders' (default) round period
TOGETHER_MS = 100  # the replies of one round land within this of each other: starts this close are one decision


@dataclass
class Client:
    """A client of the key: items queued, grants held, and the exchanges in flight."""

    client_id: str
    group: str = GROUP  # the group its items are queued in
    queue: deque = field(default_factory=deque)  # (item id, work ms)
    grants: dict = field(default_factory=dict)  # grant id -> [permits, released, confirmed released]
    settled: set = field(default_factory=set)  # grants released in full and confirmed: a late copy lists them
    heard_up_to: float = 0.0
    next_request_at: float = 0.0
    asking: bool = False
    reporting: bool = False
    failures: int = 0
    name: str | None = None  # its object's name, for a holder that calls it back (None: it cannot be called)
    in_line: bool = False  # its demand stands in its holder's line: the holder calls it when it serves it
    nudge: asyncio.Event = field(default_factory=asyncio.Event)  # ask now: new work, and nothing in line


class Driver:
    """The clients, the ground truth, and what went wrong on the way."""

    def __init__(self, runtime: Runtime, fan_out: int | None, clients: int, limit: int, depth: int = 1,
                 callable_clients: bool = True) -> None:
        self.runtime = runtime
        self.server = DurabilitySemaphore.client(binding="HOLDER", fan_out=fan_out, depth=depth).bind(runtime.env)
        self.clients = [_client(runtime, f"client-{i:06d}", callable_clients) for i in range(clients)]
        self.by_name = {client.name: client for client in self.clients if client.name is not None}
        self.ledger = measure.Ledger()
        self.limit = limit
        self.refused = 0  # calls that failed (overloaded, mostly) as the clients saw them
        self.errors: list[str] = []

    def now(self) -> float:
        return self.runtime.now_ms()

    def arrive(self, client: Client, item_id: str, work_ms: float) -> None:
        self.ledger.submitted(item_id, KEY, work_ms, self.now())
        client.queue.append((item_id, work_ms))
        if not client.in_line:  # (in line, the holder's call asks what it waits for)
            client.next_request_at = min(client.next_request_at, self.now())
            client.nudge.set()
        if not client.asking:
            client.asking = True
            _outside_objects(self.ask(client))

    async def ask(self, client: Client) -> None:
        """One request at a time while the client has items queued."""
        while client.queue:
            delay = max(client.next_request_at - self.now(), 0) / 1000
            if delay:  # paced, or in line until the fallback: new work with nothing in line asks sooner
                client.nudge.clear()
                try:
                    await asyncio.wait_for(client.nudge.wait(), delay)
                except TimeoutError:
                    pass
                continue
            reply = await self.send(client, self.server.request, self.request(client))
            if reply is not None:
                client.next_request_at = reply.get("nextRequestAt") or self.now()
                self.take(client, reply)
                client.in_line = client.name is not None and bool(client.queue)  # parked: its demand waits in line
        client.asking = False

    def request(self, client: Client) -> dict:
        """What the client waits for, as the queue says it: the enqueue times of the
        oldest items (arrival order is time order)."""
        times = [self.ledger.submitted_at[item_id] for item_id, _ in islice(client.queue, MAX_DEMAND_TIMES)]
        demand = [{"group": client.group, "count": len(client.queue), "oldestAt": times[0], "times": times}
                  ] if times else []
        message = {"type": "request", "v": 1, "clientId": client.client_id, "claims": True, "wait": WAIT_MS,
                   "heardUpTo": client.heard_up_to, "grants": self.reports(client), "demand": demand}
        if client.name is not None:
            message.update(wake=True, name=client.name)
        return message

    def called(self, name: str, key: str, reply: dict) -> dict:
        """A holder's call (``BenchClient.semaphore_reply``): what a round had for the
        client; the answer is its demand now, which stays in line."""
        client = self.by_name[name]
        self.take(client, reply)
        client.in_line = bool(client.queue)
        if not client.in_line:
            client.next_request_at = self.now()
        return self.request(client)

    async def send(self, client: Client, send, message: dict) -> dict | None:
        try:
            reply = await send(KEY, message)
        except JsException as error:
            self.refused += 1
            client.failures += 1
            if not getattr(error, "overloaded", False) and len(self.errors) < 5:
                self.errors.append(str(error)[:200])
            await asyncio.sleep(min(30.0, 0.5 * 2 ** client.failures) * random.uniform(0.5, 1.0))
            return None
        client.failures = 0
        if reply.get("type") not in ("grants", "synced"):
            self.errors.append(repr(reply)[:200])
            return None
        return reply

    def reports(self, client: Client) -> list[dict]:
        return [{"grantId": gid, "claimed": permits, "released": released}
                for gid, (permits, released, confirmed) in client.grants.items() if released > confirmed][:256]

    def take(self, client: Client, reply: dict) -> None:
        for report in reply.get("reports", []):
            grant = client.grants.get(report["grantId"])
            if grant is None:
                continue
            grant[2] = max(grant[2], report["released"])
            if report["status"] == "not_found" or grant[2] >= grant[0]:
                del client.grants[report["grantId"]]
                client.settled.add(report["grantId"])
        for entry in reply.get("grants", []):
            client.heard_up_to = max(client.heard_up_to, entry["claimDeadline"])
            if entry["grantId"] in client.grants or entry["grantId"] in client.settled or entry["released"] > 0:
                continue  # known, or settled (a late or duplicated reply or call lists it again)
            client.grants[entry["grantId"]] = grant = [entry["claimed"], 0, 0]
            for _ in range(entry["claimed"]):
                if not client.queue:
                    grant[1] += 1  # granted beyond what waits: given back at once
                    continue
                item_id, work_ms = client.queue.popleft()
                self.ledger.started(item_id, self.now())
                self.runtime.loop.call_later(work_ms / 1000, self.finish, client, entry["grantId"], item_id,
                                             context=contextvars.Context())  # the driver's timer, not the object's
        if any(g[1] > g[2] for g in client.grants.values()):
            self.report_soon(client)

    def finish(self, client: Client, grant_id: str, item_id: str) -> None:
        self.ledger.ended(item_id, self.now())
        client.grants[grant_id][1] += 1
        self.report_soon(client)

    def report_soon(self, client: Client) -> None:
        if not client.reporting:
            client.reporting = True
            _outside_objects(self.report(client))

    async def report(self, client: Client) -> None:
        await asyncio.sleep(RELEASE_DELAY_S)
        while any(g[1] > g[2] for g in client.grants.values()):
            message = {"type": "sync", "v": 1, "clientId": client.client_id, "grants": self.reports(client)}
            reply = await self.send(client, self.server.sync, message)
            if reply is not None:
                self.take(client, reply)
        client.reporting = False


def _outside_objects(coroutine) -> None:
    """Run a client's exchanges as the driver's own: started from a holder's call, a task
    would run (and be billed) as the client object's."""
    asyncio.get_running_loop().create_task(coroutine, context=contextvars.Context())


def _client(runtime: Runtime, name: str, callable_clients: bool) -> Client:
    """A client as a queue speaks: as its object (its id after the name), callable, unless not."""
    if not callable_clients:
        return Client(name)
    object_id = runtime.env.CLIENTS.idFromName(name).toString()
    return Client(f"{name}{SEPARATOR}{object_id}", name=name)


def arrivals(clients: int, limit: int, seed: int) -> list[tuple[float, int, str, int]]:
    """(at s, client index, item id, work ms): a limit's worth of items in the
    first second (the key is contended from the start, so the busy share
    measures a full limit, not a ramp), then Poisson arrivals, all at random clients."""
    rng = random.Random(seed)
    rate = OVERLOAD * limit / (sum(WORK_MS) / 2 / 1000)
    plan = [(rng.random(), rng.randrange(clients), f"i{n}", rng.randint(*WORK_MS)) for n in range(limit)]
    plan.sort()
    at = 1.0
    while True:
        at += rng.expovariate(rate)
        if at >= ARRIVALS_S:
            return plan
        plan.append((at, rng.randrange(clients), f"i{len(plan)}", rng.randint(*WORK_MS)))


async def play(driver: Driver, plan: list[tuple[float, int, str, int]], give_up_s: float) -> None:
    """Each item of ``plan`` to its client at its time, then wait until all
    have ended, or ``give_up_s`` after the last arrival."""
    loop = driver.runtime.loop
    start = loop.time()
    for at, index, item_id, work_ms in plan:
        if at > loop.time() - start:
            await asyncio.sleep(at - (loop.time() - start))
        driver.arrive(driver.clients[index], item_id, work_ms)
    give_up = loop.time() + give_up_s
    while len(driver.ledger.ended_at) < len(plan) and loop.time() < give_up:
        await asyncio.sleep(1)


def shape(clients: int) -> tuple[int, int]:
    """(fan_out, depth): a leaf per ``CLIENTS_PER_LEAF`` clients, at most
    ``WIDEST``, on one level. A leaf's requests follow the admissions its
    clients make, not their number; the root takes a request or two per
    child per round period, so one level of 400 leaves took it past 500 a
    second, and a second level costs order (see docs/semaphore.md)."""
    return min(WIDEST, max(2, round(clients / CLIENTS_PER_LEAF))), 1


def run(clients: int, limit: int, tree: bool, seed: int, fan_out: int | None = None, depth: int = 1,
        held: bool = False) -> dict:
    if not tree:
        fan_out, depth = None, 1
    elif fan_out is None:
        fan_out, depth = shape(clients)
    module = load_worker_module(WORKER)
    bindings = {"HOLDER": "TreeBenchHolder", **({} if held else {"CLIENTS": "BenchClient"})}
    runtime = Runtime(module, bindings, vars={"LIMIT": limit, "TREE": tree}, seed=seed)
    driver = Driver(runtime, fan_out, clients, limit, depth, callable_clients=not held)
    module.DRIVER = driver
    plan = arrivals(clients, limit, seed)
    wall = time.perf_counter()

    async def scenario():
        await play(driver, plan, GIVE_UP_S)
        await asyncio.sleep(5)  # the last releases reach the holders

    runtime.run(scenario())
    wall = time.perf_counter() - wall
    holders = [h for h in runtime.hosts() if h.class_name == "TreeBenchHolder"]
    totals = runtime.totals()
    ledger = driver.ledger
    admitted = max(1, len(ledger.started_at))
    result = {
        "tree": tree, "clients": clients, "fan_out": fan_out, "depth": depth, "objects": len(holders),
        "items": len(plan),
        "busiest": max(holders, key=lambda h: h.stats.peak_requests_per_s).name,
        "admitted": len(ledger.started_at), "done": len(ledger.ended_at),
        "peak_requests_per_s_per_object": max(h.stats.peak_requests_per_s for h in holders),
        "overloaded": totals["overloaded"],
        "busy_while_waiting": measure.busy_share(ledger, {KEY: limit})[0],
        "out_of_order_share": measure.out_of_order_share(ledger),
        # Ahead of an item that had waited a round period (2 s) longer, and
        # started more than a moment after: order the rounds could keep.
        "out_of_order_by_a_round": measure.out_of_order_share(ledger, slack_ms=ROUND_PERIOD_MS,
                                                              together_ms=TOGETHER_MS),
        "rows_written_per_admission": totals["rows_written"] / admitted,
        "requests_per_admission": totals["requests"] / admitted,
        # Duration: every holder's seconds awake per admission, and the most any one holder was
        # awake, as a share of the time items waited (from the first arrival to the last start).
        "awake_s_per_admission": totals["awake_s"] / admitted,
        "max_awake_share": max_awake_share(holders, ledger, runtime.loop.loop_time_for),
        "max_running": ledger.max_running.get(KEY, 0),
        "cpu_ms_per_request": max(h.stats.cpu_ms_per_request for h in holders),
        "rates": {h.name: dict(h.stats.requests_by_second) for h in holders},
        "errors": driver.errors + [repr(e) for _, e in runtime.errors[:3]],
        "wall_s": wall,
    }
    runtime.close()
    if result["max_running"] > limit:
        raise AssertionError(f"{result['max_running']} items ran at once, over the limit of {limit}")
    return result


def max_awake_share(holders: list, ledger: measure.Ledger, to_s) -> float:
    """The most any one holder was awake, as a share of the time items waited (from the
    first item's arrival to the last one's start)."""
    if not ledger.started_at:
        return 0.0
    window = [(to_s(min(ledger.submitted_at.values())), to_s(max(ledger.started_at.values())))]
    span = max(1e-9, window[0][1] - window[0][0])
    return max(measure.overlap(h.awake_periods(), window) for h in holders) / span


def table(rows: list[dict]) -> str:
    lines = [f"{'holder':>8} {'clients':>8} {'objects':>7} | {'peak/s':>6} {'refused':>7} | {'busy':>6} "
             f"{'order':>6} {'by 2 s':>6} | {'wrote/a':>7} {'req/a':>6} {'awake/a':>7} {'awake':>6} | "
             f"{'done':>7} {'max run':>7} {'cpu/req':>7} {'wall':>6}"]
    for r in rows:
        lines.append(
            f"{'tree' if r['tree'] else 'single':>8} {r['clients']:>8,} {r['objects']:>7} | "
            f"{r['peak_requests_per_s_per_object']:>6} {r['overloaded']:>7,} | {r['busy_while_waiting']:>6.1%} "
            f"{r['out_of_order_share']:>6.1%} {r['out_of_order_by_a_round']:>6.1%} | "
            f"{r['rows_written_per_admission']:>7.3f} "
            f"{r['requests_per_admission']:>6.3f} {r['awake_s_per_admission']:>6.3f}s {r['max_awake_share']:>6.1%} | "
            f"{r['done']:>7,} {r['max_running']:>7,} "
            f"{r['cpu_ms_per_request']:>5.2f}ms {r['wall_s']:>5.0f}s")
    return "\n".join(lines)


LEGEND = """
peak/s: the most requests any one holder object took within a second; refused: calls
        answered "overloaded" (past 1,000 per second to one object) or failing otherwise
busy:   running items over the limit while any item waited; order: admissions made while
        an older item waited (anywhere under the key); by 2 s: while an item waited that had
        arrived more than a round period (2 s) earlier and started over 100 ms later
wrote/a, req/a: rows written and requests (RPC calls and alarms) of every holder object,
        per admitted item; awake/a: every holder object's seconds awake (duration is billed)
        per admitted item; awake: the most awake holder's seconds awake over the time items
        waited; done: items run to the end; max run: the most running at once (ground truth;
        never above the limit); cpu/req: the busiest object's CPU per request"""


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r["clients"] == max(x["clients"] for x in rows)]
    fig, axes = plt.subplots(1, len(shown), figsize=(7 * len(shown), 4.5), sharey=True, squeeze=False)
    for axis, r in zip(axes[0], shown):
        for name, by_second in sorted(r["rates"].items()):
            seconds = sorted(by_second)
            root = name == KEY
            axis.plot(seconds, [by_second[s] for s in seconds], color="black" if root else None,
                      linewidth=1.6 if root else 0.5, alpha=1.0 if root else 0.5)
        axis.axhline(1_000, color="red", linestyle="--", linewidth=1)
        axis.set_title(f"{'tree' if r['tree'] else 'one holder'}: {r['clients']:,} clients, "
                       f"{r['objects']} objects")
        axis.set_xlabel("virtual seconds")
    axes[0][0].set_ylabel("requests per second, per object")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scales", default=None, help="comma-separated client counts")
    parser.add_argument("--limit", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="a fast smoke run: 1,000 and 3,000 clients, limit 1,000")
    parser.add_argument("--single", default="all", choices=["all", "none"],
                        help="run the single holder at every scale too (all), or not (none)")
    parser.add_argument("--fan-out", type=int, default=None,
                        help=f"the tree's children per parent (default: a leaf per {CLIENTS_PER_LEAF} clients, "
                             f"at most {WIDEST})")
    parser.add_argument("--depth", type=int, default=1, help="the tree's levels below the root, with --fan-out")
    parser.add_argument("--held", action="store_true",
                        help="clients that cannot be called: each holds a request open at its holder while it waits")
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    limit = 1_000 if args.quick else args.limit
    scales = [int(s) for s in args.scales.split(",")] if args.scales else (
        [1_000, 3_000] if args.quick else [1_000, 10_000, 100_000])
    rows = []
    for clients in scales:
        for tree in ([False, True] if args.single == "all" else [True]):
            rows.append(run(clients, limit, tree, args.seed, args.fan_out, args.depth, args.held))
            # Each run as it ends (on stderr with --json, whose stdout is the JSON alone).
            print(table(rows[-1:]).splitlines()[-1] if len(rows) > 1 else table(rows[-1:]), flush=True,
                  file=sys.stderr if args.json else sys.stdout)
    if args.plot:
        plot(rows, args.plot)
    if args.json:
        keys = ["clients", "objects", "fan_out", "depth", "peak_requests_per_s_per_object", "busy_while_waiting",
                "out_of_order_share", "out_of_order_by_a_round", "rows_written_per_admission",
                "requests_per_admission", "awake_s_per_admission", "max_awake_share"]
        single = {r["clients"]: {k: r[k] for k in keys} for r in rows if not r["tree"]}
        print(json.dumps([{**{k: r[k] for k in keys}, "single": single.get(r["clients"])}
                          for r in rows if r["tree"]], indent=1))
        return
    print(f"\none key, limit {limit:,}; items arrive at random clients {OVERLOAD - 1:.0%} faster than the limit "
          f"runs them (20-80 s each) for {ARRIVALS_S} s; tree: "
          + (f"fan_out {args.fan_out}, depth {args.depth}" if args.fan_out else
             f"one leaf per {CLIENTS_PER_LEAF} clients, at most {WIDEST}"))
    print(table(rows))
    print(LEGEND)
    for r in rows:
        if r["errors"]:
            print(f"{'tree' if r['tree'] else 'single'} {r['clients']:,}: errors {r['errors'][:2]}")


if __name__ == "__main__":
    main()
