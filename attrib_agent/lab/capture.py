"""The lab's capture process: vLLM's log (on stdin), its /metrics and its OTLP spans, recorded raw.

It runs apart from the load client (`python -m attrib_agent.lab.capture ...`, stdin = vLLM's output)
so that capturing never steals the client's CPU. It lives as long as the vLLM server, because vLLM's
OTLP endpoint and log pipe are fixed at start-up; recordings are windows opened and closed through a
tiny control API on the same HTTP port as the OTLP receiver:

    POST /lab/start   {"dir": "...", "meta": {...}}   begin writing a recording
    POST /lab/stop                                   close it; answers the per-stream counts
    POST /lab/forward {"url": "..." | null}          also send every OTLP body on, unchanged (tests of live intake)
    GET  /lab/status                                 counters
    POST /v1/traces                                  OTLP/HTTP protobuf (or JSON) export request

vLLM logs synchronously from its API server's event loop into the pipe this process reads. When this process
stalls (on this 2-core host, for up to 1.6 s while vLLM's engine spins), the kernel's default 64 KiB pipe
filled in ~0.5 s and vLLM's API server then blocked in its log write, receiving no request and streaming no
token until the capture read again: 35 of the 126 shorts that waited > 100 ms before vLLM received them in the
committed truths (all of preempt's and kvpair's, up to 1.05 s). So the capture widens that pipe first
(`widen_pipe`), and records the size in each recording's meta (`log_pipe_bytes`).

With `--steps-socket PATH` it also binds the unix datagram socket the step plugin sends to
(plugins/vllm, docs/exact-mode.md) and records each message, receipt-stamped, as the `vllm_steps` stream. The
plugin's messages reach this process later than vLLM's log on a busy host (its sender thread queues them and waits
for room in a receiver queue of `net.unix.max_dgram_qlen` datagrams, 10 here), so closing a recording waits, up to
`STEPS_CATCH_UP_S`, until the stream has reported the last step the log logged: a CI run of the step-plugin e2e
test recorded the log's last steps (a preemption among them) without their messages.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from attrib_agent.recording import (
    LOG,
    METRICS,
    OTLP,
    VLLM_STEPS,
    RecordingWriter,
    log_record,
    metrics_record,
    otlp_record,
)
from attrib_agent.sources.log.patterns import ITERATION, TOKEN_BUDGET_LEAD
from attrib_agent.sources.log.pipe import widen_pipe

MAX_OTLP_BODY = 16 * 1024 * 1024
MAX_STEP_DATAGRAM = 256 * 1024
STEPS_RCVBUF = 4 * 1024 * 1024  # bytes; the kernel also caps the queue at net.unix.max_dgram_qlen datagrams
STEPS_CATCH_UP_S = 5.0  # closing a recording waits at most this long for the plugin to report the log's last step


class Capture:
    """Holds the active recording (if any) and the counters; every source writes through it."""

    def __init__(self, server_log: Path) -> None:
        self._lock = threading.Lock()
        self.writer: RecordingWriter | None = None
        self.server_log = open(server_log, "a", encoding="utf-8")
        self.counters: dict[str, int] = {
            "log_lines": 0, "otlp_requests": 0, "scrapes": 0, "scrape_errors": 0, "otlp_rejected": 0,
            "otlp_forward_dropped": 0, "otlp_forward_errors": 0, "step_messages": 0, "step_rejected": 0,
            "steps_behind_at_stop": 0,
        }
        self.vllm_exited = threading.Event()
        self.log_pipe_bytes: int | None = None  # the log pipe's capacity once widened (None: not a pipe)
        # vLLM's start-up line an agent reads its step budget from, each recording opening with it as an agent that
        # read vLLM's log from its start would have (a restarted vLLM's replaces the last)
        self.startup_line: tuple[float, str] | None = None
        self.forward_url: str | None = None
        self.steps_expected = False  # a steps socket is bound: recordings close once its messages caught up
        self._steps = threading.Condition()
        self._logged_iter: int | None = None  # the last step vLLM's log logged, and the last the plugin reported
        self._reported_iter: int | None = None
        self._forward_q: queue.Queue[tuple[str, str, bytes, str | None]] = queue.Queue(maxsize=256)
        threading.Thread(target=self._forward_loop, daemon=True).start()

    def forward(self, ctype: str, body: bytes, encoding: str | None) -> None:
        url = self.forward_url
        if url is None:
            return
        try:
            self._forward_q.put_nowait((url, ctype, body, encoding))
        except queue.Full:
            self.count("otlp_forward_dropped")

    def _forward_loop(self) -> None:
        """Best effort, off the receiving thread, so vLLM's exporter never waits on the downstream."""
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            while True:
                url, ctype, body, encoding = self._forward_q.get()
                headers = {"Content-Type": ctype, **({"Content-Encoding": encoding} if encoding else {})}
                try:
                    client.post(url, content=body, headers=headers)
                except httpx.HTTPError:
                    self.count("otlp_forward_errors")

    def start(self, path: str, meta: dict[str, Any]) -> None:
        with self._lock:
            if self.writer is not None:
                self.writer.close()
            self.writer = RecordingWriter(path, {**meta, "log_pipe_bytes": self.log_pipe_bytes})
            if self.startup_line is not None:
                self.writer.append(LOG, log_record(*self.startup_line))

    def logged_step(self, iteration: int) -> None:
        with self._steps:
            self._logged_iter = iteration

    def reported_step(self, iteration: int) -> None:
        with self._steps:
            self._reported_iter = iteration
            self._steps.notify_all()

    def _steps_caught_up(self) -> bool:
        """The plugin has reported the log's last step (or a later one; or none was logged, or vLLM restarted and
        its log counts from 0 again: then any report will do, nothing is waited for that cannot come)."""
        logged, reported = self._logged_iter, self._reported_iter
        return logged is None or (reported is not None and reported >= logged)

    def stop(self) -> dict[str, int]:
        if self.steps_expected and self.writer is not None:
            with self._steps:
                if not self._steps.wait_for(self._steps_caught_up, timeout=STEPS_CATCH_UP_S):
                    self.count("steps_behind_at_stop")  # dropped by the plugin, or it lags by seconds
        with self._lock:
            w, self.writer = self.writer, None
        if w is None:
            return {}
        w.close()
        return dict(w.counts)

    def record(self, stream: str, rec: dict[str, Any]) -> None:
        w = self.writer
        if w is not None:
            w.append(stream, rec)

    def count(self, key: str) -> None:
        with self._lock:
            self.counters[key] += 1


def read_log(capture: Capture, stream: Any) -> None:
    """Stamp each of vLLM's output lines at receipt; EOF means vLLM exited."""
    for raw in iter(stream.readline, b""):
        ts = time.time()
        # Keep a trailing "\r": vLLM's NewLineFormatter marks continuation lines of one record with it.
        line = raw.decode("utf-8", "replace").rstrip("\n")
        capture.server_log.write(line + "\n")
        capture.server_log.flush()
        capture.count("log_lines")
        if TOKEN_BUDGET_LEAD.search(line):
            capture.startup_line = (ts, line)  # one reference, swapped whole: no lock needed
        elif capture.steps_expected and "Iteration(" in line and (it := ITERATION.search(line)):  # plugin runs only
            capture.logged_step(int(it["iteration"]))
        capture.record(LOG, log_record(ts, line))
    capture.vllm_exited.set()


def bind_steps_socket(path: str) -> socket.socket:
    """Bind the plugin's datagram socket (a stale file from a previous capture is replaced)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, STEPS_RCVBUF)
    sock.bind(path)
    return sock


def receive_steps(capture: Capture, sock: socket.socket) -> None:
    """One plugin message per datagram; recorded with its receipt time while a recording is open."""
    while True:
        try:
            data = sock.recv(MAX_STEP_DATAGRAM)
        except OSError:
            return
        ts = time.time()
        try:
            msg = json.loads(data)
            if not isinstance(msg, dict):
                raise ValueError("not an object")
        except ValueError:
            capture.count("step_rejected")
            continue
        capture.count("step_messages")
        capture.record(VLLM_STEPS, {**msg, "ts": ts})
        if isinstance(it := msg.get("iter"), int):
            capture.reported_step(it)


def scrape_metrics(capture: Capture, url: str, interval_s: float, stop: threading.Event) -> None:
    """Poll /metrics only while a recording is open; errors are counted, never fatal."""
    with httpx.Client(timeout=max(1.0, 4 * interval_s), trust_env=False) as client:
        next_due = time.monotonic()
        while not stop.is_set():
            if capture.writer is not None:
                t0 = time.monotonic()
                try:
                    resp = client.get(url)
                    if resp.status_code == 200:
                        capture.record(METRICS, metrics_record(time.time(), resp.text,
                                                               fetch_s=round(time.monotonic() - t0, 6)))
                        capture.count("scrapes")
                    else:
                        capture.count("scrape_errors")
                except httpx.HTTPError:
                    capture.count("scrape_errors")
            next_due = max(next_due + interval_s, time.monotonic())
            stop.wait(max(0.0, next_due - time.monotonic()))


def make_handler(capture: Capture) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
            return

        def _reply(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _body(self) -> bytes | None:
            n = int(self.headers.get("Content-Length") or 0)
            if n > MAX_OTLP_BODY:
                capture.count("otlp_rejected")
                self._reply(413, b"{}")
                self.close_connection = True
                return None
            return self.rfile.read(n)

        def do_POST(self) -> None:  # noqa: N802 - stdlib naming
            body = self._body()
            if body is None:
                return
            if self.path == "/v1/traces":
                ts = time.time()
                ctype = self.headers.get("Content-Type", "application/x-protobuf")
                capture.count("otlp_requests")
                encoding = self.headers.get("Content-Encoding")
                capture.record(OTLP, otlp_record(ts, ctype, body, content_encoding=encoding))
                capture.forward(ctype, body, encoding)
                # An empty ExportTraceServiceResponse is zero bytes in protobuf and {} in JSON.
                if "json" in ctype:
                    self._reply(200, b"{}")
                else:
                    self._reply(200, b"", "application/x-protobuf")
            elif self.path == "/lab/start":
                req = json.loads(body or b"{}")
                capture.start(req["dir"], req.get("meta") or {})
                self._reply(200, b"{}")
            elif self.path == "/lab/forward":
                capture.forward_url = json.loads(body or b"{}").get("url")
                self._reply(200, b"{}")
            elif self.path == "/lab/stop":
                self._reply(200, json.dumps(capture.stop()).encode())
            else:
                self._reply(404, b"{}")

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/lab/status":
                status = {**capture.counters, "recording": capture.writer is not None,
                          "vllm_exited": capture.vllm_exited.is_set(), "log_pipe_bytes": capture.log_pipe_bytes}
                self._reply(200, json.dumps(status).encode())
            else:
                self._reply(404, b"{}")

    return Handler


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="attrib_agent.lab.capture")
    p.add_argument("--port", type=int, required=True, help="OTLP/HTTP + control port on 127.0.0.1")
    p.add_argument("--metrics-url", required=True)
    p.add_argument("--interval", type=float, default=0.25)
    p.add_argument("--server-log", required=True)
    p.add_argument("--steps-socket", help="unix datagram socket the step plugin sends to (lab truth)")
    args = p.parse_args(argv)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -5)
    except OSError:
        pass
    capture = Capture(Path(args.server_log))
    capture.log_pipe_bytes = widen_pipe(sys.stdin.fileno())
    stop = threading.Event()
    httpd = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(capture))
    httpd.daemon_threads = True
    threads = [
        threading.Thread(target=read_log, args=(capture, sys.stdin.buffer), daemon=True),
        threading.Thread(target=scrape_metrics, args=(capture, args.metrics_url, args.interval, stop), daemon=True),
        threading.Thread(target=httpd.serve_forever, daemon=True),
    ]
    if args.steps_socket:
        capture.steps_expected = True
        threads.append(threading.Thread(target=receive_steps, args=(capture, bind_steps_socket(args.steps_socket)),
                                        daemon=True))
    for t in threads:
        t.start()
    try:
        # Outlive vLLM briefly so late span exports and the final stop still land.
        while not capture.vllm_exited.wait(0.5):
            pass
        time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        capture.stop()
        httpd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
