"""Sharing a limit between keys (tenants) under demand: floors, priorities and weighted fair share, as pure functions.

Lives here: ``Share`` (one key's weight, floor and priority, resolved for
a round), ``FairPolicy`` (the group -> key map and each key's share),
``checked_share`` (the clear error for a malformed one) and
``allot``: how many permits each key gets of the room a round has. Must
not know: grants, requests, the wire, storage, clocks or the user's
callbacks (the holder resolves them into a ``FairPolicy`` per round).

The rule, per round, over the keys with demand:

1. floors: each key gets up to its floor, counting what it already holds
   (the room is short: the key of the oldest work first);
2. priority classes, highest first: a class is served all it can take
   before a lower one gets any room;
3. within a class, weighted water-filling over holdings: every key's
   target is ``weight × L`` for the one level ``L`` at which the targets,
   each capped at what the key holds plus what it wants, use up what the
   class holds plus its room. A key above its target (it got there while
   others had no demand) gets nothing and keeps what it holds: permits are
   never taken back, they return as work ends.

Why this and not deficit round robin or virtual-time fair queueing: those
decide one packet (here, one permit) at a time, in turns that assume a
steady stream of small decisions. A round decides thousands of permits at
once with what every key holds in hand, so the fair split of the room can be
computed directly: the level ``L`` is found by sorting each key's two
breakpoints (where it starts to take room, where its demand is met), O(k log
k) in the keys, with no state carried between rounds to lose on a restart.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ...._common.checks import MAX_SAFE_INTEGER, int_in, number_in


@dataclass(frozen=True)
class Share:
    """One key's terms: its weight (> 0), its floor (permits it can always get
    when it has demand) and its priority class (higher first)."""

    weight: float = 1.0
    floor: int = 0
    priority: int = 0


@dataclass(frozen=True)
class FairPolicy:
    """Resolved for one round: which key each group's demand counts for, and each key's share."""

    key_of: dict[str, str] = field(default_factory=dict)  #: group -> key (absent: the group itself)
    shares: dict[str, Share] = field(default_factory=dict)  #: key -> share (absent: ``Share()``)

    def key(self, group: str) -> str:
        return self.key_of.get(group, group)

    def share(self, key: str) -> Share:
        return self.shares.get(key) or Share()


def checked_share(weight: Any, floor: Any, priority: Any) -> Share:
    """A share from what the user's callbacks returned, or ``ValueError`` saying what is wrong."""
    # The bound is 2**53: a share crosses the wire in usage() replies as a JS
    # number, which holds every integer only up to there, and a weight past
    # it would make every other key's share round to nothing.
    if not number_in(weight, 0, MAX_SAFE_INTEGER) or weight == 0:
        raise ValueError(f"a fair share's weight must be a number above 0 and at most 2**53 "
                         f"(what a JS number holds exactly), not {weight!r}")
    if not int_in(floor, 0, MAX_SAFE_INTEGER):
        raise ValueError(f"a fair share's floor must be an int from 0 to 2**53 "
                         f"(what a JS number holds exactly), not {floor!r}")
    if not int_in(priority, -MAX_SAFE_INTEGER, MAX_SAFE_INTEGER):
        raise ValueError(f"a fair share's priority must be an int from -2**53 to 2**53 "
                         f"(what a JS number holds exactly), not {priority!r}")
    return Share(float(weight), floor, priority)


@dataclass
class Claimant:
    """One key in a round: what it holds, what it still wants, its share, and
    its oldest waiting work (ties and short floors go to the oldest)."""

    key: str
    held: int
    wants: int
    share: Share
    oldest: float
    given: int = 0


def allot(room: int, claimants: Iterable[Claimant]) -> dict[str, int]:
    """Permits per key from ``room``: floors, then priority classes, then
    weighted water-filling within a class (see the module notes). Never more
    than a key wants, and no room left while a key still wants some."""
    keys = [c for c in claimants if c.wants > 0]
    room = max(room, 0)
    room -= _floors(room, keys)
    classes: dict[int, list[Claimant]] = {}
    for claimant in keys:
        classes.setdefault(claimant.share.priority, []).append(claimant)
    for priority in sorted(classes, reverse=True):
        if room <= 0:
            break
        room -= _fill(room, classes[priority])
    return {c.key: c.given for c in keys if c.given}


def _give(claimant: Claimant, count: int) -> int:
    count = max(0, min(count, claimant.wants - claimant.given))
    claimant.given += count
    return count


def _floors(room: int, keys: list[Claimant]) -> int:
    """Each key up to its floor, counting what it holds; oldest work first when the room is short."""
    used = 0
    for claimant in sorted(keys, key=lambda c: (c.oldest, c.key)):
        if claimant.share.floor > claimant.held:
            used += _give(claimant, min(claimant.share.floor - claimant.held, room - used))
    return used


def _fill(room: int, keys: list[Claimant]) -> int:
    """Weighted water-filling of ``room`` over one class; returns what it gave."""
    level = _level(room, keys)
    used = 0
    for claimant in keys:
        used += _give(claimant, min(int(_target(claimant, level)) - claimant.held - claimant.given, room - used))
    # Rounding down leaves under one permit per key: it goes to the keys
    # furthest below their target, one at a time (a key still wanting goes
    # back in line, so no room is left while a key wants some).
    behind = [_behind(c) for c in keys if c.given < c.wants]
    heapq.heapify(behind)
    while used < room and behind:
        claimant = heapq.heappop(behind)[-1]
        used += _give(claimant, 1)
        if claimant.given < claimant.wants:
            heapq.heappush(behind, _behind(claimant))
    return used


def _behind(claimant: Claimant) -> tuple[float, float, str, Claimant]:
    """A key's place in line for a permit left over: lowest holding per weight first, then oldest work."""
    return (claimant.held + claimant.given) / claimant.share.weight, claimant.oldest, claimant.key, claimant


def _target(claimant: Claimant, level: float) -> float:
    """What the key would hold at ``level``: its weight's worth, at least what
    it holds, at most what it holds plus what it wants."""
    return min(max(claimant.share.weight * level, claimant.held + claimant.given), claimant.held + claimant.wants)


def _level(room: int, keys: list[Claimant]) -> float:
    """The level at which the keys' targets take ``room`` more than they
    hold (infinite if their wants fit): a sweep over the sorted breakpoints,
    between which the room taken grows linearly with the level."""
    points = []
    for c in keys:
        base, left = c.held + c.given, c.wants - c.given
        if left > 0:
            points.append((base / c.share.weight, c.share.weight))  # starts to take room
            points.append(((base + left) / c.share.weight, -c.share.weight))  # takes all it wants
    if sum(c.wants - c.given for c in keys) <= room:
        return float("inf")
    points.sort()
    taken, slope, at = 0.0, 0.0, 0.0
    for point, change in points:
        step = slope * (point - at)
        if step > 0 and taken + step >= room:
            return at + (room - taken) / slope
        taken, at, slope = taken + step, point, slope + change
    return at
