"""Serve a Worker's ``Default.fetch`` over real HTTP on localhost, on real time.

Lives here: a small HTTP/1.1 server on asyncio streams that hands each
request to ``Runtime.fetch`` and writes its Response back, the start-up
(``wrangler.toml``, ``.dev.vars``) and what it prints, like ``wrangler dev``.
Must not know: what the Worker does, or how the runtime runs objects.

The sockets live on the runtime's own event loop (``clock="real"``), in its
one thread: a request is one more task among the objects' calls, alarms and
timers, as in workerd, so nothing crosses a thread. (A thread-per-request
server would have to hand every request over to the loop's thread anyway:
the runtime and its SQLite connections are single-threaded.) Each response
closes its connection, so stopping the server leaves no idle connection.
"""

from __future__ import annotations

import asyncio
import contextvars
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any, TextIO

from ._dev_vars import load_dev_vars
from ._runtime import Runtime

MAX_HEADER_LINE = 16 * 1024
MAX_HEADERS = 100
MAX_BODY = 100 * 1024 * 1024  # Cloudflare's request body limit on its Free and Pro plans
READ_TIMEOUT_S = 30
TRACE_KEPT = 10_000  # the runtime's trace grows with every call: a server keeps the latest only


class BadRequest(Exception):
    """A request this server cannot read; its client gets ``status`` and the message."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class HttpRequest:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((value for key, value in self.headers if key.lower() == name), None)


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str, list[tuple[str, str]]]:
    line = (await reader.readline()).decode("latin-1")
    parts = line.split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest("malformed request line")
    method, target, _ = parts
    headers: list[tuple[str, str]] = []
    while True:
        line = (await reader.readline()).decode("latin-1")
        if line in ("\r\n", "\n"):
            return method.upper(), target, headers
        if not line.endswith("\n"):
            raise BadRequest("the request ended inside its headers")
        if len(headers) == MAX_HEADERS or ":" not in line:
            raise BadRequest("too many headers" if ":" in line else "malformed header line")
        name, value = line.split(":", 1)
        headers.append((name.strip(), value.strip()))


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        size_line = (await reader.readline()).split(b";", 1)[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError:
            raise BadRequest("malformed chunk size") from None
        if len(body) + size > MAX_BODY:
            raise BadRequest("the body is too large", 413)
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # trailers are not passed on
            return bytes(body)
        body += await reader.readexactly(size)
        await reader.readexactly(2)  # the CRLF after each chunk


async def read_request(reader: asyncio.StreamReader) -> HttpRequest:
    """One request from the stream, or BadRequest."""
    try:
        method, target, headers = await _read_head(reader)
        request = HttpRequest(method, target, headers, b"")
        if (request.header("transfer-encoding") or "").lower() == "chunked":
            request.body = await _read_chunked(reader)
        elif request.header("content-length") is not None:
            length = request.header("content-length") or ""
            if not length.isdigit():
                raise BadRequest("malformed Content-Length")
            if int(length) > MAX_BODY:
                raise BadRequest("the body is too large", 413)
            request.body = await reader.readexactly(int(length))
        return request
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
        raise BadRequest("the request is incomplete or a line is too long") from None


def _head_bytes(status: int, reason: str, headers: list[tuple[str, str]], length: int) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{name}: {value}" for name, value in headers
              if name.lower() not in ("content-length", "connection", "transfer-encoding")]
    lines += [f"Content-Length: {length}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1", errors="replace")


def _reason(status: int, given: str = "") -> str:
    if given:
        return given
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


class LocalServer:
    """Serves ``runtime``'s ``Default.fetch`` on ``host``:``port`` (0: any free port)."""

    def __init__(self, runtime: Runtime, host: str = "127.0.0.1", port: int = 8787,
                 out: TextIO | None = None) -> None:
        self.runtime = runtime
        self.host = host
        self.port = port
        self.out = out or sys.stdout
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._on_connection, self.host, self.port, limit=MAX_HEADER_LINE)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening, end the requests in flight, and wait for them."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        await asyncio.sleep(0)  # a connection accepted just now starts its task and is counted
        await cancel_all(self._connections)

    def _print(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._serve_one(reader, writer)
        except (ConnectionError, asyncio.CancelledError):
            pass  # the client went away, or the server is stopping
        finally:
            self._connections.discard(task)
            writer.close()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        started = time.monotonic()
        try:
            request = await asyncio.wait_for(read_request(reader), READ_TIMEOUT_S)
        except (BadRequest, TimeoutError) as error:
            status = error.status if isinstance(error, BadRequest) else 408
            message = str(error) or "the request took too long to arrive"
            writer.write(_head_bytes(status, _reason(status), [("Content-Type", "text/plain")],
                                     len(message)) + message.encode())
            await writer.drain()
            return
        status, reason, headers, body = await self._respond(request, writer)
        writer.write(_head_bytes(status, reason, headers, len(body)))
        if request.method != "HEAD":
            writer.write(body)
        await writer.drain()
        elapsed_ms = round((time.monotonic() - started) * 1000)
        self._print(f"{request.method} {request.target} {status} {reason} ({elapsed_ms}ms)")

    async def _respond(self, request: HttpRequest,
                       writer: asyncio.StreamWriter) -> tuple[int, str, list[tuple[str, str]], bytes]:
        url = self.url + request.target if request.target.startswith("/") else request.target
        body = request.body if request.method not in ("GET", "HEAD") else None
        try:
            # A context of its own, as a request of its own: no object's context leaks in.
            response = await contextvars.Context().run(
                asyncio.ensure_future, self.runtime.fetch(url, method=request.method,
                                                          headers=request.headers, body=body))
            content = await response.bytes()
            return response.status, _reason(response.status, response.status_text), \
                list(response.headers.items()), content
        except asyncio.CancelledError:
            raise
        except Exception:
            # As wrangler dev does: the error goes to the terminal, the client gets a 500.
            print(traceback.format_exc(), file=sys.stderr, flush=True)
            message = b"the Worker threw an exception; its traceback is in the server's output"
            return 500, "Internal Server Error", [("Content-Type", "text/plain")], message


async def cancel_all(tasks: set[asyncio.Task[Any]], patience_s: float = 5.0) -> None:
    """Cancel ``tasks`` until they are done: code that catches a cancellation
    (to release a place, say) may await again, and on real time such an await
    does not end by itself. Gives up after ``patience_s``, saying which remain."""
    deadline = time.monotonic() + patience_s
    while tasks and time.monotonic() < deadline:
        for task in list(tasks):
            task.cancel()
        await asyncio.wait(list(tasks), timeout=0.1)
        tasks = {task for task in tasks if not task.done()}
    for task in tasks:
        print(f"still running after {patience_s} s, left behind: {task!r}", file=sys.stderr, flush=True)


async def _watch_runtime(runtime: Runtime) -> None:
    """Print errors of background work (alarms, tasks) as they happen, and
    keep the runtime's trace from growing without end."""
    shown = 0
    while True:
        await asyncio.sleep(1)
        for where, error in runtime.errors[shown:]:
            print(f"error in {where}: {error!r}", file=sys.stderr, flush=True)
        shown = len(runtime.errors)
        if len(runtime.trace) > 2 * TRACE_KEPT:
            del runtime.trace[:-TRACE_KEPT]


def _print_bindings(runtime: Runtime, secrets: set[str], out: Callable[[str], None]) -> None:
    out("Your Worker has access to the following bindings:")
    rows = [(f"env.{name} ({namespace.class_name})", "Durable Object")
            for name, namespace in runtime.namespaces.items()]
    for name, value in vars(runtime.env).items():
        if name not in runtime.namespaces:
            shown = '"(hidden)"' if name in secrets else repr(value)
            rows.append((f"env.{name} ({shown})", "Secret" if name in secrets else "Environment Variable"))
    width = max((len(binding) for binding, _ in rows), default=0)
    for binding, kind in rows:
        out(f"  {binding.ljust(width)}  {kind}")


def local_runtime(config: str | Path = "wrangler.toml") -> tuple[Runtime, dict[str, str] | None]:
    """The Worker of ``config`` on real time, with the secrets of the
    ``.dev.vars`` file beside it (None when there is none), as ``wrangler dev``
    loads them. Objects live in memory: their storage starts empty."""
    secrets = load_dev_vars(Path(config).resolve().parent / ".dev.vars")
    return Runtime.from_wrangler(config, vars=secrets, clock="real"), secrets


def serve(config: str = "wrangler.toml", host: str = "127.0.0.1", port: int = 8787,
          out: TextIO | None = None) -> None:
    """Serve the Worker of ``config`` until SIGINT or SIGTERM, printing what
    ``wrangler dev`` prints: the secrets file, the bindings, the address."""
    out = out or sys.stdout

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    runtime, secrets = local_runtime(config)
    with runtime:
        if secrets is not None:
            say(f"Using secrets defined in {Path(config).parent / '.dev.vars'}")
        _print_bindings(runtime, set(secrets or {}), say)
        server = LocalServer(runtime, host, port, out)

        async def run() -> None:
            stop = asyncio.Event()
            for signum in (signal.SIGINT, signal.SIGTERM):
                runtime.loop.add_signal_handler(signum, stop.set)
            await server.start()
            say(f"Ready on {server.url}")
            watcher = asyncio.ensure_future(_watch_runtime(runtime))
            try:
                await stop.wait()
            finally:
                say("Shutting down local server...")
                await server.stop()
                # Alarms, timers and calls in flight: the runtime's close would wait for them forever.
                await cancel_all(asyncio.all_tasks() - {asyncio.current_task()} - {watcher})
                watcher.cancel()

        runtime.run(run())
