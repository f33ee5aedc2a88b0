"""Which faults to inject, decided from the runtime's seeded random source.

Lives here: the fault settings and every yes/no or delay the runtime and its
hosts ask for. The same seed and the same sequence of questions give the
same answers, so a failing run replays exactly.
Must not know: how a fault is carried out, nor the runtime or the host; each
question names the class it is about, and whoever asked acts on the answer.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class CallPlan:
    """What happens to one RPC call on its way and back."""

    request_delay_ms: float = 0.0
    reply_delay_ms: float = 0.0
    lose_request: bool = False
    lose_reply: bool = False
    duplicate: bool = False
    evict_after_ms: float | None = None


@dataclass(frozen=True)
class Outage:
    """One object out of order for a while, ``after_ms`` from the runtime's
    start for ``ms``: every alarm run fails before its handler runs (the
    runtime retries it as usual, then gives up), and with ``calls`` every
    call into it fails as a lost request. The instance is not evicted.

    ``target`` names the object as the runtime's trace does
    (``"Class:name"``) or a whole class (``"Class"``).
    """

    target: str
    after_ms: float
    ms: float
    alarms: bool = True
    calls: bool = False

    def covers(self, class_name: str, name: str, elapsed_ms: float) -> bool:
        return self.target in (class_name, f"{class_name}:{name}") and (
            self.after_ms <= elapsed_ms < self.after_ms + self.ms)


@dataclass
class Faults:
    """Fault rates for a run; every rate is a probability from 0 to 1.

    Calls between objects are subject to faults; calls from the test that
    drives the runtime are too when ``external`` is true. ``targets`` limits
    faults to calls into the named classes (all classes when empty), and the
    queue faults to the queues it names.
    """

    lost_request: float = 0.0  #: the call never reaches the callee; the caller sees an error
    lost_reply: float = 0.0  #: the callee runs and commits; the caller sees an error
    duplicate: float = 0.0  #: the callee receives the call twice
    latency_ms: tuple[float, float] = (0.0, 0.0)  #: each way, uniform; unequal delays reorder calls
    evict: float = 0.0  #: the callee (or an object running its alarm) is evicted at a random moment
    evict_window_ms: float = 50.0  #: how soon after delivery that eviction may come
    crash_before_commit: float = 0.0  #: a write batch is lost with its instance, before commit
    alarm_failure: float = 0.0  #: an alarm invocation fails after its handler ran
    duplicate_alarm: float = 0.0  #: a successful alarm is delivered once more
    outages: tuple[Outage, ...] = ()  #: objects out of order for a while (see ``Outage``)
    #: a queue consumer's invocation dies within ``evict_window_ms`` of its start: the whole batch comes again
    consumer_crash: float = 0.0
    lost_ack: float = 0.0  #: a message its consumer acked comes again, as a redelivery
    #: a message reaches its consumer ``late_delivery_ms`` late (uniform): a backlog, a consumer's outage
    late_delivery: float = 0.0
    late_delivery_ms: tuple[float, float] = (0.0, 0.0)
    external: bool = False
    targets: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        for name in ("lost_request", "lost_reply", "duplicate", "evict",
                     "crash_before_commit", "alarm_failure", "duplicate_alarm", "consumer_crash", "lost_ack",
                     "late_delivery"):
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"Faults.{name} must be a probability from 0 to 1, not {rate!r}")
        for name in ("latency_ms", "late_delivery_ms"):
            low, high = getattr(self, name)
            if not 0 <= low <= high:
                raise ValueError(f"Faults.{name} must be (low, high) with 0 <= low <= high, not {(low, high)!r}")
        self.targets = frozenset(self.targets)
        self.outages = tuple(self.outages)
        for outage in self.outages:
            if not isinstance(outage, Outage) or outage.ms < 0 or outage.after_ms < 0:
                raise ValueError(f"Faults.outages takes Outage(target, after_ms, ms), not {outage!r}")


class FaultPlanner:
    """Answers the runtime's questions about faults, from one seeded source."""

    def __init__(self, faults: Faults | None, rng: random.Random,
                 elapsed_ms: Callable[[], float] = lambda: 0.0) -> None:
        self.faults = faults or Faults()
        self.rng = rng
        self.enabled = faults is not None
        self.paused = 0
        self.elapsed_ms = elapsed_ms  #: virtual ms since the runtime started, for outages

    def _applies(self, class_name: str, from_object: bool) -> bool:
        f = self.faults
        if not self.enabled or self.paused:
            return False
        if not from_object and not f.external:
            return False
        return not f.targets or class_name in f.targets

    def _chance(self, rate: float) -> bool:
        return rate > 0 and self.rng.random() < rate

    def plan_call(self, class_name: str, from_object: bool) -> CallPlan:
        if not self._applies(class_name, from_object):
            return CallPlan()
        f = self.faults
        low, high = f.latency_ms
        plan = CallPlan(
            request_delay_ms=self.rng.uniform(low, high) if high else 0.0,
            reply_delay_ms=self.rng.uniform(low, high) if high else 0.0,
        )
        plan.lose_request = self._chance(f.lost_request)
        if not plan.lose_request:
            plan.lose_reply = self._chance(f.lost_reply)
            plan.duplicate = self._chance(f.duplicate)
            if self._chance(f.evict):
                plan.evict_after_ms = self.rng.uniform(0, f.evict_window_ms)
        return plan

    def out_of_order(self, class_name: str, name: str, what: str, from_object: bool = True) -> bool:
        """Whether an outage covers the object now, for its ``"alarms"`` or its
        ``"calls"`` (those of the driving test only with ``external``). An
        outage names its object itself: ``targets`` does not apply."""
        if not self.enabled or self.paused or not (from_object or self.faults.external):
            return False
        elapsed = self.elapsed_ms()
        return any(getattr(outage, what) and outage.covers(class_name, name, elapsed)
                   for outage in self.faults.outages)

    def alarm_eviction(self, class_name: str) -> float | None:
        """Milliseconds into an alarm's run at which to evict its object, or None."""
        if self._applies(class_name, True) and self._chance(self.faults.evict):
            return self.rng.uniform(0, self.faults.evict_window_ms)
        return None

    def crash_before_commit(self, class_name: str) -> bool:
        return self._applies(class_name, True) and self._chance(self.faults.crash_before_commit)

    def alarm_fails(self, class_name: str) -> bool:
        return self._applies(class_name, True) and self._chance(self.faults.alarm_failure)

    def duplicate_alarm(self, class_name: str) -> bool:
        return self._applies(class_name, True) and self._chance(self.faults.duplicate_alarm)

    def _queue_applies(self, queue: str) -> bool:
        f = self.faults
        return self.enabled and not self.paused and (not f.targets or queue in f.targets)

    def consumer_crash(self, queue: str) -> float | None:
        """Milliseconds into a consumer's invocation at which it dies, or None."""
        if self._queue_applies(queue) and self._chance(self.faults.consumer_crash):
            return self.rng.uniform(0, self.faults.evict_window_ms)
        return None

    def ack_lost(self, queue: str) -> bool:
        return self._queue_applies(queue) and self._chance(self.faults.lost_ack)

    def delivery_late_ms(self, queue: str) -> float:
        """How much later than asked a message sent now reaches its consumer (0: on time)."""
        if self._queue_applies(queue) and self._chance(self.faults.late_delivery):
            return self.rng.uniform(*self.faults.late_delivery_ms)
        return 0.0
