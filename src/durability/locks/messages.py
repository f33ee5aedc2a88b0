"""The wire format between a semaphore's clients and its holder object.

Lives here: the four messages clients send (acquire, renew, release,
cancel), written (``Acquire.to_wire``, ``token_message``,
``cancel_message``) and checked into typed values, the replies the holder
returns, and reading them back (``HolderReply``, a refusal included). Must not know: storage, time, the line's
rules.

A message that breaks any rule below is refused whole, and changes nothing,
with the refusal the semaphore sends too (``durability._wire``):
``{"type": "error", "v": 1, "code", "message"}``, ``code`` one of
``invalid_message``, ``unsupported`` or ``not_holder``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._common.checks import MAX_SAFE_INTEGER, int_in, number_in, storable_text
from .._common.rates import Rate
from .._common.wire import ErrorCode, ProtocolError as ProtocolError
from .options import MAX_DURATION_MS, MAX_LIMIT, MAX_TTL_MS, MIN_LIMIT, MIN_TTL_MS

VERSION = 1
MAX_ID_LENGTH = 128  # requestId, token
# One acquire call stands in line at most this long; a client that means to
# wait longer says so (``more``) and calls again with the same request id,
# keeping its place in line. Calls stay well inside any client timeout.
MAX_CALL_WAIT_MS = 50_000

# Reply statuses.
GRANTED = "granted"
PENDING = "pending"  #: the call's time is up, the request keeps its place in line: call again
TIMEOUT = "timeout"
RENEWED = "renewed"
RELEASED = "released"
NOT_HELD = "not_held"
CANCELLED = "cancelled"
ERROR = "error"  #: how a holder of the previous release marked a refusal (``status``)

# The error codes this holder sends.
INVALID_MESSAGE = ErrorCode.INVALID_MESSAGE
UNSUPPORTED = ErrorCode.UNSUPPORTED
NOT_HOLDER = ErrorCode.NOT_HOLDER


@dataclass(frozen=True)
class Acquire:
    request_id: str
    limit: int
    ttl_ms: float
    wait_ms: float  #: how long this call stands in line
    more: bool  #: the client calls again after ``wait_ms`` if it has no place by then
    max_hold_ms: float | None
    rate: Rate | None = None  #: the open's start rate (sent only when it has one)

    def to_wire(self) -> dict[str, Any]:
        wire = {"v": VERSION, "requestId": self.request_id, "limit": self.limit, "ttlMs": self.ttl_ms,
                "waitMs": self.wait_ms, "more": self.more, "maxHoldMs": self.max_hold_ms}
        if self.rate is not None:
            wire["rate"] = [self.rate.limit, self.rate.period_ms, self.rate.burst]
        return wire


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(INVALID_MESSAGE, "a message must be an object")
    version = value.get("v")
    if version != VERSION or isinstance(version, bool):
        raise ProtocolError(UNSUPPORTED,
                            f"protocol version {version!r} is not supported (this holder speaks {VERSION})")
    return value


def _identifier(message: dict[str, Any], name: str) -> str:
    value = message.get(name)
    if not storable_text(value, MAX_ID_LENGTH):
        raise ProtocolError(INVALID_MESSAGE,
                            f"{name} must be a string of 1 to {MAX_ID_LENGTH} characters with a UTF-8 form")
    return value


def _ms(message: dict[str, Any], name: str, low: float, high: float) -> float:
    value = message.get(name)
    if not number_in(value, low, high):
        raise ProtocolError(INVALID_MESSAGE, f"{name} must be a number of ms from {low:g} to {high:g}")
    return float(value)


def _optional_ms(message: dict[str, Any], name: str, low: float, high: float) -> float | None:
    return None if message.get(name) is None else _ms(message, name, low, high)


def parse_acquire(message: Any) -> Acquire:
    message = _object(message)
    request_id = _identifier(message, "requestId")
    limit = message.get("limit")
    if not int_in(limit, MIN_LIMIT, MAX_LIMIT):
        raise ProtocolError(INVALID_MESSAGE, f"limit must be an integer from {MIN_LIMIT} to {MAX_LIMIT}")
    ttl_ms = _ms(message, "ttlMs", MIN_TTL_MS, MAX_TTL_MS)
    wait_ms = _ms(message, "waitMs", 0, MAX_CALL_WAIT_MS)
    more = message.get("more", False)
    if not isinstance(more, bool):
        raise ProtocolError(INVALID_MESSAGE, "more must be true or false")
    max_hold_ms = _optional_ms(message, "maxHoldMs", 0, MAX_DURATION_MS)
    if max_hold_ms == 0:
        raise ProtocolError(INVALID_MESSAGE, "maxHoldMs must be longer than 0")
    return Acquire(request_id, limit, ttl_ms, wait_ms, more, max_hold_ms, _rate(message.get("rate")))


def _rate(value: Any) -> Rate | None:
    """``[limit, periodMs, burst]``: the open's start rate, or absent."""
    if value is None:
        return None
    if (not isinstance(value, list) or len(value) != 3 or not int_in(value[0], MIN_LIMIT, MAX_LIMIT)
            or not number_in(value[1], 1, MAX_DURATION_MS) or not int_in(value[2], 0, MAX_LIMIT)):
        raise ProtocolError(INVALID_MESSAGE, f"rate must be [limit from {MIN_LIMIT} to {MAX_LIMIT}, a period of "
                                             f"1 to {MAX_DURATION_MS:g} ms, a burst from 0 to {MAX_LIMIT}]")
    return Rate(value[0], float(value[1]), value[2])


def parse_token(message: Any) -> str:
    """A renew or release names the place by the token the holder issued."""
    return _identifier(_object(message), "token")


def parse_cancel(message: Any) -> str:
    """A cancel names the acquire it withdraws by its request id."""
    return _identifier(_object(message), "requestId")


def token_message(token: str) -> dict[str, Any]:
    """A renew or a release of the place ``token`` names."""
    return {"v": VERSION, "token": token}


def cancel_message(request_id: str) -> dict[str, Any]:
    return {"v": VERSION, "requestId": request_id}


@dataclass(frozen=True)
class HolderReply:
    """A holder's reply, read: its status and the fields that status carries."""

    status: str
    token: str | None = None  #: ``granted``: the place's token
    lease_ms: float = 0.0  #: ``granted``, ``renewed``: the lease, counted from the call's arrival
    #: ``granted`` under a start rate: the work must start within this, counted from
    #: the call's arrival, or give the place back (None: no rate)
    start_by_ms: float | None = None
    final: bool = False  #: ``granted``, ``renewed``: max_hold is reached with this lease: no renewal
    refused: ProtocolError | None = None  #: any status this client does not know: the refusal it is

    @classmethod
    def parse(cls, reply: Any) -> HolderReply:
        """Raises ``ProtocolError`` (``invalid_message``) for a granted or
        renewed reply without the fields it must carry."""
        reply = dict(reply) if isinstance(reply, dict) else {"message": repr(reply)}
        status = reply.get("status")
        if status == GRANTED:
            start_by = reply.get("startByMs")
            if start_by is not None and not number_in(start_by, -MAX_SAFE_INTEGER, MAX_SAFE_INTEGER):
                raise ProtocolError(INVALID_MESSAGE, "startByMs must be a number of ms")
            return cls(GRANTED, _identifier(reply, "token"), _lease_ms(reply), final=_final(reply),
                       start_by_ms=None if start_by is None else float(start_by))
        if status == RENEWED:
            return cls(RENEWED, lease_ms=_lease_ms(reply), final=_final(reply))
        if status in (PENDING, TIMEOUT, RELEASED, NOT_HELD, CANCELLED):
            return cls(status)
        return cls(ERROR, refused=refusal(reply))


def _lease_ms(reply: dict[str, Any]) -> float:
    return _ms(reply, "leaseMs", 0, MAX_SAFE_INTEGER)


def _final(reply: dict[str, Any]) -> bool:
    final = reply.get("final", False)
    if not isinstance(final, bool):
        raise ProtocolError(INVALID_MESSAGE, "final must be true or false")
    return final


def refusal(reply: dict[str, Any]) -> ProtocolError:
    """What a reply with no status this client knows says: a refusal, in
    this release's shape or the previous release's (``{"status": "error",
    "code", "message"}``), which carry the same two fields; anything else
    reads as a refusal coded ``unknown`` that quotes the reply."""
    return ProtocolError(reply.get("code", "unknown"), reply.get("message", repr(reply)))


def granted(token: str, lease_ms: float, final: bool, start_by_ms: float | None = None) -> dict[str, Any]:
    """``lease_ms`` counts from the call's arrival, on the holder's clock: a client that
    adds it to the time it sent the call gets a lease end no later than the holder's.
    So does ``start_by_ms``, under a start rate: the time by which the work must start."""
    reply = {"status": GRANTED, "v": VERSION, "token": token, "leaseMs": lease_ms, "final": final}
    if start_by_ms is not None:
        reply["startByMs"] = start_by_ms
    return reply


def renewed(lease_ms: float, final: bool) -> dict[str, Any]:
    return {"status": RENEWED, "v": VERSION, "leaseMs": lease_ms, "final": final}


def status(name: str, **fields: Any) -> dict[str, Any]:
    return {"status": name, "v": VERSION, **fields}
