"""vLLM's /metrics endpoint played back from a recording, on a thread: a scrape at elapsed time t gets the last
body vLLM had served by t in the recorded run (the first before that, the last for ever after), byte for byte.

For tests that drive a real agent or a real Prometheus without a real vLLM. It can stop listening and listen
again on the same port (vLLM unreachable, then back) and switch to another recording (vLLM restarted, its
counters reset). `lab/playback.py`'s `MetricsStandIn` is the asyncio twin the benchmarks schedule by wall time.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"  # what vLLM's prometheus_client serves
TimedBodies = Sequence[tuple[float, bytes]]  # (seconds from the run's start, raw /metrics body), in time order
HANGUPS: Final = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)

logger = logging.getLogger("attrib_agent")


class _QuietServer(ThreadingHTTPServer):
    """A scraper that hangs up mid-body (a scrape timeout, an agent stopped) is normal, as for vLLM's own server:
    counted, not printed. socketserver's default prints a traceback from the handler thread, and on Python 3.11
    formatting one runs `ast.parse` (the caret anchors), whose AST state is shared between threads: a test parsing
    source at that moment failed with `SystemError: AST constructor recursion depth mismatch` (CI, 2026-11-26)."""

    hangups = 0
    errors = 0

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, HANGUPS):
            self.hangups += 1
            return
        self.errors += 1
        logger.warning("recorded /metrics stand-in: %s while serving %s", type(exc).__name__, client_address)


class RecordedMetricsServer:
    """Serves `GET /metrics` on 127.0.0.1 from the bodies `play()` was given, at their recorded pace."""

    def __init__(self, bodies: TimedBodies, port: int = 0) -> None:
        if not bodies:
            raise ValueError("no /metrics bodies to serve")
        self._lock = threading.Lock()
        self._bodies = bodies
        self._started: float | None = None
        self.scrapes = 0
        self.hangups = self.errors = 0  # of servers stopped before; `handled()` adds the current one's
        self._httpd: _QuietServer | None = None
        self._thread: threading.Thread | None = None
        self.port = port
        self.start()

    @property
    def url(self) -> str:
        """The base URL, as `--vllm-url` takes it."""
        return f"http://127.0.0.1:{self.port}"

    def handled(self) -> tuple[int, int]:
        """Scrapers that hung up mid-body, and other errors while serving, since the start."""
        h = self._httpd
        return self.hangups + (h.hangups if h else 0), self.errors + (h.errors if h else 0)

    def play(self, bodies: TimedBodies, started_mono: float | None = None) -> None:
        """From now on serve `bodies` as if their run began at `started_mono` (time.monotonic()); None: the first
        body until the next play()."""
        if not bodies:
            raise ValueError("no /metrics bodies to serve")
        with self._lock:
            self._bodies, self._started = bodies, started_mono

    def body_now(self) -> bytes:
        with self._lock:
            self.scrapes += 1
            body = self._bodies[0][1]
            if self._started is None:
                return body
            elapsed = time.monotonic() - self._started
            for offset, b in self._bodies:
                if offset > elapsed:
                    break
                body = b
            return body

    def start(self) -> None:
        """Listen (again) on `port` (0 the first time: a free one)."""
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = server.body_now()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        deadline = time.monotonic() + 10
        while True:  # the old socket may linger a moment after stop()
            try:
                httpd = _QuietServer(("127.0.0.1", self.port), Handler)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        httpd.daemon_threads = True
        self._httpd = httpd
        self.port = httpd.server_address[1]
        self._thread = threading.Thread(target=httpd.serve_forever, name="recorded-vllm-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop listening: scrapes are refused, as when vLLM is down."""
        if self._httpd is not None:
            self.hangups += self._httpd.hangups
            self.errors += self._httpd.errors
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
