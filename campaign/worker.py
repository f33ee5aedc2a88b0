"""The Worker module the campaign runs in its budget modes: holders, and shards that queue jobs.

Lives here: ``Holder`` (a ``DurabilitySemaphore`` per key, its limits read
from ``CONFIG`` on every round, each commit reported to ``TRUTH``) and
``Shard`` (a ``DurabilitySemaphoreQueue`` whose admitted items "run" for the
time their body names, or in mode "consumer" are handed as jobs to the
``ATTEMPTS`` queue, whose consumer, ``Default.queue``, runs them and
reports to the shard; each start, stop, run and registration reported to
``TRUTH``), written the way a user writes them, plus the hooks of the
planted defects. Must not know: how a scenario is drawn or checked.

The runner loads this module afresh for every run (so ``CONFIG`` and
``TRUTH`` are the run's own) and sets them before any object starts.
"""

import asyncio
import random
import time

from workers import DurableObject, WorkerEntrypoint

from campaign.scenario import (
    CHECKS_WAIT_MS,
    FINISHED_CHECK_MS,
    GRANT_TIMEOUT_MS,
    KEEP_DONE_MS,
    RETRY_MAX_MS,
    RUN_WITHIN_MS,
    START_WITHIN_MS,
    WAKE_AFTER_MS,
)
from durability import Backoff, DurabilityJobs, DurabilityScheduler, JobConsumer, QueueHandoff, current_job
from durability.semaphore import DurabilitySemaphore, DurabilitySemaphoreQueue
from durability.semaphore.holder.pure.allocation import usage
from durability.semaphore.holder.pure.leases import lease_usage
from durability.semaphore.identity import client_label
from durability.testing import JsException

CONFIG = {
    "limits": [],  # per key
    "group_limits": [],  # per key: group -> int, None, or "raise"
    "leases": None,  # the holders' leases= option (read when a holder starts)
    "lose_releases": 0.0,
    "partitioned": {},  # shard name -> until (ms)
    "plant": None,
    "keep_done": True,  # False: the shards keep no done item (keep_done_ms=0)
    "shards": 0,  # how many shards there are: the sweep calls every one
    "fan_out": 0,  # mode "tree": each key's root lends to this many children (0: one holder per key)
    "depth": 1,  # mode "tree": levels under the root (2: its children lend on to leaves)
    # True: holders answer a shard's request at once and call it back (semaphore_reply)
    "calls": False,
    # the faults of those calls alone: kind -> rate ("lost", "lost_reply", "duplicate",
    # "late", "evict_client": delivered, then the shard evicted; "evict_holder": the
    # holder evicted between its round and the call), drawn from "call_rng"
    "call_faults": {},
    "call_rng": None,
    "evict": None,  # stub -> None: the runner's eviction of that stub's object
    "rates": [],  # mode "rate": per key, the holder's rate= (limit, period_ms, burst)
    "group_rates": {},  # mode "rate": group -> its own rate (group_rate=), every key
    "consumer": False,  # mode "consumer": admitted work runs in the ATTEMPTS queue's consumer
    # mode "consumer": a job its first attempt ends keeps its outcome in its released item
    "records": False,
}
TRUTH = None


def now_ms():
    return time.time() * 1000


def key_index(name):
    return int(name.split("~child-")[0][1:])  # "k0" -> 0, and "k0~child-1" (a tree's child) -> 0


def cut_off(name):
    return CONFIG["partitioned"].get(name, 0) > now_ms()


class Holder(DurableObject):
    """One instance per key ("k0", "k1", ...), and in mode "tree" its children ("k0~child-1", ...)."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.name = ctx.id.name
        self.key = key_index(self.name)
        self.scheduler = DurabilityScheduler(ctx)
        parent = DurabilitySemaphore.client(binding="HOLDER").with_(self._unless_cut_off).bind(env)
        self.semaphore = DurabilitySemaphore(
            self.scheduler, limit=self._limit, group_limit=self._group_limit,
            grant_timeout_ms=GRANT_TIMEOUT_MS, leases=CONFIG["leases"],
            parent=parent if CONFIG["fan_out"] else None,
            clients=FaultyCalls(env.SHARD, lambda: env.HOLDER.getByName(self.name)) if CONFIG["calls"] else None,
            wake_after_ms=WAKE_AFTER_MS, rate=self._rate(),
            group_rate=self._group_rate if CONFIG["group_rates"] else None,
        )
        self._semaphore_commit = self.semaphore._commit
        self.semaphore._commit = self._commit_and_report  # every commit is reported to TRUTH

    async def _unless_cut_off(self, call):
        """A tree's holder partitioned (its name in ``CONFIG["partitioned"]``) reaches neither parent nor child."""
        if cut_off(self.name):
            raise lost_connection()
        return await call()

    def _rate(self):
        if not CONFIG["rates"]:
            return None
        limit, period_ms, burst = CONFIG["rates"][self.key]
        planted = 1 if CONFIG["plant"] == "over_rate" else 0  # a holder that lets one start too many
        return limit + planted, period_ms, burst

    def _group_rate(self, group):
        rate = CONFIG["group_rates"].get(group)
        if rate is None or CONFIG["plant"] != "over_rate":
            return rate
        limit, period_ms, burst = rate
        return limit + 1, period_ms, burst  # planted: one start too many per window

    def _limit(self):
        planted = 1 if CONFIG["plant"] == "over_grant" else 0  # a holder that grants one permit too many
        return CONFIG["limits"][self.key] + planted

    def _group_limit(self, group):
        value = CONFIG["group_limits"][self.key].get(group)
        if value == "raise":
            raise RuntimeError(f"no limit known for {group}")
        return value

    def _commit_and_report(self, changes):
        grants, leases = self.semaphore.books.grants(), self.semaphore.books.leases()
        moved_back = _moved_back(grants, leases, changes)
        if "~child-" in self.name:
            self._semaphore_commit(changes)
            TRUTH.child_committed(moved_back)
            return
        issued = {g.group for g in changes.written.values() if g.grant_id not in grants}
        issued |= {lease.group for lease in changes.leases_written.values() if lease.lease_id not in leases}
        self._semaphore_commit(changes)
        total, groups = usage(self.semaphore.books.grants().values())
        leased, leased_groups = lease_usage(self.semaphore.books.leases().values())
        for group, n in leased_groups.items():
            groups[group] = groups.get(group, 0) + n
        TRUTH.holder_committed(self.key, (total + leased, groups), issued, moved_back)

    async def permits(self, message):
        return await self.semaphore.handle(message)

    async def usage(self):
        return self.semaphore.usage()

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)


class FaultyCalls:
    """The shards' namespace as a holder calls it, with the faults of ``CONFIG["call_faults"]``."""

    def __init__(self, namespace, holder):
        self.namespace, self.holder = namespace, holder

    def idFromString(self, hex_id):
        return self.namespace.idFromString(hex_id)

    def get(self, object_id):
        return _FaultyStub(self.namespace.get(object_id), self.holder)

    def getByName(self, name):
        return _FaultyStub(self.namespace.getByName(name), self.holder)


class _FaultyStub:
    def __init__(self, stub, holder):
        self.stub, self.holder = stub, holder

    async def semaphore_reply(self, key, reply):
        fault = _call_fault()
        if fault == "evict_holder":  # its round's rows are written; the call never leaves
            CONFIG["evict"](self.holder())
            raise lost_connection()
        if fault == "lost":
            raise lost_connection()
        if fault == "late":
            await asyncio.sleep(CONFIG["call_rng"].uniform(1, 20))
        answer = await self.stub.semaphore_reply(key, reply)
        if fault == "duplicate":
            await self.stub.semaphore_reply(key, reply)
        elif fault == "evict_client":
            CONFIG["evict"](self.stub)
        elif fault == "lost_reply":
            raise lost_connection()
        return answer


def _call_fault():
    """One call's fault, if any (at most one), from the run's own source of them."""
    draw = CONFIG["call_rng"].random() if CONFIG["call_faults"] else 1.0
    for kind, rate in sorted(CONFIG["call_faults"].items()):
        if draw < rate:
            return kind
        draw -= rate
    return None


def _moved_back(grants, leases, changes):
    found = []
    for grant in changes.written.values():
        old = grants.get(grant.grant_id)
        if old is not None and (grant.claimed < old.claimed or grant.released < old.released
                                or grant.permits > old.permits):
            found.append(f"grant {grant.grant_id}: {old} -> {grant}")
    for lease in changes.leases_written.values():
        old = leases.get(lease.lease_id)
        if old is not None and (lease.drawn < old.drawn or lease.released < old.released
                                or lease.permits > old.permits):
            found.append(f"lease {lease.lease_id}: {old} -> {lease}")
    return found


limits = DurabilitySemaphore.client(binding="HOLDER")


def lost_connection():
    error = JsException("Network connection lost.")
    error.retryable = True
    return error


class Shard(DurableObject):
    """Queues jobs of every key; an admitted job runs for ``body["ms"]``, then is released."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.name = ctx.id.name
        self.scheduler = DurabilityScheduler(ctx)
        self.scheduler.register("work", self._work_ends)
        tree = DurabilitySemaphore.client(binding="HOLDER", fan_out=CONFIG["fan_out"],
                                          depth=CONFIG["depth"]) if CONFIG["fan_out"] else None
        server = (tree or limits).bind(env)
        send = server._send

        async def send_unless_partitioned(key, message):
            if cut_off(self.name):
                raise lost_connection()
            return await send(key, message)

        server._send = send_unless_partitioned
        lost_all = CONFIG["plant"] == "lost_release"
        self.jobs = DurabilityJobs(
            self.scheduler, handlers={"run": run_attempt}, on_lifecycle_event=self._on_job_event,
            retries=Backoff(initial_ms=500, max_ms=RETRY_MAX_MS),
            runs_in=QueueHandoff(env.ATTEMPTS, ctx.id.toString(), start_within_ms=START_WITHIN_MS,
                                 run_within_ms=RUN_WITHIN_MS),
            outcomes=self if CONFIG["records"] else None) if CONFIG["consumer"] else None
        self._lost: dict[str, bool] = {}  #: item id -> its release is lost (drawn once an item)
        self.queue = DurabilitySemaphoreQueue(
            self.scheduler, client_id=self.name, server=server, admit=self._admit,
            finished=None if lost_all else self._finished,  # a lost release with no sweep
            finished_check_ms=FINISHED_CHECK_MS, lease_report_delay_ms=2_000,
            retries=Backoff(initial_ms=500, max_ms=RETRY_MAX_MS),
            # Done items are kept past the end of any run (the end-of-run
            # check reads every accepted item's final state from the shards),
            # or not at all, as the example Worker does.
            keep_done_ms=KEEP_DONE_MS if CONFIG["keep_done"] else 0,
            keep_records_ms=KEEP_DONE_MS,  # a record outlives the run, as a kept item does
            woken=CONFIG["calls"],
            checks_wait_ms=CHECKS_WAIT_MS if CONFIG["consumer"] else 0,
        )
        # An instance a holder's call made through the shard's id alone has no
        # name: it speaks under the label its queue kept, and is partitioned by it.
        self.name = client_label(self.queue.client_id)
        self._report_admissions()

    def _report_admissions(self):
        """Each write of an item as admitted is reported to ``TRUTH`` (a start
        rate counts admissions; one whose transaction fails is written again later)."""
        store = self.queue.ctx.store
        move_item = store.move_item

        def reported(item, to, *args, **kwargs):
            result = move_item(item, to, *args, **kwargs)
            if to == "admitted":
                TRUTH.admission_written(item.id, key_index(item.key))
            return result

        store.move_item = reported

    async def semaphore_reply(self, key, reply):
        if cut_off(self.name):
            raise lost_connection()
        return await self.queue.hear(key, reply)

    async def submit(self, items):
        return [item.id for item in await self.queue.enqueue(items)]

    async def cancel(self, item_id):
        try:
            return await self.queue.cancel(item_id)
        except ValueError:
            return False  # no longer queued

    async def states(self):
        return {r["id"]: r["state"] for r in self.ctx.storage.sql.exec("SELECT id, state FROM durability_queue_items")}

    async def enqueued_times(self):
        """When each item kept was queued (a copy a retried submit queued is younger than its id's run)."""
        return {r["id"]: r["enqueued_at"]
                for r in self.ctx.storage.sql.exec("SELECT id, enqueued_at FROM durability_queue_items")}

    async def _admit(self, items):
        twice = CONFIG["plant"] == "double_admit"
        for item in items:
            # admit() must be idempotent on item id: the work registers once.
            if twice or not TRUTH.registered[item.id]:
                if TRUTH.register(item.id):
                    TRUTH.start(item.id, key_index(item.key), item.group)
            if self.jobs is not None:  # its consumer runs it, and the job's end releases it
                await self.jobs.run.kept(item.id, {"ms": item.body["ms"]}, resumed=item.resumed,
                                         since=item.admitted_at)
            else:
                self.scheduler.schedule("work", item.id, TRUTH.admitted_at[item.id] + item.body["ms"])
        await self.scheduler.sync()
        if twice and items:
            raise RuntimeError("admit() fails after its work started: it runs again")

    async def _work_ends(self, timer):
        await self._ended(timer.key)

    def _release_lost(self, item_id):
        if item_id not in self._lost:
            self._lost[item_id] = CONFIG["plant"] == "lost_release" or random.random() < CONFIG["lose_releases"]
        return self._lost[item_id]

    async def _ended(self, item_id):
        TRUTH.stop(item_id)
        if not self._release_lost(item_id):
            await self.queue.release(item_id)

    # -- the job runner's outcomes= (records): kept in the released item
    def keep(self, job_id, row):
        if self._release_lost(job_id):
            return False  # the runner keeps it, and the item stays admitted: the sweep returns its permit
        try:
            kept = self.queue.release_keeping(job_id, row)
        except (KeyError, ValueError):  # no item admitted under it: the runner keeps its row
            return False
        if kept:
            # Its end counts once the release is durable, before its holder
            # hears of it (the holder hears once the write commits).
            self.queue.ctx.in_this_event(lambda: self._stopped_once_durable(job_id))
        return kept

    async def _stopped_once_durable(self, job_id):
        await self.scheduler.sql.flush()
        TRUTH.stop(job_id)

    def get(self, job_id):
        if CONFIG["plant"] == "lost_outcome":
            return None  # planted: what the release kept is never read back
        return self.queue.record(job_id)

    async def job_statuses(self, ids):
        """Mode "consumer": what each job's record says now (``get_result``)."""
        return {job_id: (await self.jobs.run.get_result(job_id))["status"] for job_id in ids}

    async def _on_job_event(self, event):
        if event.type == "terminal":
            # Its end counts once it is durable: a crash that loses the write
            # leaves the job out, and the consumer's next delivery runs it again.
            await self.scheduler.sql.flush()
            await self._ended(event.id)

    async def job_report(self, report):
        """The consumer's call (mode "consumer"): an attempt it ran ended, or is it still out?"""
        if cut_off(self.name):
            raise lost_connection()
        await self.queue.hand_in_admitted()  # a new instance's admitted jobs: known before the report
        answer = await self.jobs.report(report)
        if answer["status"] in ("completed", "failed"):
            await self.queue.check_finished([report["job"]])
        return answer

    async def _finished(self, ids):
        if self.jobs is None:
            return [i for i in ids if i in TRUTH.stopped]
        # The runner's word: a job whose terminal event was lost with its instance is over too
        # (once that word is durable: a read sees the instance's own writes before they commit).
        done = [i for i in ids if (await self.jobs.run.get_result(i))["status"] in ("completed", "failed")]
        if done:
            await self.scheduler.sql.flush()
        for item_id in done:
            TRUTH.stop(item_id)
        return done

    async def wake(self):
        await self.queue.resume()

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)


async def run_attempt(payload):
    """Mode "consumer": an item's work, run by the queue's consumer for as long as its body says."""
    item_id = current_job().id
    TRUTH.run_started(item_id)
    try:
        await asyncio.sleep(payload["ms"] / 1000)
    finally:
        TRUTH.run_ended(item_id)


class Default(WorkerEntrypoint):
    async def queue(self, batch, env, ctx):
        """Mode "consumer": the ATTEMPTS queue's batches (and its dead letters')."""
        consumer = JobConsumer({"run": run_attempt}, binding="SHARD", dead_letter_queue="attempts-dead")
        if CONFIG["plant"] == "consumer_overlap":  # every batch handled twice at once: runs overlap
            await asyncio.gather(consumer.handle(batch, self.env), consumer.handle(batch, self.env))
            return
        await consumer.handle(batch, self.env)

    async def scheduled(self, controller, env, ctx):
        """The sweep (a Cron Trigger every minute), as the example Worker's:
        every shard resumes work whose alarm the runtime gave up on, and its
        idle keys that may hold grants ask what they hold. Holders are not
        swept: every shard with work waiting calls its holder."""
        for stub in [env.SHARD.getByName(f"s{i}") for i in range(CONFIG["shards"])]:
            try:
                await stub.wake()
            except Exception:
                pass  # faulted: the next sweep calls it again
