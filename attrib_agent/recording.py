"""The recording directory, format version 1: raw inputs stamped with their receipt time.

A recording holds what the agent's sources receive, *before* any parsing, so replay runs the same
parsers as live and a parser fix can be checked on old recordings. See docs/recording-format.md.
"""

from __future__ import annotations

import base64
import gzip
import json
import lzma
import os
import re
import threading
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

FORMAT_NAME: Final = "attrib-recording"
FORMAT_VERSION: Final = 1

# Stream name -> file stem. Unknown extra files in a directory are ignored by readers.
METRICS: Final = "metrics"
LOG: Final = "log"
OTLP: Final = "otlp"
NVML: Final = "nvml"
CLIENT: Final = "client"
VLLM_STEPS: Final = "vllm_steps"  # the step plugin's steps: lab truth; replayed only with --exact
STREAMS: Final = (METRICS, LOG, OTLP, NVML, CLIENT, VLLM_STEPS)


class RecordingError(Exception):
    """A directory that is not a readable attrib recording."""


class RecordingVersionError(RecordingError):
    """A recording written by a newer attrib-agent than this one."""


def metrics_record(ts: float, text: str, **extra: Any) -> dict[str, Any]:
    return {"ts": ts, "text": text, **extra}


def log_record(ts: float, line: str, **extra: Any) -> dict[str, Any]:
    return {"ts": ts, "line": line, **extra}


def otlp_record(ts: float, content_type: str, body: bytes, **extra: Any) -> dict[str, Any]:
    return {"ts": ts, "content_type": content_type, "body_b64": base64.b64encode(body).decode("ascii"), **extra}


def otlp_body(record: Mapping[str, Any]) -> bytes:
    return base64.b64decode(record["body_b64"])


def compress_streams(path: str | os.PathLike[str]) -> None:
    """xz every finished `<stream>.jsonl` in place: /metrics bodies repeat, so 6.9 MB becomes ~30 KB."""
    for p in sorted(Path(path).glob("*.jsonl")):
        if p.stem in STREAMS:
            with open(p, "rb") as src, lzma.open(p.with_name(p.name + ".xz"), "wb", preset=6) as dst:
                dst.write(src.read())
            p.unlink()


class RecordingWriter:
    """Appends records to a recording directory; thread-safe, one flush per record.

    Flushing every line costs little at lab rates and means a crash loses at most the line in flight.
    """

    def __init__(
        self, path: str | os.PathLike[str], meta: Mapping[str, Any] | None = None, *, merge_existing: bool = False
    ) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._files: dict[str, IO[str]] = {}
        self.counts: dict[str, int] = {}
        self._meta: dict[str, Any] = {"format": FORMAT_NAME, "version": FORMAT_VERSION}
        existing = self.path / "meta.json"
        if merge_existing and existing.is_file():
            self._meta.update(json.loads(existing.read_text()))
        self.update_meta(meta or {})

    def update_meta(self, extra: Mapping[str, Any]) -> None:
        with self._lock:
            self._meta.update(extra)
            self._meta["format"], self._meta["version"] = FORMAT_NAME, FORMAT_VERSION
            tmp = self.path / "meta.json.tmp"
            tmp.write_text(json.dumps(self._meta, indent=2, sort_keys=True) + "\n")
            tmp.replace(self.path / "meta.json")

    def append(self, stream: str, record: Mapping[str, Any]) -> None:
        if stream not in STREAMS:
            raise ValueError(f"unknown stream {stream!r}")
        line = json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n"
        with self._lock:
            f = self._files.get(stream)
            if f is None:
                f = self._files[stream] = open(self.path / f"{stream}.jsonl", "a", encoding="utf-8")
            f.write(line)
            f.flush()
            self.counts[stream] = self.counts.get(stream, 0) + 1

    def close(self) -> None:
        with self._lock:
            for f in self._files.values():
                f.close()
            self._files.clear()

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SCAN: Final[Callable[[str, int], tuple[Any, int]]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_WS: Final[Callable[[str, int], re.Match[str]]] = json.decoder.WHITESPACE.match  # type: ignore[attr-defined]
# (the C scanner behind json.loads with default settings, and the whitespace it skips)


def _loads(raw: str) -> Any:
    """`json.loads(raw)` for one line, same result and errors, without its three Python layers per call (a
    recording's reader decodes ~100,000 lines a second of replay)."""
    if raw.startswith("\ufeff"):
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", raw, 0)
    try:
        obj, end = _SCAN(raw, _WS(raw, 0).end())
    except StopIteration as err:
        raise json.JSONDecodeError("Expecting value", raw, err.value) from None
    end = _WS(raw, end).end()
    if end != len(raw):
        raise json.JSONDecodeError("Extra data", raw, end)
    return obj


@dataclass
class StreamReadStats:
    records: int = 0
    skipped: int = 0
    skipped_examples: list[str] = field(default_factory=list)


class Recording:
    """Read side of a recording directory. Accepts `<stream>.jsonl`, `.jsonl.gz` or `.jsonl.xz`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        meta_path = self.path / "meta.json"
        if not meta_path.is_file():
            raise RecordingError(f"{self.path}: no meta.json; not an attrib recording")
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError) as e:
            raise RecordingError(f"{meta_path}: unreadable meta.json ({e})") from e
        if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
            raise RecordingError(f"{meta_path}: format is not {FORMAT_NAME!r}")
        version = meta.get("version")
        if not isinstance(version, int):
            raise RecordingError(f"{meta_path}: version missing or not an integer")
        if version > FORMAT_VERSION:
            raise RecordingVersionError(
                f"{self.path}: recording format version {version} is newer than this attrib-agent reads "
                f"(up to {FORMAT_VERSION}); upgrade attrib-agent"
            )
        self.meta: dict[str, Any] = meta
        self.stats: dict[str, StreamReadStats] = {}

    def stream_file(self, stream: str) -> Path | None:
        for name in (f"{stream}.jsonl", f"{stream}.jsonl.gz", f"{stream}.jsonl.xz"):
            p = self.path / name
            if p.is_file():
                return p
        return None

    def has(self, stream: str) -> bool:
        return self.stream_file(stream) is not None

    def records(self, stream: str) -> Iterator[dict[str, Any]]:
        """Yield the stream's records in file order; malformed lines are counted, not raised."""
        stats = self.stats[stream] = StreamReadStats()
        p = self.stream_file(stream)
        if p is None:
            return
        opener: Any = {".gz": gzip.open, ".xz": lzma.open}.get(p.suffix, open)
        lineno = 0
        scan = _SCAN
        with opener(p, "rt", encoding="utf-8", errors="replace") as f:
            lines = enumerate(f, 1)
            try:
                for lineno, raw in lines:
                    try:
                        # The usual line, one value from its first character to its newline, is read by the scanner
                        # alone; any other (blank, leading blank, BOM, trailing data) goes through `_loads` for its
                        # error. (A blank line makes the scanner stop at once: it is looked at only then.)
                        try:
                            rec, end = scan(raw, 0)
                        except StopIteration:
                            end = -1
                        if end != len(raw) - 1 or raw[end] != "\n":
                            if not raw or raw.isspace():
                                continue
                            rec = _loads(raw)
                        ts = rec.get("ts") if type(rec) is dict else None
                        if (type(ts) is not float and not isinstance(ts, int | float)) or ts != ts:
                            raise ValueError("not an object with a numeric ts")  # (NaN has no place in receipt order)
                    except (ValueError, RecursionError) as e:  # RecursionError: nested too deep for the scanner
                        self._skip(stats, f"{p.name}:{lineno}: "
                                          f"{type(e).__name__ if isinstance(e, RecursionError) else e}")
                        continue
                    stats.records += 1
                    yield rec
            except (OSError, EOFError, lzma.LZMAError, zlib.error) as e:
                # A torn or damaged compressed stream (a recorder killed mid-write): keep what came before.
                self._skip(stats, f"{p.name}:{lineno + 1}: damaged {p.suffix} stream ({type(e).__name__})")

    @staticmethod
    def _skip(stats: StreamReadStats, example: str) -> None:
        stats.skipped += 1
        if len(stats.skipped_examples) < 5:
            stats.skipped_examples.append(example)
