"""Ground truth kept outside the objects, and the invariants checked against it at every step.

Lives here: ``Truth`` for the budget modes (which work really runs, per key
and group; what the holder counts after each commit; every registration
of an item's work; the ceilings in force over time), the end-of-run checks
(durability, no leak after the sweep, liveness within a stated bound), and
``overlaps_beyond_limits`` for the lock semaphore. Must not know: how the
runtime runs objects; the Worker and the runner call in.

The invariants (``docs/testing.md`` explains each bound):

- ``limit``: at every start, the work running under a key is within the
  ceiling (the limit, or limit + extra for leases ``over``). A lowered limit
  revokes nothing and a lease is capacity already handed out, so the
  ceiling that applies is the highest one in force during the last
  ``stale_ms``: as long as a permit issued before a change may still be used.
- ``group_limit``: the same per group, for groups with a limit of their own.
- ``accounting``: at every start and every holder commit, the work running
  under a key (and group) is no more than what the holder counts: a report
  applied twice or a permit freed early shows here first.
- ``issue``: a holder commit that hands out permits leaves the holder's count
  within the ceiling in force (and each group within its limit).
- ``monotonic``: a grant's claimed and released counts and a lease's drawn
  and released counts never move back, and permits never grow.
- ``exactly_once``: an item's work is registered once, however often
  ``admit()`` is called; at the end every admitted item was registered.
- ``durability``: every item a shard accepted is still there at the end.
- ``leak``: once the run is quiet, the holder counts nothing but leases their
  clients never learned of (the one charge the spec keeps).
- ``liveness``: once faults stop, every item not cancelled is admitted
  within ``liveness_bound_ms``.
- ``rate``: in mode "rate", no window of a key's ``period_ms`` holds more
  than its ``limit + burst`` admissions (nor of a group's own rate, its
  group's), each at the time its shard wrote it
  admitted (the write that committed: the last before its work registered).
- ``run_in_permit``: in mode "consumer", each run of an item's work by the
  queue's consumer starts while the item holds its permit (admitted, not yet
  ended), and no two runs of one item overlap.
- ``outcome``: in mode "consumer", at the end, every job whose work ended
  reads ``completed`` or ``failed`` (its outcome kept, in the runner's row or,
  with ``records``, in its released item; checked by ``campaign/run``).
- ``recovery``: in a tree run whose only faults are restarts
  (``Scenario.restarts_alone``), after each restart of a key's root that
  finds work of the key waiting and a permit of its limit (and of the
  waiting work's group) free, an item of the key is admitted within
  ``recovery_bound_ms``.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field

from durability.semaphore.holder.pure.rate import RATE_CLAIM_MS

from .scenario import (
    CHECKS_WAIT_MS,
    FINISHED_CHECK_MS,
    GRANT_TIMEOUT_MS,
    GRANTS_ONLY,
    LEASE_TTL_MS,
    RETRY_MAX_MS,
    ROUND_PERIOD_MS,
    RUN_WITHIN_MS,
    START_WITHIN_MS,
    WAKE_AFTER_MS,
    Scenario,
)

ROUND_MS = 3_000  #: round_wait_ms + round_period_ms of the campaign's holders
#: mode "consumer": what holds a permit past its work once faults stop: an attempt out whose
#: message was lost is taken for lost a span after its send (``jobs/handoff``), a report
#: retried comes within the consumer's doubling delays (5 + 10 + 20 + 40 s), and the
#: shard's own checks wait ``CHECKS_WAIT_MS``
CONSUMER_RECOVERY_MS = START_WITHIN_MS + RUN_WITHIN_MS + 60_000 + 75_000 + CHECKS_WAIT_MS
SWEEP_CRON = "* * * * *"  #: the campaign Worker's sweep: every shard is called once a minute
SWEEP_MS = 60_000
#: a holder tries a failed call to a shard again within this (``holder/calls.RETRY_MAX_MS``); the
#: shard asks again by itself within its request wait (the library's 50 s), whichever comes first
CALL_RETRY_MS = 60_000
OVER_EXTRA = 2  #: the extra of mode "over": leases get two permits above the limit


def ceiling_of(mode: str, limit: int, leases_on: bool) -> int:
    return limit + (OVER_EXTRA if mode == "over" and leases_on else 0)


def stale_ms(scenario: Scenario) -> float:
    """How long a permit handed out before a change may still be used: a grant
    until its claim is confirmed (its deadline, plus confirmations retried at
    most ``RETRY_MAX_MS`` apart a few times), a lease until its client hears it
    is retired (half its ttl, or after a partition ends)."""
    partition = max((p.ms for p in scenario.partitions), default=0)
    return LEASE_TTL_MS + GRANT_TIMEOUT_MS + partition + 6 * RETRY_MAX_MS + 2 * ROUND_MS


def liveness_bound_ms(scenario: Scenario, waiting_work_ms: float, limit: int, capped_work_ms: float,
                      cap: int | None, rate_ms: float = 0.0) -> float:
    """How long after faults stop the last item of a key may wait to be admitted.

    Once faults stop, an object whose alarm the runtime gave up on is called
    by the sweep within ``SWEEP_MS`` and sets its alarm again; a shard's
    failed request is retried within ``RETRY_MAX_MS``; a permit whose
    release was lost comes back by the ``finished()`` sweep
    (``FINISHED_CHECK_MS``, twice: a sweep may have just run); a lease
    unreported past its ttl and unclaimed grants come back within
    ``LEASE_TTL_MS`` and ``GRANT_TIMEOUT_MS``; each request waits at most
    two rounds. Then the work still waiting needs its sum over the limit
    (or over its group's limit), after the longest job running ends.
    """
    recovery = (SWEEP_MS + 2 * RETRY_MAX_MS + 2 * FINISHED_CHECK_MS + LEASE_TTL_MS + GRANT_TIMEOUT_MS
                + 4 * ROUND_MS + (CALL_RETRY_MS + 6 * WAKE_AFTER_MS if scenario.calls else 0)
                + (CONSUMER_RECOVERY_MS if scenario.mode == "consumer" else 0))
    work = waiting_work_ms / max(limit, 1)
    if cap:
        work = max(work, capped_work_ms / cap)
    return recovery + 20_000 + max(work, rate_ms) * 1.5 + 30_000


def recovery_bound_ms(scenario: Scenario) -> float:
    """How soon a tree serves again after its root restarts, with no other
    fault: the children ask on their beat (a round period) and the new
    root runs its first round within one after them; a child idle on a
    loan gives it back at its next round, and its parent lends it at the
    following one (a period more); the child lent calls its shard at once.
    A round's wait on top, and the chain's latency: five calls and their
    answers (shard to leaf, leaf to root, root to leaf, the leaf's ask,
    leaf to shard), each way delayed up to the run's ``latency_ms``.

    Restarts of a series come every 2 to 5 periods, so a window often holds
    the next one: what the check holds to the bound is progress through
    restarts that keep coming, not one restart's recovery alone."""
    return 3 * ROUND_PERIOD_MS + ROUND_MS + 10 * scenario.latency_ms


def recovery_violations(scenario: Scenario, truth: Truth, start: float,
                        accepted_at: dict[str, float], cancel_asked: Callable[[str], bool]) -> list[str]:
    """``recovery`` (see the module's docstring): ``accepted_at`` is when
    each item's submission was accepted, ``cancel_asked(item)`` whether
    its cancel was asked (it need not be admitted then)."""
    if not scenario.restarts_alone:
        return []
    bound, own = recovery_bound_ms(scenario), dict(scenario.group_limits)
    never = float("inf")
    found = []
    for restart in (r for r in scenario.restarts if r.child == -1):
        at = start + restart.at_ms
        items = [item for item in accepted_at if scenario.jobs[int(item[1:])].key == restart.key]
        running = [i for i in items if truth.admitted_at.get(i, never) <= at < truth.stopped.get(i, never)]
        groups = collections.Counter(scenario.jobs[int(i[1:])].group for i in running)
        full = {group for group, most in own.items() if groups[group] >= most}  # its own limit reached
        waiting = [i for i in items if accepted_at[i] < at < truth.admitted_at.get(i, never)
                   and not cancel_asked(i) and scenario.jobs[int(i[1:])].group not in full]
        limit = scenario.limits[restart.key]
        if not waiting or len(running) >= limit:
            continue
        after = min((truth.admitted_at[i] for i in items if truth.admitted_at.get(i, at) > at), default=None)
        if after is None or after - at > bound:
            waited = "nothing admitted since" if after is None else f"the next admission {after - at:.0f} ms on"
            found.append(f"key {restart.key}: root restarted at {restart.at_ms:.0f} ms with {waiting[0]} waiting "
                         f"and {len(running)} of {limit} running; {waited}, bound {bound:.0f} ms")
    return found


def rate_time_ms(scenario: Scenario, key: int, waiting_groups: list[str]) -> float:
    """Mode "rate": how long the rates take to let the waiting items start: a
    window (and a claim window, which a grant the holder cannot place adds)
    per rate's worth of them, and one more; the key's rate over them all, a
    group's over its own."""
    rated = [(len(waiting_groups), scenario.rates[key])] if scenario.rates else []
    rated += [(waiting_groups.count(group), rate) for group, *rate in scenario.group_rates]
    return max(((count / max(limit, 1) + 1) * (period_ms + RATE_CLAIM_MS) for count, (limit, period_ms, _) in rated),
               default=0.0)


@dataclass
class Violations:
    counts: collections.Counter = field(default_factory=collections.Counter)
    first: dict[str, str] = field(default_factory=dict)

    def add(self, invariant: str, detail: str) -> None:
        self.counts[invariant] += 1
        self.first.setdefault(invariant, detail)

    def __bool__(self) -> bool:
        return bool(self.counts)


class History:
    """Values in force over time, for "the highest in the last ``window`` ms"."""

    def __init__(self, value: object) -> None:
        self.changes: list[tuple[float, object]] = [(float("-inf"), value)]

    def set(self, at: float, value: object) -> None:
        self.changes.append((at, value))

    def now(self) -> object:
        return self.changes[-1][1]

    def highest_since(self, since: float) -> object:
        """The highest value in force at any time from ``since`` on (None: no ceiling)."""
        values = [value for at, value in self.changes if at > since]
        values.append(next(value for at, value in reversed(self.changes) if at <= since))
        numbers = [v for v in values if isinstance(v, int)]
        if any(v is None for v in values):
            return None  # without a ceiling of its own for a while: nothing to hold it to
        return max(numbers) if numbers else 0  # a raising callback admits nothing


class Truth:
    """What really runs, registered as the Worker reports it, checked at every step."""

    def __init__(self, scenario: Scenario, clock) -> None:
        self.scenario = scenario
        self.clock = clock  #: () -> now in ms
        self.violations = Violations()
        self.excused: collections.Counter = collections.Counter()  #: what the spec allows, counted
        self.steps = 0
        self.running: dict[int, dict[str, set[str]]] = collections.defaultdict(lambda: collections.defaultdict(set))
        self.where: dict[str, tuple[int, str]] = {}
        self.registered: collections.Counter = collections.Counter()
        self.admitted_at: dict[str, float] = {}
        #: per item, when its shard wrote it admitted (a write whose transaction failed is followed by another)
        self.admission_writes: dict[str, list[float]] = collections.defaultdict(list)
        #: per key, and per (key, group), when each registered item was admitted (mode "rate")
        self.admissions: dict[object, list[float]] = collections.defaultdict(list)
        self.stopped: dict[str, float] = {}  #: item -> when its work ended
        self.runs_now: set[str] = set()  #: mode "consumer": items whose work a consumer runs now
        self.counted: dict[int, tuple[int, dict[str, int]]] = {}  #: key -> holder's (total, per group)
        leases_on = scenario.mode not in GRANTS_ONLY
        self.leases_on = History(leases_on)
        self.limits = [History(limit) for limit in scenario.limits]
        own = dict(scenario.group_limits)
        self.group_limits = [{group: History(own.get(group)) for group in ("wf0", "wf1", "capped")}
                             for _ in scenario.limits]

    # -- live changes, as the runner makes them --------------------------------------
    def limit_changed(self, key: int, value: int) -> None:
        self.limits[key].set(self.clock(), value)

    def group_limit_changed(self, key: int, group: str, value: object) -> None:
        self.group_limits[key][group].set(self.clock(), value)

    def leases_changed(self, on: bool) -> None:
        self.leases_on.set(self.clock(), on)

    def ceiling_now(self, key: int) -> int:
        return ceiling_of(self.scenario.mode, self.limits[key].now(), self.leases_on.now())

    def _allowed(self, key: int) -> int:
        since = self.clock() - stale_ms(self.scenario)
        limit = self.limits[key].highest_since(since)
        over = self.scenario.mode == "over" and self.leases_on.highest_since(since)
        return limit + (OVER_EXTRA if over else 0)

    # -- steps ----------------------------------------------------------------------------
    def register(self, item: str) -> bool:
        """An item's work is registered (started); False if it already was."""
        self.steps += 1
        self.registered[item] += 1
        if self.registered[item] > 1:
            self.violations.add("exactly_once", f"{item} registered {self.registered[item]} times")
            return False
        return True

    def admission_written(self, item: str, key: int) -> None:
        self.admission_writes[item].append(self.clock())

    def start(self, item: str, key: int, group: str) -> None:
        self.steps += 1
        self.admitted_at.setdefault(item, self.clock())
        writes = self.admission_writes.get(item)
        admitted = writes[-1] if writes else self.clock()
        self.admissions[key].append(admitted)
        self.admissions[(key, group)].append(admitted)
        self.where[item] = (key, group)
        self.running[key][group].add(item)
        total = sum(len(items) for items in self.running[key].values())
        allowed = self._allowed(key)
        if total > allowed:
            self.violations.add("limit", f"{total} running under key {key} at {self.clock():.0f} ms; at most {allowed}")
        ceiling = self.group_limits[key][group].highest_since(self.clock() - stale_ms(self.scenario))
        in_group = len(self.running[key][group])
        if isinstance(ceiling, int) and in_group > ceiling:
            self.violations.add("group_limit", f"{in_group} running in {key}/{group}; at most {ceiling}")
        self._check_counted(key)

    def stop(self, item: str) -> None:
        self.steps += 1
        key, group = self.where.get(item, (None, None))
        if key is not None:
            self.running[key][group].discard(item)
        self.stopped.setdefault(item, self.clock())

    def run_started(self, item: str) -> None:
        """Mode "consumer": the queue's consumer starts a run of the item's work."""
        self.steps += 1
        key, group = self.where.get(item, (None, None))
        if key is None or item not in self.running[key][group]:
            self.violations.add("run_in_permit", f"{item} ran at {self.clock():.0f} ms without its permit")
        if item in self.runs_now:
            self.violations.add("run_in_permit", f"{item} ran twice at once at {self.clock():.0f} ms")
        self.runs_now.add(item)

    def run_ended(self, item: str) -> None:
        self.runs_now.discard(item)

    def holder_committed(self, key: int, counted: tuple[int, dict[str, int]], issued: set[str],
                         moved_back: list[str]) -> None:
        """After each holder commit: what it counts, the groups it handed permits in,
        and any count that moved back."""
        self.steps += 1
        self.counted[key] = counted
        for detail in moved_back:
            self.violations.add("monotonic", detail)
        if issued:
            total, groups = counted
            ceiling = self.ceiling_now(key)
            if total > ceiling:
                self.violations.add(
                    "issue", f"holder {key} counts {total} after handing out permits; ceiling {ceiling}")
            for group in issued:
                limit = self.group_limits[key][group].now()
                if isinstance(limit, int) and groups.get(group, 0) > limit:
                    self.violations.add("issue", f"holder {key} counts {groups[group]} in {group}; limit {limit}")
        self._check_counted(key)

    def child_committed(self, moved_back: list[str]) -> None:
        """After each commit of a tree's child holder: only its counts'
        monotony is its own (what runs under the key is checked against the
        root, which counts what each child holds)."""
        self.steps += 1
        for detail in moved_back:
            self.violations.add("monotonic", detail)

    def _check_counted(self, key: int) -> None:
        if key not in self.counted:
            return
        total, groups = self.counted[key]
        running = {group: len(items) for group, items in self.running[key].items()}
        if sum(running.values()) > total:
            self.violations.add("accounting", f"{sum(running.values())} running under key {key}; holder counts {total}")
        for group, n in running.items():
            if n > groups.get(group, 0):
                self.violations.add("accounting", f"{n} running in {key}/{group}; holder counts {groups.get(group, 0)}")


def rate_violations(scenario: Scenario, admissions: dict[object, list[float]]) -> list[str]:
    """Windows holding more admissions than a rate allows (mode "rate"): a
    key's, and a group's own under every key."""
    found = []
    for key, (limit, period_ms, burst) in enumerate(scenario.rates):
        found += _over(admissions.get(key, []), limit + burst, period_ms, f"key {key}")
    for group, limit, period_ms, burst in scenario.group_rates:
        for key in range(scenario.keys):
            found += _over(admissions.get((key, group), []), limit + burst, period_ms, f"{key}/{group}")
    return found


def _over(admitted: list[float], most: int, period_ms: float, what: str) -> list[str]:
    times, first, found = sorted(admitted), 0, []
    for last, at in enumerate(times):
        while at - times[first] >= period_ms:
            first += 1
        if last - first + 1 > most:
            found.append(f"{last - first + 1} admissions of {what} within {period_ms:.0f} ms "
                         f"from {times[first]:.0f}; at most {most}")
    return found


def overlaps_beyond_limits(holds: list[dict]) -> list[tuple]:
    """Every hold admitted while as many others surely held the key as its open's limit allows.

    A key admits by the limit of the open that waits, so a hold's limit binds
    at its admission: later holds admitted by larger limits may join it.
    """
    found = []
    for hold in holds:
        others = [other for other in holds if other is not hold and other["key"] == hold["key"]
                  and other["start"] <= hold["admitted"] < other["end"] and other["seq"] < hold["seq"]]
        if len(others) >= hold["limit"]:
            found.append((hold["id"], hold["limit"], sorted(o["id"] for o in others)))
    return found
