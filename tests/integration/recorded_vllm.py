"""A stand-in for vLLM's /metrics endpoint that serves a recording's real bodies at their recorded pace.

Prometheus scrapes it like a live vLLM: after `start()`, a scrape at elapsed time t gets the last body
vLLM had served by t in the recorded run (the first before that, the last for ever after), byte for byte.
"""

from __future__ import annotations

import bisect
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from attrib_agent.recording import METRICS, Recording

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # what vLLM's prometheus_client serves


class RecordedMetricsServer:
    def __init__(self, recording: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        records = list(Recording(recording).records(METRICS))
        if not records:
            raise ValueError(f"{recording} holds no /metrics bodies")
        t0 = self.recording_start = float(records[0]["ts"])
        self.offsets = [float(r["ts"]) - t0 for r in records]
        self.bodies = [str(r["text"]).encode("utf-8") for r in records]
        self.duration_s = self.offsets[-1]
        self.scrapes = 0
        self._started: float | None = None
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

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self.url = f"http://{host}:{self._httpd.server_address[1]}/metrics"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="recorded-vllm", daemon=True)
        self._thread.start()

    def start(self) -> None:
        """Start the recorded clock (before this, the first body is served)."""
        self._started = time.monotonic()

    def index_now(self) -> int:
        if self._started is None:
            return 0
        return max(0, bisect.bisect_right(self.offsets, time.monotonic() - self._started) - 1)

    def body_now(self) -> bytes:
        self.scrapes += 1
        return self.bodies[self.index_now()]

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
