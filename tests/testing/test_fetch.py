"""The stand-in's ``workers.fetch``: real HTTP on 127.0.0.1, and the virtual clock while it is in flight."""

import asyncio
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import durability.testing  # noqa: F401  (installs the stand-in)
from durability.testing import VirtualClockLoop
from durability.testing._clock import patched_wall_clock

REAL_DELAY_S = 0.05


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        time.sleep(REAL_DELAY_S)
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("location", "/elsewhere")
        else:
            self.send_response(int(self.path.strip("/") or 200))
        self.send_header("x-echo-type", self.headers.get("content-type", ""))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def run(coroutine_function):
    loop = VirtualClockLoop()
    try:
        with patched_wall_clock(loop):
            return loop.run_until_complete(coroutine_function(loop))
    finally:
        loop.close()


def test_fetch_sends_a_real_request_and_any_status_is_an_answer(server):
    import workers

    async def scenario(loop):
        ok = await workers.fetch(f"{server}/201", method="POST", body='{"a": 1}')
        refused = await workers.fetch(f"{server}/503", method="POST", body="x",
                                      headers={"content-type": "application/json"})
        moved = await workers.fetch(f"{server}/moved", method="POST", body="x", redirect="manual")
        return ([ok.status, ok.ok, ok.headers["x-echo-type"], await ok.text()],
                [refused.status, refused.ok, refused.headers["x-echo-type"]], moved.status)

    ok, refused, moved = run(scenario)
    assert ok == [201, True, "text/plain;charset=UTF-8", '{"a": 1}']  # a string body is labelled as fetch does
    assert refused == [503, False, "application/json"]
    assert moved == 302  # not followed


def test_no_answer_raises_os_error_as_pyfetch_does(server):
    import workers

    closed = socket_port_nobody_listens_on()

    async def scenario(loop):
        with pytest.raises(OSError, match="Connection refused"):
            await workers.fetch(f"http://127.0.0.1:{closed}/", method="POST", body="x")

    run(scenario)


def socket_port_nobody_listens_on():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_virtual_time_follows_real_time_while_a_request_is_in_flight(server):
    import workers

    async def scenario(loop):
        ticks = []

        async def tick():
            while True:
                await asyncio.sleep(0.01)
                ticks.append(loop.time())

        ticker = asyncio.ensure_future(tick())
        start = loop.time()
        await workers.fetch(f"{server}/200", method="POST", body="x")
        during = loop.time() - start
        ticker.cancel()
        await asyncio.sleep(3_600)  # nothing in flight: the clock jumps again
        return during, len(ticks), loop.time() - start

    during, ticks, total = run(scenario)
    # The request took at least the server's real delay, and so did virtual time:
    # the 10 ms timers fired in step with it, neither skipped nor frozen.
    assert during >= REAL_DELAY_S
    assert ticks >= 1 and ticks <= during / 0.01 + 1
    assert total >= 3_600


def test_a_timeout_on_virtual_time_bounds_a_real_request(server):
    import workers

    async def scenario(loop):
        # The server takes 50 ms: were the clock frozen while the request is
        # in flight, the answer would come first and nothing would time out.
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await workers.fetch(f"{server}/200", method="POST", body="x")

    run(scenario)
