"""A CPython stand-in for the ``workers`` module of the Workers SDK.

Lives here: the classes a Worker module imports from ``workers``
(``DurableObject``, ``WorkerEntrypoint``, ``Request``, ``Response``...), with
the same constructors, and the installer that puts them in ``sys.modules``.
Must not know: the runtime. It never replaces the real SDK inside Pyodide,
where the real one imports; on CPython the real one cannot (it needs ``js``).
"""

from __future__ import annotations

import http.client
import json as _json
import sys
import types
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, TypeVar
from urllib.parse import urlsplit

from . import _fetch
from ._values import JsDict, JsException, rpc_copy

MODULE_NAME = "workers"

F = TypeVar("F", bound=Callable[..., Any])


class DurableObject:
    """Base class of a Durable Object: ``self.ctx`` and ``self.env``."""

    def __init__(self, ctx: Any, env: Any) -> None:
        self.ctx = ctx
        self.env = env


class WorkerEntrypoint:
    """Base class of a Worker entrypoint such as ``Default``."""

    def __init__(self, ctx: Any, env: Any) -> None:
        self.ctx = ctx
        self.env = env


class WorkflowEntrypoint(WorkerEntrypoint):
    """Base class of a Workflow; workflows themselves are not emulated."""


def _headers(values: Any) -> http.client.HTTPMessage:
    message = http.client.HTTPMessage()
    items = values.items() if isinstance(values, dict) else (values or [])
    for key, value in items:
        message[key] = str(value)
    return message


def _body_bytes(body: Any) -> bytes:
    if body is None:
        return b""
    if isinstance(body, str):
        return body.encode()
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    raise TypeError(f"Unsupported type in body: {type(body).__name__}")


class _Body:
    _rpc_passthrough = True  # a Request or Response crosses RPC as itself

    def __init__(self, body: Any, headers: Any) -> None:
        self._body = _body_bytes(body)
        self._headers = _headers(headers)
        self.body_used = False

    @property
    def headers(self) -> http.client.HTTPMessage:
        return self._headers

    def _consume(self) -> bytes:
        if self.body_used:
            raise TypeError("Body has already been used. It can only be used once.")
        self.body_used = True
        return self._body

    async def bytes(self) -> bytes:
        return self._consume()

    async def text(self) -> str:
        return self._consume().decode()

    async def json(self, **kwargs: Any) -> Any:
        return _json.loads(self._consume().decode(), **kwargs)


class Request(_Body):
    """An HTTP request: ``url``, ``method``, ``headers`` and the body readers."""

    url: str
    method: str

    def __init__(self, input: str | Request, method: str = "GET", headers: Any = None,
                 body: Any = None, **_options: Any) -> None:
        if isinstance(input, Request):
            url, method = input.url, method or input.method
            headers = headers if headers is not None else input.headers.items()
            body = body if body is not None else input._body
        else:
            url = input
        parts = urlsplit(url)
        if not parts.scheme or not parts.netloc:
            raise TypeError(f"Invalid URL: {url}")
        method = str(getattr(method, "value", method)).upper()
        if body is not None and method in ("GET", "HEAD"):
            raise TypeError("Request with a GET or HEAD method cannot have a body.")
        super().__init__(body, headers)
        self.url = url
        self.method = method

    def __repr__(self) -> str:
        return f"Request(method={self.method!r}, url={self.url!r})"


class IncomingRequest(Request):
    """The request workerd hands to ``Default.fetch``: the JavaScript Request
    itself, not the SDK's wrapper (SDK 1.9.5 wraps only handlers decorated
    with ``workers.handler``). Its ``text()`` decodes as JavaScript does, and
    its ``json()`` rejects a body that is not JSON with a JavaScript
    ``SyntaxError``, which Python sees as a ``JsException``, not a ``ValueError``."""

    async def text(self) -> str:
        return self._consume().decode(errors="replace")

    async def json(self, **_kwargs: Any) -> Any:
        text = await self.text()
        try:
            return _json.loads(text)
        except ValueError:
            raise JsException(f"Unexpected token in JSON: {text[:40]!r}", name="SyntaxError") from None


class Response(_Body):
    """An HTTP response; ``Response.json(data)`` builds a JSON one."""

    def __init__(self, body: Any = None, status: HTTPStatus | int | None = None,
                 status_text: str = "", headers: Any = None, **_options: Any) -> None:
        if body is not None and not isinstance(body, (str, bytes)):
            raise TypeError(f"Unsupported type in Response: {type(body).__name__}")
        super().__init__(body, headers)
        code = status.value if isinstance(status, HTTPStatus) else (status or 200)
        if not 200 <= code <= 599:
            raise ValueError("Responses may only be constructed with status codes in the range 200 to 599, "
                             f"inclusive; got {code}")
        self.status = code
        self.status_text = status_text
        self.ok = 200 <= code < 300

    @staticmethod
    def from_json(data: Any, status: HTTPStatus | int = HTTPStatus.OK, status_text: str = "",
                  headers: Any = None) -> Response:
        merged = dict(headers.items() if hasattr(headers, "items") else (headers or []))
        if not any(key.lower() == "content-type" for key in merged):
            merged["content-type"] = "application/json"
        return Response(_json.dumps(data), status=status, status_text=status_text, headers=merged)

    def json(self, *args: Any, **kwargs: Any) -> Any:
        # Like the SDK: on an instance it reads the body, on the class it builds one.
        if isinstance(self, Response):
            return super().json()
        return Response.from_json(self, *args, **kwargs)

    def __repr__(self) -> str:
        return f"Response(status={self.status})"


def handler(func: F) -> F:
    """The SDK's argument-converting decorator; arguments are already Python here."""
    return func


async def fetch(resource: str | Request, *, method: Any = None, headers: Any = None, body: Any = None,
                redirect: str = "follow", **_options: Any) -> Response:
    """``workers.fetch``: a real HTTP request (``_fetch``), its answer as a
    ``Response``; any status is an answer, no answer raises ``OSError``."""
    request = resource if isinstance(resource, Request) else Request(
        resource, method=method or "GET", headers=headers, body=body)
    if isinstance(resource, Request) and (method or headers is not None or body is not None):
        request = Request(resource, method=method or resource.method, headers=headers, body=body)
    sent = list(request.headers.items())
    if isinstance(body, str) and not any(name.lower() == "content-type" for name, _ in sent):
        sent.append(("content-type", "text/plain;charset=UTF-8"))  # as fetch labels a string body
    payload = request._consume() if request.method not in ("GET", "HEAD") else None
    answer = await _fetch.send(request.url, request.method, sent, payload, redirect)
    return Response(answer.body or None, status=answer.status, status_text=answer.reason,
                    headers=answer.headers)


def import_from_javascript(module_name: str) -> Any:
    raise ImportError(f"Failed to import '{module_name}': no JavaScript on CPython")


def python_to_rpc(value: Any) -> Any:
    return rpc_copy(value)


def python_from_rpc(value: Any) -> Any:
    return value


def _build_module() -> types.ModuleType:
    module = types.ModuleType(MODULE_NAME, __doc__)
    for name in ("DurableObject", "WorkerEntrypoint", "WorkflowEntrypoint", "Request",
                 "Response", "handler", "fetch", "import_from_javascript",
                 "python_to_rpc", "python_from_rpc", "JsDict"):
        setattr(module, name, globals()[name] if name != "JsDict" else JsDict)
    module.__durability_standin__ = True  # type: ignore[attr-defined]  # a mark of our own, not in ModuleType
    return module


def install_workers_standin() -> types.ModuleType:
    """Make ``import workers`` give the stand-in on CPython; a no-op in Pyodide."""
    existing = sys.modules.get(MODULE_NAME)
    if sys.platform == "emscripten":
        return existing  # the real SDK
    if existing is not None and getattr(existing, "__durability_standin__", False):
        return existing
    module = _build_module()
    sys.modules[MODULE_NAME] = module
    return module
