"""Checks on values that come from outside: the predicates every wire format and option shares.

Lives here: what counts as an integer, a number in a range, and a string
that storage can hold, decided before any arithmetic, any comparison with a
float and any SQL binding sees the value. Must not know: any message, its
field names or its error codes; each caller words its own refusal.

Why these rules:

- An integer may arrive too large for a float (a Python int, or a JS BigInt
  over RPC). ``math.isfinite`` and ``float()`` raise ``OverflowError`` on
  it, so ranges are compared first; Python compares ints with floats
  exactly, whatever their size. Nothing that is stored or sent on may be
  outside ±2**53, the integers a JS number holds exactly.
- ``bool`` is an ``int`` in Python; no count, time or limit is a bool.
- A string with a lone surrogate (``"\\ud800"``) passes every length check
  but has no UTF-8 form: SQLite on CPython refuses to bind it, and workerd
  would store a replacement character, so the id in storage would differ
  from the one in memory. Such strings are refused at the door.
"""

from __future__ import annotations

import json
import math
from typing import Any, TypeGuard

MAX_SAFE_INTEGER = 2**53  #: beyond this a JS number no longer holds every integer

#: How deep lists and dicts may nest in a value the library stores or sends
#: (a queue item's body, a job's payload and result, an outbox message).
#: Deeper values fail at either end in ways no caller can read: CPython's
#: ``json`` raises ``RecursionError`` near 1,000 levels, Pyodide's SDK near
#: 1,000 when it converts an RPC argument, and Pyodide's ``json.dumps`` of
#: 100,000 levels ends the whole interpreter with a fatal error (measured
#: in Pyodide 0.28.2). 128 leaves room for a caller's own wrapping around
#: a value it limits more tightly (the example Worker's webhook payload,
#: 64, inside its job inside a queue item's body).
MAX_NESTING = 128


def is_int(value: Any) -> TypeGuard[int]:
    """An integer that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> TypeGuard[int | float]:
    """An int or a float (not a bool); possibly infinite or NaN."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def int_in(value: Any, low: int, high: int) -> TypeGuard[int]:
    """An integer (not a bool) from ``low`` to ``high``."""
    return is_int(value) and low <= value <= high


def number_in(value: Any, low: float, high: float) -> TypeGuard[int | float]:
    """A finite int or float (not a bool) from ``low`` to ``high``; never raises."""
    if is_int(value):
        return low <= value <= high  # exact for ints of any size
    return isinstance(value, float) and math.isfinite(value) and low <= value <= high


def storable_text(value: Any, max_length: int) -> TypeGuard[str]:
    """A string of 1 to ``max_length`` characters that has a UTF-8 form (no lone surrogates)."""
    if not isinstance(value, str) or not 0 < len(value) <= max_length:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def nests_within(value: Any, max_depth: int) -> bool:
    """Whether lists, tuples and dicts nest at most ``max_depth`` deep in
    ``value``. Walked with a list, not recursion, so that any depth (and a
    value that holds itself) is measured without exhausting a stack."""
    pending = [(value, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, (list, tuple, dict)):
            if depth > max_depth:
                return False
            pending.extend((entry, depth + 1) for entry in (value.values() if isinstance(value, dict) else value))
    return True


def compact_json(value: Any, what: str) -> str:
    """``value`` as compact JSON text, or ``ValueError`` saying why ``what`` is not JSON;
    the nesting is measured first, so no depth reaches the encoder."""
    if not nests_within(value, MAX_NESTING):
        raise ValueError(f"{what} must nest at most {MAX_NESTING} lists or dicts deep")
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{what} must be JSON: {error}") from None
