"""A Worker module that exercises the runtime surface, for the runtime's own tests."""

import asyncio
import contextvars
import time

from workers import DurableObject, WorkerEntrypoint


class Custom:
    pass


MARK = contextvars.ContextVar("probe_mark", default=None)  #: set by a caller, read by a callee


class Probe(DurableObject):
    """Records what happens to it in its own SQL table, so tests can read it back."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.memory = []  # lost on eviction, unlike storage
        ctx.storage.sql.exec(
            "CREATE TABLE IF NOT EXISTS log (seq INTEGER PRIMARY KEY AUTOINCREMENT, what TEXT)"
        )

    def _log(self, what):
        self.ctx.storage.sql.exec("INSERT INTO log (what) VALUES (?)", what)

    async def entries(self):
        return [r["what"] for r in self.ctx.storage.sql.exec("SELECT what FROM log ORDER BY seq")]

    async def echo(self, *values):
        return list(values)

    async def kinds(self, value):
        return type(value).__name__

    async def attribute(self, value, name):
        return getattr(value, name)

    async def give(self, what):
        if what == "tuple":
            return (1, 2)
        if what == "custom":
            return Custom()
        if what == "float":
            return 2.0
        return None

    async def fail(self, message):
        raise ValueError(message)

    async def record(self, what):
        self._log(what)
        self.memory.append(what)
        return len(self.memory)

    async def remembered(self):
        return list(self.memory)

    async def slow_record(self, what, seconds):
        self._log(f"start {what}")
        await asyncio.sleep(seconds)
        self._log(f"end {what}")
        return what

    async def gated(self, what):
        # A storage await: no other event may run in between.
        self._log(f"before {what}")
        await self.ctx.storage.getAlarm()
        self._log(f"after {what}")

    async def call_marked(self, name):
        """Set MARK in this event, then ask another object what it sees of it."""
        MARK.set(f"set by {self.ctx.id.name}")
        return await self.env.PROBE.getByName(name).read_mark()

    async def read_mark(self):
        return MARK.get()

    async def call_other(self, name, what):
        other = self.env.PROBE.getByName(name)
        self._log(f"calling {what}")
        result = await other.slow_record(what, 1)
        self._log(f"called {what}")
        return result

    async def write_then_call(self, name, what):
        """A write, then a call in the same turn: the call waits for the write to be durable."""
        self._log(what)
        return await self.env.PROBE.getByName(name).record(what)

    async def call_when_resolved(self, name):
        """A call made later, from a callback of a future this instance keeps."""
        self.gate = asyncio.get_running_loop().create_future()
        other = self.env.PROBE.getByName(name)
        self.gate.add_done_callback(lambda _: asyncio.ensure_future(other.record("late")))
        return "armed"

    async def write_then_fail(self, what):
        def change():
            self._log(what)
            raise RuntimeError("rolled back")

        self.ctx.storage.transactionSync(change)

    async def async_transaction_fails(self, what):
        async def body(txn):
            self._log(what)
            await asyncio.sleep(0)
            raise RuntimeError("async transaction fails")

        await self.ctx.storage.transaction(body)

    async def alarm_in_failed_transaction(self):
        def change():
            pending = self.ctx.storage.setAlarm(time.time() * 1000 + 60_000)
            pending.close()  # cannot be awaited in a synchronous function
            raise RuntimeError("rolled back")

        try:
            self.ctx.storage.transactionSync(change)
        except RuntimeError:
            pass
        return await self.ctx.storage.getAlarm()

    async def set_alarm_in(self, ms, fail_times=0, sleep_s=0):
        self.ctx.storage.sql.exec(
            "CREATE TABLE IF NOT EXISTS alarm_plan (k TEXT PRIMARY KEY, failures INTEGER, sleep REAL)"
        )
        self.ctx.storage.sql.exec(
            "INSERT INTO alarm_plan VALUES ('plan', ?, ?) ON CONFLICT (k) DO UPDATE "
            "SET failures = excluded.failures, sleep = excluded.sleep",
            fail_times, sleep_s,
        )
        await self.ctx.storage.setAlarm(time.time() * 1000 + ms)
        return await self.ctx.storage.getAlarm()

    async def get_alarm(self):
        return await self.ctx.storage.getAlarm()

    async def delete_alarm(self):
        await self.ctx.storage.deleteAlarm()

    async def alarm(self, alarm_info=None):
        seen = await self.ctx.storage.getAlarm()
        self._log(f"alarm retry={alarm_info.retryCount} seen={seen} at={int(time.time() * 1000)}")
        plan = self.ctx.storage.sql.exec("SELECT failures, sleep FROM alarm_plan").toArray()
        if plan and plan[0]["failures"] > 0:
            self.ctx.storage.sql.exec("UPDATE alarm_plan SET failures = failures - 1")
            raise RuntimeError("alarm handler failed")
        if plan and plan[0]["sleep"]:
            await asyncio.sleep(plan[0]["sleep"])
            self._log("alarm-done")

    async def block(self, seconds):
        async def hold():
            self._log("block start")
            await asyncio.sleep(seconds)
            self._log("block end")

        await self.ctx.blockConcurrencyWhile(hold)

    async def background(self, what):
        async def later():
            await asyncio.sleep(1)
            self._log(what)

        self.ctx.waitUntil(later())
        return "replied"

    async def set_timer(self, seconds):
        """A bare timer of the instance's: nothing awaits it."""
        self.timer = asyncio.get_running_loop().call_later(seconds, self._log, "timer fired")
        return "set"

    async def cancel_timer(self):
        self.timer.cancel()
        return "cancelled"

    async def spin(self, cpu_ms):
        """Burn ``cpu_ms`` of CPU, half before an await and half after it."""
        for _ in range(2):
            start = time.process_time()
            while time.process_time() - start < cpu_ms / 2000:
                pass
            await asyncio.sleep(0)
        return "spun"

    async def keywords(self, first, options=None):
        return {"first": first, "options": options}

    def _private(self):
        return "secret"


class Default(WorkerEntrypoint):
    async def hello(self, name):
        return {"hello": name}

    async def scheduled(self, controller, env, ctx):
        """A Cron Trigger's run: record it in the object named "cron"."""
        await env.PROBE.getByName("cron").record(f"{controller.cron} {controller.scheduledTime}")
