"""Running one scenario on the embedded runtime, in virtual time, and checking it.

Lives here: ``run(scenario) -> Outcome``: the runtime with the scenario's
seed and faults, the driver that submits and cancels jobs, makes the live
changes and partitions, stops the faults and waits for quiet, the
end-of-run checks, and the planted defects that patch the library for one
run. Must not know: how scenarios are drawn or shrunk, or how many run.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from durability.semaphore.holder.pure import allocation
from durability.semaphore.holder.store import GRANT_ROWS
from durability.semaphore.identity import client_label, wire_identity
from durability.semaphore.tree.pure.rules import holder_for
from durability.testing import HIBERNATE_AFTER_MS, Faults, Outage, QueueConsumer, Runtime, load_worker_module

from .checks import (
    SWEEP_CRON,
    Truth,
    Violations,
    liveness_bound_ms,
    overlaps_beyond_limits,
    rate_time_ms,
    rate_violations,
    recovery_violations,
)
from .scenario import FAULTS_END_MS, GRANTS_ONLY, LATE_DELIVERY_MS, LEASE_TTL_MS, Scenario

ROOT = Path(__file__).resolve().parent.parent
BUDGET_WORKER = Path(__file__).resolve().parent / "worker.py"
LOCKS_WORKER = ROOT / "tests" / "workers" / "locks.py"
LEASE_MODES = {
    "strict": {"mode": "strict"},
    "under": {"mode": "under", "reserve": 1},
    "over": {"mode": "over", "extra": {"count": 2}},  # campaign.checks.OVER_EXTRA
}
POLL_MS = 5_000


@dataclass
class Outcome:
    mode: str
    seed: int
    steps: int
    virtual_ms: float
    violations: Violations = field(default_factory=Violations)
    #: what the spec allows, counted
    excused: collections.Counter = field(default_factory=collections.Counter)
    #: a fingerprint of the run's trace: equal for two runs that went the same way
    digest: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.violations)


def run(scenario: Scenario) -> Outcome:
    """One run; the library's own log lines (retries under faults) are silenced."""
    logging.disable(logging.CRITICAL)
    try:
        return _run_locks(scenario) if scenario.mode == "locks" else _run_budget(scenario)
    finally:
        logging.disable(logging.NOTSET)


def _faults(scenario: Scenario, **extra) -> Faults:
    outages = tuple(Outage(o.target, o.at_ms, o.ms, o.alarms, o.calls) for o in scenario.outages)
    if "late_delivery" in extra:
        extra["late_delivery_ms"] = LATE_DELIVERY_MS
    return Faults(**dict(scenario.faults), latency_ms=(0.0, scenario.latency_ms), outages=outages, **extra)


def _hibernation(scenario: Scenario) -> float | None:
    return HIBERNATE_AFTER_MS if scenario.hibernate else None


def trace_digest(trace: list[tuple[float, str, str, str]]) -> str:
    """A fingerprint of every call, fault and event of a run, each with its
    virtual time: two runs of one seed must give the same one, in any process."""
    return hashlib.sha256(repr(trace).encode()).hexdigest()[:16]


def lease_options(scenario: Scenario, on: bool = True) -> dict | None:
    if scenario.mode not in LEASE_MODES or not on:
        return None
    return {"provisioning": LEASE_MODES[scenario.mode], "permits_per_lease": scenario.permits_per_lease,
            "ttl_ms": LEASE_TTL_MS}


@contextlib.contextmanager
def planted(plant: str | None) -> Iterator[None]:
    """A defect in the library for one run: a report applied twice frees its releases again."""
    if plant != "double_report":
        yield
        return
    real = allocation.apply_report

    def applied_twice(working, report):
        outcome = real(working, report)
        grant = working.get(report.grant_id)
        if grant is not None and report.released:
            released = min(grant.claimed, grant.released + report.released)  # as if it were a delta
            working.put(grant._replace(released=released))
        return outcome

    allocation.apply_report = applied_twice
    try:
        yield
    finally:
        allocation.apply_report = real


# -- the budget modes ---------------------------------------------------------------------

def _run_budget(scenario: Scenario) -> Outcome:
    consumer = scenario.mode == "consumer"
    runtime = Runtime(load_worker_module(BUDGET_WORKER), {"HOLDER": "Holder", "SHARD": "Shard"},
                      seed=scenario.seed, faults=_faults(scenario, **dict(scenario.queue_faults)),
                      crons=[SWEEP_CRON], hibernate_after_ms=_hibernation(scenario),
                      **(_attempts_queue() if consumer else {}))
    truth = Truth(scenario, runtime.now_ms)
    module = runtime.module
    module.TRUTH = truth
    module.CONFIG.update(limits=list(scenario.limits),
                         group_limits=[dict(scenario.group_limits) for _ in scenario.limits],
                         leases=lease_options(scenario), lose_releases=scenario.lose_releases, plant=scenario.plant,
                         keep_done=scenario.keep_done, shards=scenario.shards, fan_out=scenario.fan_out,
                         depth=scenario.depth,
                         calls=scenario.calls, call_faults=dict(scenario.call_faults),
                         call_rng=random.Random(f"{scenario.mode}:{scenario.seed}:call faults"),
                         evict=runtime.evict, rates=list(scenario.rates),
                         group_rates={group: tuple(rate) for group, *rate in scenario.group_rates},
                         consumer=consumer, records=scenario.records)
    start = runtime.now_ms()
    try:
        with planted(scenario.plant):
            runtime.run(_BudgetDriver(runtime, scenario, truth).drive())
        # The trace as the run ended: what closing the runtime cancels, in
        # whatever order, is no part of the run.
        digest = trace_digest(runtime.trace)
    finally:
        runtime.close()
    return Outcome(scenario.mode, scenario.seed, truth.steps, runtime.now_ms() - start, truth.violations,
                   truth.excused, digest)


def _attempts_queue() -> dict:
    """Mode "consumer": the queue the shards hand admitted work to, its dead
    letters, and their consumer (the Worker's ``Default.queue``)."""
    return {"queues": {"ATTEMPTS": "attempts"},
            "consumers": [QueueConsumer("attempts", max_batch_size=5, max_batch_timeout=0, max_retries=3,
                                        dead_letter_queue="attempts-dead"),
                          QueueConsumer("attempts-dead", max_batch_size=5, max_batch_timeout=0)]}


class _BudgetDriver:
    def __init__(self, runtime: Runtime, scenario: Scenario, truth: Truth) -> None:
        self.runtime, self.scenario, self.truth = runtime, scenario, truth
        self.config = runtime.module.CONFIG
        self.start = runtime.now_ms()
        self.accepted: dict[str, tuple[str, int, int]] = {}  # item id -> (shard, key, ms)
        self.accepted_at: dict[str, float] = {}  # item id -> when its shard accepted it
        self.cancelled: set[str] = set()
        #: cancels whose call failed: the shard may have cancelled the item
        #: and lost only the reply, so either outcome is right for them
        self.maybe_cancelled: set[str] = set()
        #: submits made again after one failed: with no done item kept, one
        #: that arrives after the item ran and went queues it anew (the id is
        #: a no-op only while the item is kept, docs/queue.md)
        self.resubmitted: set[str] = set()
        self.enqueued_at: dict[str, float] = {}  #: item id -> when the item its shard keeps at the end was queued

    def shard(self, index: int):
        return self.runtime.env.SHARD.getByName(f"s{index}")

    def shard_identity(self, index: int) -> str:
        """The id the shard's queue speaks to its holders as (its name and object id)."""
        return wire_identity(self.runtime.env.SHARD.idFromName(f"s{index}").toString(), f"s{index}")

    async def at(self, ms: float) -> None:
        await asyncio.sleep(max(0.0, self.start + ms - self.runtime.now_ms()) / 1000)

    async def drive(self) -> None:
        await asyncio.gather(*(self.submit(i, job) for i, job in enumerate(self.scenario.jobs)),
                             *(self.change(c) for c in self.scenario.changes),
                             *(self.partition(p) for p in self.scenario.partitions),
                             *(self.restart(r) for r in self.scenario.restarts))
        await self.at(self.scenario.faults_end_ms)
        self.runtime.faults.enabled = False
        self.restore()
        await self.quiet()

    async def submit(self, index: int, job) -> None:
        await self.at(job.at_ms)
        item_id = f"j{index}"
        item = {"id": item_id, "key": f"k{job.key}", "group": job.group,
                "body": {"ms": job.ms // 3 if job.fails else job.ms}}
        for _ in range(30):  # a submit may fail with its shard (evicted, crashed): try again
            try:
                await self.shard(job.shard).submit([item])
                break
            except Exception:
                self.resubmitted.add(item_id)
                await asyncio.sleep(1)
        else:
            return
        self.accepted[item_id] = (job.shard, job.key, item["body"]["ms"])
        self.accepted_at[item_id] = self.runtime.now_ms()
        if job.cancel_after_ms is not None:
            await asyncio.sleep(job.cancel_after_ms / 1000)
            try:
                if await self.shard(job.shard).cancel(item_id):
                    self.cancelled.add(item_id)
            except Exception:
                self.maybe_cancelled.add(item_id)

    def cancel_asked(self, item: str) -> bool:
        return item in self.cancelled or item in self.maybe_cancelled

    async def change(self, change) -> None:
        await self.at(change.at_ms)
        self.apply(change.kind, change.key, change.value)

    def apply(self, kind: str, key: int, value: object) -> None:
        if kind == "limit":
            self.config["limits"][key] = value
            self.truth.limit_changed(key, value)
        elif kind == "group_limit":
            self.config["group_limits"][key]["wf1"] = value
            self.truth.group_limit_changed(key, "wf1", value)
        elif kind == "leases":
            on = value == "on"
            self.config["leases"] = lease_options(self.scenario, on)
            self.truth.leases_changed(on)
            for key_ in range(self.scenario.keys):  # a holder reads leases= when it starts
                self.runtime.evict(self.runtime.env.HOLDER.getByName(f"k{key_}"))

    async def restart(self, restart) -> None:
        await self.at(restart.at_ms)
        name = f"k{restart.key}" + (f"~child-{restart.child}" if restart.child >= 0 else "")
        self.runtime.evict(self.runtime.env.HOLDER.getByName(name))

    async def partition(self, partition) -> None:
        """The shard is cut off; in a tree, so is the child that serves it,
        from its parent: past a grant's deadline, with its clients' work running."""
        await self.at(partition.at_ms)
        until = self.runtime.now_ms() + partition.ms
        self.config["partitioned"][f"s{partition.shard}"] = until
        if self.scenario.fan_out:
            for key in range(self.scenario.keys):
                self.config["partitioned"][holder_for(f"k{key}", self.shard_identity(partition.shard),
                                                      self.scenario.fan_out, self.scenario.depth)] = until

    def restore(self) -> None:
        """Faults stop; limits, group limits and leases go back to where they started."""
        self.config["call_faults"] = {}  # the holders' calls to shards too
        own = dict(self.scenario.group_limits)
        for key, limit in enumerate(self.scenario.limits):
            if self.config["limits"][key] != limit:
                self.apply("limit", key, limit)
            if self.config["group_limits"][key].get("wf1") != own.get("wf1"):
                self.apply("group_limit", key, own.get("wf1"))
        if (self.config["leases"] is None) != (self.scenario.mode in GRANTS_ONLY):
            self.apply("leases", 0, "on")

    def bounds(self) -> dict[int, float]:
        """When each key's last item must be admitted (``checks.liveness_bound_ms``)."""
        own = dict(self.scenario.group_limits)
        bounds = {}
        for key, limit in enumerate(self.scenario.limits):
            waiting = [(item, ms) for item, (_, k, ms) in self.accepted.items()
                       if k == key and item not in self.truth.admitted_at and item not in self.cancelled]
            capped = [ms for item, ms in waiting if self.scenario.jobs[int(item[1:])].group == "capped"]
            bounds[key] = self.runtime.now_ms() + liveness_bound_ms(
                self.scenario, sum(ms for _, ms in waiting), limit, sum(capped), own.get("capped"),
                rate_time_ms(self.scenario, key, [self.scenario.jobs[int(item[1:])].group for item, _ in waiting]))
        return bounds

    async def quiet(self) -> None:
        """Wait until every item is released or cancelled and every holder's count is
        back to what runs (outboxes retry on their own backoff), or past the bounds."""
        bounds = self.bounds()
        give_up = max(bounds.values(), default=self.runtime.now_ms()) + 60_000
        while self.runtime.now_ms() < give_up:
            await asyncio.sleep(POLL_MS / 1000)
            states = await self.states()
            if all(states.get(item) in ("released", "cancelled") for item in self.accepted) and not self.leaks():
                break
        for index in range(self.scenario.shards):
            self.enqueued_at.update(await self.shard(index).enqueued_times())
        self.check_end(await self.states(), bounds)
        if self.scenario.mode == "consumer":
            self.check_outcomes(await self.job_statuses())

    async def job_statuses(self) -> dict[str, str]:
        """Mode "consumer": each accepted job's status as its shard's runner reads it."""
        found: dict[str, str] = {}
        with self.runtime.no_faults():
            for index in range(self.scenario.shards):
                ids = [item for item, (shard, _, _) in self.accepted.items() if shard == index]
                found.update(await self.shard(index).job_statuses(ids))
        return found

    def check_outcomes(self, statuses: dict[str, str]) -> None:
        """A job whose work ran and ended is read back as completed or failed:
        its outcome was kept (in the runner's row, or in its released item)."""
        for item, ended_at in self.truth.stopped.items():
            if item in self.accepted and statuses.get(item) not in ("completed", "failed"):
                self.truth.violations.add("outcome", f"{item} ended at {ended_at:.0f} ms, yet reads "
                                                     f"{statuses.get(item)}")

    async def states(self) -> dict[str, str]:
        found = {}
        for index in range(self.scenario.shards):
            found.update(await self.shard(index).states())
        if not self.scenario.keep_done:
            # Kept nothing: an item gone after its work ended was released,
            # one gone after its cancel was cancelled. (An accepted item gone
            # otherwise stays missing: a durability violation.)
            for item in self.accepted:
                if item not in found and item in self.truth.stopped:
                    found[item] = "released"
                elif item not in found and self.cancel_asked(item) and not self.truth.registered[item]:
                    found[item] = "cancelled"
        return found

    def check_end(self, states: dict[str, str], bounds: dict[int, float]) -> None:
        truth, violations = self.truth, self.truth.violations
        books = self.books()
        lost_lease_keys = {key for key, (_, never_learned, _) in books.items() if never_learned}

        def late(key: int, detail: str) -> None:
            # The spec keeps a lease lost in a reply counted until its client
            # settles it, which a client that never asks again never does: a
            # key whose capacity such a lease holds may stall, by design.
            if key in lost_lease_keys:
                truth.excused["liveness: capacity held by a lease lost in a reply"] += 1
            else:
                violations.add("liveness", detail)

        for item, (_, key, _) in self.accepted.items():
            state = states.get(item)
            if state is None:
                violations.add("durability", f"{item}, accepted, is gone")
            elif item in self.cancelled or (item in self.maybe_cancelled and state == "cancelled"):
                # A submit retried after its item ran and went (no done item kept)
                # queues a copy under the same id, and the cancel met the copy: its
                # row went (read as released, grants seed 158), or stays cancelled
                # (8195), queued after the id's run was over: the copy.
                ran_before = truth.stopped.get(item, math.inf)
                copy = state == "released" or self.enqueued_at.get(item, -math.inf) > ran_before
                if (item in self.resubmitted and not self.scenario.keep_done and state in ("released", "cancelled")
                        and copy and truth.registered[item] == 1  # ran once, and was over before the copy was queued:
                        and ran_before < self.accepted_at[item]):
                    truth.excused["durability: a submit retried after its item ran and went, then cancelled"] += 1
                elif state != "cancelled" or truth.registered[item]:
                    violations.add("durability", f"{item} was cancelled, yet is {state}")
            elif state != "released":
                late(key, f"{item} is still {state} at the end")
            elif truth.registered[item] != 1:
                violations.add("exactly_once", f"{item} was registered {truth.registered[item]} times")
            elif truth.admitted_at[item] > max(bounds[key], self.start + self.scenario.faults_end_ms):
                late(key, f"{item} admitted {truth.admitted_at[item] - bounds[key]:.0f} ms past its bound")
        for leak in self.leaks(books):
            violations.add("leak", leak)
        for detail in rate_violations(self.scenario, truth.admissions):
            violations.add("rate", detail)
        for detail in recovery_violations(self.scenario, truth, self.start, self.accepted_at, self.cancel_asked):
            violations.add("recovery", detail)

    def books(self) -> dict[int, tuple[int, int, int]]:
        """Per key: what the holder counts beyond leases their clients never learned
        of, the permits of those leases (the one charge the spec keeps), and what runs."""
        known = set()
        registered: dict[str, set[str]] = {}  # shard -> keys a new instance of it asks about
        for index in range(self.scenario.shards):
            host = self.runtime.host_of(self.shard(index))
            if host.instance is not None:  # the leases its live instance knows (no row holds them)
                known |= {lease.lease_id for lease in host.instance.queue.lease_book.leases()}
            with contextlib.suppress(Exception):  # a shard that never queued has no pacing table
                registered[f"s{index}"] = {r["key"] for r in host.db.inspect("SELECT key FROM durability_queue_pacing")}
        found = {}
        for key in range(self.scenario.keys):
            running = sum(len(items) for items in self.truth.running[key].values())
            db = self.runtime.host_of(self.runtime.env.HOLDER.getByName(f"k{key}")).db
            try:
                grants = db.inspect(f"SELECT permits - released AS charged FROM ({GRANT_ROWS})")
                leases = db.inspect(
                    "SELECT lease_id, client_id, permits, drawn, released FROM durability_semaphore_leases")
            except Exception:
                continue  # this holder never started
            # A lease its client's instance does not know is still one it will
            # hear of, if the client's key row makes it ask (see lease_book).
            never_learned = sum(r["permits"] for r in leases
                                if r["lease_id"] not in known and r["drawn"] == r["released"] == 0
                                and f"k{key}" not in registered.get(client_label(r["client_id"]), set()))
            charged = sum(r["charged"] for r in grants) + sum(r["permits"] - r["released"] for r in leases)
            if self.scenario.fan_out and charged == running:
                charged = self.children_charged(key)  # a tree: what its children count must match too
            found[key] = (charged - never_learned, never_learned, running)
        return found

    def children_charged(self, key: int) -> int:
        """What the children of key's root count, together (a tree)."""
        total = 0
        for child in range(self.scenario.fan_out):
            db = self.runtime.host_of(self.runtime.env.HOLDER.getByName(f"k{key}~child-{child}")).db
            with contextlib.suppress(Exception):  # a child that never started has no table
                total += sum(r["charged"] for r in db.inspect(
                    f"SELECT permits - released AS charged FROM ({GRANT_ROWS})"))
        return total

    def leaks(self, books: dict[int, tuple[int, int, int]] | None = None, by_key: bool = False) -> list:
        """Each holder that counts more than really runs, beyond the leases their
        clients never learned of (with ``by_key``: as (key, description))."""
        books = self.books() if books is None else books
        found = [(key, f"holder k{key} counts {charged}; {running} running at the end")
                 for key, (charged, _, running) in books.items() if charged != running]
        return found if by_key else [text for _, text in found]


# -- the lock semaphore -------------------------------------------------------------------

def _run_locks(scenario: Scenario) -> Outcome:
    runtime = Runtime(load_worker_module(LOCKS_WORKER), {"SLOTS": "Slots", "UPLOADER": "Uploader"},
                      seed=scenario.seed, faults=_faults(scenario, targets=frozenset({"Slots"})),
                      hibernate_after_ms=_hibernation(scenario))
    world = runtime.module.WORLD
    violations = Violations()
    start = runtime.now_ms()
    rng = random.Random(scenario.seed)

    async def one(index: int, hold) -> dict:
        await asyncio.sleep(hold.at_ms / 1000)
        # ttl, wait and max_hold in seconds, as the semaphore takes them.
        job = {"id": f"h{index}", "key": f"key{hold.key}", "limit": hold.limit, "ttl": 2, "work_ms": hold.work_ms}
        if hold.style == "try":
            job["try"] = True
        elif hold.style == "wait":
            job["wait"] = 5
        if hold.stall_ms:
            job["stall_ms"] = hold.stall_ms
        if hold.max_hold:
            job["max_hold"] = 2.5
        return await runtime.env.UPLOADER.getByName(f"uploader-{rng.randrange(scenario.shards)}").upload(job)

    async def drive() -> tuple[list, list]:
        calls = asyncio.gather(*(one(i, hold) for i, hold in enumerate(scenario.holds)))
        stop_faults = asyncio.ensure_future(
            _later(FAULTS_END_MS / 2, lambda: setattr(runtime.faults, "enabled", False)))
        try:
            results = await asyncio.wait_for(calls, FAULTS_END_MS * 4 / 1000)
        except TimeoutError:
            violations.add("liveness", "a hold never ended")
            results = []
        await stop_faults
        await asyncio.sleep(10)  # every lease left behind ends
        with runtime.no_faults():
            left = [await runtime.env.SLOTS.getByName(f"uploads:key{k}").semaphore_usage()
                    for k in range(scenario.keys)]
        return results, left

    try:
        results, left = runtime.run(drive())
        digest = trace_digest(runtime.trace)  # as the run ended (see _run_budget)
    finally:
        runtime.close()
    holds = [dict(h, admitted=world["admitted_at"][h["token"]], seq=world["admission_seq"][h["token"]])
             for h in world["holds"]]
    for hold in holds:
        if hold["admitted"] > hold["start"]:
            violations.add("limit", f"{hold['id']} began before the holder admitted it")
    for found in overlaps_beyond_limits(holds):
        violations.add("limit", f"{found[0]} admitted beyond its limit {found[1]} with {found[2]} holding")
    # A hold whose code ran past the end of its lease (a stall, or renewals
    # that failed) must be told. A stall alone is not enough: a restarted
    # holder keeps a place up to half a lease longer, and says so.
    outran = {hold["id"] for hold in holds if hold["ran_until"] > hold["end"]}
    for result in results:
        if result["status"] not in ("done", "timeout", "busy", "lost"):
            violations.add("liveness", f"{result['id']} ended {result['status']}")
        if result["id"] in outran and result["status"] == "done":
            violations.add("lost", f"{result['id']} ran past its lease and was not told")
    for k, usage in enumerate(left):
        if (usage["held"], usage["waiting"]) != (0, 0):
            violations.add("leak", f"key{k} still holds {usage['held']} and has {usage['waiting']} waiting")
    return Outcome(scenario.mode, scenario.seed, len(holds) + len(results), runtime.now_ms() - start, violations,
                   digest=digest)


async def _later(ms: float, fn) -> None:
    await asyncio.sleep(ms / 1000)
    fn()

