"""Outbound HTTP for the stand-in's ``fetch``: real requests, made with ``urllib`` in threads.

Lives here: sending one request for real and reading its whole answer,
off the event loop, with the loop told that real time passes meanwhile
(``VirtualClockLoop.real_time``; on any other loop the request simply
runs in a thread). Must not know: the ``workers`` classes, objects, RPC.

As JavaScript's ``fetch`` does, any HTTP status is an answer, not an
error; a request that gets no answer (refused, reset, timed out, a bad
address) raises ``OSError``, as Pyodide's ``pyfetch`` does. Redirects
are followed (``redirect="follow"``), returned as they are (``"manual"``)
or refused (``"error"``); ``urllib`` follows a 307 or 308 only for GET
and HEAD, where ``fetch`` also repeats a POST.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

#: Seconds a request may wait for the network before it fails. JavaScript's
#: fetch has no such limit; this one only keeps a thread from hanging for good.
SOCKET_TIMEOUT_S = 60.0
# Enough threads that requests are not queued behind one another here:
# concurrency is the Worker's to limit, and tests measure it at the receiver.
_MAX_THREADS = 64
_executor: ThreadPoolExecutor | None = None


@dataclass(frozen=True)
class Answer:
    """What the server answered: status, reason, headers and the whole body."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def __init__(self, refuse: bool) -> None:
        self.refuse = refuse

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> urllib.request.Request | None:
        if self.refuse:
            raise OSError(f"fetch: {req.full_url} redirects to {newurl} and redirect is 'error'")
        return None  # the 3xx is returned as the answer


def _opener(redirect: str) -> urllib.request.OpenerDirector:
    # No proxy from the environment (``http_proxy``...): workerd's fetch uses none,
    # and a request to 127.0.0.1 must not be sent through one.
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if redirect in ("manual", "error"):
        handlers.append(_NoRedirect(refuse=redirect == "error"))
    elif redirect != "follow":
        raise TypeError(f"fetch: redirect must be 'follow', 'manual' or 'error', not {redirect!r}")
    return urllib.request.build_opener(*handlers)


def _send(request: urllib.request.Request, redirect: str) -> Answer:
    """In a thread: the request, sent and answered (an HTTP error status is an answer)."""
    try:
        with _opener(redirect).open(request, timeout=SOCKET_TIMEOUT_S) as response:
            return Answer(response.status, response.reason, list(response.headers.items()), response.read())
    except urllib.error.HTTPError as error:
        with error:
            return Answer(error.code, str(error.reason), list(error.headers.items()), error.read())
    except (OSError, http.client.HTTPException) as error:  # refused, reset, timed out, no answer
        reason = error.reason if isinstance(error, urllib.error.URLError) else error
        raise OSError(f"fetch {request.full_url} failed: {reason!r}") from None


def _threads() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(_MAX_THREADS, thread_name_prefix="durability-fetch")
    return _executor


async def send(url: str, method: str, headers: list[tuple[str, str]], body: bytes | None,
               redirect: str = "follow") -> Answer:
    """Send one request for real and return the answer; ``OSError`` if there is none."""
    request = urllib.request.Request(url, data=body, method=method)
    for name, value in headers:
        request.add_header(name, value)
    loop = asyncio.get_running_loop()
    real_time = getattr(loop, "real_time", None)
    with real_time() if real_time is not None else contextlib.nullcontext():
        return await loop.run_in_executor(_threads(), _send, request, redirect)
