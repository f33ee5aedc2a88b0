"""A Worker module for the scheduler's and outbox's tests: participants that record runs."""

import asyncio
import time

from workers import DurableObject

from durability import Backoff, DurabilityOutbox, DurabilityScheduler

#: the next alarm runs that fail after the scheduler's part, and whether it is handed the alarm's info
FAIL_AFTER_ALARM = {"runs": 0, "forward": True}


class Timers(DurableObject):
    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        self.scheduler = DurabilityScheduler(ctx, backoff=Backoff(initial_ms=1_000, jitter=0))
        self.scheduler.register("work", self._work)
        self.outbox = DurabilityOutbox(self.scheduler)
        self.events = self.outbox.channel("events", self._send_events, batch_size=3)
        sql = ctx.storage.sql
        sql.exec("CREATE TABLE IF NOT EXISTS runs "
                 "(seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT, at REAL, attempt INTEGER)")
        sql.exec("CREATE TABLE IF NOT EXISTS failing (key TEXT PRIMARY KEY, times INTEGER)")
        sql.exec("CREATE TABLE IF NOT EXISTS state (k TEXT PRIMARY KEY, v INTEGER) WITHOUT ROWID")
        # A participant whose timers live in memory: the "planned" rows say
        # when each is due, and the constructor derives them from those rows.
        self.scheduler.register("derived", self._derived, backoff=Backoff(initial_ms=1_000, jitter=0), durable=False)
        sql.exec("CREATE TABLE IF NOT EXISTS planned (key TEXT PRIMARY KEY, due_at REAL, fails INTEGER) WITHOUT ROWID")
        for row in sql.exec("SELECT key, due_at FROM planned").toArray():
            # The earlier instance kept the alarm for each planned time; a
            # "duty-" timer stands for work a new instance must do at once,
            # which no alarm need ever have covered.
            covered = not row["key"].startswith("duty-")
            self.scheduler.schedule_by("derived", row["key"], row["due_at"], covered=covered)

    # -- timers in memory, derived from rows -----------------------------
    async def plan(self, key, in_ms, fails=0):
        def change():
            due = time.time() * 1000 + in_ms
            self.ctx.storage.sql.exec("INSERT INTO planned VALUES (?, ?, ?)", key, due, fails)
            self.scheduler.schedule("derived", key, due)

        self.scheduler.transaction(change)
        await self.scheduler.sync()

    async def put_off(self, key, in_ms):
        """A planned timer made due later: its alarm stays where it was (a
        later time moves no alarm), to fire early and run nothing."""
        def change():
            due = time.time() * 1000 + in_ms
            self.ctx.storage.sql.exec("UPDATE planned SET due_at = ? WHERE key = ?", due, key)
            self.scheduler.schedule("derived", key, due)

        self.scheduler.transaction(change)
        await self.scheduler.sync()

    async def run_now(self, key, again=0):
        """A derived timer due now that this call runs itself
        (``run_now``), with no alarm set for it; ``again``: times its run
        sets it due again at once, then takes 5 s more (a pump that learns
        news and goes on with its reply)."""
        def change():
            due = time.time() * 1000
            self.ctx.storage.sql.exec("INSERT INTO planned VALUES (?, ?, ?)", key, due, -again)
            self.scheduler.schedule("derived", key, due, alarm_by=due + 3_600_000)

        self.scheduler.transaction(change)
        await self.scheduler.sync()
        ran = await self.scheduler.run_now("derived", key)
        await self.scheduler.sync()
        return ran

    async def _derived(self, timer):
        sql = self.ctx.storage.sql
        sql.exec("INSERT INTO runs (key, at, attempt) VALUES (?, ?, ?)", timer.key, time.time() * 1000, timer.attempt)
        row = sql.exec("SELECT fails FROM planned WHERE key = ?", timer.key).toArray()
        if row and row[0]["fails"] < 0:  # (run_now's "again")
            self.scheduler.transaction(lambda: (
                sql.exec("UPDATE planned SET fails = fails + 1 WHERE key = ?", timer.key),
                self.scheduler.schedule("derived", timer.key, time.time() * 1000)))
            await self.scheduler.sync()
            await asyncio.sleep(5)
            return
        row = sql.exec("SELECT fails FROM planned WHERE key = ?", timer.key).toArray()
        if row and row[0]["fails"] > 0:
            sql.exec("UPDATE planned SET fails = fails - 1 WHERE key = ?", timer.key)
            raise RuntimeError(f"{timer.key} fails")
        sql.exec("DELETE FROM planned WHERE key = ?", timer.key)

    async def forget_alarm(self):
        """As if the platform had given up on this object's alarm."""
        await self.ctx.storage.deleteAlarm()

    async def wake(self):
        """What a periodic sweep calls: resume a live instance whose alarm was lost."""
        await self.scheduler.resume()

    async def peek(self):
        """A read that goes through the library, as a queue's status() does."""
        self.scheduler.resume_if_overdue()
        return self.ctx.storage.sql.exec("SELECT count(*) AS n FROM runs").one()["n"]

    async def write_old_timer_row(self, participant, key):
        """A timer row as an older deployment wrote it, for a participant now kept in memory.
        (Written past the scheduler, whose earliest-timer read it leaves stale
        until the scheduler's own next write: the tests using it make one.)"""
        self.ctx.storage.sql.exec(
            "INSERT INTO durability_timers (participant, key, due_at, version) VALUES (?, ?, ?, 0)",
            participant, key, time.time() * 1000)

    # -- timers -------------------------------------------------------
    async def schedule(self, key, in_ms, fail_times=0):
        def change():
            self.scheduler.schedule("work", key, time.time() * 1000 + in_ms)
            if fail_times:
                self.ctx.storage.sql.exec(
                    "INSERT INTO failing VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET times = excluded.times",
                    key, fail_times,
                )

        self.scheduler.transaction(change)
        await self.scheduler.sync()

    async def schedule_for(self, participant, key, in_ms):
        self.scheduler.schedule(participant, key, time.time() * 1000 + in_ms)
        await self.scheduler.sync()

    async def schedule_unsynced(self, key, in_ms):
        self.scheduler.schedule("work", key, time.time() * 1000 + in_ms)

    async def schedule_by(self, key, in_ms):
        self.scheduler.schedule_by("work", key, time.time() * 1000 + in_ms)
        await self.scheduler.sync()

    async def cancel(self, key):
        self.scheduler.cancel("work", key)
        await self.scheduler.sync()

    async def _work(self, timer):
        failing = self.ctx.storage.sql.exec("SELECT times FROM failing WHERE key = ?", timer.key).toArray()
        self.ctx.storage.sql.exec(
            "INSERT INTO runs (key, at, attempt) VALUES (?, ?, ?)", timer.key, time.time() * 1000, timer.attempt
        )
        if failing and failing[0]["times"] > 0:
            self.ctx.storage.sql.exec("UPDATE failing SET times = times - 1 WHERE key = ?", timer.key)
            raise RuntimeError(f"{timer.key} fails")
        if timer.key.startswith("slow"):
            await asyncio.sleep(2)

    async def runs(self):
        return [dict(r) for r in self.ctx.storage.sql.exec("SELECT key, at, attempt FROM runs ORDER BY seq")]

    async def alarm_time(self):
        return await self.ctx.storage.getAlarm()

    async def timer_count(self):
        return self.ctx.storage.sql.exec("SELECT count(*) AS n FROM durability_timers").one()["n"]

    # -- outbox -------------------------------------------------------
    async def change(self, key, value, fail=False, coalesce=True):
        def apply():
            self.ctx.storage.sql.exec(
                "INSERT INTO state VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v", key, value
            )
            message_id = self.events.enqueue({"key": key, "value": value}, key=key if coalesce else None)
            if fail:
                raise ValueError("the change fails")
            return message_id

        message_id = self.scheduler.transaction(apply)
        await self.scheduler.sync()
        return message_id

    async def stale_acknowledgement(self):
        """Acknowledge a message after it was delivered, deleted and written again."""
        self.events.enqueue({"key": "k", "value": 1}, key="k")
        [first] = self.events.pending()
        self.events.acknowledge([first])
        self.events.enqueue({"key": "k", "value": 2}, key="k")
        self.events.acknowledge([first])  # a late reply to the first delivery
        return [m.body for m in self.events.pending()]

    async def bad_message(self):
        self.events.enqueue({"not json": object()})

    async def state(self):
        return {r["k"]: r["v"] for r in self.ctx.storage.sql.exec("SELECT k, v FROM state")}

    async def pending(self):
        return [m.body for m in self.events.pending()]

    async def _send_events(self, messages):
        inbox = self.env.INBOX.getByName("inbox")
        await inbox.receive([m.body for m in messages])

    async def fail_after_next_alarm(self, forward_info=True):
        """The next alarm run fails after the scheduler's part is done (the
        object's own code raising), handing the scheduler the alarm's info
        or not (``def alarm(self)`` works too)."""
        FAIL_AFTER_ALARM.update(runs=1, forward=forward_info)

    async def alarm(self, alarm_info=None):
        await self.scheduler.alarm(alarm_info if FAIL_AFTER_ALARM["forward"] else None)
        if FAIL_AFTER_ALARM["runs"] > 0:
            FAIL_AFTER_ALARM["runs"] -= 1
            raise RuntimeError("the object's own code failed after the scheduler's run")


class Inbox(DurableObject):
    """Receives outbox messages; can be told to fail."""

    def __init__(self, ctx, env):
        super().__init__(ctx, env)
        ctx.storage.sql.exec("CREATE TABLE IF NOT EXISTS got (seq INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT)")
        ctx.storage.sql.exec("CREATE TABLE IF NOT EXISTS down (k INTEGER PRIMARY KEY, until REAL)")

    async def go_down(self, seconds):
        self.ctx.storage.sql.exec("INSERT OR REPLACE INTO down VALUES (1, ?)", time.time() * 1000 + seconds * 1000)

    async def receive(self, bodies):
        down = self.ctx.storage.sql.exec("SELECT until FROM down").toArray()
        if down and down[0]["until"] > time.time() * 1000:
            raise RuntimeError("inbox is down")
        for body in bodies:
            self.ctx.storage.sql.exec("INSERT INTO got (body) VALUES (?)", f"{body['key']}={body['value']}")
        return len(bodies)

    async def received(self):
        return [r["body"] for r in self.ctx.storage.sql.exec("SELECT body FROM got ORDER BY seq")]
