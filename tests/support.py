"""Helpers shared by the tests: runtimes over the probe Worker and the example Worker."""

import asyncio
import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest

from durability import outbox
from durability._common.schema import migrate
from durability._common.sql import Sql
from durability.semaphore.queue import schema as queue_schema
from durability.testing import Runtime, load_worker_module
from durability.testing._sql import SqlDatabase

ROOT = Path(__file__).resolve().parent.parent
PROBE = Path(__file__).resolve().parent / "workers" / "probe.py"


def probe_runtime(**options) -> Runtime:
    return Runtime(load_worker_module(PROBE), {"PROBE": "Probe"}, **options)


def example_runtime(**options) -> Runtime:
    return Runtime.from_wrangler(ROOT / "wrangler.toml", vars={"API_TOKEN": "t0ken"}, **options)

TIMERS = Path(__file__).resolve().parent / "workers" / "timers.py"


def timers_runtime(**options) -> Runtime:
    return Runtime(load_worker_module(TIMERS), {"TIMERS": "Timers", "INBOX": "Inbox"}, **options)

HOLDERS = Path(__file__).resolve().parent / "workers" / "holders.py"


def holders_runtime(**options) -> Runtime:
    return Runtime(load_worker_module(HOLDERS), {"HOLDER": "Holder", "SIM": "SimClient", "SHARD": "Shard"},
                   **options)

LOCKS = Path(__file__).resolve().parent / "workers" / "locks.py"


def locks_runtime(**options) -> Runtime:
    return Runtime(load_worker_module(LOCKS), {"SLOTS": "Slots", "UPLOADER": "Uploader"}, **options)


def queue_jobs(prefix, n, ms=3_000, group="g", key="holder"):
    """Items for a Shard of the holders Worker: each runs ``ms`` once admitted."""
    return [{"id": f"{prefix}{i}", "key": key, "group": group, "body": {"ms": ms}} for i in range(n)]


async def released_then_evicted(runtime: Runtime, shard, measure, settle_s: float):
    """Run one job (``a0``, 5 s) on a holders ``Shard`` until it is released,
    its report not sent yet; evict the shard and wait ``settle_s``. Returns
    ``await measure()`` from before the eviction and from after the wait."""
    await shard.submit(queue_jobs("a", 1, ms=5_000))
    while "a0" not in runtime.module.WORLD["completed"]:
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)  # released; its report waits for its delay
    before = await measure()
    runtime.evict(shard)
    await asyncio.sleep(settle_s)  # the alarm the old instance set wakes the new one
    return before, await measure()


#: Virtual times may end a few microseconds past the moment waited for (see durability._clock).
approx = partial(pytest.approx, abs=0.01)


@pytest.fixture(name="runtime")
def holders_runtime_fixture():
    """A ``runtime`` fixture for the queue tests: the holders Worker, seed 1."""
    with holders_runtime(seed=1) as rt:
        yield rt


def queue_shard(runtime: Runtime, name: str = "s1"):
    """The holders Worker's ``Shard`` of that name."""
    return runtime.env.SHARD.getByName(name)


def as_made_before_queue_version_9(storage) -> None:
    """Give a queue's storage (its ``ctx.storage``) what one made before the
    queue's version 9 has: the tables those versions wrote to (a queue made
    new has none), the old outbox's table, and the row that says so; the
    queue's next instance reads them."""
    sql = Sql(SimpleNamespace(storage=storage))
    for step in (step for steps in queue_schema._SCHEMA.values() for step in steps):
        if isinstance(step, queue_schema.OlderTable):
            sql.exec(step.statement)
    migrate(sql, "outbox", outbox._SCHEMA)
    sql.exec("INSERT INTO durability_schema (component, version) VALUES (?, 8) ON CONFLICT DO NOTHING",
             queue_schema.LEGACY)


def has_table(db: SqlDatabase, table: str) -> bool:
    return bool(db.inspect("SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?", table))


class SchemaStorage:
    """Just enough of ``ctx.storage`` for a schema's creation and removal, on the embedded SQL."""

    def __init__(self) -> None:
        self.db = SqlDatabase()
        self.sql = self

    def exec(self, query, *bindings):
        return self.db.exec(query, bindings)

    def transactionSync(self, fn):
        return self.db.run_in_savepoint(fn)

    def tables(self) -> set[str]:
        return {row["name"] for row in self.db.exec("SELECT name FROM sqlite_master WHERE type = 'table'", ())}

    def shape(self) -> dict[str, tuple]:
        """Every table's kind, columns and keys, as SQLite describes them."""
        return {table: tuple(self.exec(query.format(table=table)).toArray() for query in (
                    "SELECT wr FROM pragma_table_list WHERE name = '{table}'",
                    "SELECT * FROM pragma_table_xinfo('{table}')",
                    "SELECT name, [unique], origin FROM pragma_index_list('{table}')"))
                for table in sorted(self.tables()) if not table.startswith("sqlite_")}


@pytest.fixture(name="runtime")
def locks_runtime_fixture():
    """A ``runtime`` fixture for the lock tests: the locks Worker, no faults."""
    with locks_runtime() as rt:
        yield rt


# -- the local server (python -m durability.testing serve) ---------------------------

def example_worker_dir(directory: Path, token: str, **values: str) -> Path:
    """A copy of the example's wrangler.toml in ``directory`` (its ``main``
    pointing back at src/entry.py, its [vars] changed by ``values``) with a
    ``.dev.vars`` holding ``API_TOKEN``."""
    text = (ROOT / "wrangler.toml").read_text()
    values["main"] = str(ROOT / "src" / "entry.py")
    for name, value in values.items():
        line = f"{name} = {json.dumps(value)}"
        text, found = re.subn(rf"(?m)^{name} = .*$", lambda _, line=line: line, text)
        assert found == 1, f"wrangler.toml has no line `{name} = ...`"
    (directory / "wrangler.toml").write_text(text)
    (directory / ".dev.vars").write_text(f"# local secrets\nAPI_TOKEN={token}\n")
    return directory / "wrangler.toml"


def http(url: str, method: str = "GET", body=None, headers=None, timeout: float = 30):
    """One HTTP request with urllib: ``(status, headers, body text)``, errors included."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read().decode()


@contextlib.contextmanager
def serving(config: Path):
    """``python -m durability.testing serve --port 0`` in a subprocess. Yields
    it once it prints ``Ready on``, as ``.url``, ``.process``, ``.stdout`` and
    ``.stderr`` (lists of the lines printed so far); stops it with SIGINT at
    the end if it still runs."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    process = subprocess.Popen(
        [sys.executable, "-m", "durability.testing", "serve", "--config", str(config), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    server = SimpleNamespace(url=None, process=process, stdout=[], stderr=[])
    ready: queue.Queue[str] = queue.Queue()

    def drain(stream, lines, watch):
        for line in stream:
            lines.append(line.rstrip("\n"))
            if watch and line.startswith("Ready on "):
                ready.put(line.split()[-1])

    readers = [threading.Thread(target=drain, args=(process.stdout, server.stdout, True), daemon=True),
               threading.Thread(target=drain, args=(process.stderr, server.stderr, False), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        try:
            server.url = ready.get(timeout=60)
        except queue.Empty:
            pytest.fail(f"the server printed no `Ready on` line: {server.stdout} {server.stderr}")
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=30)
        for reader in readers:
            reader.join(timeout=10)


def served_behind_the_line(later: bool = False, **config) -> dict:
    """At a limit of 1 (and ``config``), shard ``a`` is served its job ``a0``
    (5 s) while ``b`` and ``c`` wait in line with two older jobs each than
    ``a``'s next, ``a1-0`` (and, ``later``, a younger ``a2-0`` is queued
    while ``a0`` runs); returns the holders Worker's ``WORLD`` once all ran,
    with ``vias`` of ``a``'s items added."""
    runtime = holders_runtime(seed=1)
    runtime.module.CONFIG.update(limit=1, **config)

    async def scenario():
        shard = runtime.env.SHARD.getByName
        await shard("a").submit(queue_jobs("a", 1, ms=5_000))
        await asyncio.sleep(0.1)
        for name in ("b", "c"):
            await shard(name).submit(queue_jobs(name, 2, ms=1_000))
        await asyncio.sleep(0.1)
        await shard("a").submit(queue_jobs("a1-", 1, ms=1_000))  # younger than what b and c wait with
        if later:
            await asyncio.sleep(2)
            await shard("a").submit(queue_jobs("a2-", 1, ms=1_000))
        await asyncio.sleep(60)
        return await shard("a").vias()

    with runtime:
        vias = runtime.run(scenario())
    return {**runtime.module.WORLD, "vias": vias}


def assert_back_in_line_with_the_release(world: dict) -> None:
    """``a`` held no request while ``a0`` ran: its next went with ``a0``'s
    release and carried the report (its only sync is ``a1-0``'s release,
    with nothing left to ask for), and its younger job ran after the others."""
    asked = [t for t, client in world["requests"] if client == "a"]
    assert len(asked) == 2 and asked[1] >= world["started"]["a0"] + 5_000
    assert [t > world["started"]["a1-0"] for t, client in world["syncs"] if client == "a"] == [True]
    assert world["started"]["a1-0"] > max(world["started"][j] for j in ("b0", "b1", "c0", "c1"))
    assert world["completed"] >= {"a0", "a1-0", "b0", "b1", "c0", "c1"} and world["violations"] == []
