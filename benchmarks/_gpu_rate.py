"""A GPU server's event stream made of real continuous recordings: time-compressed copies, back to back, never idle.

The lab's CPU vLLM steps ~20 times a second and finishes ~1 request a second; a busy GPU server steps 50-100+
times a second, finishes tens of requests a second and is never idle (issue 14). This builds such a stream from
the continuous `vllm bench serve` recordings (`bench-mixed`: whales and KV full with preemptions; `bench-prefix`:
shared prefixes), each copy keeping every raw line and body but for what makes it a different, faster run:

- time: every time goes through one monotonic map per copy, `t -> base + (t - start - squeezed(t)) / k`: `k`
  makes the copy finish `finished_per_s` requests a second of its busy time, and every idle stretch between two
  engine steps longer than `max_idle_s` (after compression) is squeezed to `max_idle_s`. Mapped: receipt `ts`,
  log-prefix stamps, `iteration elapsed time` (/ k), the stats lines' tokens/s (x k), span start/end/event times,
  and the spans' latency attributes (each the mapped difference of its two ends);
- continuity: the next copy starts `max_idle_s` after the last step of the one before; iteration numbers and every
  counter and histogram sample of /metrics carry on from the copies before (one vLLM that never restarted);
- /metrics bodies are thinned to one per `scrape_interval_s` of the new time (the poller's cadence does not
  speed up with vLLM), and those before the first step or after the last step of a copy are left out;
- ids: the recording's run tag inside every request id becomes the copy's own tag of the same length, other
  request ids (`tokenize-<hex>`, vLLM's own `cmpl-<hex>`) get the copy number XORed into their hex digits, span
  and trace ids the copy number XORed into their last four bytes (as `_recordings.py` does).

The output is a format-v1 recording (docs/recording-format.md): `attrib-agent replay` and lab playback read it.
`measure(path)` reads one back through the agent's own parsers and reports its rates.
"""

from __future__ import annotations

import base64
import bisect
import calendar
import hashlib
import heapq
import json
import lzma
import math
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from attrib_agent.events import EngineStep, MetricsSnapshot, RequestReceived, RequestSpan
from attrib_agent.lab.recording_copy import CopyRewrite, copy_tag
from attrib_agent.recording import FORMAT_NAME, FORMAT_VERSION, LOG, METRICS, OTLP, Recording
from attrib_agent.sources.log.patterns import PREFIX
from attrib_agent.sources.otlp.decode import FLOAT_ATTRS
from attrib_agent.sources.replay import ReplaySource
from benchmarks._recordings import FIXTURES, build_dir, default_cache_dir

GPU_RATE_SOURCES: Final = ("bench-mixed", "bench-prefix")
BUILDER_VERSION: Final = 1
_STREAMS: Final = (METRICS, LOG, OTLP)
_ITERATION: Final = re.compile(r"Iteration\((\d+)\)")
_ELAPSED: Final = re.compile(r"iteration elapsed time: ([0-9.]+) ms")
_THROUGHPUT: Final = re.compile(r"throughput: ([0-9.]+) tokens/s")
_RANDOM_ID: Final = re.compile(r"\b((?:cmpl|chatcmpl|tokenize)-)([0-9a-f]{16})(?![0-9a-z])")  # ids without the tag
_TYPE: Final = re.compile(r"# TYPE (\S+) (counter|histogram)")
_LATENCY_ATTRS: Final = frozenset(FLOAT_ATTRS.values())


@dataclass(frozen=True)
class GpuSource:
    """One continuous recording, read once: its records, busy stretches, and what a copy adds to the counters."""

    path: Path
    tag: str
    records: Mapping[str, Sequence[dict[str, Any]]]
    steps: Sequence[tuple[float, float]]  # (start, end) of each engine step, unix s, in order
    first_request_ts: float  # receipt of the first `Received request` line (before the first step)
    finished: int
    last_iteration: int
    final_counters: Mapping[str, float]  # counter/histogram sample (name{labels}) -> its last value in the copy

    def compression(self, finished_per_s: float, max_idle_s: float) -> float:
        """The k at which a copy, idle stretches squeezed to `max_idle_s`, finishes `finished_per_s` requests a
        second: its length, busy/k + sum(min(gap/k, max_idle_s)), falls as k grows; bisected."""
        busy = sum(e - s for s, e in self.steps)
        gaps = [max(0.0, s - e) for (_, e), (s, _) in zip(self.steps, self.steps[1:], strict=False)]
        want = self.finished / finished_per_s
        lo, hi = 1e-3, 1e6
        for _ in range(100):
            k = math.sqrt(lo * hi)
            length = busy / k + max_idle_s + sum(min(g / k, max_idle_s) for g in gaps)
            lo, hi = (k, hi) if length > want else (lo, k)
        return hi


def load_source(path: Path) -> GpuSource:
    rec = Recording(path)
    tag = rec.meta.get("run_tag")
    if not isinstance(tag, str) or not tag:
        raise ValueError(f"{path}: meta.json has no run_tag; cannot make request ids unique per copy")
    records = {s: list(rec.records(s)) for s in _STREAMS}
    steps, finished, last_it, first_request = [], 0, 0, math.inf
    for ev in ReplaySource(path).events():  # the agent's own parsers say where the steps are
        if isinstance(ev, RequestReceived):
            first_request = min(first_request, ev.ts)
        elif isinstance(ev, EngineStep) and not ev.dummy:
            end = ev.ts if ev.log_ts is None else ev.log_ts
            steps.append((end - ev.elapsed_ms / 1000.0, end))
            last_it = max(last_it, ev.iteration)
        elif isinstance(ev, RequestSpan):
            finished += 1
    if not steps or not records[METRICS]:
        raise ValueError(f"{path}: no engine steps or no /metrics bodies")
    final = _counters(str(records[METRICS][-1]["text"]))
    return GpuSource(path, tag, records, steps, min(first_request, steps[0][0]), finished, last_it, final)


class TimeMap:
    """Monotonic map of one copy's times: idle stretches over `keep_s` (recorded seconds) squeezed, then / k."""

    def __init__(self, steps: Sequence[tuple[float, float]], start: float, base: float, k: float,
                 keep_s: float) -> None:
        self.start, self.base, self.k = start, base, k
        ends = [start, *(e for _, e in steps[:-1])]
        self._knots: list[float] = []  # recorded time of each knot
        self._mapped: list[float] = []  # its compressed offset before / k
        squeezed = 0.0
        for prev_end, (s, _) in zip(ends, steps, strict=True):
            gap = s - prev_end
            if gap > keep_s:
                self._knots += [prev_end, s]
                self._mapped += [prev_end - start - squeezed, prev_end - start - squeezed + keep_s]
                squeezed += gap - keep_s
        self._squeezed_total = squeezed

    def __call__(self, t: float) -> float:
        i = bisect.bisect_right(self._knots, t)
        if i == 0:
            off = t - self.start
        elif i % 2 == 1:  # inside a squeezed gap: linear across it
            a, b = self._knots[i - 1], self._knots[i]
            ma, mb = self._mapped[i - 1], self._mapped[i]
            off = ma + (t - a) / (b - a) * (mb - ma)
        else:
            off = self._mapped[i - 1] + (t - self._knots[i - 1])
        return self.base + off / self.k


def _counters(body: str) -> dict[str, float]:
    """Every counter and histogram sample of a body (`_created` stamps excluded): name{labels} -> value."""
    kinds = set(_TYPE.findall(body))
    families = {name for name, _ in kinds}
    out = {}
    for line in body.split("\n"):
        if not line or line[0] == "#":
            continue
        key, _, value = line.rpartition(" ")
        name = key.split("{", 1)[0]
        if name.endswith("_created"):
            continue
        base = name
        for suffix in ("_total", "_bucket", "_count", "_sum"):
            if name.endswith(suffix):
                base = name[: -len(suffix)]
                break
        if base in families or name in families:
            try:
                out[key] = float(value)
            except ValueError:
                continue
    return out


def carry_counters(body: str, offsets: Mapping[str, float]) -> str:
    """The body with each counter/histogram sample raised by the copies before's totals (vLLM never restarted)."""
    if not offsets:
        return body
    lines = body.split("\n")
    for i, line in enumerate(lines):
        if not line or line[0] == "#":
            continue
        key, _, value = line.rpartition(" ")
        off = offsets.get(key)
        if off:
            lines[i] = f"{key} {float(value) + off!r}"
    return "\n".join(lines)


class _Stamps:
    """vLLM's `YYYY-MM-DD HH:MM:SS.mmm` (UTC, the lab's format) to unix seconds and back, cached per second."""

    def __init__(self) -> None:
        self._parsed: dict[str, int] = {}
        self._formatted: dict[int, str] = {}

    def parse(self, text: str) -> int:
        v = self._parsed.get(text)
        if v is None:
            v = self._parsed[text] = calendar.timegm(time.strptime(text, "%Y-%m-%d %H:%M:%S"))
        return v

    def format(self, t: float) -> tuple[str, int]:
        ms = int(round(t * 1000))
        sec, milli = divmod(ms, 1000)
        s = self._formatted.get(sec)
        if s is None:
            if len(self._formatted) > 100_000:
                self._formatted.clear()
            s = self._formatted[sec] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(sec))
        return s, milli


@dataclass
class _Copy:
    """What one copy needs to rewrite its records."""

    index: int
    src: GpuSource
    fmap: TimeMap
    end: float  # recorded time of its last step's end
    iteration_offset: int
    counters: Mapping[str, float]
    rewrite: CopyRewrite = field(init=False)
    new_tag: str = field(init=False)

    def __post_init__(self) -> None:
        self.new_tag = copy_tag(self.src.tag, self.index)
        self.rewrite = CopyRewrite(self.src.tag, self.index, 0, new_tag=self.new_tag)

    def ids(self, text: str) -> str:
        text = text.replace(self.src.tag, self.new_tag)
        return _RANDOM_ID.sub(lambda m: m.group(1) + _retag_hex(m.group(2), self.index), text)

    def log_line(self, line: str, stamps: _Stamps) -> str:
        m = PREFIX.match(line)
        if m is not None and m.group("year") and m.group("ms"):
            start, end = m.start("year"), m.end("ms")
            t = stamps.parse(line[start:m.end("second")]) + int(m.group("ms")) / 1000.0
            sec, milli = stamps.format(self.fmap(t))
            line = f"{line[:start]}{sec}.{milli:03d}{line[end:]}"
        if "Iteration(" in line:
            line = _ITERATION.sub(lambda x: f"Iteration({int(x.group(1)) + self.iteration_offset})", line, count=1)
            line = _ELAPSED.sub(lambda x: f"iteration elapsed time: {float(x.group(1)) / self.fmap.k:.2f} ms", line,
                                count=1)
        elif "throughput: " in line:
            line = _THROUGHPUT.sub(lambda x: f"throughput: {float(x.group(1)) * self.fmap.k:.1f} tokens/s", line)
        return self.ids(line)

    def otlp_body(self, body: bytes) -> bytes:
        msg = ExportTraceServiceRequest()
        msg.ParseFromString(body)
        f = self.fmap
        for rs in msg.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    arrival = span.start_time_unix_nano / 1e9
                    span.start_time_unix_nano = int(round(f(arrival) * 1e9))
                    span.end_time_unix_nano = int(round(f(span.end_time_unix_nano / 1e9) * 1e9))
                    for ev in span.events:
                        ev.time_unix_nano = int(round(f(ev.time_unix_nano / 1e9) * 1e9))
                    span.trace_id = self.rewrite.binary_id(span.trace_id)
                    span.span_id = self.rewrite.binary_id(span.span_id)
                    if span.parent_span_id:
                        span.parent_span_id = self.rewrite.binary_id(span.parent_span_id)
                    self._latencies(span.attributes, arrival)
                    for kv in span.attributes:
                        if kv.value.HasField("string_value"):
                            kv.value.string_value = self.ids(kv.value.string_value)
        return bytes(msg.SerializeToString())

    def _latencies(self, attributes: Any, arrival: float) -> None:
        """Each latency becomes the mapped difference of its two ends (vLLM's do_tracing: queue, prefill, decode
        and inference count from when it was scheduled; ttft and e2e from arrival)."""
        got = {kv.key: kv.value.double_value for kv in attributes
               if kv.key in _LATENCY_ATTRS and kv.value.HasField("double_value")}
        f = self.fmap
        queue = got.get(FLOAT_ATTRS["queue_s"], 0.0)
        prefill = got.get(FLOAT_ATTRS["prefill_s"], 0.0)
        sched = arrival + queue
        ends = {"queue_s": (arrival, sched), "ttft_s": (arrival, arrival + got.get(FLOAT_ATTRS["ttft_s"], 0.0)),
                "e2e_s": (arrival, arrival + got.get(FLOAT_ATTRS["e2e_s"], 0.0)),
                "prefill_s": (sched, sched + prefill),
                "decode_s": (sched + prefill, sched + prefill + got.get(FLOAT_ATTRS["decode_s"], 0.0)),
                "inference_s": (sched, sched + got.get(FLOAT_ATTRS["inference_s"], 0.0))}
        by_attr = {FLOAT_ATTRS[k]: v for k, v in ends.items()}
        for kv in attributes:
            if kv.key in got:
                a, b = by_attr[kv.key]
                kv.value.double_value = f(b) - f(a)

    def otlp_record(self, rec: Mapping[str, Any]) -> dict[str, Any]:
        if rec.get("content_type") != "application/x-protobuf" or rec.get("content_encoding") not in (None, ""):
            raise ValueError("only uncompressed protobuf OTLP records can be copied")
        body = self.otlp_body(base64.b64decode(rec["body_b64"]))
        return {**rec, "ts": self.fmap(float(rec["ts"])), "body_b64": base64.b64encode(body).decode("ascii")}


def _retag_hex(h: str, copy: int) -> str:
    n = len(h)
    return f"{(int(h, 16) ^ copy) % 16 ** n:0{n}x}"


@dataclass(frozen=True)
class GpuRateInfo:
    path: Path
    copies: int
    records: dict[str, int]
    span_s: float  # event time from the first record to the last


def _dumps(rec: Mapping[str, Any]) -> str:
    return json.dumps(rec, separators=(",", ":"), ensure_ascii=False) + "\n"


def _plan(sources: Sequence[GpuSource], duration_s: float, finished_per_s: float,
          max_idle_s: float, t0: float) -> Iterator[_Copy]:
    base, iteration, counters = t0, 0, dict[str, float]()
    for c in range(10**9):
        src = sources[c % len(sources)]
        k = src.compression(finished_per_s, max_idle_s)
        keep = max_idle_s * k
        start = min(src.steps[0][0] - keep, src.first_request_ts - 0.001)  # the first arrivals are kept
        fmap = TimeMap(src.steps, start, base, k, keep)
        end = src.steps[-1][1]
        yield _Copy(c, src, fmap, end, iteration, dict(counters))
        base = fmap(end)  # the next copy's first step starts max_idle_s later (its leading gap, squeezed)
        if base - t0 >= duration_s:
            return
        iteration += src.last_iteration + 1
        for key, v in src.final_counters.items():
            counters[key] = counters.get(key, 0.0) + v


def build_gpu_rate(out: str | Path, *, duration_s: float = 600.0, finished_per_s: float = 55.0,
                   max_idle_s: float = 0.02, scrape_interval_s: float = 0.25,
                   sources: Sequence[GpuSource] | None = None, preset: int = 0) -> GpuRateInfo:
    """Write the GPU-rate recording to `out` (an empty directory or an earlier build): copies until `duration_s`
    of event time are filled."""
    srcs = list(sources) if sources is not None else [load_source(FIXTURES / n) for n in GPU_RATE_SOURCES]
    path = build_dir(out)
    meta_path = path / "meta.json"
    t0 = float(math.ceil(srcs[0].steps[0][0]))
    copies = list(_plan(srcs, duration_s, finished_per_s, max_idle_s, t0))
    first = Recording(srcs[0].path).meta
    meta: dict[str, Any] = {"format": FORMAT_NAME, "version": FORMAT_VERSION,
            **{k: first[k] for k in ("block_size", "num_gpu_blocks", "model", "vllm_version") if k in first},
            "synthetic": {"builder": "gpu_rate", "builder_version": BUILDER_VERSION, "duration_s": duration_s,
                          "finished_per_s": finished_per_s, "max_idle_s": max_idle_s,
                          "scrape_interval_s": scrape_interval_s, "copies": len(copies),
                          "plan": [[c.src.path.name, c.new_tag, round(c.fmap.base, 3), round(c.fmap.k, 3)]
                                   for c in copies]}}
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    counts: dict[str, int] = {}
    stamps = _Stamps()
    for stream in _STREAMS:
        with lzma.open(path / f"{stream}.jsonl.xz", "wt", encoding="utf-8", preset=preset) as f:
            counts[stream] = _write_stream(f, stream, copies, stamps, scrape_interval_s)
    last = copies[-1]
    return GpuRateInfo(path, len(copies), counts, last.fmap(last.end) - t0)


def _write_stream(f: IO[str], stream: str, copies: Sequence[_Copy], stamps: _Stamps, scrape_interval_s: float) -> int:
    """One stream of every copy, in time order: a copy's late records (spans exported after its last step) are
    held back and merged with the next copy's."""
    pending: list[tuple[float, int, str]] = []
    seq = n = 0
    next_scrape = -math.inf
    for c in copies:
        first_start = c.src.steps[0][0]
        end = c.fmap(c.end)  # the next copy's records all come later than this: safe to write up to it
        for rec in c.src.records[stream]:
            ts = float(rec["ts"])
            if ts < c.fmap.start:
                continue
            if stream == METRICS:
                if ts > c.end:
                    break
                t = c.fmap(ts)
                if ts < first_start or t < next_scrape:
                    continue
                next_scrape = t + scrape_interval_s
                line = _dumps({**rec, "ts": t, "text": carry_counters(str(rec["text"]), c.counters)})
            elif stream == LOG:
                if ts > c.end + 1.0:
                    break
                t = c.fmap(ts)
                line = _dumps({**rec, "ts": t, "line": c.log_line(str(rec["line"]), stamps)})
            else:
                out = c.otlp_record(rec)
                t, line = out["ts"], _dumps(out)
            while pending and pending[0][0] <= min(t, end):
                f.write(heapq.heappop(pending)[2])
                n += 1
            heapq.heappush(pending, (t, seq, line))
            seq += 1
        while pending and pending[0][0] <= end:
            f.write(heapq.heappop(pending)[2])
            n += 1
    while pending:
        f.write(heapq.heappop(pending)[2])
        n += 1
    return n


@dataclass(frozen=True)
class Rates:
    """What a stream looks like to the agent, read back through its parsers."""

    span_s: float  # first engine step to last
    steps_per_s: float
    finished_per_s: float
    max_idle_s: float  # longest stretch with no engine step running
    kv_max: float
    kv_near_full_share: float  # of /metrics scrapes with KV usage >= 0.9
    whales: int  # requests with >= 2,000 prompt tokens
    events: int
    restarts: int  # counter resets seen (0: one vLLM throughout)


def measure(path: str | Path) -> Rates:
    steps = finished = whales = events = restarts = 0
    first = last_end = None
    max_idle = 0.0
    kv: list[float] = []
    for ev in ReplaySource(path).events():
        events += 1
        if isinstance(ev, EngineStep) and not ev.dummy:
            end = ev.ts if ev.log_ts is None else ev.log_ts
            if last_end is not None:
                max_idle = max(max_idle, end - ev.elapsed_ms / 1000.0 - last_end)
            first = end if first is None else first
            last_end = end
            steps += 1
        elif isinstance(ev, RequestSpan):
            finished += 1
            whales += (ev.prompt_tokens or 0) >= 2000
        elif isinstance(ev, MetricsSnapshot):
            restarts += ev.counter_reset
            if ev.kv_usage is not None:
                kv.append(ev.kv_usage)
    span = (last_end - first) if first is not None and last_end is not None else 0.0
    return Rates(span, steps / span if span else 0.0, finished / span if span else 0.0, max_idle,
                 max(kv, default=0.0), sum(v >= 0.9 for v in kv) / len(kv) if kv else 0.0, whales, events, restarts)


def cached_gpu_rate(duration_s: float = 600.0, *, cache_dir: Path | None = None, **kw: Any) -> GpuRateInfo:
    """The GPU-rate recording for `duration_s`, built once and reused while the source recordings are unchanged."""
    digest = _sources_digest([FIXTURES / n for n in GPU_RATE_SOURCES])
    opts = "-".join(f"{k}{v:g}" for k, v in sorted(kw.items()))
    path = (cache_dir or default_cache_dir()) / f"gpu-rate-v{BUILDER_VERSION}-{duration_s:g}s{opts}-{digest}"
    done = path / "build.json"
    if done.is_file():
        d = json.loads(done.read_text())
        return GpuRateInfo(path, d["copies"], d["records"], d["span_s"])
    info = build_gpu_rate(path, duration_s=duration_s, **kw)
    done.write_text(json.dumps({"copies": info.copies, "records": info.records, "span_s": info.span_s}) + "\n")
    return info


def _sources_digest(dirs: Sequence[Path]) -> str:
    h = hashlib.sha256(str(BUILDER_VERSION).encode())
    for d in dirs:
        for p in sorted(d.iterdir()):
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:12]
