"""What a queue accepts from its caller: ids, keys, groups and bodies, checked before anything is written.

Lives here: the checks ``enqueue`` and the item calls run on what they
are given, each raising ``ValueError`` with what is wrong and where.
Must not know: storage, the holder or the wire.
"""

from __future__ import annotations

import json
from typing import Any

from ..._common.checks import MAX_NESTING, nests_within, storable_text
from ..messages import MAX_ID_LENGTH


def identifier(value: Any, what: str) -> str:
    if not storable_text(value, MAX_ID_LENGTH):
        raise ValueError(f"{what} must be a string of 1 to {MAX_ID_LENGTH} characters with a UTF-8 form, "
                         f"not {value!r}")
    return value


def check_body(value: Any, where: str = "body") -> None:
    """A body must survive JSON and RPC unchanged: plain values, lists and
    string-keyed dicts, at most ``MAX_NESTING`` deep (measured first, so the
    walk below recurses that deep at most)."""
    if not nests_within(value, MAX_NESTING):
        raise ValueError(f"{where} must nest at most {MAX_NESTING} lists or dicts deep")
    _check_values(value, where)


def _check_values(value: Any, where: str) -> None:
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{where} holds a non-finite number")
        return
    if isinstance(value, list):
        for i, entry in enumerate(value):
            _check_values(entry, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for k, entry in value.items():
            if not isinstance(k, str):
                raise ValueError(f"{where} has a key that is not a string: {k!r}")
            _check_values(entry, f"{where}.{k}")
        return
    raise ValueError(f"{where} holds a {type(value).__name__}, which JSON and RPC do not carry unchanged")


def checked_items(items: Any) -> dict[str, tuple[str, str, str]]:
    """``enqueue``'s items as id -> (key, group, body as JSON), in order; an
    id given twice must come with the same contents."""
    if not isinstance(items, list) or not items:
        raise ValueError("enqueue takes a non-empty list of items")
    checked: dict[str, tuple[str, str, str]] = {}
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"items[{i}] must be a dict")
        item_id = identifier(item.get("id"), f"items[{i}].id")
        key = identifier(item.get("key"), f"items[{i}].key")
        group = identifier(item.get("group", "default"), f"items[{i}].group")
        check_body(item.get("body"), f"items[{i}].body")
        body = json.dumps(item.get("body"), sort_keys=True, separators=(",", ":"))
        if item_id in checked and checked[item_id] != (key, group, body):
            raise ValueError(f"item {item_id!r} appears twice with different contents")
        checked[item_id] = (key, group, body)
    return checked
