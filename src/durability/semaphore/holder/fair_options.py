"""The user's fair-share options, as a holder reads them: checked once, resolved once per round, never failing closed.

Lives here: ``UserFairShare``: the ``fair_share`` option (``key``,
``weight``, ``floor``, ``priority``, each a constant or a callable),
checked at construction, and resolved for a round's groups into a
``fairness.FairPolicy``; a callback that raises or returns something
malformed makes that round oldest first (logged), it never stops the
key's grants; and the per-key rows ``usage()`` shows. Must not know:
rounds, storage, or the wire beyond ``ShareUsage``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from ..messages import ShareUsage
from .pure.fairness import FairPolicy, Share, checked_share

log = logging.getLogger("durability.semaphore")
OPTIONS = ("key", "weight", "floor", "priority")
OLDEST_FIRST, FAIR_SHARE, FALLBACK = "oldest_first", "fair_share", "oldest_first_fallback"


class UserFairShare:
    """``fair_share={"key": group -> key, "weight": key -> number, "floor": key -> int,
    "priority": key -> int}``: each a constant or a callable; absent, the group
    is the key, weights are 1, floors 0 and every key in one class."""

    def __init__(self, options: Any) -> None:
        if not isinstance(options, dict) or not set(options) <= set(OPTIONS):
            raise ValueError(f"fair_share must be a dict with some of the keys {OPTIONS}, not {options!r}")
        self.options: dict[str, Any] = dict(options)
        key = self.options.get("key")
        if key is not None and not callable(key):
            raise ValueError(f"fair_share's key must be a callable (group -> key), not {key!r}")
        # Constants are checked now: a typo fails the construction, not every round.
        checked_share(*(self._constant(name, default) for name, default in (("weight", 1), ("floor", 0),
                                                                              ("priority", 0))))
        self.status = OLDEST_FIRST  #: how the last round shared the limit

    def _constant(self, name: str, default: Any) -> Any:
        value = self.options.get(name, default)
        return default if callable(value) else value

    def _value(self, name: str, default: Any, key: str) -> Any:
        value = self.options.get(name, default)
        return value(key) if callable(value) else value

    def key_of(self, group: str) -> str:
        key = self.options.get("key")
        found = group if key is None else key(group)
        if not isinstance(found, str) or not found:
            raise ValueError(f"fair_share's key must return a non-empty str, not {found!r}")
        return found

    def share(self, key: str) -> Share:
        return checked_share(self._value("weight", 1, key), self._value("floor", 0, key),
                             self._value("priority", 0, key))

    def policy(self, groups: Iterable[str]) -> FairPolicy:
        """The callbacks read once for ``groups``: raises what they raise, or ``ValueError``."""
        # Sorted, so that the callbacks are called in an order no hash seed changes.
        key_of = {group: self.key_of(group) for group in sorted(set(groups))}
        return FairPolicy(key_of, {key: self.share(key) for key in sorted(set(key_of.values()))})

    def for_round(self, groups: Iterable[str]) -> FairPolicy | None:
        """The policy for a round over ``groups`` (those in demand and those
        holding permits), or None: a callback failed, the round is oldest first."""
        try:
            policy = self.policy(groups)
        except Exception as error:
            log.warning("fair_share callback failed; this round serves oldest first: %r", error)
            self.status = FALLBACK
            return None
        self.status = FAIR_SHARE
        return policy

    def usage(self, held: dict[str, int], waiting: dict[str, int]) -> dict[str, ShareUsage]:
        """Per key, from per-group holdings and waiting items (empty if a callback fails now)."""
        try:
            policy = self.policy([*held, *waiting])
        except Exception:  # logged by the round that meets it
            return {}
        rows: dict[str, list[int]] = {}
        for group, count in held.items():
            rows.setdefault(policy.key(group), [0, 0])[0] += count
        for group, count in waiting.items():
            rows.setdefault(policy.key(group), [0, 0])[1] += count
        return {key: _row(policy.share(key), *counts) for key, counts in sorted(rows.items())}


def _row(share: Share, held: int, waiting: int) -> ShareUsage:
    return ShareUsage(held, share.weight, share.floor, share.priority, waiting)


def fair_share_of(options: Any, leases: Any) -> UserFairShare | None:
    """The holder's option checked against its others: leases and a fair
    share do not mix (a lease's permits are drawn without a round)."""
    if options is None:
        return None
    if leases is not None:
        raise ValueError("fair_share shares grants between keys: give fair_share= or leases=, not both")
    return UserFairShare(options)

