"""The refusal every holder sends: one ``ProtocolError`` and one error reply for the semaphore and the locks.

Lives here: the machine-readable error codes, the exception a holder raises
when it refuses a message (or a client when a reply breaks its format), and
the refusal's shape on the wire, written and read::

    {"type": "error", "v": 1, "code": "invalid_message", "message": "limit must be ..."}

Must not know: any message but the refusal, storage, time. Each protocol's
own module (``semaphore.messages``, ``locks.messages``) says which codes it
sends and why.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from .checks import storable_text

REFUSAL_VERSION = 1  #: the ``v`` of a refusal; both protocols are at version 1
MAX_CODE_LENGTH = 256
MAX_QUOTED = 300  #: how much of a refusal's message (or of a bad reply) an error quotes


class ErrorCode(StrEnum):
    """Why a message was refused (``ProtocolError.code``)."""

    INVALID_MESSAGE = "invalid_message"  #: a field is missing, of the wrong type or out of range
    TOO_LARGE = "too_large"  #: a list holds more entries than the protocol allows
    UNSUPPORTED = "unsupported"  #: an unknown message type or protocol version
    FORBIDDEN = "forbidden"  #: the semaphore: a report names another client's grant or lease
    NOT_HOLDER = "not_holder"  #: the locks: no live place holds the token
    MALFORMED_REPLY = "malformed_reply"  #: raised on a client: the holder's reply breaks the format


class ProtocolError(ValueError):
    """A message refused whole; ``code`` is machine-readable. Nothing changed."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code

    def reply(self) -> dict[str, Any]:
        """The refusal as the holder sends it."""
        return {"type": "error", "v": REFUSAL_VERSION, "code": self.code, "message": str(self)}

    @classmethod
    def parse(cls, reply: Any) -> ProtocolError | None:
        """The refusal a reply carries, or None if it is no refusal. A code
        that is no short string reads as ``malformed_reply``."""
        if not isinstance(reply, dict) or reply.get("type") != "error":
            return None
        code = reply.get("code")
        code = code if storable_text(code, MAX_CODE_LENGTH) else ErrorCode.MALFORMED_REPLY
        return cls(code, f"holder refused the message: {reply.get('message')!r}"[:MAX_QUOTED])
