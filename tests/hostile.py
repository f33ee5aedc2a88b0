"""Hostile messages for the holders' property tests: Hypothesis strategies and a tally.

Lives here: values that break a wire format in every way RPC can carry
(type confusion, integers too large for a float or past 2**53, negative
counts, non-finite numbers, strings with no UTF-8 form, over-long strings,
deep nesting, oversized lists, unknown fields), mutations of a valid message
that put such values at any field of it or of its entries, and ``Tally``,
which counts what the holders refused, accepted and crashed on. Must not
know: any holder's rules; each test builds its own valid messages.
"""

from __future__ import annotations

import collections
import copy
import math

from hypothesis import strategies as st

HUGE = [10**400, -(10**400), 2**53 + 1, -(2**53) - 1, 2**63, -1, -(10**6) - 1, 10**6 + 1]
NON_FINITE = [math.nan, math.inf, -math.inf]
UNSTORABLE = ["\ud800", "a\udfff", "\udc80" * 3]
LONG = ["x" * 129, "x" * 257, "y" * 5_000]


def _nested(depth: int):
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


_known_bad = st.sampled_from(HUGE + NON_FINITE + UNSTORABLE + LONG)

#: one value that no field of any holder message accepts as it stands (the
#: known-bad values drawn most often: they are the ones that crashed holders)
hostile_value = st.one_of(
    _known_bad, _known_bad, _known_bad, _known_bad,
    st.sampled_from([None, True, False, "", [], {}, "1", 0.5, -0.5, b"\x00", {"a": 1}, [1, 2]]),
    st.builds(_nested, st.integers(10, 80)),
    st.builds(lambda n, entry: [dict(entry) for _ in range(n)], st.integers(257, 400),
              st.sampled_from([{}, {"grantId": "g1", "claimed": 1, "released": 0}, {"group": "g", "count": 1}])),
    st.integers(), st.floats(), st.text(max_size=8),
)

#: a field name a message may carry, known or not
field_name = st.one_of(
    st.sampled_from(["type", "v", "clientId", "demand", "grants", "leaseReports", "wait", "leases", "group",
                     "count", "oldestAt", "grantId", "claimed", "released", "leaseId", "permits", "drawn",
                     "stopped", "requestId", "limit", "ttlMs", "waitMs", "more", "maxHoldMs", "token"]),
    st.text(min_size=1, max_size=6),
)


def _containers(message: dict) -> list:
    """Every dict in the message: itself and each entry of its lists."""
    found = [message]
    for value in message.values():
        if isinstance(value, list):
            found += [entry for entry in value if isinstance(entry, dict)]
    return found


@st.composite
def mutated(draw, message: dict) -> dict:
    """``message`` with one to three fields replaced by hostile values, removed, or added."""
    message = copy.deepcopy(message)
    for _ in range(draw(st.integers(1, 3))):
        target = draw(st.sampled_from(_containers(message)))
        action = draw(st.sampled_from(["replace", "replace", "remove", "add"]))
        if action != "add" and target:
            name = draw(st.sampled_from(sorted(target)))
        else:
            name = draw(field_name)
        if action == "remove":
            target.pop(name, None)
        else:
            target[name] = draw(hostile_value)
    return message


#: a message of arbitrary shape, as a confused or hostile sender might send
arbitrary = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10),
              st.sampled_from(HUGE + UNSTORABLE)),
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(field_name, children, max_size=5)),
    max_leaves=20,
)


class Tally:
    """What a property test saw, by outcome, printed at the end of the session."""

    seen: dict[str, collections.Counter] = {}

    @classmethod
    def count(cls, holder: str, outcome: str) -> None:
        cls.seen.setdefault(holder, collections.Counter())[outcome] += 1

    @classmethod
    def lines(cls) -> list[str]:
        return [f"{holder}: " + ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
                for holder, counts in sorted(cls.seen.items())]
