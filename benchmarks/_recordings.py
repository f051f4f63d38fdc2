"""A large recording built from the committed real ones: copies time-shifted and concatenated.

The benchmarks need millions of events, the lab recorded thousands, so each recording is replayed as many
times as needed, one copy after the other (`gap_s` of silence between copies). A copy keeps every raw line
and body as recorded except what would make it a different run:

- time: every receipt `ts`, the stamp in each vLLM log line's prefix, and the span start/end/event times in
  OTLP bodies move by the copy's shift, a whole number of seconds (so millisecond stamps stay exact);
- request ids: the lab's run tag inside them (`cmpl-<tag>-s003-0`, `chatcmpl-<tag>-t002`) becomes the copy's
  own tag of the same length, in log lines and in the spans' string attributes alike;
- span and trace ids: the copy number is XORed into their last four bytes (copy 0 keeps the recorded ids),
  so two copies never share a trace.

OTLP bodies are re-encoded with protobuf, which reproduces a recorded body byte for byte when nothing
changed (tests check). /metrics bodies carry no ids or times and are copied verbatim. vLLM's counters and
iteration numbers restart between copies, as after a vLLM restart.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import lzma
import math
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from attrib_agent.events import RequestReceived
from attrib_agent.lab.recording_copy import CopyRewrite, copy_tag
from attrib_agent.recording import FORMAT_NAME, FORMAT_VERSION, LOG, METRICS, NVML, OTLP, Recording
from attrib_agent.sources.replay import ReplaySource

INPUT_STREAMS: Final = (METRICS, LOG, OTLP, NVML)  # what the agent reads; client.jsonl is the lab's own
BUILDER_VERSION: Final = 1  # bump when the output of a build changes, to invalidate cached builds
FIXTURES: Final = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "recordings"
DEFAULT_SOURCES = ("shorts", "whale1", "whale2", "preempt", "canary")
"""The lab-client recordings the published figures are made of: their ids carry the run tag the copier rewrites.
Third-party client recordings (bench-*: `vllm bench serve`'s own ids, a `tokenize-` call) and the plugin's
preempt-steps (a re-run of preempt) are not copied: pass them explicitly once the copier can retag them."""
_PROTOBUF: Final = "application/x-protobuf"


@dataclass(frozen=True)
class SourceRecording:
    """One committed recording held in memory, with what a copy of it needs to know."""

    path: Path
    tag: str  # the lab's run tag inside every request id
    meta: Mapping[str, Any]
    records: Mapping[str, Sequence[dict[str, Any]]]  # input stream -> records in file order
    first_ts: float
    last_ts: float
    events: int  # typed events its replay yields (a copy yields as many)
    requests: int  # requests it sends (`Received request` lines)


@dataclass(frozen=True)
class BuildInfo:
    path: Path
    copies: int
    events: int  # typed events the built recording replays into
    records: dict[str, int]  # per stream
    span_s: float  # receipt time from the first record to the last


def load_sources(paths: Iterable[str | os.PathLike[str]] | None = None) -> list[SourceRecording]:
    """The recordings (default: every committed one), in the order they were recorded."""
    dirs = [FIXTURES / name for name in DEFAULT_SOURCES] if paths is None else [Path(p) for p in paths]
    out = []
    for d in dirs:
        rec = Recording(d)
        tag = rec.meta.get("run_tag")
        if not isinstance(tag, str) or not tag:
            raise ValueError(f"{d}: meta.json has no run_tag; cannot make request ids unique per copy")
        records = {s: list(rec.records(s)) for s in INPUT_STREAMS}
        stamps = [r["ts"] for rs in records.values() for r in rs]
        if not stamps:
            raise ValueError(f"{d}: no input records")
        kinds = Counter(type(ev) for ev in ReplaySource(d).events())
        out.append(SourceRecording(d, tag, rec.meta, records, min(stamps), max(stamps), kinds.total(),
                                   kinds[RequestReceived]))
    return sorted(out, key=lambda s: s.first_ts)


def _dumps(rec: Mapping[str, Any]) -> str:
    return json.dumps(rec, separators=(",", ":"), ensure_ascii=False) + "\n"


class _MetricsLines:
    """/metrics records change only in `ts`: encode each 50 KB body once, not once per copy."""

    def __init__(self, records: Sequence[Mapping[str, Any]]) -> None:
        self._tails = []
        for rec in records:
            head = _dumps({**rec, "ts": None})
            if not head.startswith('{"ts":null'):
                raise ValueError("a metrics record whose first key is not ts")
            self._tails.append((float(rec["ts"]), head[len('{"ts":null'):]))

    def lines(self, shift_s: int) -> Iterator[str]:
        for ts, tail in self._tails:
            yield '{"ts":' + json.dumps(ts + shift_s) + tail


def copy_plan(sources: Sequence[SourceRecording], gap_s: float) -> Iterator[tuple[int, int]]:
    """(source index, shift in whole seconds) of each copy, without end: round-robin over the sources, each
    copy starting at least `gap_s` after the previous one's last record (the first copy is not shifted)."""
    end: float | None = None
    for copy in itertools.count():
        i = copy % len(sources)
        src = sources[i]
        shift = 0 if end is None else math.ceil(end + gap_s - src.first_ts)
        yield i, shift
        end = src.last_ts + shift


def plan_copies(sources: Sequence[SourceRecording], min_events: int, gap_s: float) -> list[tuple[int, int]]:
    """The first copies of `copy_plan` that together replay into at least `min_events` events."""
    plan: list[tuple[int, int]] = []
    total = 0
    for i, shift in copy_plan(sources, gap_s):
        plan.append((i, shift))
        total += sources[i].events
        if total >= min_events:
            return plan
    raise AssertionError("unreachable")


def round_rate(sources: Sequence[SourceRecording], gap_s: float) -> tuple[float, float]:
    """(requests, events) per second of receipt time over one round of copies, gaps included."""
    plan = list(itertools.islice(copy_plan(sources, gap_s), len(sources) + 1))
    span = plan[-1][1]  # the next round's first copy starts this much after the first one
    return sum(s.requests for s in sources) / span, sum(s.events for s in sources) / span


class EndlessRecording(Recording):
    """Stands in for a recording in `ReplaySource`: the copies of `copy_plan`, made in memory as they are
    read, without end (the soak runs for as long as it is asked to)."""

    def __init__(self, sources: Sequence[SourceRecording], gap_s: float = 5.0) -> None:
        super().__init__(sources[0].path)
        self.meta = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "synthetic": {"endless": True}}
        self._sources, self._gap_s = list(sources), gap_s

    def records(self, stream: str) -> Iterator[dict[str, Any]]:
        if stream not in INPUT_STREAMS or not any(s.records[stream] for s in self._sources):
            return  # (a stream no source has would loop over copies without end, yielding nothing)
        for copy, (i, shift) in enumerate(copy_plan(self._sources, self._gap_s)):
            src = self._sources[i]
            rw = CopyRewrite(src.tag, copy, shift)
            for rec in src.records[stream]:
                yield rw.record(stream, rec)


def endless_replay(sources: Sequence[SourceRecording], gap_s: float = 5.0) -> ReplaySource:
    """A ReplaySource (the live parsers) over an EndlessRecording."""
    rs = ReplaySource(sources[0].path)
    rs.recording = EndlessRecording(sources, gap_s)
    return rs


def build_dir(out: str | os.PathLike[str]) -> Path:
    """`out`, made ready for a build: created, or emptied when it holds an earlier build (never anything else)."""
    path = Path(out)
    meta_path = path / "meta.json"
    if path.is_dir() and any(path.iterdir()):
        if not meta_path.is_file() or "synthetic" not in json.loads(meta_path.read_text()):
            raise ValueError(f"{path} is not empty and holds no earlier build; refusing to overwrite it")
        for old in path.iterdir():
            old.unlink()
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_concatenated(out: str | os.PathLike[str], sources: Sequence[SourceRecording], *, min_events: int,
                       gap_s: float = 5.0, preset: int = 0) -> BuildInfo:
    """Write the concatenation to `out`, streams as .jsonl.xz (xz -0 writes and reads ~10x faster than -6,
    and consecutive /metrics bodies still shrink ~150x). `out` must be empty or an earlier build."""
    path = build_dir(out)
    meta_path = path / "meta.json"
    plan = plan_copies(sources, min_events, gap_s)
    first = sources[plan[0][0]]
    meta = {"format": FORMAT_NAME, "version": FORMAT_VERSION,
            **{k: first.meta[k] for k in ("block_size", "num_gpu_blocks", "model") if k in first.meta},
            "synthetic": {"builder_version": BUILDER_VERSION, "copies": len(plan), "gap_s": gap_s,
                          "events": sum(sources[i].events for i, _ in plan),
                          "plan": [[sources[i].path.name, copy_tag(sources[i].tag, c), shift]
                                   for c, (i, shift) in enumerate(plan)]}}
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")  # first: marks the directory as ours
    metrics = [_MetricsLines(s.records[METRICS]) for s in sources]
    counts = {s: 0 for s in INPUT_STREAMS}
    for stream in INPUT_STREAMS:
        if not any(s.records[stream] for s in sources):
            continue
        with lzma.open(path / f"{stream}.jsonl.xz", "wt", encoding="utf-8", preset=preset) as f:
            for copy, (i, shift) in enumerate(plan):
                src = sources[i]
                if stream == METRICS:
                    lines: Iterable[str] = metrics[i].lines(shift)
                else:
                    rw = CopyRewrite(src.tag, copy, shift)
                    lines = (_dumps(rw.record(stream, r)) for r in src.records[stream])
                for line in lines:
                    f.write(line)
                    counts[stream] += 1
    last_i, last_shift = plan[-1]
    return BuildInfo(path, len(plan), meta["synthetic"]["events"], counts,
                     sources[last_i].last_ts + last_shift - first.first_ts)


def sources_digest(sources: Sequence[SourceRecording]) -> str:
    h = hashlib.sha256(str(BUILDER_VERSION).encode())
    for s in sources:
        for p in sorted(s.path.iterdir()):
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:12]


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "attrib-agent" / "bench"


def cached_concatenation(min_events: int, *, cache_dir: Path | None = None, gap_s: float = 5.0,
                         sources: Sequence[SourceRecording] | None = None) -> BuildInfo:
    """The concatenation for `min_events`, built once and reused while the committed recordings are unchanged."""
    srcs = list(sources) if sources is not None else load_sources()
    path = (cache_dir or default_cache_dir()) / f"concat-{min_events}-{gap_s:g}s-{sources_digest(srcs)}"
    done = path / "build.json"
    if done.is_file():
        d = json.loads(done.read_text())
        return BuildInfo(path, d["copies"], d["events"], d["records"], d["span_s"])
    info = build_concatenated(path, srcs, min_events=min_events, gap_s=gap_s)
    done.write_text(json.dumps({"copies": info.copies, "events": info.events, "records": info.records,
                                "span_s": info.span_s}) + "\n")
    return info
