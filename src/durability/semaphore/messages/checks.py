"""The wire format's version, bounds and vocabularies, and the checks every field of a message or reply is read with.

Lives here: ``VERSION``, the bounds (``MAX_*``), the vocabularies
(``BlockedReason``, ``ReportStatus``, and their members by their old
names), and the field checks the messages, the replies and the usage
reply share: those of a message, which refuse it as ``invalid_message``
(``_field``, ``_identifier``, ``_count``, ``_time``, ``_list``,
``_object``), and those of a reply, which refuse it as
``malformed_reply`` (``_flag``, ``_one_of``, ``_entries``,
``_reply_field``). Must not know: any message or reply as a whole,
storage, time, allocation, how a message travels.

Every bound below is part of the protocol: a message beyond one is refused
whole with an ``error`` reply and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any, TypeVar

from ..._common.checks import MAX_SAFE_INTEGER, int_in, number_in, storable_text
from ..._common.wire import ProtocolError

E = TypeVar("E")  # an entry of a reply, as parsed
V = TypeVar("V")  # a field of an entry, as checked

VERSION = 1
MAX_ID_LENGTH = 256  # clientId, group, grantId
MAX_DEMAND_ENTRIES = 64  # groups in one request
MAX_DEMAND_TIMES = 32  # item times a queue sends in one demand entry (``Demand.times``)
#: item times one demand entry may carry: a tree's child sends up to this many of
#: what its round left waiting, so that its parent lends to the oldest of them
MAX_TREE_DEMAND_TIMES = 256
MAX_REPORTS = 256  # grant reports, and lease reports, in one message
MAX_COUNT = 1_000_000  # demand in one group, permits claimed or released on one grant
MAX_WAIT_MS = 300_000  # how long a request may ask to be held for a grant

class BlockedReason(StrEnum):
    """Why a group's demand got no permit, in the order they are checked."""

    LIMIT_RESOLUTION_ERROR = "limit_resolution_error"
    NOT_PERMITTED = "not_permitted"
    GROUP_LIMIT = "group_limit"
    LIMIT = "limit"
    RATE = "rate"  #: the key's start rate: more may start once its window allows


class ReportStatus(StrEnum):
    """The holder's answer to a report on a grant or a lease."""

    OK = "ok"
    EXPIRED = "expired"  #: a grant's unclaimed permits were reclaimed before the claim
    NOT_FOUND = "not_found"  #: no such grant (reclaimed with nothing claimed, or settled)
    RETIRED = "retired"  #: a lease that must not be drawn from any more; keep reporting it
    SETTLED = "settled"  #: a lease the holder no longer counts; forget it


# The members by their old names.
LIMIT_RESOLUTION_ERROR, NOT_PERMITTED, GROUP_LIMIT, LIMIT, RATE = BlockedReason
OK, EXPIRED, NOT_FOUND, RETIRED, SETTLED = ReportStatus


def _field(message: dict[str, Any], name: str, where: str) -> Any:
    if name not in message:
        raise ProtocolError("invalid_message", f"{where}: missing field {name!r}")
    return message[name]


def _identifier(value: Any, what: str) -> str:
    if not storable_text(value, MAX_ID_LENGTH):
        raise ProtocolError("invalid_message",
                            f"{what} must be a string of 1 to {MAX_ID_LENGTH} characters with a UTF-8 form")
    return value


def _count(value: Any, what: str) -> int:
    # RPC turns whole numbers into ints; a float here was never whole.
    if not int_in(value, 0, MAX_COUNT):
        raise ProtocolError("invalid_message", f"{what} must be an integer from 0 to {MAX_COUNT}")
    return value


def _time(value: Any, what: str) -> float:
    if not number_in(value, 0, MAX_SAFE_INTEGER):
        raise ProtocolError("invalid_message", f"{what} must be an epoch time in ms from 0 to 2**53")
    return float(value)


def _list(value: Any, what: str, most: int) -> list[Any]:
    if not isinstance(value, list):
        raise ProtocolError("invalid_message", f"{what} must be a list")
    if len(value) > most:
        raise ProtocolError("too_large", f"{what} holds {len(value)} entries; at most {most} are allowed")
    return value


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError("invalid_message", f"{what} must be an object")
    return value


def _flag(entry: dict[str, Any], name: str, where: str, default: bool = False) -> bool:
    value = entry.get(name, default)
    if not isinstance(value, bool):
        raise ProtocolError("malformed_reply", f"{where}.{name} must be true or false")
    return value


def _one_of(value: Any, allowed: tuple[str, ...], what: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ProtocolError("malformed_reply", f"{what} must be one of {list(allowed)}")
    return value


MAX_REPLY_ENTRIES = 10_000  # a sanity bound: a reply lists what one client holds and reported


def _entries(reply: dict[str, Any], name: str, parse_entry: Callable[[dict[str, Any], str], E]) -> tuple[E, ...]:
    raw = reply.get(name, [])
    if not isinstance(raw, list) or len(raw) > MAX_REPLY_ENTRIES:
        raise ProtocolError("malformed_reply", f"{name} must be a list of at most {MAX_REPLY_ENTRIES} entries")
    entries = []
    for i, entry in enumerate(raw):
        where = f"{name}[{i}]"
        if not isinstance(entry, dict):
            raise ProtocolError("malformed_reply", f"{where} must be an object")
        entries.append(parse_entry(entry, where))
    return tuple(entries)


def _reply_field(entry: dict[str, Any], name: str, where: str, check: Callable[[Any, str], V]) -> V:
    try:
        return check(_field(entry, name, where), f"{where}.{name}")
    except ProtocolError as error:
        raise ProtocolError("malformed_reply", str(error)) from None
