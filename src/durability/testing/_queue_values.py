"""What Queues' code meets: a consumer's settings, the producer's checks, and the batch a consumer handles.

Lives here: ``QueueConsumer`` (one ``[[queues.consumers]]`` entry, with
production's defaults and limits), the checks ``send`` and ``sendBatch``
run before anything is queued (sizes, counts, delays, content types),
``Message`` and ``MessageBatch`` as ``Default.queue(batch)`` receives them
(``ack``, ``retry``, ``ackAll``, ``retryAll``: what the handler decided,
read by the broker once it returns), and ``WorkerStats`` (what stateless
invocations of the Worker are billed for). Must not know: the broker, the
clock or the runtime.
"""

from __future__ import annotations

import contextvars
import datetime
import functools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ._values import JsException

# Queues counts a KB as 1,000 bytes (Cloudflare's Queues limits and pricing pages).
MAX_MESSAGE_BYTES = 128_000
MAX_BATCH_MESSAGES = 100
MAX_BATCH_BYTES = 256_000
MAX_DELAY_S = 43_200  #: 12 hours
OPERATION_BYTES = 64_000  #: each 64 KB written, read or deleted is one billed operation
MAX_CONCURRENCY = 250  #: production scales a consumer up to this many invocations at once
CONTENT_TYPES = ("json", "text", "bytes", "v8")


@dataclass(frozen=True)
class QueueConsumer:
    """One consumer of a queue, as ``[[queues.consumers]]`` sets it up."""

    queue: str
    max_batch_size: int = 10
    max_batch_timeout: float = 5.0  #: seconds
    max_retries: int = 3
    dead_letter_queue: str | None = None
    retry_delay: float = 0.0  #: seconds before a retried message comes again, unless retry() says
    max_concurrency: int | None = None  #: batches handled at once (None: as production scales, up to 250)

    def __post_init__(self) -> None:
        if not 1 <= self.max_batch_size <= MAX_BATCH_MESSAGES:
            raise ValueError(f"queue {self.queue}: max_batch_size must be 1 to {MAX_BATCH_MESSAGES}")
        if not 0 <= self.max_batch_timeout <= 60:
            raise ValueError(f"queue {self.queue}: max_batch_timeout must be 0 to 60 seconds")
        if not 0 <= self.max_retries <= 100:
            raise ValueError(f"queue {self.queue}: max_retries must be 0 to 100")
        if not 0 <= self.retry_delay <= MAX_DELAY_S:
            raise ValueError(f"queue {self.queue}: retry_delay must be 0 to {MAX_DELAY_S} seconds")
        if self.max_concurrency is not None and not 1 <= self.max_concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"queue {self.queue}: max_concurrency must be 1 to {MAX_CONCURRENCY}")
        if self.dead_letter_queue == self.queue:
            raise ValueError(f"queue {self.queue}: a queue cannot be its own dead-letter queue")

    @classmethod
    def from_wrangler(cls, entry: dict[str, Any]) -> QueueConsumer:
        known = {"queue", "max_batch_size", "max_batch_timeout", "max_retries", "dead_letter_queue",
                 "retry_delay", "max_concurrency"}
        unknown = sorted(set(entry) - known)
        if unknown:
            raise ValueError(f"[[queues.consumers]] has unknown keys {unknown}")
        if "queue" not in entry:
            raise ValueError("[[queues.consumers]] needs `queue`")
        return cls(**entry)


def _option(options: Any, extra: dict[str, Any], name: str) -> Any:
    """An option given as a dict (``{"delaySeconds": 5}``) or as a keyword, as the SDK passes both."""
    if extra and name in extra:
        return extra[name]
    if options is None:
        return None
    if not isinstance(options, dict):
        raise JsException("options must be an object", name="TypeError")
    return options.get(name)


def delay_of(options: Any, extra: dict[str, Any], default: float = 0.0) -> float:
    value = _option(options, extra, "delaySeconds")
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_DELAY_S:
        raise JsException(f"delaySeconds must be a number from 0 to {MAX_DELAY_S}, not {value!r}",
                          name="TypeError")
    return float(value)


def encoded(body: Any, options: Any, extra: dict[str, Any]) -> tuple[str, int]:
    """The message's content type and its size in bytes, as the broker stores it."""
    content_type = _option(options, extra, "contentType") or "json"
    if not isinstance(content_type, str) or content_type.lower() not in CONTENT_TYPES:
        raise JsException(f"Unsupported queue message content type: {content_type}", name="TypeError")
    content_type = content_type.lower()
    if content_type == "text" and not isinstance(body, str):
        raise JsException(f'Content Type "text" requires a value of type string, but received: {type(body).__name__}',
                          name="TypeError")
    if content_type == "bytes" and not isinstance(body, (bytes, memoryview)):
        raise JsException('Content Type "bytes" requires a value of type ArrayBufferView, but received: '
                          f"{type(body).__name__}", name="TypeError")
    if isinstance(body, (bytes, memoryview)):
        size = len(bytes(body))
    else:
        try:
            size = len(json.dumps(body, separators=(",", ":"), default=_unserializable).encode())
        except (TypeError, ValueError) as error:
            raise JsException(f"could not serialize the message body: {error}", name="DataCloneError") from None
    if size > MAX_MESSAGE_BYTES:
        raise JsException(f"Queue send failed: message length of {size} bytes exceeds limit of "
                          f"{MAX_MESSAGE_BYTES}", name="Error")
    return content_type, size


def _unserializable(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not serializable")


def operations(size: int) -> int:
    """Billed operations for one write, read or delete of a message of ``size`` bytes."""
    return max(1, math.ceil(size / OPERATION_BYTES))


@dataclass
class Message:
    """One message of a batch, as the consumer's handler sees it.

    What the handler says of it is kept here, as workerd keeps it until the
    invocation ends: the first word counts (an ``ack()`` after a
    ``retry()`` is ignored, and the other way round); a second ``retry()``
    only changes the delay. A word about the message itself outranks one
    about the whole batch, whichever came first."""

    id: str
    timestamp: datetime.datetime
    body: Any
    attempts: int
    decided: str | None = None  #: "ack" or "retry"
    delay_s: float | None = None  #: the delay its retry() gave

    def ack(self) -> None:
        if self.decided is None:
            self.decided = "ack"

    def retry(self, options: Any = None, **extra: Any) -> None:
        delay = delay_of(options, extra, default=-1.0)
        if self.decided in (None, "retry"):
            self.decided = "retry"
            if delay >= 0:
                self.delay_s = delay


@dataclass
class MessageBatch:
    """What ``Default.queue(batch, env, ctx)`` receives."""

    queue: str
    messages: list[Message]
    decided: str | None = None  #: ackAll() or retryAll(), the first of them
    delay_s: float | None = None  #: the delay retryAll() gave

    def ackAll(self) -> None:
        if self.decided is None:
            self.decided = "ack"

    def retryAll(self, options: Any = None, **extra: Any) -> None:
        delay = delay_of(options, extra, default=-1.0)
        if self.decided is None:
            self.decided = "retry"
            self.delay_s = delay if delay >= 0 else None

    def outcome(self, message: Message, returned: bool) -> tuple[str, float | None]:
        """What becomes of ``message`` once the handler ``returned`` (or
        raised): its own word, else the batch's, else an ack if it returned
        and a retry if it raised; with the retry's delay, if one was given
        (the message's own before the batch's)."""
        decided = message.decided or self.decided or ("ack" if returned else "retry")
        delay = message.delay_s if message.delay_s is not None else self.delay_s
        return decided, delay


@dataclass
class WorkerStats:
    """What the Worker's stateless invocations are billed for: requests and CPU, in all and by kind."""

    requests: int = 0
    cpu_s: float = 0.0
    by_kind: dict[str, int] = field(default_factory=dict)  #: "fetch", "rpc", "scheduled", "queue" -> count
    cpu_s_by_kind: dict[str, float] = field(default_factory=dict)

    def count(self, kind: str) -> Callable[[float], None]:
        """An invocation of ``kind`` billed; what its steps' CPU is charged to."""
        self.requests += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        return functools.partial(self._charge_cpu, kind)

    def _charge_cpu(self, kind: str, seconds: float) -> None:
        self.cpu_s += seconds  # (the CPU limit of a stateless invocation is not enforced here)
        self.cpu_s_by_kind[kind] = self.cpu_s_by_kind.get(kind, 0.0) + seconds


#: what the CPU of the stateless invocation whose code runs now is charged to (None: an object's, or the test's)
current_invocation: contextvars.ContextVar[Callable[[float], None] | None] = contextvars.ContextVar(
    "durability_current_invocation", default=None)

#: True while a queue's consumer runs: the calls it makes to objects are faulted
#: as an object's are (nothing drives a consumer but its queue, not the test)
in_consumer: contextvars.ContextVar[bool] = contextvars.ContextVar("durability_in_consumer", default=False)
