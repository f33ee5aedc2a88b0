"""A webhook receiver on 127.0.0.1 for the tests: it records every delivery and how many run at once.

Lives here: a threaded ``http.server`` on a loopback port that answers
POSTs by their path, counts deliveries per job and concurrent deliveries
per account (the peak is measured here, outside the Worker), and can hold
each delivery until its account has ``limit`` in flight, so that the peak a
correct Worker reaches is its limit, not whatever the timing allowed.
Must not know: the Worker; it sees only HTTP.

Paths: ``/ok`` answers 200; ``/flaky`` 503 to a job's first delivery,
then 200; ``/reset`` closes the connection without an answer on a job's
first delivery, then 200; ``/gone`` 410.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DELAY_S = 0.02  #: real time each delivery takes once it may go on
HOLD_LIMIT_S = 5.0  #: a held delivery goes on after this long even if its account's others never come


class Receiver:
    """``with Receiver(limits, expected) as receiver``: ``receiver.url(path)``."""

    def __init__(self, limits: dict[str, int], expected: dict[str, int] | None = None) -> None:
        self.limits = limits
        self.expected = expected  # deliveries per account; None: do not hold deliveries
        self.lock = threading.Condition()
        self.in_flight: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.answered: Counter[str] = Counter()  # per account, deliveries answered 2xx
        self.deliveries: defaultdict[str, list[dict]] = defaultdict(list)  # per job id
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}{path}"

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _enter(self, account: str) -> None:
        with self.lock:
            self.in_flight[account] += 1
            self.peak[account] = max(self.peak[account], self.in_flight[account])
            self.lock.notify_all()
            if self.expected is None:
                return
            # Hold until the account's limit is in flight, or every delivery it still expects is.
            deadline = time.monotonic() + HOLD_LIMIT_S
            while (self.in_flight[account] < self.limits[account]
                   and self.answered[account] + self.in_flight[account] < self.expected[account]):
                if not self.lock.wait(deadline - time.monotonic()):
                    break

    def _leave(self, account: str, answered: bool) -> None:
        with self.lock:
            self.in_flight[account] -= 1
            self.answered[account] += answered
            self.lock.notify_all()

    def _record(self, headers, body: bytes) -> tuple[dict, int]:
        delivery = json.loads(body)
        delivery["idempotency_key"] = headers.get("idempotency-key")
        delivery["content_type"] = headers.get("content-type")
        with self.lock:
            self.deliveries[delivery["id"]].append(delivery)
            return delivery, len(self.deliveries[delivery["id"]])

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                delivery, nth = receiver._record(self.headers, body)
                account = delivery["account"]
                receiver._enter(account)
                status = 200
                try:
                    time.sleep(DELAY_S)
                    if nth == 1 and self.path == "/reset":
                        self.close_connection = True
                        return  # no answer at all: the sender sees a network error
                    status = {"/gone": 410, "/flaky": 503 if nth == 1 else 200}.get(self.path, 200)
                    self.send_response(status)
                    self.send_header("content-length", "0")
                    self.end_headers()
                finally:
                    receiver._leave(account, answered=status == 200)

            def log_message(self, *args: object) -> None:
                pass  # the tests read the records, not a log

        return Handler
