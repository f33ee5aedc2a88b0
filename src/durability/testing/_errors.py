"""What a caller sees when an object fails its call: a reset, an overload, a Python error.

Lives here: the errors a caller receives instead of a reply, marked as
workerd marks them (``durableObjectReset``, ``overloaded``, ``retryable``)
so that the caller can tell whether trying again may help, and a Python
exception as it reaches a remote caller.
Must not know: the object or why it failed; the host and the runtime
decide that, then raise these.
"""

from __future__ import annotations

import traceback

from ._values import JsException

# What a caller sees when the object it called was reset under it.
RESET_MESSAGE = "Network connection lost."

# What a caller sees when the object it called takes no more requests for now.
OVERLOADED_MESSAGE = "Durable Object is overloaded. Too many requests queued."


def reset_error(reason: str = RESET_MESSAGE) -> JsException:
    error = JsException(reason)
    error.durableObjectReset = True  # as workerd marks it
    error.retryable = True
    return error


def overloaded_error() -> JsException:
    error = JsException(OVERLOADED_MESSAGE)
    error.overloaded = True  # as workerd marks it: retrying would only add to the load
    error.retryable = False
    return error


def python_error(error: BaseException) -> JsException:
    """A Python exception as a remote caller receives it: a PythonError whose
    message is the formatted traceback (the stack itself does not travel)."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return JsException(text, name="PythonError")

