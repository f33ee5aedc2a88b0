"""A Worker module for the holder's tests: a holder with live, test-controlled limits,
and simulated client objects that claim, run and release work against it.

``CONFIG`` is read on every round, so a test changes limits while rounds run
(``leases`` and the queue's options are read when an object starts).
``WORLD`` is the ground truth outside the objects: which work is running now,
checked at every start against the limit, or ``CONFIG["ceiling"]`` (limit +
extra, for leases provisioned "over").
"""

import asyncio
import contextlib
import copy
import dataclasses
import json
import random
import time

from workers import DurableObject

from durability import DurabilityScheduler
from durability.semaphore import DurabilitySemaphore, DurabilitySemaphoreQueue, SemaphoreClient
from durability.semaphore.identity import client_label
from durability.semaphore.messages import LeaseEntry

CONFIG = {
    "limit": 3,
    "group_limits": {},
    "denied": set(),
    "failing_groups": set(),
    "round_wait_ms": 1_000,
    "round_period_ms": 2_000,
    "grant_timeout_ms": 10_000,
    "finished_check_ms": 60_000,
    "use_finished": True,
    "lose_releases": 0.0,  # share of releases the shard "forgets" to make
    "admit_failures": 0,  # admit() raises this many times first
    "abort_in_admit": 0,  # admit() resets the object (ctx.abort) this many times first
    "release_in_admit": False,  # admit() releases an item of no work (ms 0) itself, before it returns;
                                # "detached": in a task it leaves running
    "fake_reply": None,  # when set, the shard's holder answers every message with this
    "leases": None,  # the holder's leases= option
    "fair_share": None,  # the holder's fair_share= option
    "ceiling": None,  # what work may really reach (limit + extra for leases "over"); None: the limit
    "lease_report_delay_ms": 10_000,
    "keep_done_ms": 600_000,
    "keep_records_ms": None,  # the shards' keep_records_ms
    "keep_done_max": None,  # the shards' keep_done_max
    "records": False,  # a job's end releases its item keeping a record of it (release_keeping)
    "hold_syncs": None,  # an asyncio.Event: the shard's syncs wait for it before they reach the holder
    "hold_replies": {},  # message type -> an asyncio.Event: the holder's answers wait for it to reach the shard
    "lose_replies": {},  # message type -> how many of the holder's next answers are lost on the way
    "two_phase": False,  # the shard's requests reach the holder as a version that grants unclaimed permits
    "client_id": None,  # the label every shard gives its queue; None: the shard's name
    "calls": False,  # the holder answers at once and calls shards back (clients=, woken=True)
    "wake_after_ms": 60_000,  # the holder's wake_after_ms (with calls)
    "request_wait_ms": 50_000,  # the shards' request_wait_ms
    "hold_calls": None,  # an asyncio.Event: the holder's calls to shards wait for it before they leave
    "lose_calls": 0,  # how many of the holder's next calls to shards are lost on the way
    "rate": None,  # the holder's rate= option (read when it starts)
    "group_rates": {},  # group -> its own rate (group_rate=, read every round)
}
WORLD = {"running": {}, "violations": [], "max_running": 0, "completed": set(), "admit_calls": 0,
         "started": {}, "starts": {}, "events": [], "requests": [], "syncs": [], "finished_asks": [], "messages": [],
         "speakers": set(), "calls": [], "call_replies": [], "resumed": [],
         "request_copies": []}  # each request as it reached a holder: a test may deliver a copy late


def _label(client_id):
    """The label a shard gave its queue (its name), for the tests to read."""
    return client_label(client_id) if isinstance(client_id, str) else client_id


def _start(item):
    # Idempotent by item id: a client that starts an item again after its
    # commit was lost does not run it twice.
    WORLD["running"][item] = True
    total = len(WORLD["running"])
    WORLD["max_running"] = max(WORLD["max_running"], total)
    if total > (CONFIG["ceiling"] if CONFIG["ceiling"] is not None else CONFIG["limit"]):
        WORLD["violations"].append((time.time(), sorted(WORLD["running"])))


def _stop(item):
    if WORLD["running"].pop(item, None):
        WORLD["completed"].add(item)


class Holder(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx)
        self.semaphore = DurabilitySemaphore(
            self.scheduler,
            limit=lambda: CONFIG["limit"],
            group_limit=self._group_limit,
            can_grant=lambda client, group: (client_label(client), group) not in CONFIG["denied"],
            round_wait_ms=CONFIG["round_wait_ms"],
            round_period_ms=CONFIG["round_period_ms"],
            grant_timeout_ms=CONFIG["grant_timeout_ms"],
            leases=CONFIG["leases"],
            fair_share=CONFIG["fair_share"],
            clients=_Calls(env.SHARD) if CONFIG["calls"] else None,
            wake_after_ms=CONFIG["wake_after_ms"],
            rate=CONFIG["rate"],
            group_rate=(lambda group: CONFIG["group_rates"].get(group)) if CONFIG["group_rates"] else None,
        )

    def _group_limit(self, group):
        if group in CONFIG["failing_groups"]:
            raise RuntimeError(f"no limit known for {group}")
        return CONFIG["group_limits"].get(group)

    async def permits(self, message):
        if isinstance(message, dict) and message.get("type") in ("request", "sync"):
            WORLD[message["type"] + "s"].append((time.time() * 1000, _label(message.get("clientId"))))
            if message["type"] == "request":
                with contextlib.suppress(TypeError):  # (a hostile message may hold what copies not)
                    WORLD["request_copies"].append(copy.deepcopy(message))
            if isinstance(message.get("clientId"), str):
                WORLD["speakers"].add(message["clientId"])  # as the wire spells it
        WORLD["messages"].append(message.get("type") if isinstance(message, dict) else None)
        return await self.semaphore.handle(message)

    async def usage(self):
        return self.semaphore.usage()

    async def usage_info(self):
        """The typed usage, as plain values (a dataclass does not cross RPC)."""
        return json.loads(json.dumps(dataclasses.asdict(self.semaphore.usage_info())))  # tuples as lists, as RPC takes

    async def drop_schema(self):
        DurabilitySemaphore.migrate(self.ctx, None)
        return [r["name"] for r in self.ctx.storage.sql.exec(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'durability_semaphore%'"
        )]

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)


class _Calls:
    """The shards' namespace as the holder calls it: each call noted in
    ``WORLD["calls"]``, held by ``CONFIG["hold_calls"]`` or lost (``lose_calls``)."""

    def __init__(self, namespace):
        self.namespace = namespace

    def idFromString(self, hex_id):
        return self.namespace.idFromString(hex_id)

    def get(self, object_id):
        return _CallStub(self.namespace.get(object_id))

    def getByName(self, name):
        return _CallStub(self.namespace.getByName(name))


class _CallStub:
    def __init__(self, stub):
        self.stub = stub

    async def semaphore_reply(self, key, reply):
        WORLD["calls"].append((time.time() * 1000, self.stub.name, [g["grantId"] for g in reply["grants"]]))
        WORLD["call_replies"].append((self.stub.name, key, reply))  # as sent: a test may deliver a copy late
        if CONFIG["hold_calls"] is not None:
            await CONFIG["hold_calls"].wait()
        if CONFIG["lose_calls"] > 0:
            CONFIG["lose_calls"] -= 1
            raise ConnectionError("the holder's call was lost")
        return await self.stub.semaphore_reply(key, reply)


limits = DurabilitySemaphore.client(binding="HOLDER")

TICK = "tick"


class SimClient(DurableObject):
    """Queues ``want`` items of one group, claims permits, runs each item for a
    while (in ``WORLD``, which outlives evictions) and releases it.

    It starts an item only once the holder confirmed its claim, and returns
    the permit only after the item stopped: the two rules that keep work
    actually running within the limit.
    """

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx)
        self.scheduler.register(TICK, self._tick)
        self.client = limits.bind(env)
        sql = ctx.storage.sql
        sql.exec("CREATE TABLE IF NOT EXISTS sim (k TEXT PRIMARY KEY, v) WITHOUT ROWID")
        sql.exec(
            "CREATE TABLE IF NOT EXISTS grants (grant_id TEXT PRIMARY KEY, permits INTEGER,"
            " claimed INTEGER, confirmed INTEGER, released INTEGER)"
        )
        sql.exec("CREATE TABLE IF NOT EXISTS work (item TEXT PRIMARY KEY, grant_id TEXT, ends_at REAL)")

    def _get(self, key, default=None):
        rows = self.ctx.storage.sql.exec("SELECT v FROM sim WHERE k = ?", key).toArray()
        return rows[0]["v"] if rows else default

    def _set(self, key, value):
        self.ctx.storage.sql.exec(
            "INSERT INTO sim VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v", key, value
        )

    async def start(self, group, want, oldest_at):
        self._set("group", group)
        self._set("want", want)
        self._set("oldest", oldest_at)
        self.scheduler.schedule(TICK, TICK, time.time() * 1000)
        await self.scheduler.sync()

    async def status(self):
        running = self.ctx.storage.sql.exec("SELECT item FROM work").toArray()
        return {"want": self._get("want", 0), "running": len(running)}

    async def _tick(self, timer):
        sql = self.ctx.storage.sql
        name = self.ctx.id.name
        now = time.time() * 1000
        # Work that ended gives its permit back (after it stopped).
        for row in sql.exec("SELECT item, grant_id FROM work WHERE ends_at <= ?", now).toArray():
            _stop(row["item"])  # the work stops first, then its permit goes back
            sql.exec("DELETE FROM work WHERE item = ?", row["item"])
            sql.exec("UPDATE grants SET released = released + 1 WHERE grant_id = ?", row["grant_id"])
        # Claim what known grants leave unclaimed, for queued items.
        want = self._get("want", 0)
        for grant in sql.exec("SELECT grant_id, permits, claimed FROM grants").toArray():
            take = min(grant["permits"] - grant["claimed"], want)
            if take > 0:
                sql.exec("UPDATE grants SET claimed = claimed + ? WHERE grant_id = ?", take, grant["grant_id"])
                want -= take
        self._set("want", want)
        reports = [
            {"grantId": g["grant_id"], "claimed": g["claimed"], "released": g["released"]}
            for g in sql.exec("SELECT grant_id, claimed, released FROM grants").toArray()
        ]
        message = {"type": "request", "v": 1, "clientId": name, "grants": reports,
                   "demand": [{"group": self._get("group"), "count": want, "oldestAt": self._get("oldest")}]}
        try:
            reply = await self.client.request("holder", message)
        except Exception:
            reply = None  # lost: ask again on the next tick; the counts are cumulative
        if reply is not None and reply.get("type") == "grants":
            self._apply(reply)
        # Keep reporting until the holder has settled every grant: a lost
        # release would otherwise stay charged at the holder.
        busy = self._get("want", 0) or sql.exec("SELECT count(*) AS n FROM work").one()["n"] or sql.exec(
            "SELECT count(*) AS n FROM grants").one()["n"]
        if busy:
            self.scheduler.schedule(TICK, TICK, time.time() * 1000 + 500 + random.random() * 500)

    def _apply(self, reply):
        sql = self.ctx.storage.sql
        name = self.ctx.id.name
        now = time.time() * 1000
        for report in reply["reports"]:
            row = sql.exec("SELECT claimed, confirmed FROM grants WHERE grant_id = ?", report["grantId"]).toArray()
            if not row:
                continue
            confirmed = report["claimed"] if report["status"] != "not_found" else row[0]["confirmed"]
            for k in range(row[0]["confirmed"], confirmed):
                item = f"{name}/{report['grantId']}/{k}"
                sql.exec("INSERT INTO work VALUES (?, ?, ?)", item, report["grantId"],
                         now + random.uniform(500, 4_000))
                _start(item)
            refused = row[0]["claimed"] - confirmed
            if refused > 0:  # claimed locally, but the permits were taken back
                self._set("want", self._get("want", 0) + refused)
            sql.exec("UPDATE grants SET claimed = ?, confirmed = ?, permits = ? WHERE grant_id = ?",
                     confirmed, confirmed, max(report["permits"], confirmed), report["grantId"])
            if report["status"] == "not_found" or report["released"] == report["permits"] == confirmed:
                if not sql.exec("SELECT item FROM work WHERE grant_id = ?", report["grantId"]).toArray():
                    sql.exec("DELETE FROM grants WHERE grant_id = ? AND released = claimed", report["grantId"])
        for grant in reply["grants"]:
            sql.exec(
                "INSERT INTO grants VALUES (?, ?, 0, 0, 0) "
                "ON CONFLICT (grant_id) DO UPDATE SET permits = excluded.permits",
                grant["grantId"], grant["permits"],
            )

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)


class Shard(DurableObject):
    """A client object that queues jobs with DurabilitySemaphoreQueue; a job
    "runs" in WORLD for the duration its body names, then is released."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx)
        self.scheduler.register("work", self._work_ends)
        self.queue = DurabilitySemaphoreQueue(
            self.scheduler,
            client_id=CONFIG["client_id"] or ctx.id.name,
            server=self._server(env),
            admit=self._admit,
            finished=self._finished if CONFIG["use_finished"] else None,
            finished_check_ms=CONFIG["finished_check_ms"],
            lease_report_delay_ms=CONFIG["lease_report_delay_ms"],
            keep_done_ms=CONFIG["keep_done_ms"],
            keep_records_ms=CONFIG["keep_records_ms"],
            keep_done_max=CONFIG["keep_done_max"],
            on_lifecycle_event=lambda event: WORLD["events"].append((ctx.id.name, event)),
            woken=CONFIG["calls"],
            request_wait_ms=CONFIG["request_wait_ms"],
        )

    async def semaphore_reply(self, key, reply):
        return await self.queue.hear(key, reply)

    async def wake(self):
        """The sweep's call."""
        await self.queue.resume()

    @staticmethod
    def _server(env):
        if CONFIG["hold_syncs"] is not None or CONFIG["hold_replies"] or CONFIG["two_phase"] or CONFIG["lose_replies"]:
            async def held(key, message):
                if CONFIG["two_phase"]:  # as a holder that knows no "claims" reads it
                    message = {k: v for k, v in message.items() if k not in ("claims", "heardUpTo")}
                if message.get("type") == "sync" and CONFIG["hold_syncs"] is not None:
                    await CONFIG["hold_syncs"].wait()
                reply = await env.HOLDER.getByName(key).permits(message)
                gate = CONFIG["hold_replies"].get(message.get("type"))
                if gate is not None:
                    await gate.wait()
                if CONFIG["lose_replies"].get(message.get("type"), 0) > 0:
                    CONFIG["lose_replies"][message.get("type")] -= 1
                    raise ConnectionError("the holder's reply was lost")
                return reply

            return SemaphoreClient(held)
        if CONFIG["fake_reply"] is None:
            return limits.bind(env)

        async def send(key, message):
            return CONFIG["fake_reply"]

        return SemaphoreClient(send)

    async def submit(self, items):
        return [item.id for item in await self.queue.enqueue(items)]

    async def release(self, item_id):
        return await self.queue.release(item_id)

    async def cancel(self, item_id):
        return await self.queue.cancel(item_id)

    async def status(self, item_id):
        return self.queue.status(item_id)

    async def record(self, item_id):
        return self.queue.record(item_id)

    async def leases(self):
        """The leases the queue holds, with their counts (drawn and released are its items')."""
        return [dataclasses.asdict(lease) for lease in self.queue.lease_book.leases()]

    async def hear_late_listing(self, key, lease):
        """A late reply's listing of ``lease`` as it was when first issued (nothing drawn)."""
        now = time.time() * 1000
        entry = LeaseEntry(lease["lease_id"], lease["group"], lease["permits"], 0, lease["ttl_ms"],
                           now + lease["ttl_ms"], False)
        self.queue.ctx.commit_now(lambda: self.queue.leases.learn(key, (entry,), now))
        return await self.leases()

    async def vias(self):
        return {r["id"]: r["via"] for r in self.ctx.storage.sql.exec("SELECT id, via FROM durability_queue_items")}

    async def states(self):
        return {r["id"]: r["state"] for r in self.ctx.storage.sql.exec("SELECT id, state FROM durability_queue_items")}

    async def _admit(self, items):
        WORLD["admit_calls"] += 1
        WORLD["resumed"].append(sorted((item.id, item.resumed) for item in items))
        if CONFIG["abort_in_admit"] > 0:
            CONFIG["abort_in_admit"] -= 1
            self.ctx.abort("crashed between the admission and admit()")
        if CONFIG["admit_failures"] > 0:
            CONFIG["admit_failures"] -= 1
            raise RuntimeError("admit fails")
        now = time.time() * 1000
        for item in items:
            if item.id not in WORLD["started"]:  # idempotent on item id
                WORLD["started"][item.id] = now
                WORLD["starts"][item.id] = WORLD["starts"].get(item.id, 0) + 1
                _start(item.id)
            if CONFIG["release_in_admit"] and item.body["ms"] == 0:
                _stop(item.id)
                if CONFIG["release_in_admit"] == "detached":
                    self.ctx.waitUntil(asyncio.ensure_future(self.queue.release(item.id)))
                else:
                    await self.queue.release(item.id)
                continue
            self.scheduler.schedule("work", item.id, WORLD["started"][item.id] + item.body["ms"])
        await self.scheduler.sync()

    async def _work_ends(self, timer):
        _stop(timer.key)
        if random.random() >= CONFIG["lose_releases"]:
            if CONFIG["records"]:
                self.queue.release_keeping(timer.key, {"ran": timer.key})
            else:
                await self.queue.release(timer.key)

    async def _finished(self, ids):
        WORLD["finished_asks"].append((time.time() * 1000, list(ids)))
        return [i for i in ids if i in WORLD["completed"]]

    async def pacing(self, key):
        """When this instance will next ask the holder of ``key``, and the interval kept in SQL."""
        row = self.ctx.storage.sql.exec("SELECT interval_ms FROM durability_queue_pacing WHERE key = ?", key).toArray()
        return [self.queue.server.next_request_at(key), row[0]["interval_ms"] if row else None]

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)
