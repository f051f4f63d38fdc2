"""Append-only NDJSON journal of attribution results, so a restarted agent still answers for the last hour.

One `result_codec.to_dict` record per line in segments `results-<seq>.ndjson` (and for a request that ended without
a result, aborted or skipped, `{"request_id": ..., "ended": ...}`, so a restarted agent still says so); the oldest
segments are deleted past `max_bytes` (and `max_age_s`). `append` only buffers; `flush` writes and fsyncs, and the
app calls it at least every second, so a restart loses at most the last second. A result is journaled each time it
changes (partial, then final): `load` keeps the last record per request id. Each process writes a fresh segment, so
a line torn by a kill is never glued to the next record. Only a journal that cannot be opened raises
(`JournalError`, at start); later write failures (disk full) are counted in `errors` and retried.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Final

from attrib_agent.attribution.result import AttributionResult
from attrib_agent.attribution.result_codec import to_dict
from attrib_agent.sinks.journal.segments import (
    Ended,
    Segment,
    highest_seq,
    read_segment,
    scan_segments,
    segment_path,
)

__all__ = ["JournalError", "ResultJournal"]

logger = logging.getLogger(__name__)

MIB: Final = 1024 * 1024
DEFAULT_MAX_BYTES: Final = 256 * MIB


class JournalError(Exception):
    """The journal directory cannot be created or written: raised at start, so a misconfiguration is loud."""


class ResultJournal:
    """Results on disk, bounded by bytes and age. `written_total` counts records written, `errors` failures by
    kind (`disk_full`, `io`, `encode`, `dropped`, and on load `malformed`, `truncated`, `read`).

    At most `max_buffer_bytes` of unflushed records are held; past it the oldest are dropped (counted), so a
    disk that stays full never grows the agent. Segments are `segment_bytes`, or a quarter of a `max_bytes`
    smaller than that. Call `load` before writing (at start): it reads the segment being written too.
    """

    def __init__(self, directory: Path | str, *, segment_bytes: int = 4 * MIB, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_age_s: float | None = None, max_buffer_bytes: int = 16 * MIB,
                 clock: Callable[[], float] = time.time) -> None:
        if segment_bytes < 1 or max_bytes < 1 or max_buffer_bytes < 1:
            raise ValueError("segment_bytes, max_bytes and max_buffer_bytes must be >= 1")
        if max_age_s is not None and max_age_s <= 0:
            raise ValueError("max_age_s must be > 0 (or None)")
        self.directory = Path(directory)
        # a quarter of a small bound, so dropping the oldest segment never drops most of the history
        self.segment_bytes = segment_bytes if segment_bytes <= max_bytes else max(max_bytes // 4, 1)
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.max_buffer_bytes = max_buffer_bytes
        self._clock = clock
        self.written_total = 0
        self.deleted_segments_total = 0
        self.errors: Counter[str] = Counter()
        self._pending: deque[bytes] = deque()  # encoded lines not yet written
        self._pending_bytes = 0
        self._lock = threading.Lock()  # append (the loop) against flush (may run in a worker thread)
        self._write_lock = threading.Lock()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._segments = scan_segments(self.directory)
            self._next_seq = highest_seq(self.directory) + 1
        except (OSError, ValueError) as e:  # ValueError: a NUL in the path
            msg = e.strerror if isinstance(e, OSError) and e.strerror else e
            raise JournalError(f"journal directory {self.directory} is not usable: {msg}") from None
        self._fd: int | None = None
        try:
            self._open_next()  # fails here, loudly, when the directory is not writable
        except OSError as e:
            raise JournalError(f"journal directory {self.directory} is not writable: {e.strerror or e}") from None
        self._enforce_bounds()

    # ---- writing -----------------------------------------------------------------------------------------
    def append(self, results: Iterable[AttributionResult]) -> None:
        """Buffer results for the next flush (cheap: encodes only)."""
        for r in results:
            try:
                line = (json.dumps(to_dict(r), separators=(",", ":"), allow_nan=False) + "\n").encode()
            except (TypeError, ValueError):  # a NaN or infinity is not JSON: count it rather than write junk
                self.errors["encode"] += 1
                continue
            self._buffer(line)

    def append_ended(self, ended: Iterable[tuple[str, str]]) -> None:
        """Buffer (request id, `aborted` or `skipped`) records: requests that ended without a result."""
        for rid, status in ended:
            self._buffer((json.dumps({"request_id": rid, "ended": status}, separators=(",", ":")) + "\n").encode())

    def _buffer(self, line: bytes) -> None:
        """One record's line for the next flush; past `max_buffer_bytes` the oldest are dropped (counted)."""
        with self._lock:
            self._pending.append(line)
            self._pending_bytes += len(line)
            while self._pending_bytes > self.max_buffer_bytes and len(self._pending) > 1:
                self._pending_bytes -= len(self._pending.popleft())
                self.errors["dropped"] += 1

    def flush(self) -> int:
        """Write and fsync what is buffered; the records written. A write error is counted, and the unwritten
        records go back to the buffer for the next flush, into a fresh segment."""
        with self._write_lock:
            with self._lock:
                lines = list(self._pending)
                self._pending.clear()
                self._pending_bytes = 0
            written, error = self._write(lines)
            self.written_total += written
            if error is not None:
                kind = "disk_full" if error.errno in (errno.ENOSPC, errno.EDQUOT) else "io"
                self.errors[kind] += 1
                logger.warning("journal write failed (%s): %s; retrying in a new segment", kind,
                               error.strerror or error)
                self._requeue(lines[written:])
                self._close_fd()
            try:
                self._enforce_bounds()
            except OSError as e:
                self.errors["io"] += 1
                logger.warning("journal clean-up failed: %s", e.strerror or e)
            return written

    def _write(self, lines: list[bytes]) -> tuple[int, OSError | None]:
        """Write whole lines, rotating at segment_bytes, fsync each segment touched: (lines written, error)."""
        done = 0
        try:
            while done < len(lines):
                seg = self._segments[-1] if self._segments else None
                if self._fd is None or seg is None or seg.size and seg.size + len(lines[done]) > self.segment_bytes:
                    self._open_next()
                seg, fd = self._segments[-1], self._fd
                assert fd is not None
                end, size = done, seg.size
                while end < len(lines) and (end == done or size + len(lines[end]) <= self.segment_bytes):
                    size += len(lines[end])
                    end += 1
                _write_all(fd, b"".join(lines[done:end]), seg)
                os.fsync(fd)
                seg.mtime = self._clock()
                done = end
        except OSError as e:
            return done, e
        return done, None

    def _open_next(self) -> None:
        """Start the next segment (and fsync the directory, so the new name survives a crash too)."""
        self._close_fd()
        seq = self._next_seq
        self._next_seq += 1  # also on failure: the retry takes a fresh name
        path = segment_path(self.directory, seq)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self._segments.append(Segment(seq, path, os.fstat(fd).st_size, self._clock()))
        self._fd = fd
        _fsync_dir(self.directory)

    def _requeue(self, lines: list[bytes]) -> None:
        with self._lock:
            self._pending.extendleft(reversed(lines))
            self._pending_bytes += sum(len(x) for x in lines)
            while self._pending_bytes > self.max_buffer_bytes and len(self._pending) > 1:
                self._pending_bytes -= len(self._pending.popleft())
                self.errors["dropped"] += 1

    def _enforce_bounds(self) -> None:
        """Delete empty closed segments, then the oldest past max_bytes or max_age_s (never the open one)."""
        now = self._clock()
        for seg in [s for s in self._segments[:-1] if s.size == 0]:
            seg.path.unlink(missing_ok=True)
            self._segments.remove(seg)
        while len(self._segments) > 1:
            oldest = self._segments[0]
            too_big = sum(s.size for s in self._segments) > self.max_bytes
            too_old = self.max_age_s is not None and now - oldest.mtime > self.max_age_s
            if not (too_big or too_old):
                break
            oldest.path.unlink(missing_ok=True)
            self._segments.pop(0)
            self.deleted_segments_total += 1

    # ---- reading and lifecycle ---------------------------------------------------------------------------
    def load(self, *, since_ts: float | None = None, max_results: int | None = None) -> list[AttributionResult]:
        """Every result on disk (`load_all`'s results)."""
        return self.load_all(since_ts=since_ts, max_results=max_results)[0]

    def load_all(self, *, since_ts: float | None = None, max_results: int | None = None,
                 max_ended: int = 1) -> tuple[list[AttributionResult], list[tuple[str, str]]]:
        """Every result on disk, the last record per request id, ordered by when that record was written; and the
        last `max_ended` requests that ended without a result, (id, status), oldest first.

        `since_ts` keeps results that finished at or after it, `max_results` the newest that many: what the
        agent's store would keep anyway, so a full journal never costs more memory than the store. Malformed
        and torn lines are skipped and counted; a segment that cannot be read is counted and passed over.
        """
        if max_results is not None and max_results < 1:
            raise ValueError("max_results must be >= 1 (or None)")
        found: OrderedDict[str, AttributionResult] = OrderedDict()
        ended: OrderedDict[str, str] = OrderedDict()
        for seg in scan_segments(self.directory):
            for r in read_segment(seg.path, self.errors, max_line=self.segment_bytes + MIB):
                if isinstance(r, Ended):
                    ended.pop(r.request_id, None)
                    ended[r.request_id] = r.status
                    if len(ended) > max_ended:
                        ended.popitem(last=False)
                    continue
                found.pop(r.request_id, None)
                if since_ts is not None and r.finished_ts < since_ts:
                    continue
                found[r.request_id] = r
                if max_results is not None and len(found) > max_results:
                    found.popitem(last=False)
        return list(found.values()), list(ended.items())

    @property
    def pending(self) -> int:
        """Records buffered, not yet written."""
        return len(self._pending)

    def segments(self) -> list[Path]:
        return [s.path for s in self._segments]

    def close(self) -> None:
        """Flush what is buffered and close the segment (removed if empty: restarts leave no empty files)."""
        self.flush()
        self._close_fd()
        with self._write_lock:
            if self._segments and self._segments[-1].size == 0:
                self._segments.pop().path.unlink(missing_ok=True)

    def _close_fd(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError:
                pass

    def __enter__(self) -> ResultJournal:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _write_all(fd: int, data: bytes, seg: Segment) -> None:
    """os.write may write less than asked: loop, and on a failure cut the segment back to whole lines."""
    start = seg.size
    view = memoryview(data)
    try:
        while view:
            n = os.write(fd, view)
            view = view[n:]
            seg.size += n
    except OSError:
        try:
            os.ftruncate(fd, start)
            seg.size = start
        except OSError:
            pass
        raise


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
