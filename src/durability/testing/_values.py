"""How Python values change when they cross into JavaScript and back.

Lives here: the copy RPC makes of arguments and replies, the conversion of
SQL bindings and results, and the JavaScript-shaped types Python code sees
(``JsDict`` rows and replies, ``JsException`` errors).
Must not know: objects, storage, the clock.

Each rule mirrors a conversion of production: the workers SDK turns Python
values into JavaScript ones (``python_to_rpc``), workerd copies them with
structured clone, and Pyodide turns them back (``python_from_rpc``). A
JavaScript number that holds a whole value comes back as ``int``, even when
a ``float`` went in; keys of a dict come back as strings; a ``datetime``
comes back naive, in UTC (the Workers runtime's time zone).
"""

from __future__ import annotations

import datetime
import inspect
import math
from typing import Any

# JavaScript numbers hold integers exactly up to 2**53 - 1 (Number.MAX_SAFE_INTEGER).
MAX_SAFE_INTEGER = 2**53 - 1


class JsDict(dict[str, Any]):
    """A dict that also allows ``row.column``, as the workers SDK returns."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


class JsException(Exception):
    """An error thrown by JavaScript, as Pyodide raises it in Python.

    ``name`` is the JavaScript error's name (``Error``, ``TypeError``...),
    ``message`` its message; ``str()`` reads ``"<name>: <message>"``.
    """

    # Set only on some errors, as workerd sets them: read with getattr(error, name, False).
    durableObjectReset: bool  #: the object was reset under the call
    retryable: bool  #: the call may be tried again
    overloaded: bool  #: the object took no more requests: do not try again now

    def __init__(self, message: str, name: str = "Error") -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message


def number_from_js(value: float) -> float | int:
    """What Pyodide gives for a JavaScript number: whole and safe means int."""
    if value.is_integer() and abs(value) <= MAX_SAFE_INTEGER:
        return int(value)
    return value


def _refuse(value: object) -> TypeError:
    return TypeError(f"{type(value)} cannot be sent over RPC.")


#: How deep lists, dicts and sets may nest in a value sent over RPC here. The
#: SDK converts a value with Python recursion, which in Pyodide fails with
#: ``RecursionError`` between about 700 and 1,000 levels (its limit is 1,000
#: frames, the caller's own among them); past this depth the copy is refused
#: with a ``ValueError`` at the call instead, well before production fails.
MAX_RPC_NESTING = 256


def rpc_copy(value: object, depth: int = 0) -> object:
    """The value a receiver sees when ``value`` is sent over RPC.

    Raises ``TypeError`` for what the SDK refuses (tuples, bytearrays,
    awaitables), a ``DataCloneError`` for instances of other classes,
    which have no structured-clone form, and ``ValueError`` for a value
    nested deeper than ``MAX_RPC_NESTING``.
    """
    if isinstance(value, (dict, list, set, frozenset)) and depth >= MAX_RPC_NESTING:
        raise ValueError(f"a value sent over RPC must nest at most {MAX_RPC_NESTING} lists, dicts or sets deep")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)  # a str subclass (a StrEnum member) arrives as a plain string
    if isinstance(value, int):
        # Small ints travel as numbers, larger ones as BigInts: both come back whole.
        return int(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return value
        return number_from_js(value)
    if isinstance(value, (tuple, bytearray)):
        raise _refuse(value)
    if isinstance(value, (bytes, memoryview)):
        return memoryview(bytes(value))  # a Uint8Array arrives as a memoryview
    if isinstance(value, dict):
        return JsDict((_rpc_key(k), rpc_copy(v, depth + 1)) for k, v in value.items())
    if isinstance(value, list):
        return [rpc_copy(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        return {rpc_copy(v, depth + 1) for v in value}
    if isinstance(value, datetime.datetime):
        return _utc_naive(value)
    if isinstance(value, BaseException):
        # An Error crosses as a new Error whose message is the text it had.
        return Exception(f"Error: {value}")
    if inspect.isawaitable(value):
        raise TypeError(f"Awaitable {type(value)} cannot be sent over RPC.")
    if getattr(value, "_rpc_passthrough", False):  # Request, Response: cloneable in JS
        return value
    # Any other object becomes a PyProxy, which the RPC serializer rejects.
    raise JsException(DATA_CLONE_MESSAGE, name="DataCloneError")


DATA_CLONE_MESSAGE = (
    "Proxy could not be serialized because it is not a valid RPC receiver type. "
    "The Proxy must emulate either a plain object or an RpcTarget, as indicated "
    "by the Proxy's prototype chain."
)


def _rpc_key(key: object) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    if isinstance(key, float):
        return str(number_from_js(key))
    raise TypeError(f"{type(key)} cannot be a key of a dict sent over RPC.")


def _utc_naive(moment: datetime.datetime) -> datetime.datetime:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    millis = math.floor(moment.timestamp() * 1000)  # a JS Date holds whole ms
    utc = datetime.datetime.fromtimestamp(millis / 1000, tz=datetime.UTC)
    return utc.replace(tzinfo=None)


def sql_binding(value: object) -> object:
    """The value SQLite binds for ``value``, as workerd binds it.

    Production binds every number as a REAL, ``None`` as NULL, strings as
    TEXT and bytes as BLOB. It binds ``True`` as the text ``'true'`` and
    refuses an int that Pyodide hands over as a BigInt (2**53 - 1 and
    beyond, as the conformance probe shows); both are refused here with a
    clear error, since neither is ever what the caller meant.
    """
    if value is None or isinstance(value, (str, bytes)):
        return value
    if isinstance(value, bool):
        raise TypeError(
            "a bool cannot be bound to SQL: production binds True as the text "
            "'true'; bind int(flag) instead"
        )
    if isinstance(value, int):
        if abs(value) >= MAX_SAFE_INTEGER:
            raise TypeError(
                "Cannot convert a BigInt value to a number (production's error: the int "
                f"{value} is 2**53 - 1 or beyond, which Pyodide hands over as a BigInt)"
            )
        return float(value)
    if isinstance(value, float):
        return value
    raise TypeError(f"{type(value).__name__} cannot be bound to SQL")


def sql_value(value: object) -> object:
    """What Python code reads for a value SQLite returns in a row."""
    if isinstance(value, int):
        # workerd reads an INTEGER as a double: exact when safe, rounded beyond.
        return value if abs(value) <= MAX_SAFE_INTEGER else float(value)
    if isinstance(value, float):
        return number_from_js(value)
    return value
