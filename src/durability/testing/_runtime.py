"""The embedded runtime: a Worker module's Durable Objects, run on CPython.

Lives here: loading the Worker from ``wrangler.toml``, ``env`` with its
namespaces and vars, the journey of an RPC call (copies, latency, faults),
calls into the ``Default`` entrypoint, the loop that runs it all (on
virtual time, or real time to serve), and the services each
``ObjectHost`` is given. ``env``'s classes and the stubs are in
``_bindings``, the loop's hooks in ``_loop_hooks``, the import of the
Worker's module in ``_worker_module``.
Must not know: what happens inside an object; ``ObjectHost`` owns that.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import random
import tomllib
from collections.abc import Awaitable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from ._bindings import DurableObjectNamespace, DurableObjectStub, Env
from ._clock import DEFAULT_EPOCH_MS, RealClockLoop, RuntimeLoop, VirtualClockLoop, patched_wall_clock
from ._cron import CronSchedule
from ._entrypoint import Entrypoint
from ._faults import FaultPlanner, Faults
from ._host import (
    DEFAULT_CPU_LIMIT_MS,
    DEFAULT_MAX_REQUESTS_PER_S,
    OBJECT_GB,
    RESET_MESSAGE,
    HostServices,
    ObjectHost,
    current_generation,
    current_host,
    reset_error,
)
from ._loop_hooks import _cpu_meter, _task_factory, _timer_owner
from ._queue_values import QueueConsumer, in_consumer
from ._queues import Queues, consumers_of, producers_of
from ._storage import DurableObjectId
from ._values import JsDict, JsException, rpc_copy
from ._worker_module import load_worker_module


class Runtime:
    """Runs a Worker module's Durable Objects on CPython, on virtual time.

    ``Runtime.from_wrangler("wrangler.toml")`` loads the Worker named by
    ``main`` with the Durable Object bindings and ``[vars]`` of the file;
    ``vars=`` adds or overrides values (secrets, say). Drive it with
    ``runtime.run(coroutine)``: inside, ``env.X.getByName(name)`` stubs
    reach the objects, ``asyncio.sleep`` and alarms run on the virtual
    clock, and ``time.time()`` reads it. ``clock="real"`` runs on real time
    instead, with real sockets, to serve the Worker locally (``epoch_ms``
    then does not apply: the clock starts at the real time). ``crons``, or
    ``[triggers] crons`` of the file, run ``Default.scheduled`` on that
    clock from the first ``run`` on; ``scheduled()`` runs it once at will.

    Each object takes at most ``max_requests_per_s`` requests (RPC calls and
    alarms) within any second of the clock, as production's soft limit of
    about a thousand; a call past it fails as workerd's does ("Durable Object
    is overloaded", ``overloaded`` set, not ``retryable``) and is neither
    run nor billed. ``None`` lifts the limit. Each object's stats count its
    requests per second and the CPU its code ran for (``ObjectStats``).

    Each request tops an object's CPU time up to ``cpu_limit_ms`` (30 s, as
    production's default; ``[limits] cpu_ms`` of the file sets it, ``None``
    lifts it); an object whose code runs past it is reset. An alarm's run
    ends, with its instance, after 15 minutes, and counts as failed.

    ``hibernate_after_ms`` drops an object's instance once it has had
    nothing pending (no event, task or timer of its code; its alarm aside)
    for that long, as production hibernates one after 10 s
    (``HIBERNATE_AFTER_MS``): memory goes, storage stays. None (the
    default) keeps idle instances; the environment variable
    ``DURABILITY_HIBERNATE_AFTER_MS`` sets it for every runtime that is not
    given one.
    """

    def __init__(self, module: ModuleType, durable_objects: dict[str, str], *,
                 vars: dict[str, Any] | None = None, seed: int = 0,
                 faults: Faults | None = None, epoch_ms: int = DEFAULT_EPOCH_MS,
                 entrypoint: str = "Default", clock: Literal["virtual", "real"] = "virtual",
                 crons: Sequence[str] = (),
                 max_requests_per_s: float | None = DEFAULT_MAX_REQUESTS_PER_S,
                 cpu_limit_ms: float | None = DEFAULT_CPU_LIMIT_MS,
                 hibernate_after_ms: float | None = None,
                 queues: dict[str, str] | None = None, consumers: Sequence[QueueConsumer] = ()) -> None:
        if clock not in ("virtual", "real"):
            raise ValueError(f"clock must be 'virtual' or 'real', not {clock!r}")
        self.module = module
        self.seed = seed
        self.cpu_limit_ms = cpu_limit_ms
        self.rng = random.Random(seed)
        random.seed(seed)  # user code that draws from `random` replays too
        self.loop: RuntimeLoop = VirtualClockLoop(epoch_ms) if clock == "virtual" else RealClockLoop()
        self.loop.set_task_factory(_task_factory)
        self.loop.meter_for = _cpu_meter
        self.loop.timer_owner = _timer_owner
        started = self.loop.now_ms()
        self.faults = FaultPlanner(faults, self.rng, lambda: self.loop.now_ms() - started)
        self.errors: list[tuple[str, BaseException]] = []
        self.trace: list[tuple[float, str, str, str]] = []  #: (ms, object, event, detail)
        self._hosts: dict[tuple[str, str], ObjectHost] = {}
        self._system_tasks: set[asyncio.Task[Any]] = set()
        #: the Cron Triggers: ``Default.scheduled`` runs at each, on the runtime's clock
        self.crons = tuple(CronSchedule.parse(cron) for cron in crons)
        self._crons_started = False
        bindings: dict[str, Any] = {}
        for binding, class_name in durable_objects.items():
            cls = getattr(module, class_name, None)
            if cls is None:
                raise ValueError(f"binding {binding}: {module.__name__} has no class {class_name}")
            bindings[binding] = DurableObjectNamespace(self, class_name, cls)
        self.namespaces: dict[str, DurableObjectNamespace] = dict(bindings)
        #: each queue by name: producers' bindings send to it, its consumer's batches go to ``Default.queue``
        self.queues = Queues(self.loop, self.faults, self.spawn_system, self.log_queue, self._output_gate)
        bindings.update(self.queues.set_up(queues or {}, consumers, lambda batch: self.entrypoint.queue(batch)))
        bindings.update(vars or {})
        self.env = Env(bindings)
        #: ``Default``: its invocations (fetch, RPC, crons, queue batches) and what they are billed for
        self.entrypoint = Entrypoint(getattr(module, entrypoint, None), module.__name__, self.env, self.spawn_system)
        self.worker_stats = self.entrypoint.stats
        self._host_services = HostServices(
            loop=self.loop, rng=self.rng, env=self.env, faults=self.faults,
            max_requests_per_s=max_requests_per_s, cpu_limit_ms=cpu_limit_ms,
            hibernate_after_ms=_hibernation(hibernate_after_ms),
            spawn_system=self.spawn_system, log_event=self.log_event,
            report_background_error=self.report_background_error,
        )

    @classmethod
    def from_wrangler(cls, config: str | os.PathLike[str] = "wrangler.toml", *,
                      vars: dict[str, Any] | None = None, **options: Any) -> Runtime:
        path = Path(config).resolve()
        with open(path, "rb") as f:
            settings = tomllib.load(f)
        if "main" not in settings:
            raise ValueError(f"{path}: no `main` module")
        module = load_worker_module(path.parent / settings["main"])
        objects = {
            b["name"]: b["class_name"]
            for b in settings.get("durable_objects", {}).get("bindings", [])
            if not b.get("script_name")  # classes of other Workers are not ours to run
        }
        merged = dict(settings.get("vars", {}))
        merged.update(vars or {})
        options.setdefault("queues", producers_of(settings))
        options.setdefault("consumers", consumers_of(settings))
        options.setdefault("crons", settings.get("triggers", {}).get("crons", ()))
        if "cpu_ms" in settings.get("limits", {}):
            options.setdefault("cpu_limit_ms", settings["limits"]["cpu_ms"])
        return cls(module, objects, vars=merged, **options)

    # -- driving the runtime ---------------------------------------------
    def run(self, awaitable: Awaitable[Any]) -> Any:
        """Run ``awaitable`` to completion on the virtual clock and return its result."""
        asyncio.set_event_loop(self.loop)
        with patched_wall_clock(self.loop):
            return self.loop.run_until_complete(self._with_crons(awaitable))

    async def _with_crons(self, awaitable: Awaitable[Any]) -> Any:
        if not self._crons_started:  # from the first run on, as a deployed Worker's triggers
            self._crons_started = True
            for schedule in self.crons:
                self.spawn_system(self._cron_loop(schedule))
        return await awaitable

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass: alarms and timers due in it run."""
        self.run(asyncio.sleep(seconds))

    def now_ms(self) -> float:
        return self.loop.now_ms()

    @contextlib.contextmanager
    def no_faults(self) -> Iterator[None]:
        """Inside this block no fault is injected (to read state back, say)."""
        self.faults.paused += 1
        try:
            yield
        finally:
            self.faults.paused -= 1

    def close(self) -> None:
        """Stop everything still running and close the loop."""
        if self.loop.is_closed():
            return
        tasks = list(asyncio.all_tasks(self.loop))
        for task in tasks:
            task.cancel()
        if tasks:
            with patched_wall_clock(self.loop):
                self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- objects ----------------------------------------------------------
    def _host(self, namespace: DurableObjectNamespace, object_id: DurableObjectId) -> ObjectHost:
        key = (namespace.class_name, object_id.toString())
        host = self._hosts.get(key)
        if host is None:
            host = self._hosts[key] = ObjectHost(
                self._host_services, namespace.cls, namespace.class_name, object_id)
        return host

    def host_of(self, stub: DurableObjectStub) -> ObjectHost:
        """The object behind a stub (storage, stats, eviction), for tests."""
        return self._host(stub._namespace, stub.id)

    def hosts(self) -> list[ObjectHost]:
        return list(self._hosts.values())

    def evict(self, stub: DurableObjectStub) -> None:
        """Drop the object's live instance now, whatever it is doing; keep its storage."""
        self.host_of(stub).evict()

    def totals(self) -> dict[str, float]:
        """Billing figures summed over every object (rows read and written,
        requests, calls refused as overloaded, seconds awake and the GB-s
        they bill at 128 MB an object), the highest requests per second
        any one object took, the Worker's stateless requests and their CPU,
        and the operations of every queue."""
        totals: dict[str, float] = {
            "rows_read": 0, "rows_written": 0, "requests": 0, "alarm_invocations": 0, "evictions": 0,
            "overloaded": 0, "peak_requests_per_s": 0, "awake_s": 0.0, "gb_s": 0.0,
            "worker_requests": self.worker_stats.requests, "worker_cpu_ms": self.worker_stats.cpu_s * 1000,
            "queue_operations": self.queues.operations()}
        for host in self._hosts.values():
            totals["rows_read"] += host.db.rows_read
            totals["rows_written"] += host.db.rows_written + host.stats.alarm_writes
            totals["requests"] += host.stats.requests
            totals["alarm_invocations"] += host.stats.alarm_invocations
            totals["evictions"] += host.stats.evictions
            totals["overloaded"] += host.stats.overloaded
            totals["peak_requests_per_s"] = max(totals["peak_requests_per_s"], host.stats.peak_requests_per_s)
            totals["awake_s"] += host.awake_s()
        totals["gb_s"] = totals["awake_s"] * OBJECT_GB
        return totals

    def spawn_system(self, coroutine: Awaitable[Any]) -> asyncio.Task[Any]:
        """Work of the runtime itself (alarm delivery), outside any object."""
        task = self.loop.create_task(_await(coroutine), context=contextvars.Context())
        self._system_tasks.add(task)
        task.add_done_callback(self._system_tasks.discard)
        return task

    def report_background_error(self, host: ObjectHost | None, error: BaseException) -> None:
        where = f"{host.class_name}:{host.name}" if host else "runtime"
        self.errors.append((where, error))
        self.log_event(host, "background error", repr(error))

    def log_queue(self, event: str, detail: str) -> None:
        self.log_event(None, event, detail)

    def log_event(self, host: ObjectHost | None, event: str, detail: str = "") -> None:
        name = f"{host.class_name}:{host.name}" if host else "-"
        self.trace.append((round(self.loop.now_ms(), 3), name, event, detail))

    # -- RPC ----------------------------------------------------------------
    async def _send(self, stub: DurableObjectStub, method: str, args: list[Any]) -> Any:
        if stub._broken is not None:
            raise stub._broken
        caller = await self._output_gate()
        host = self._host(stub._namespace, stub.id)
        if stub.id.name is not None and host.object_id.name is None:
            host.object_id = stub.id  # a name learned (for its alarms and the trace)
        faulted = caller is not None or in_consumer.get()  # (the test's own calls only with external)
        plan = self.faults.plan_call(host.class_name, faulted)
        self.log_event(host, "call", method)
        try:
            if plan.request_delay_ms:
                await self.loop.sleep_exact(plan.request_delay_ms / 1000)
            if plan.lose_request or self.faults.out_of_order(host.class_name, host.name, "calls", faulted):
                self.log_event(host, "lost request", method)
                raise reset_error(RESET_MESSAGE)
            if plan.evict_after_ms is not None:
                self.loop.call_later_exact(plan.evict_after_ms / 1000, host.evict_if_current, host.generation)
            if plan.duplicate:
                self.spawn_system(self._deliver_duplicate(host, method, args))
            reply = await host.call(method, [rpc_copy(arg) for arg in args], named=stub.id.name is not None)
            if plan.reply_delay_ms:
                await self.loop.sleep_exact(plan.reply_delay_ms / 1000)
            if plan.lose_reply:
                self.log_event(host, "lost reply", method)
                raise reset_error(RESET_MESSAGE)
            return reply
        except JsException as error:
            stub._broken = error  # production: recreate a stub after any exception
            raise

    async def _output_gate(self) -> ObjectHost | None:
        """What leaves an object (a call, a message to a queue) waits for the
        writes made ahead of it to be durable, and code of an instance that
        is gone reaches nobody. The calling object, or None."""
        caller = current_host.get()
        if caller is not None and current_generation.get() != caller.generation:
            raise reset_error(caller.reset_reason)
        if caller is not None and caller.db.in_batch:
            await caller.flushed()
        return caller

    async def _deliver_duplicate(self, host: ObjectHost, method: str, args: list[Any]) -> None:
        self.log_event(host, "duplicate", method)
        try:
            await host.call(method, [rpc_copy(arg) for arg in args])
        except Exception:
            pass  # nobody waits for a duplicate's outcome

    # -- Cron Triggers ---------------------------------------------------------
    async def _cron_loop(self, schedule: CronSchedule) -> None:
        while True:
            at = schedule.next_after(self.loop.now_ms())
            await asyncio.sleep(max(0.0, at - self.loop.now_ms()) / 1000)
            try:
                await self.scheduled(schedule.expression, at)
            except Exception as error:  # the trigger fires again at its next time
                self.report_background_error(None, error)

    async def scheduled(self, cron: str = "", scheduled_time: float | None = None) -> None:
        """Run ``Default.scheduled(controller, env, ctx)`` once, as a Cron Trigger does."""
        self.log_event(None, "scheduled", cron)
        await self.entrypoint.scheduled(cron, self.loop.now_ms() if scheduled_time is None else scheduled_time)

    # -- the Default entrypoint ---------------------------------------------
    async def call_entrypoint(self, method: str, *args: Any) -> Any:
        """Call a method of ``Default`` as another Worker would over a service binding."""
        return await self.entrypoint.call(method, *args)

    async def fetch(self, url: str, **init: Any) -> Any:
        """Send an HTTP request to ``Default.fetch`` and return its Response.

        The handler receives what workerd gives it, a JavaScript Request:
        ``await request.json()`` on a body that is not JSON raises a
        ``JsException`` (``SyntaxError``) there and here alike."""
        from ._workers_standin import IncomingRequest

        return await self.entrypoint.fetch(IncomingRequest(url, **init))


def _hibernation(given: float | None) -> float | None:
    if given is not None:
        return given
    from_env = os.environ.get("DURABILITY_HIBERNATE_AFTER_MS")
    return float(from_env) if from_env else None


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


__all__ = ["Runtime", "DurableObjectNamespace", "DurableObjectStub", "Env", "JsDict",
           "load_worker_module"]
