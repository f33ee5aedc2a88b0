"""Scenarios of the simulation campaign: what one run does, drawn from one seed.

Lives here: ``Scenario`` (a workload, a mode, live changes, a fault mix
and partitions, all plain values that print as a ready-to-paste Python
literal), ``generate(seed, mode)``, which draws one "swarm" style (each
fault kind on or off per run, at its own rate), and ``smaller(scenario)``,
the candidates the shrinker tries. Must not know: the runtime, the Worker
or the checks; a scenario is data.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace

BUDGET_MODES = ("grants", "strict", "under", "over", "tree", "rate", "consumer")
#: modes without leases ("tree": a budget tree of holders, grants only; "rate": a start rate on each key;
#: "consumer": each admitted item's work run by a queue's consumer, which reports to its shard)
GRANTS_ONLY = ("grants", "tree", "rate", "consumer")
#: every mode the full campaign and CI's sample run
MODES = ("grants", "strict", "under", "over", "tree", "rate", "consumer", "locks")
ALL_MODES = BUDGET_MODES + ("locks",)
PLANTS = ("over_grant", "double_report", "lost_release", "double_admit", "over_rate", "consumer_overlap",
          "lost_outcome")

LEASE_TTL_MS = 20_000
GRANT_TIMEOUT_MS = 5_000
FINISHED_CHECK_MS = 10_000
RETRY_MAX_MS = 10_000  #: the shards' backoff ceiling (see ``campaign.checks.liveness_bound_ms``)
WAKE_AFTER_MS = 20_000  #: a holder calls a shard silent this long on a grant this old (``wake_after_ms``)
KEEP_DONE_MS = 24 * 3_600_000  #: longer than any run: the end check reads every item back (the purge has its own tests)
ROUND_PERIOD_MS = 2_000  #: the campaign's holders' round period (the library's default)
FAULTS_END_MS = 150_000  #: faults stop here (or when the last outage ends); every live change is undone then too
JOB_MS = (200, 1_000, 3_000, 8_000, 20_000)
GROUPS = ("wf0", "wf1", "capped")
FAULT_KINDS = ("lost_request", "lost_reply", "duplicate", "evict", "crash_before_commit", "alarm_failure",
               "duplicate_alarm")
#: what can befall a holder's call to a shard (``CONFIG["call_faults"]`` of the worker): lost on its
#: way, its answer lost, delivered twice, late (1 to 20 s), delivered and then the shard evicted,
#: and the holder evicted between its round and the call
CALL_FAULT_KINDS = ("lost", "lost_reply", "duplicate", "late", "evict_client", "evict_holder")
#: mode "consumer": a consumer's invocation dies partway, an ack is lost (the message comes again), a
#: message comes late (``LATE_DELIVERY_MS``), often past its start limit: dropped, its attempt taken for lost
QUEUE_FAULT_KINDS = ("consumer_crash", "lost_ack", "late_delivery")
#: mode "consumer": a consumer starts an attempt within this of its send or drops it, and stops a run
#: this long after its start (jobs run 20 s at most); the shard's checks wait for its next event this long
START_WITHIN_MS = 30_000
RUN_WITHIN_MS = 30_000
CHECKS_WAIT_MS = 20_000
#: mode "consumer": how late a late message comes (uniform), up to twice its start limit
LATE_DELIVERY_MS = (0.0, 2 * START_WITHIN_MS)


@dataclass(frozen=True)
class Job:
    at_ms: float  #: when it is submitted
    shard: int
    key: int
    group: str
    ms: int  #: how long its work runs once admitted
    cancel_after_ms: float | None = None  #: cancelled this long after submission, if still queued
    fails: bool = False  #: its work ends in failure (its permit goes back all the same)


@dataclass(frozen=True)
class Change:
    """A live change at ``at_ms``: ``kind`` is "limit" (key, value), "group_limit"
    (key, value: None, an int, or "raise" for a callback that raises) or "leases"
    (value: on or off)."""

    at_ms: float
    kind: str
    key: int = 0
    value: object = None


@dataclass(frozen=True)
class Partition:
    """``shard`` cannot reach any holder from ``at_ms`` for ``ms``."""

    shard: int
    at_ms: float
    ms: float


@dataclass(frozen=True)
class Outage:
    """An object out of order from ``at_ms`` for ``ms``: every alarm run of
    ``holder`` key or ``shard`` index fails (``alarms``: long enough that the
    runtime gives up on its alarm), or every call into it does (``calls``).
    In mode "tree", ``child``: the key's root's ``n``-th child instead (-1 the root)."""

    kind: str  #: "shard" or "holder"
    index: int
    at_ms: float
    ms: float
    alarms: bool = True
    calls: bool = False
    child: int = -1

    @property
    def target(self) -> str:
        """The object as the runtime names it."""
        if self.kind == "shard":
            return f"Shard:s{self.index}"
        return f"Holder:k{self.index}" + (f"~child-{self.child}" if self.child >= 0 else "")


@dataclass(frozen=True)
class Restart:
    """The holder of ``key`` evicted at ``at_ms``: with a burst just sent, mid-burst
    (in mode "tree", ``child``: the root's ``n``-th child instead, -1 the root)."""

    key: int
    at_ms: float
    child: int = -1


@dataclass(frozen=True)
class Hold:
    """One use of a lock semaphore (mode "locks")."""

    at_ms: float
    key: int
    limit: int
    work_ms: int
    style: str = "hold"  #: "hold" (wait as long as it takes), "wait" (5 s at most) or "try"
    stall_ms: int = 0  #: the holder's code stalls this long (past its lease: it must be told)
    max_hold: bool = False


@dataclass(frozen=True)
class Scenario:
    seed: int
    mode: str
    limits: tuple[int, ...] = (3,)  #: per key
    group_limits: tuple[tuple[str, int], ...] = ()  #: group -> its own ceiling, every key
    shards: int = 3
    jobs: tuple[Job, ...] = ()
    holds: tuple[Hold, ...] = ()
    changes: tuple[Change, ...] = ()
    faults: tuple[tuple[str, float], ...] = ()  #: fault kind -> rate
    latency_ms: float = 0.0  #: the upper end of each call's delay each way
    partitions: tuple[Partition, ...] = ()
    lose_releases: float = 0.0  #: share of releases a shard forgets to make (finished() returns them)
    permits_per_lease: int = 2
    plant: str | None = None  #: a defect planted on purpose, to show a check catches it
    #: False: the shards keep no done item (keep_done_ms=0), as the example
    #: Worker; the end check takes an item gone after its work ended as released
    keep_done: bool = True
    #: mode "consumer": a job that ends in its first attempt keeps its outcome
    #: in its released item (``outcomes=``, ``release_keeping``), as the example Worker
    records: bool = False
    outages: tuple[Outage, ...] = ()
    restarts: tuple[Restart, ...] = ()
    fan_out: int = 0  #: mode "tree": children per root (shards reach them by a hash of their name)
    #: mode "tree": levels under the root (2: each of its children lends to
    #: ``fan_out`` children of its own, and shards reach those leaves)
    depth: int = 1
    #: objects with nothing pending but their alarm lose their instance after
    #: 10 s, as production hibernates them (their memory goes, storage stays)
    hibernate: bool = False
    #: holders answer a shard's request at once and call the shard back with
    #: what a round has for it; False: requests are held open (a long poll)
    calls: bool = False
    call_faults: tuple[tuple[str, float], ...] = ()  #: what befalls those calls: kind -> rate
    #: mode "rate": per key, its start rate (limit, period_ms, burst): at most
    #: limit + burst admissions in any window of period_ms
    rates: tuple[tuple[int, float, int], ...] = ()
    #: mode "rate": groups with a start rate of their own, every key: (group, limit, period_ms, burst)
    group_rates: tuple[tuple[str, int, float, int], ...] = ()
    #: mode "consumer": what befalls the queue's deliveries: kind -> rate (``QUEUE_FAULT_KINDS``)
    queue_faults: tuple[tuple[str, float], ...] = ()

    @property
    def faults_end_ms(self) -> float:
        """When faults stop: at ``FAULTS_END_MS``, or when the last outage ends or the last restart comes."""
        return max([FAULTS_END_MS] + [o.at_ms + o.ms for o in self.outages] + [r.at_ms for r in self.restarts])

    @property
    def restarts_alone(self) -> bool:
        """A tree run, its holders calling their shards, whose only faults are
        its holders' restarts and the calls' latency: each restart of a root
        is held to a recovery bound (``campaign.checks.recovery_violations``)."""
        return bool(self.fan_out and self.calls) and any(r.child == -1 for r in self.restarts) and not (
            self.faults or self.call_faults or self.partitions or self.outages or self.lose_releases
            or self.changes or self.queue_faults)

    @property
    def keys(self) -> int:
        return len(self.limits)

    def size(self) -> int:
        """What the shrinker makes smaller."""
        return (len(self.jobs) + len(self.holds) + len(self.changes) + len(self.faults) + len(self.partitions)
                + len(self.outages) + len(self.restarts)
                + self.keys + self.shards + (self.latency_ms > 0) + (self.lose_releases > 0) + self.hibernate
                + self.calls + len(self.call_faults) + len(self.queue_faults))

    def to_literal(self) -> str:
        """The scenario as Python source, for a pytest case."""
        fields = [f"{name}={_literal(getattr(self, name))}" for name in asdict(self)
                  if getattr(self, name) != getattr(Scenario, name, object())]
        return "Scenario(" + ", ".join(fields) + ")"


def _literal(value: object) -> str:
    if isinstance(value, tuple):
        inner = ", ".join(_literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, (Job, Change, Partition, Hold, Outage, Restart)):
        defaults = type(value).__dataclass_fields__  # a field without a default is always written
        parts = [f"{k}={v!r}" for k, v in asdict(value).items() if v != defaults[k].default]
        return f"{type(value).__name__}({', '.join(parts)})"
    return repr(value)


# -- drawing one scenario ------------------------------------------------------------

def generate(seed: int, mode: str) -> Scenario:
    """One scenario of ``mode``, the same for the same seed."""
    if mode not in ALL_MODES:
        raise ValueError(f"mode must be one of {ALL_MODES}, not {mode!r}")
    rng = random.Random(f"{mode}:{seed}")
    faults, latency = _swarm(rng)
    if mode == "locks":
        keys = rng.randint(1, 3)
        return Scenario(seed, mode, limits=(1,) * keys, shards=rng.randint(2, 5), holds=_holds(rng, keys),
                        faults=faults, latency_ms=latency, hibernate=_hibernates(f"{mode}:{seed}"))
    keys = rng.choice([1, 1, 2])
    limits = tuple(rng.randint(1, 6) for _ in range(keys))
    shards = rng.randint(2, 5)
    group_limits = (("capped", rng.randint(1, 2)),) if rng.random() < 0.6 else ()
    jobs = _jobs(rng, keys, shards)
    fan_out = rng.choice([2, 3]) if mode == "tree" else 0
    calls, call_faults = _calls(f"{mode}:{seed}")
    scenario = Scenario(
        seed, mode, limits=limits, group_limits=group_limits, shards=shards,
        jobs=jobs, changes=_changes(rng, mode, keys), faults=faults, latency_ms=latency,
        partitions=_partitions(rng, shards), lose_releases=rng.choice([0.0, 0.05, 0.2]),
        permits_per_lease=rng.randint(1, 4), keep_done=rng.random() < 0.5,
        outages=_outages(rng, keys, shards) + _child_outages(f"{mode}:{seed}", keys, fan_out),
        restarts=_restarts(rng, keys, jobs, fan_out) + _root_restarts(f"{mode}:{seed}", keys, fan_out),
        fan_out=fan_out, depth=_depth(f"{mode}:{seed}", fan_out), hibernate=_hibernates(f"{mode}:{seed}"),
        calls=calls, call_faults=call_faults, rates=_rates(f"{mode}:{seed}", keys) if mode == "rate" else (),
        group_rates=_group_rates(f"{mode}:{seed}") if mode == "rate" else (),
        queue_faults=_queue_faults(f"{mode}:{seed}") if mode == "consumer" else (),
        records=mode == "consumer" and _records(f"{mode}:{seed}"),
    )
    if _restarts_alone(f"{mode}:{seed}", scenario):
        scenario = replace(scenario, faults=(), call_faults=(), partitions=(), outages=(), lose_releases=0.0,
                           changes=())
    return scenario


def _rates(name: str, keys: int) -> tuple[tuple[int, float, int], ...]:
    """Mode "rate": each key's start rate, one to six per 2, 5 or 15 s, now
    and then a burst of one or two: short periods, so that a run of two
    minutes crosses many windows. Drawn from a source of its own, so that
    every other draw of a seed stays what it is in mode "grants"."""
    rng = random.Random(f"{name}:rates")
    return tuple((rng.randint(1, 6), rng.choice([2_000.0, 5_000.0, 15_000.0]), rng.choice([0, 0, 1, 2]))
                 for _ in range(keys))


def _group_rates(name: str) -> tuple[tuple[str, int, float, int], ...]:
    """Mode "rate", half the runs: one group with a start rate of its own,
    under its key's (drawn apart, as ``_rates``)."""
    rng = random.Random(f"{name}:group rates")
    if rng.random() >= 0.5:
        return ()
    return ((rng.choice(GROUPS), rng.randint(1, 3), rng.choice([2_000.0, 5_000.0]), rng.choice([0, 1])),)


def _queue_faults(name: str) -> tuple[tuple[str, float], ...]:
    """Mode "consumer": each queue fault on or off, at a rate of its own, one
    often heavy (drawn apart, as ``_rates``)."""
    rng = random.Random(f"{name}:queue faults")
    heavy = rng.choice(QUEUE_FAULT_KINDS + (None,))
    return tuple((kind, round(rng.uniform(0.2, 0.4) if kind == heavy else rng.uniform(0.01, 0.1), 3))
                 for kind in QUEUE_FAULT_KINDS if kind == heavy or rng.random() < 0.6)


def _records(name: str) -> bool:
    """Mode "consumer", half the runs: jobs' outcomes kept in their items (drawn apart, as ``_rates``)."""
    return random.Random(f"{name}:records").random() < 0.5


def _hibernates(name: str) -> bool:
    """Half the runs: idle objects hibernate as in production. Drawn from a source
    of its own, so that every other draw of a seed stays what it was."""
    return random.Random(f"{name}:hibernate").random() < 0.5


def _calls(name: str) -> tuple[bool, tuple[tuple[str, float], ...]]:
    """Three runs in four: holders call their shards back (in a tree, its
    leaves; a parent calls its children in every run), each kind of fault of
    those calls on or off at a rate of its own. Drawn from a source of their
    own, so that every other draw of a seed stays what it was."""
    rng = random.Random(f"{name}:calls")
    if rng.random() >= 0.75:
        return False, ()
    return True, tuple((kind, round(rng.uniform(0.01, 0.15), 3)) for kind in CALL_FAULT_KINDS if rng.random() < 0.5)


def _swarm(rng: random.Random) -> tuple[tuple[tuple[str, float], ...], float]:
    """Each fault kind on or off for this run, at a rate of its own; one kind
    often heavy: some runs lose many replies, some evict often, some delay long."""
    heavy = rng.choice(FAULT_KINDS + ("latency", None))
    faults = []
    for kind in FAULT_KINDS:
        if kind == heavy:
            faults.append((kind, round(rng.uniform(0.2, 0.4), 3)))
        elif rng.random() < 0.5:
            faults.append((kind, round(rng.uniform(0.01, 0.08), 3)))
    latency = rng.choice([0.0, 20.0, 80.0]) if heavy != "latency" else 2_000.0
    return tuple(faults), latency


def _jobs(rng: random.Random, keys: int, shards: int) -> tuple[Job, ...]:
    jobs = []
    for _ in range(rng.randint(3, 10)):  # bursts
        at = rng.uniform(0, 100_000)
        for _ in range(rng.randint(1, 8)):
            cancel = rng.uniform(0, 8_000) if rng.random() < 0.1 else None
            jobs.append(Job(round(at + rng.uniform(0, 500), 1), rng.randrange(shards), rng.randrange(keys),
                            rng.choice(GROUPS), rng.choice(JOB_MS),
                            None if cancel is None else round(cancel, 1), rng.random() < 0.1))
    return tuple(sorted(jobs, key=lambda job: job.at_ms))


def _changes(rng: random.Random, mode: str, keys: int) -> tuple[Change, ...]:
    changes = []
    for _ in range(rng.randint(0, 3)):
        at = round(rng.uniform(5_000, FAULTS_END_MS - 10_000), 1)
        kind = rng.choice(["limit", "limit", "group_limit"] + (["leases"] if mode not in GRANTS_ONLY else []))
        if kind == "limit":
            changes.append(Change(at, kind, rng.randrange(keys), rng.randint(0, 8)))
        elif kind == "group_limit":
            changes.append(Change(at, kind, rng.randrange(keys), rng.choice([None, 1, 3, "raise"])))
        else:
            changes.append(Change(at, kind, 0, rng.choice(["on", "off"])))
    return tuple(sorted(changes, key=lambda change: change.at_ms))


def _partitions(rng: random.Random, shards: int) -> tuple[Partition, ...]:
    if rng.random() >= 0.3:
        return ()
    at = round(rng.uniform(10_000, 80_000), 1)
    return (Partition(rng.randrange(shards), at, round(rng.uniform(1.2, 2.0) * LEASE_TTL_MS, 1)),)


def _outages(rng: random.Random, keys: int, shards: int) -> tuple[Outage, ...]:
    """Three runs in ten: an object whose every alarm run fails for 170 to 220 s
    (the runtime's seven tries take about 160 s: it gives up on the alarm),
    a shard more often than a holder. One in five: an object that fails every
    call for one to three minutes."""
    found = []
    if rng.random() < 0.3:
        kind = "shard" if rng.random() < 0.7 else "holder"
        index = rng.randrange(shards if kind == "shard" else keys)
        found.append(Outage(kind, index, round(rng.uniform(5_000, 60_000), 1), round(rng.uniform(170_000, 220_000), 1)))
    if rng.random() < 0.2:
        kind = "shard" if rng.random() < 0.5 else "holder"
        index = rng.randrange(shards if kind == "shard" else keys)
        found.append(Outage(kind, index, round(rng.uniform(5_000, 90_000), 1), round(rng.uniform(60_000, 180_000), 1),
                            alarms=False, calls=True))
    return tuple(found)


def _child_outages(name: str, keys: int, fan_out: int) -> tuple[Outage, ...]:
    """In a tree, three runs in ten: one of a key's children whose every
    alarm run fails for 170 to 220 s, as ``_outages`` does to a root. Drawn
    from a source of its own, so that every other draw, and so a seed's
    scenario otherwise, stays as it was."""
    rng = random.Random(f"{name}:children")
    if not fan_out or rng.random() >= 0.3:
        return ()
    return (Outage("holder", rng.randrange(keys), round(rng.uniform(5_000, 60_000), 1),
                   round(rng.uniform(170_000, 220_000), 1), child=rng.randrange(fan_out)),)


def _depth(name: str, fan_out: int) -> int:
    """In a tree, one run in four: two levels under the root, whose children
    then lend on to leaves of their own (a restart or outage of a ``child``
    strikes one of the root's children, in the middle). Drawn from a source
    of its own, so that every other draw of a seed stays what it was."""
    return 2 if fan_out and random.Random(f"{name}:depth").random() < 0.25 else 1


def _restarts(rng: random.Random, keys: int, jobs: tuple[Job, ...], fan_out: int = 0) -> tuple[Restart, ...]:
    """Three runs in ten: a holder restarted within two seconds of a burst of
    its key's jobs (in a tree, the root or one of its children; half the runs
    of a tree restart every child at once, with the root)."""
    if fan_out and rng.random() < 0.5 and jobs:
        job = rng.choice(jobs)
        at = round(job.at_ms + rng.uniform(100, 2_000), 1)
        return tuple(Restart(job.key, at, child) for child in range(-1, fan_out))
    if rng.random() >= 0.3 or not jobs:
        return ()
    found = []
    for _ in range(rng.randint(1, 2)):
        job = rng.choice(jobs)
        child = rng.randrange(-1, fan_out) if fan_out else -1
        found.append(Restart(job.key, round(job.at_ms + rng.uniform(100, 2_000), 1), child))
    return tuple(sorted(found, key=lambda restart: restart.at_ms))


def _root_restarts(name: str, keys: int, fan_out: int) -> tuple[Restart, ...]:
    """In a tree, three runs in ten: one key's root restarted again and again,
    every 2 to 5 round periods (``ROUND_PERIOD_MS``) for one to three minutes
    from 5 to 60 s on, as a root that keeps failing is. Drawn from a source
    of its own, so that every other draw of a seed stays what it was."""
    rng = random.Random(f"{name}:root restarts")
    if not fan_out or rng.random() >= 0.3:
        return ()
    key, every = rng.randrange(keys), rng.uniform(2, 5) * ROUND_PERIOD_MS
    start, length = rng.uniform(5_000, 60_000), rng.uniform(60_000, 180_000)
    return tuple(Restart(key, round(start + n * every, 1)) for n in range(int(length // every) + 1))


def _restarts_alone(name: str, scenario: Scenario) -> bool:
    """In a tree whose holders call their shards, two in five of the runs
    whose root restarts again and again: no other fault, no live change
    (latency stays), so that how soon the tree serves again after each
    restart can be held to a bound (``Scenario.restarts_alone``; with
    requests held instead, a shard's new group waits for its held request's
    answer, up to its wait). Drawn from a source of its own."""
    series = sum(1 for r in scenario.restarts if r.child == -1) > 1
    return series and scenario.calls and random.Random(f"{name}:restarts alone").random() < 0.4


def _holds(rng: random.Random, keys: int) -> tuple[Hold, ...]:
    holds = []
    for _ in range(rng.randint(10, 60)):
        style = rng.choices(["hold", "wait", "try"], [0.65, 0.2, 0.15])[0]
        holds.append(Hold(round(rng.uniform(0, 60_000), 1), rng.randrange(keys), rng.choice([1, 2, 3]),
                          rng.choice([0, 300, 1_500, 4_000]), style,
                          2_500 if rng.random() < 0.05 else 0, rng.random() < 0.1))
    return tuple(sorted(holds, key=lambda hold: hold.at_ms))


# -- shrinking -------------------------------------------------------------------------

def smaller(scenario: Scenario) -> Iterator[Scenario]:
    """Candidates one step smaller, the biggest cuts first."""
    for name in ("jobs", "holds", "changes", "partitions", "faults", "outages", "restarts", "call_faults",
                 "queue_faults"):
        items = getattr(scenario, name)
        n = len(items)
        chunk = n  # all of them, then halves, down to one at a time
        while chunk >= 1:
            for start in range(0, n, chunk):
                yield replace(scenario, **{name: items[:start] + items[start + chunk:]})
            chunk //= 2
    if scenario.latency_ms:
        yield replace(scenario, latency_ms=0.0)
    if scenario.lose_releases:
        yield replace(scenario, lose_releases=0.0)
    if scenario.hibernate:
        yield replace(scenario, hibernate=False)
    if scenario.calls:
        yield replace(scenario, calls=False, call_faults=())
    if scenario.keys > 1:
        yield _without_key(scenario, scenario.keys - 1)
    if scenario.shards > 1:
        last = scenario.shards - 1
        yield replace(scenario, shards=last,
                      jobs=tuple(replace(j, shard=min(j.shard, last - 1)) for j in scenario.jobs),
                      partitions=tuple(p for p in scenario.partitions if p.shard < last),
                      outages=tuple(o for o in scenario.outages if o.kind != "shard" or o.index < last))


def _without_key(scenario: Scenario, key: int) -> Scenario:
    return replace(scenario, limits=scenario.limits[:key], rates=scenario.rates[:key],
                   jobs=tuple(j for j in scenario.jobs if j.key != key),
                   holds=tuple(h for h in scenario.holds if h.key != key),
                   changes=tuple(c for c in scenario.changes if c.key != key),
                   outages=tuple(o for o in scenario.outages if o.kind != "holder" or o.index != key),
                   restarts=tuple(r for r in scenario.restarts if r.key != key))


def with_plant(scenario: Scenario, plant: str | None) -> Scenario:
    if plant is not None and plant not in PLANTS:
        raise ValueError(f"plant must be one of {PLANTS}, not {plant!r}")
    return replace(scenario, plant=plant)


