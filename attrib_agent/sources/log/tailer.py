"""Follow vLLM's log file (or read stdin) as `(receipt_ts, line)` pairs, in bounded memory.

Why polling rather than inotify: it behaves the same on every filesystem and container volume, and at
0.1 s it costs nothing. The follower survives rotation (the path names a new inode: finish the old file,
then read the new one from its start), truncation (copytruncate: start again at 0), delete-and-recreate,
and holds a partial last line until its newline arrives. A line longer than `max_line_bytes` is cut: only
its first `max_line_bytes` bytes are kept, and it is counted (`line_too_long`). Lines keep a trailing "\r"
(vLLM's mark that the next line continues the same record; the parser relies on it).

Started at the end of a file (`from_start=False`, an agent restarted beside a running vLLM), the follower first
reads back for the running vLLM's start-up line with its step budget (`startup_budget_line`): it is written once,
as vLLM starts, and the agent would otherwise re-simulate with a budget guessed from the steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import IO, Final, Literal, Protocol

from attrib_agent.health import SourceHealth

logger = logging.getLogger(__name__)

READ_CHUNK_BYTES: Final = 65_536
MAX_BYTES_PER_POLL: Final = 1_048_576  # then yield what was read before reading on: bounds each batch
_Start = Literal["end", "zero", "resume"]
LOOKBACK_BYTES: Final = 16 * 2**20  # how far back from the end the start-up budget line is looked for (the
# shipped logging config rotates vllm.log at 10 MiB: the whole current file)
BUDGET_MARK: Final = b"Chunked prefill is enabled with max_num_batched_tokens="  # vllm/config/scheduler.py
# Lines every vLLM API server logs as it starts, before the budget line (vllm/entrypoints/serve/utils/api_utils.py:
# the version banner, without and with the logo, and the non-default arguments)
START_MARKS: Final = (b"vLLM server version ", b"] non-default args: ", b"\xe2\x96\x88  version ")


Seen = Literal["budget", "restart", "none"]  # what the look-back found last: a budget line, a start-up, neither


def startup_budget_line(f: IO[bytes], end: int, limit: int = LOOKBACK_BYTES, max_line_bytes: int = 65_536,
                        chunk: int = 1_048_576) -> tuple[Seen, str | None]:
    """The running vLLM's budget line in `f` before `end`: ("budget", the line) when the last start-up mark is a
    budget line; ("restart", None) when a later start-up (a vLLM restarted without `--max-num-batched-tokens`, which
    logs none) follows the last one; ("none", None) when neither is within `limit` bytes of `end` (the line may
    have been rotated out). Read backwards a chunk at a time; leaves `f`'s position anywhere."""
    lowest = max(0, end - limit)
    pos, later = end, b""  # `later`: the head of the chunk read before (the next one up), for marks across chunks
    while pos > lowest:
        start = max(lowest, pos - chunk)
        f.seek(start)
        buf = f.read(pos - start) + later
        budget = buf.rfind(BUDGET_MARK)
        restart = max(buf.rfind(m) for m in START_MARKS)
        if budget >= 0 and budget > restart:
            return "budget", _line_at(f, start + budget, end, max_line_bytes)
        if restart >= 0:
            return "restart", None
        later, pos = buf[:max(len(m) for m in (BUDGET_MARK, *START_MARKS))], start
    return "none", None


def _line_at(f: IO[bytes], offset: int, end: int, max_line_bytes: int) -> str | None:
    """The whole line holding byte `offset` (None when it is longer than `max_line_bytes`)."""
    head_from = max(0, offset - max_line_bytes)
    f.seek(head_from)
    before = f.read(offset - head_from)
    nl = before.rfind(b"\n")
    if nl < 0 and head_from > 0:
        return None
    line_start = head_from + nl + 1
    f.seek(line_start)
    line = f.read(min(max_line_bytes, end - line_start)).split(b"\n", 1)[0]
    return line.decode("utf-8", errors="replace").rstrip("\r")


class LineSplitter:
    """Bytes in, complete lines out; holds the unfinished tail, never more than `max_line_bytes` of it."""

    def __init__(self, max_line_bytes: int, health: SourceHealth) -> None:
        self.max_line_bytes = max_line_bytes
        self.health = health
        self._buf = bytearray()
        self._cut = False  # the line in progress went over the limit; the rest of it is being discarded
        self._cut_ended_cr = False

    @property
    def pending_bytes(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[str]:
        lines: list[str] = []
        start = 0
        while (nl := data.find(b"\n", start)) >= 0:
            self._hold(data[start:nl])
            lines.append(self._take())
            start = nl + 1
        self._hold(data[start:])
        return lines

    def flush(self) -> str | None:
        """The unfinished tail as a last line (its file will never grow again), or None."""
        if not self._buf and not self._cut:
            return None
        return self._take()

    def discard(self) -> None:
        """Forget the unfinished tail (its file was truncated under it)."""
        if self._buf or self._cut:
            self.health.skip("partial_line_discarded")
        self._buf.clear()
        self._cut = self._cut_ended_cr = False

    def _hold(self, piece: bytes) -> None:
        if not piece:
            return
        room = self.max_line_bytes - len(self._buf)
        if len(piece) > room:
            self._buf += piece[: max(room, 0)]
            self._cut = True
        if self._cut:
            self._cut_ended_cr = piece.endswith(b"\r")
        else:
            self._buf += piece

    def _take(self) -> str:
        line = self._buf.decode("utf-8", "replace")
        if self._cut:
            self.health.skip("line_too_long")
            if self._cut_ended_cr and not line.endswith("\r"):
                line += "\r"
        self._buf.clear()
        self._cut = self._cut_ended_cr = False
        return line


POLL_INTERVAL_S: Final = 0.1


class LogFollower:
    """Follows one log file by path, like `tail -F`, yielding each complete line with its receipt time.

    Limits of polling: a file truncated and regrown past the old offset within one poll interval looks
    unchanged (as with `tail -F`). I/O trouble is counted in `health.errors` and retried every poll.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        poll_interval_s: float = POLL_INTERVAL_S,
        max_line_bytes: int = 65_536,
        clock: Callable[[], float] = time.time,
        from_start: bool = False,
        health: SourceHealth | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.poll_interval_s = poll_interval_s
        self.clock = clock
        self.from_start = from_start
        self.health = health if health is not None else SourceHealth("log_file")
        self.splitter = LineSplitter(max_line_bytes, self.health)
        self.rotations = self.truncations = 0  # seen so far, for tests and the agent's own metrics
        self._file: IO[bytes] | None = None
        self._ident: tuple[int, int] | None = None
        self._offset = 0
        self._first_attempt = True
        self._error_kind: str | None = None  # reported once until the file is back
        self._closed = False
        self._read_back: list[tuple[float, str]] = []  # at most one line, handed out with the first poll
        self.startup_read_back = False  # the running vLLM's budget line was read back from before the end
        # what the look-back at the first open found (None: not done, or the file read from its start)
        self.startup_seen: Seen | None = None

    async def lines(self) -> AsyncIterator[tuple[float, str]]:
        """`(receipt_ts, line)` for every complete line, until close(); sleeps a poll interval when idle."""
        while not self._closed:
            batch, more = self.poll()
            for item in batch:
                yield item
            if not more:
                await asyncio.sleep(self.poll_interval_s)

    def close(self) -> None:
        self._closed = True
        self._close_file()

    def poll(self) -> tuple[list[tuple[float, str]], bool]:
        """One step: new lines (stamped when read), and whether more is waiting to be read at once."""
        out: list[tuple[float, str]] = []
        if self._file is None:
            start: _Start = "end" if self._first_attempt and not self.from_start else "resume"
            self._first_attempt = False
            if not self._open(start):
                return out, False
            out.extend(self._read_back)
            self._read_back.clear()
        if self._read(out, MAX_BYTES_PER_POLL):
            return out, True
        return out, self._check_path(out)

    def _read(self, out: list[tuple[float, str]], budget: int) -> bool:
        """Read until EOF or `budget` bytes; True when the budget ran out first."""
        f = self._file
        while f is not None and budget > 0:
            try:
                data = f.read(min(READ_CHUNK_BYTES, budget))
            except OSError as e:
                self._io_error("read_error", e)
                self._close_file()
                return False
            if not data:
                return False
            budget -= len(data)
            self._offset += len(data)
            now = self.clock()
            out.extend((now, line) for line in self.splitter.feed(data))
        return f is not None

    def _check_path(self, out: list[tuple[float, str]]) -> bool:
        """At EOF: has the path moved to a new file, or has this one shrunk? True when more is waiting."""
        try:
            st = os.stat(self.path)
            old_deleted = self._file is not None and os.fstat(self._file.fileno()).st_nlink == 0
        except FileNotFoundError:
            return False  # deleted or mid-rotation: keep the old file open, a writer may still append to it
        except OSError as e:
            self._io_error("stat_error", e)
            return False
        if self._file is None:
            return False
        if (st.st_dev, st.st_ino) != self._ident or old_deleted:
            if self._read(out, MAX_BYTES_PER_POLL):  # finish the old file first: lines written before the rename
                return True
            last = self.splitter.flush()
            if last is not None:
                out.append((self.clock(), last))
            self.rotations += 1
            logger.info("log file %s was replaced (rotated or recreated); following the new file", self.path)
            self._close_file()
            return self._open("zero") and self._read(out, MAX_BYTES_PER_POLL)
        if st.st_size < self._offset:
            self.truncations += 1
            logger.info("log file %s was truncated; reading it again from the start", self.path)
            self.splitter.discard()
            self._file.seek(0)
            self._offset = 0
            return True
        return False

    def _open(self, start: _Start) -> bool:
        """Open the path at its end, its start, or (same file as before, e.g. after a read error) where we were."""
        try:
            f = open(self.path, "rb", buffering=0)  # kept open across polls; closed by _close_file
        except FileNotFoundError as e:
            self._io_error("not_found", e)
            return False
        except OSError as e:
            self._io_error("open_error", e)
            return False
        st = os.fstat(f.fileno())
        ident = (st.st_dev, st.st_ino)
        if start == "end":
            end = f.seek(0, os.SEEK_END)
            self.startup_seen, line = startup_budget_line(f, end, max_line_bytes=self.splitter.max_line_bytes)
            if line is not None:
                self._read_back.append((self.clock(), line))
                self.startup_read_back = True
                logger.info("log file %s: read vLLM's start-up budget line back from before its end", self.path)
            self._offset = f.seek(end)
        elif start == "resume" and ident == self._ident and self._offset <= st.st_size:
            self._offset = f.seek(self._offset)
        else:
            self._offset = 0
            self.splitter.discard()
        self._file, self._ident = f, ident
        if self._error_kind is not None:
            logger.info("log file %s is readable again", self.path)
        self._error_kind = None
        self.health.success(self.clock())
        return True

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _io_error(self, kind: str, e: OSError) -> None:
        self.health.error(kind, self.clock(), type(e).__name__)
        if self._error_kind != kind:
            logger.warning("log file %s: %s (%s); retrying every %.1fs", self.path, kind, e.strerror,
                           self.poll_interval_s)
            self._error_kind = kind


class BinaryReader(Protocol):
    """What StdinLines reads: `read1` returns what is available (at most `size` bytes), b"" at EOF."""

    def read1(self, size: int = ..., /) -> bytes: ...


class StdinLines:
    """Lines from a byte stream (`sys.stdin.buffer` for `--log-stdin`), read by a daemon thread.

    At most `queue_size` lines wait between the thread and the consumer (a semaphore counts them), so a
    slow consumer slows the reader instead of growing memory. At EOF the unfinished last line is delivered.
    A slow reader must not stall vLLM, which writes its log synchronously from its API server: with `spill`
    (true while the pipe behind the reader is filling), a reader whose queue is full drops the line it holds
    instead of waiting, and counts it (`queue_full`); without it (`when_full=block`, or stdin not a pipe) it waits.
    """

    def __init__(
        self,
        stream: BinaryReader,
        *,
        max_line_bytes: int = 65_536,
        clock: Callable[[], float] = time.time,
        health: SourceHealth | None = None,
        queue_size: int = 1024,
        spill: Callable[[], bool] | None = None,
    ) -> None:
        self.stream = stream
        self.spill = spill
        self._dropping = 0  # lines dropped in the current episode of a full queue and a filling pipe
        self.clock = clock
        self.health = health if health is not None else SourceHealth("log_stdin")
        self.splitter = LineSplitter(max_line_bytes, self.health)
        self._slots = threading.Semaphore(queue_size)
        self._stop = threading.Event()

    async def lines(self) -> AsyncIterator[tuple[float, str]]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, str] | None] = asyncio.Queue()  # bounded by self._slots
        threading.Thread(target=self._reader, args=(loop, queue), name="attrib-log-stdin", daemon=True).start()
        try:
            while (item := await queue.get()) is not None:
                self._slots.release()
                yield item
        finally:
            self._stop.set()

    def close(self) -> None:
        self._stop.set()

    def _drop(self) -> None:
        """One line not delivered, so vLLM's log write does not block: counted, and said once per episode."""
        if not self._dropping:
            logger.warning("vLLM's log: the agent is behind and the pipe is half full: dropping lines until it "
                           "catches up, so vLLM is not blocked writing its log")
        self._dropping += 1
        self.health.skip("queue_full")

    def _reader(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[tuple[float, str] | None]) -> None:
        def put(item: tuple[float, str] | None) -> bool:
            while True:
                if self._dropping and item is not None:  # go on dropping until the consumer frees a slot:
                    if self._slots.acquire(blocking=False):  # waiting per line would fill the pipe again
                        break
                    self._drop()
                    return True
                if self._slots.acquire(timeout=0.05 if self.spill is not None else 0.5):
                    break
                if self._stop.is_set():
                    return False
                if item is not None and self.spill is not None and self.spill():
                    self._drop()
                    return True
            if self._dropping:
                logger.warning("vLLM's log: %d lines dropped while the agent was behind and the pipe filling "
                               "(attrib_source_skipped_total{kind=\"queue_full\"})", self._dropping)
                self._dropping = 0
            loop.call_soon_threadsafe(queue.put_nowait, item)
            return True

        try:
            while not self._stop.is_set():
                try:
                    data = self.stream.read1(READ_CHUNK_BYTES)
                except (OSError, ValueError) as e:  # ValueError: the stream was closed under us
                    self.health.error("read_error", self.clock(), type(e).__name__)
                    break
                if not data:
                    break
                now = self.clock()
                if not all(put((now, line)) for line in self.splitter.feed(data)):
                    return
            last = self.splitter.flush()
            if last is None or put((self.clock(), last)):
                put(None)
        except RuntimeError:  # the event loop closed under us: nobody is listening any more
            return
        except Exception as e:  # a bug here must end the stream, not leave its consumer waiting forever
            logger.exception("vLLM's log: the stdin reader failed")
            self.health.error("reader_failed", self.clock(), type(e).__name__)
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, None)
