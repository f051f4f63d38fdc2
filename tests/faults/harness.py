"""The fault tests' harness: the real `attrib-agent run` process fed from a committed recording, over loopback.

- `RecordedInput`: a recording under tests/fixtures/recordings, re-timed to a chosen start. Every vLLM time in
  it (the millisecond stamp of each log line, the start/end of each span) moves by one whole-millisecond
  offset, so the agent sees what that vLLM run would have produced had it run now: a live agent compares
  vLLM's times with its own clock (result ages, partial time-outs, the top window), and three-day-old times
  would be what no live vLLM emits. Nothing else changes: the text of every line, the bytes of every
  /metrics body, the spans' ids and attributes are the recording's.
- `StandInVllm`: vLLM's /metrics served from a recording's bodies at their recorded pace (like
  tests/integration/recorded_vllm.py), switchable to another recording (a restarted vLLM), stoppable and
  restartable on the same port (vLLM down and back).
- `LogWriter`: the file the agent tails, written like vLLM's FileHandler (one fd, O_APPEND), with the faults
  a log file sees: rotation, copytruncate, delete and recreate, a line in two writes.
- `Feed`: plays a recording in a thread at its recorded pace: log lines to the LogWriter, OTLP exports POSTed
  to the agent's OTLP/HTTP port, /metrics bodies through the stand-in, with hooks to inject faults.
- `AgentProcess`: `.venv/bin/attrib-agent run ...` as a subprocess in its own session, always stopped.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

from attrib_agent.health import SourceHealth
from attrib_agent.lab.metrics_stand_in import RecordedMetricsServer
from attrib_agent.lab.recording_copy import CopyRewrite
from attrib_agent.lab.server import kill_group, stop_group
from attrib_agent.lab.sidecar import wait_healthy
from attrib_agent.recording import LOG, METRICS, OTLP, Recording, otlp_body
from attrib_agent.sinks.prometheus.families import snake_case
from attrib_agent.sources.log.parser import LogLineParser
from attrib_agent.sources.otlp.decode import decode_export

RECORDINGS = Path(__file__).parents[1] / "fixtures" / "recordings"
AGENT_BIN = Path(sys.executable).parent / "attrib-agent"

T = TypeVar("T")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(fn: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.2,
               detail: Callable[[], str] | None = None) -> T:
    """Poll `fn` until it returns something truthy; fail with `what` (and `detail()`) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{detail()}" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}{extra}")
        time.sleep(interval_s)


# ---- recorded input ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Export:
    offset_s: float
    body: bytes
    content_type: str
    encoding: str | None


@dataclass(frozen=True)
class RecordedInput:
    """One recording's streams as offsets from its first record (vLLM's times still the recorded ones)."""

    name: str
    meta: Mapping[str, Any]
    t0: float  # receipt time of the first record
    metrics: tuple[tuple[float, bytes], ...]
    log: tuple[tuple[float, str], ...]
    exports: tuple[Export, ...]
    span_ids: tuple[str, ...]  # request ids of the `llm_request` spans: the requests that finished

    @property
    def duration_s(self) -> float:
        return max(self.metrics[-1][0], self.log[-1][0], self.exports[-1].offset_s)

    def delta_for(self, start_wall: float) -> int:
        """The whole-second shift that puts the recording's first record at `start_wall` (within half a second)."""
        return round(start_wall - self.t0)

    def _moved(self, delta_s: int) -> CopyRewrite:
        tag = str(self.meta["run_tag"])
        return CopyRewrite(tag, 0, delta_s, new_tag=tag)  # ids as recorded: only times move

    def log_lines(self, delta_s: int) -> list[str]:
        moved = self._moved(delta_s)
        return [moved.log_line(line, self.t0 + offset) for offset, line in self.log]

    def bodies(self, delta_s: int) -> list[bytes]:
        moved = self._moved(delta_s)
        return [moved.otlp_body(e.body) for e in self.exports]


@functools.cache
def recorded(name: str) -> RecordedInput:
    rec = Recording(RECORDINGS / name)
    metrics = list(rec.records(METRICS))
    log = list(rec.records(LOG))
    otlp = list(rec.records(OTLP))
    t0 = min(float(r["ts"]) for r in (*metrics, *log, *otlp))
    exports = tuple(Export(float(r["ts"]) - t0, otlp_body(r), str(r.get("content_type") or "application/x-protobuf"),
                           r.get("content_encoding")) for r in otlp)
    ids: list[str] = []
    for e in exports:
        result = decode_export(e.body, content_type=e.content_type, content_encoding=e.encoding, ts=0.0,
                               max_decompressed=64 * 1024 * 1024)
        ids += [s.request_id for s in result.spans]
    return RecordedInput(name, rec.meta, t0,
                         tuple((float(r["ts"]) - t0, str(r["text"]).encode("utf-8")) for r in metrics),
                         tuple((float(r["ts"]) - t0, str(r["line"])) for r in log), exports,
                         tuple(dict.fromkeys(ids)))


def log_event_counts(lines: Iterable[str]) -> Counter[str]:
    """What the agent's own parser makes of these lines, by `attrib_events_total` kind."""
    parser = LogLineParser(SourceHealth("expected"))
    out: Counter[str] = Counter()
    for line in lines:
        for ev in parser.parse_all(line, 0.0):
            out[snake_case(type(ev).__name__)] += 1
    return out


# ---- vLLM's /metrics, from a recording -------------------------------------------------------------------
class StandInVllm(RecordedMetricsServer):
    """Serves /metrics like vLLM: a recording's bodies at their recorded pace from `play()`'s start."""

    def __init__(self, first: RecordedInput, port: int = 0) -> None:
        super().__init__(first.metrics, port)

    def play(self, rec: RecordedInput, started_mono: float | None = None) -> None:  # type: ignore[override]
        """From now on serve `rec`'s bodies as if its run began at `started_mono` (another recording: a new vLLM);
        None: its first body until the next play()."""
        super().play(rec.metrics, started_mono)


# ---- the log file ------------------------------------------------------------------------------------------
class LogWriter:
    """vLLM's log file as its FileHandler writes it: one O_APPEND fd, a line per write (unless split)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = self._open()
        self.lines_written = 0

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, data: bytes) -> None:
        os.write(self.fd, data)

    def line(self, text: str) -> None:
        self.write(text.encode("utf-8") + b"\n")
        self.lines_written += 1

    def split_line(self, text: str, at: int, pause_s: float = 0.3) -> None:
        """One line in two writes with a pause between: the tailer sees half a line first."""
        data = text.encode("utf-8") + b"\n"
        self.write(data[:at])
        time.sleep(pause_s)  # lets the tailer read the partial line; correctness does not depend on it
        self.write(data[at:])
        self.lines_written += 1

    def rotate(self, then_old: Iterable[str] = ()) -> None:
        """logrotate's create mode: rename to .1, the writer still appends to the old file, then reopens."""
        os.rename(self.path, self.path.with_name(self.path.name + ".1"))
        for text in then_old:
            self.line(text)
        os.close(self.fd)
        self.fd = self._open()

    def truncate(self) -> None:
        """logrotate's copytruncate: the file is emptied under the writer, whose O_APPEND goes on at 0."""
        os.truncate(self.path, 0)

    def delete_and_recreate(self, then_old: Iterable[str] = ()) -> None:
        """The file deleted while the writer still holds it, then a new one created at the same path."""
        os.unlink(self.path)
        for text in then_old:
            self.line(text)
        os.close(self.fd)
        self.fd = self._open()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


# ---- the agent process -------------------------------------------------------------------------------------
@dataclass
class AgentProcess:
    workdir: Path
    vllm_url: str
    log_file: Path
    journal_dir: Path | None = None
    otlp_export: str | None = None
    token: str | None = None
    listen: str | None = None  # default: 127.0.0.1:<free port>
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    api_port: int = field(default_factory=free_port)
    otlp_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def otlp_url(self) -> str:
        return f"http://127.0.0.1:{self.otlp_port}/v1/traces"

    @property
    def output_path(self) -> Path:
        return self.workdir / "agent.out"

    def args(self) -> list[str]:
        args = [str(AGENT_BIN), "run", "--vllm-url", self.vllm_url, "--log-file", str(self.log_file),
                "--otlp-http-port", str(self.otlp_port), "--otlp-grpc-port", "0",
                "--listen", self.listen or f"127.0.0.1:{self.api_port}", "--metrics-interval-s", "0.1",
                "--metrics-timeout-s", "0.5", "--log-poll-interval-s", "0.05", "--no-nvml"]
        if self.journal_dir is not None:
            args += ["--journal-dir", str(self.journal_dir)]
        if self.otlp_export is not None:
            args += ["--otlp-export", self.otlp_export]
        return [*args, *self.extra_args]

    def start(self, timeout_s: float = 60.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTRIB_", "OTEL_"))}
        env.update(self.env)
        if self.token is not None:
            env["ATTRIB_API_TOKEN"] = self.token
        with self.output_path.open("ab") as out:
            out.write(f"---- start {self.starts}\n".encode())  # (not the command: --vllm-url may hold a password)
            out.flush()
            self.proc = subprocess.Popen(self.args(), stdout=out, stderr=subprocess.STDOUT, env=env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.starts += 1
        if wait_healthy(self.proc, self.api_url, timeout_s):
            return
        if self.proc.poll() is not None:
            raise AssertionError(f"attrib-agent run exited with {self.proc.returncode}:\n{self.tail()}")
        self.stop()
        raise AssertionError(f"attrib-agent did not answer /healthz within {timeout_s:.0f} s:\n{self.tail()}")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL to its process group: no chance to flush anything."""
        kill_group(self.proc)

    def stop(self) -> int | None:
        return stop_group(self.proc)

    def output(self) -> str:
        return self.output_path.read_text(errors="replace") if self.output_path.exists() else ""

    def tail(self, n: int = 4000) -> str:
        return self.output()[-n:]

    # ---- the API ---------------------------------------------------------------------------------------
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def get(self, path: str, **params: str) -> httpx.Response:
        with httpx.Client(trust_env=False, timeout=10.0) as c:
            return c.get(f"{self.api_url}{path}", params=params or None, headers=self.headers())

    def healthy(self) -> bool:
        try:
            return self.alive and self.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def metrics(self) -> Metrics:
        r = self.get("/metrics")
        assert r.status_code == 200, r.text[:300]
        return Metrics(r.text)

    def culprits(self, ids: Iterable[str]) -> dict[str, httpx.Response]:
        with httpx.Client(trust_env=False, timeout=10.0) as c:
            return {rid: c.get(f"{self.api_url}/v1/requests/{rid}/culprits", headers=self.headers()) for rid in ids}

    def finals(self, ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The final results the API serves now for these ids (the others left out)."""
        return {rid: r.json() for rid, r in self.culprits(ids).items() if r.status_code == 200}

    def wait_final(self, ids: Iterable[str], timeout_s: float = 60.0) -> dict[str, dict[str, Any]]:
        wanted = list(ids)
        last: dict[str, dict[str, Any]] = {}

        def done() -> dict[str, dict[str, Any]] | None:
            nonlocal last
            last = self.finals(wanted)
            return last if len(last) == len(wanted) else None

        return wait_until(done, timeout_s, f"final results for all {len(wanted)} requests",
                          detail=lambda: f"missing {sorted(set(wanted) - set(last))}\n{self.tail()}")


class Metrics:
    """A /metrics scrape: `value(name, **labels)` sums the samples whose labels include those given."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: list[tuple[str, dict[str, str], float]] = []
        for fam in text_string_to_metric_families(text):
            self.samples += [(s.name, dict(s.labels), float(s.value)) for s in fam.samples]

    def value(self, name: str, **labels: str) -> float:
        return sum(v for n, lab, v in self.samples if n == name and all(lab.get(k) == x for k, x in labels.items()))

    def has(self, name: str, **labels: str) -> bool:
        return any(n == name and all(lab.get(k) == x for k, x in labels.items()) for n, lab, _ in self.samples)

    def counters(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every monotonic sample (counters, histogram buckets/counts/sums) by name and labels."""
        return {(n, tuple(sorted(lab.items()))): v for n, lab, v in self.samples
                if n.endswith(("_total", "_bucket", "_count", "_sum"))}


def same_result(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """The same attribution (what the API says about the request), whatever the serving process."""
    keys = ("request_id", "status", "final", "culprits", "ttft_slowdown_s", "itl_slowdown_s", "finished_ts")
    return json.dumps({k: a.get(k) for k in keys}, sort_keys=True) == json.dumps({k: b.get(k) for k in keys},
                                                                                  sort_keys=True)


# ---- the feed ----------------------------------------------------------------------------------------------
PostExport = Callable[[bytes, Export], None]


class Feed:
    """Plays a recording at its recorded pace (from `start()`), in a thread: the log, the spans, /metrics.

    `before_line(i, writer)` runs before log line i is written and may inject a fault; it returns False to
    have the feed skip writing the line (the hook wrote it itself). `post` sends each export (default: one
    POST, 200 expected). `spans_first` POSTs every export at the start, before any log line.
    """

    def __init__(self, rec: RecordedInput, writer: LogWriter, stand_in: StandInVllm, otlp_url: str, *,
                 before_line: Callable[[int, str, LogWriter], bool] | None = None,
                 post: PostExport | None = None, spans_first: bool = False,
                 time_shift_s: float = 0.0) -> None:
        self.rec = rec
        self.writer = writer
        self.stand_in = stand_in
        self.otlp_url = otlp_url
        self.before_line = before_line
        self.post = post or self.post_once
        self.spans_first = spans_first
        self.time_shift_s = time_shift_s  # added to vLLM's times beyond the re-timing (a stepped clock)
        self.started_wall: float | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._client = httpx.Client(trust_env=False, timeout=10.0)
        self._thread = threading.Thread(target=self._run, name=f"feed-{rec.name}", daemon=True)
        self.lines: list[str] = []
        self.bodies: list[bytes] = []

    def post_once(self, body: bytes, export: Export) -> None:
        r = self.post_raw(body, export.content_type, export.encoding)
        assert r.status_code == 200, (r.status_code, r.content[:200])

    def post_raw(self, body: bytes, content_type: str = "application/x-protobuf", encoding: str | None = None,
                 headers: Mapping[str, str] | None = None) -> httpx.Response:
        h = {"Content-Type": content_type, **(headers or {})}
        if encoding:
            h["Content-Encoding"] = encoding
        return self._client.post(self.otlp_url, content=body, headers=h)

    def start(self) -> Feed:
        self.started_wall = time.time()
        delta = self.rec.delta_for(self.started_wall) + round(self.time_shift_s)
        self.lines = self.rec.log_lines(delta)
        self.bodies = self.rec.bodies(delta)
        self._start_mono = time.monotonic()
        self.stand_in.play(self.rec, self._start_mono)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            items: list[tuple[float, int, int]] = [(off, 0, i) for i, (off, _) in enumerate(self.rec.log)]
            items += [(-1.0 if self.spans_first else e.offset_s, 1, i) for i, e in enumerate(self.rec.exports)]
            for offset, kind, i in sorted(items):
                delay = self._start_mono + offset - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                if kind == 1:
                    self.post(self.bodies[i], self.rec.exports[i])
                elif self.before_line is None or self.before_line(i, self.lines[i], self.writer):
                    self.writer.line(self.lines[i])
        except BaseException as e:  # re-raised by join()
            self.error = e
        finally:
            self.done.set()

    def join(self, timeout_s: float = 60.0) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"feed of {self.rec.name} still running after {timeout_s} s"
        if self.error is not None:
            raise self.error
