"""The example Worker: counters that report to tallies through a durable outbox.

Lives here: the Durable Object classes and the ``Default`` entrypoint that
``wrangler deploy`` ships, written the way a user of the library writes them.
Must not know: the embedded runtime; this module runs unmodified on
Cloudflare and in tests.

Each ``Counter`` counts increments per tally. Its increment and the report
of its new cumulative count to the ``Tally`` commit in one transaction; the
outbox then delivers the report at least once. A tally keeps, per counter,
the highest count it was told, so lost, repeated and reordered reports
still add up to exactly what was counted.
"""

import json

from workers import DurableObject, Response, WorkerEntrypoint

from durability import DurabilityOutbox, DurabilityScheduler
from durability.semaphore import DurabilitySemaphore

MAX_NAME_LENGTH = 256
MAX_AMOUNT = 1_000_000_000


def _name(value, what):
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"{what} must be a string of 1 to {MAX_NAME_LENGTH} characters")
    return value


def _amount(value):
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_AMOUNT:
        raise ValueError(f"amount must be an integer from 1 to {MAX_AMOUNT}")
    return value


class Counter(DurableObject):
    """Counts increments per tally and reports each cumulative count to its tally."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx)
        self.outbox = DurabilityOutbox(self.scheduler)
        # Reports wait up to a second so that each tally hears one cumulative
        # count per second however many increments there were.
        self.reports = self.outbox.channel("tally-reports", self._send_reports, delay_ms=1_000)
        ctx.storage.sql.exec(
            "CREATE TABLE IF NOT EXISTS counts ("
            " tally TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID"
        )

    async def add(self, tally, amount):
        """Add ``amount`` to this counter's count for ``tally``; return the new count."""
        _name(tally, "tally")
        _amount(amount)

        def change():
            value = self.ctx.storage.sql.exec(
                "INSERT INTO counts (tally, value) VALUES (?, ?) ON CONFLICT (tally) "
                "DO UPDATE SET value = value + excluded.value RETURNING value",
                tally, amount,
            ).one()["value"]
            report = {"tally": tally, "source": self.ctx.id.toString(), "count": value}
            self.reports.enqueue(report, key=tally)  # replaces an unsent older report
            return value

        value = self.ctx.storage.transactionSync(change)
        await self.scheduler.sync()
        return value

    async def count(self, tally):
        row = self.ctx.storage.sql.exec(
            "SELECT value FROM counts WHERE tally = ?", _name(tally, "tally")
        ).toArray()
        return row[0]["value"] if row else 0

    async def _send_reports(self, messages):
        for message in messages:
            report = message.body
            tally = self.env.TALLY.getByName(report["tally"])
            await tally.report(report["source"], report["count"])

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)


class Tally(DurableObject):
    """Sums the cumulative counts its counters report, each counted once."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        ctx.storage.sql.exec(
            "CREATE TABLE IF NOT EXISTS sources ("
            " source TEXT PRIMARY KEY, count INTEGER NOT NULL) WITHOUT ROWID"
        )

    async def report(self, source, count):
        """Record that ``source`` has counted ``count`` in all; older reports change nothing."""
        _name(source, "source")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError("count must be a non-negative integer")
        self.ctx.storage.sql.exec(
            "INSERT INTO sources (source, count) VALUES (?, ?) ON CONFLICT (source) "
            "DO UPDATE SET count = excluded.count WHERE excluded.count > sources.count",
            source, count,
        )
        return {"ok": True}

    async def total(self):
        return self.ctx.storage.sql.exec(
            "SELECT coalesce(sum(count), 0) AS total FROM sources"
        ).one()["total"]


class AccountLimit(DurableObject):
    """One instance per account (the account id is its name): the account's
    concurrency budget, shared by every object that queues its work."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx)
        self.semaphore = DurabilitySemaphore(
            self.scheduler,
            limit=lambda: int(self.env.ACCOUNT_CONCURRENCY),
            group_limit=self._workflow_limit,
        )

    def _workflow_limit(self, workflow_id):
        return json.loads(getattr(self.env, "WORKFLOW_LIMITS", "{}") or "{}").get(workflow_id)

    async def permits(self, message):
        return await self.semaphore.handle(message)

    async def usage(self):
        return self.semaphore.usage()

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info)


# Client objects reach an account's holder through this factory:
# `limits.bind(self.env).request(account_id, message)`.
limits = DurabilitySemaphore.client(binding="ACCOUNT_LIMIT")


class Default(WorkerEntrypoint):
    """Other Workers call these methods over a service binding; HTTP serves the same."""

    async def add(self, counter, tally, amount):
        # Check here too: a bad value gets a clear error before any call is made.
        stub = self.env.COUNTER.getByName(_name(counter, "counter"))
        return await stub.add(_name(tally, "tally"), _amount(amount))

    async def total(self, tally):
        return await self.env.TALLY.getByName(_name(tally, "tally")).total()

    async def account_usage(self, account):
        return await self.env.ACCOUNT_LIMIT.getByName(_name(account, "account")).usage()

    async def fetch(self, request):
        token = getattr(self.env, "API_TOKEN", None)
        if not token or request.headers.get("authorization") != f"Bearer {token}":
            return Response.json({"error": "unauthorized"}, status=401)
        path = "/" + request.url.split("://", 1)[-1].split("/", 1)[-1].split("?", 1)[0]
        parts = [part for part in path.split("/") if part]
        try:
            if request.method == "POST" and len(parts) == 3 and parts[::2] == ["counters", "add"]:
                body = await request.json()
                if not isinstance(body, dict):
                    raise ValueError("the body must be a JSON object")
                value = await self.add(parts[1], body.get("tally"), body.get("amount"))
                return Response.json({"count": value})
            if request.method == "GET" and len(parts) == 2 and parts[0] == "tallies":
                return Response.json({"total": await self.total(parts[1])})
        except ValueError as error:
            return Response.json({"error": str(error)}, status=400)
        return Response.json({"error": "not found"}, status=404)
