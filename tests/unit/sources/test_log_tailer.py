"""LogFollower and StdinLines on temporary files written with real recorded vLLM lines."""

from __future__ import annotations

import asyncio
import functools
import io
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from attrib_agent.health import SourceHealth
from attrib_agent.recording import LOG, Recording
from attrib_agent.sources.log.tailer import MAX_BYTES_PER_POLL, LineSplitter, LogFollower, StdinLines

RECORDING = Path(__file__).parents[2] / "fixtures" / "recordings" / "whale2"


@functools.cache
def real_lines() -> tuple[str, ...]:
    return tuple(r["line"] for r in Recording(RECORDING).records(LOG))


def blob(lines: tuple[str, ...] | list[str]) -> bytes:
    return "".join(x + "\n" for x in lines).encode()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_795_308_000.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


Follow = Callable[..., LogFollower]


@pytest.fixture
def follow() -> Iterator[Follow]:
    """Makes followers (fake clock unless given) and closes them after the test: each holds its file open."""
    made: list[LogFollower] = []

    def make(path: Path, **kwargs: Any) -> LogFollower:
        kwargs.setdefault("clock", FakeClock())
        made.append(LogFollower(path, **kwargs))
        return made[-1]

    yield make
    for f in made:
        f.close()


def drain(f: LogFollower) -> list[str]:
    out: list[str] = []
    more = True
    while more:
        batch, more = f.poll()
        out += [line for _, line in batch]
    return out


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as w:
        w.write(data)


def test_starts_at_end_by_default_or_at_start_on_request(tmp_path: Path, follow: Follow) -> None:
    log = tmp_path / "vllm.log"
    lines = real_lines()
    log.write_bytes(blob(lines[:10]))
    tail, head = follow(log), follow(log, from_start=True)
    assert drain(tail) == [] and drain(head) == list(lines[:10])
    append(log, blob(lines[10:20]))
    assert drain(tail) == drain(head) == list(lines[10:20])


def test_receipt_time_is_when_read(tmp_path: Path, follow: Follow) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(blob(real_lines()[:3]))
    clock = FakeClock()
    batch, more = follow(log, clock=clock, from_start=True).poll()
    assert not more and [ts for ts, _ in batch] == [batch[0][0]] * 3 and batch[0][0] <= clock.now


def test_partial_last_line_is_held_until_its_newline(tmp_path: Path, follow: Follow) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    f = follow(log)
    drain(f)
    line = real_lines()[0].encode()
    for piece in (line[:5], line[5:300], line[300:]):
        append(log, piece)
        assert drain(f) == []
    append(log, b"\n" + line[:7])
    assert drain(f) == [real_lines()[0]] and f.splitter.pending_bytes == 7


def test_utf8_split_across_writes_and_carriage_return_kept(tmp_path: Path, follow: Follow) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"")
    f = follow(log)
    drain(f)
    data = (real_lines()[0] + " é\r\n").encode()
    append(log, data[:-3])  # ends inside the two-byte "é"
    assert drain(f) == []
    append(log, data[-3:])
    assert drain(f) == [real_lines()[0] + " é\r"]


def test_rotation_finishes_the_old_file_then_reads_the_new_one(tmp_path: Path, follow: Follow) -> None:
    log, lines = tmp_path / "vllm.log", real_lines()
    log.write_bytes(blob(lines[:5]))
    f = follow(log, from_start=True)
    assert drain(f) == list(lines[:5])
    with open(log, "ab") as writer:  # vLLM still holds the old file while it is renamed
        log.rename(tmp_path / "vllm.log.1")
        writer.write(blob(lines[5:8]) + lines[8].encode())  # ... and its last line has no newline
    log.write_bytes(blob(lines[9:12]))
    assert drain(f) == list(lines[5:12]) and f.rotations == 1
    append(log, blob(lines[12:14]))
    assert drain(f) == list(lines[12:14])


def test_truncation_restarts_at_zero(tmp_path: Path, follow: Follow) -> None:
    log, lines = tmp_path / "vllm.log", real_lines()
    log.write_bytes(blob(lines[:20]) + lines[20].encode()[:30])
    f = follow(log, from_start=True)
    assert drain(f) == list(lines[:20])
    with open(log, "r+b") as w:  # copytruncate
        w.truncate(0)
    append(log, blob(lines[21:23]))
    assert drain(f) == list(lines[21:23])
    assert f.truncations == 1 and f.health.skipped["partial_line_discarded"] == 1


def test_delete_and_recreate(tmp_path: Path, follow: Follow) -> None:
    log, lines = tmp_path / "vllm.log", real_lines()
    log.write_bytes(blob(lines[:3]))
    f = follow(log, from_start=True)
    assert drain(f) == list(lines[:3])
    log.unlink()
    assert drain(f) == [] and not f.health.errors  # gone for now: the old file stays open
    log.write_bytes(blob(lines[3:6]))
    assert drain(f) == list(lines[3:6]) and f.rotations == 1


def test_missing_file_is_counted_then_read_from_its_start(
    tmp_path: Path, follow: Follow, caplog: pytest.LogCaptureFixture
) -> None:
    log, lines = tmp_path / "vllm.log", real_lines()
    f = follow(log)
    for _ in range(3):
        assert drain(f) == []
    assert f.health.errors["not_found"] == 3 and not f.health.up
    assert caplog.text.count("not_found") == 1  # warned once, counted every time
    log.write_bytes(blob(lines[:4]))  # appeared after we started: all of it is new
    assert drain(f) == list(lines[:4]) and f.health.up


def test_long_line_is_cut_and_counted_without_keeping_the_rest(tmp_path: Path, follow: Follow) -> None:
    log, lines = tmp_path / "vllm.log", real_lines()
    received = next(x for x in lines if "Received request" in x)
    step = next(x for x in lines if "Iteration(" in x)
    limit = len(step) + 10
    assert len(received) > 2 * limit
    log.write_bytes(b"")
    f = follow(log, max_line_bytes=limit)
    drain(f)
    data = (received + "\r\n").encode()
    for i in range(0, len(data), 64):  # arrives in pieces: never more than the limit held
        append(log, data[i:i + 64])
        assert drain(f) == [] or i + 64 >= len(data)
        assert f.splitter.pending_bytes <= limit
    append(log, blob([step]))
    assert drain(f) == [step] and f.splitter.pending_bytes == 0
    whole = follow(tmp_path / "whole.log", max_line_bytes=limit, from_start=True)
    (tmp_path / "whole.log").write_bytes(data + blob([step]))
    assert drain(whole) == [received[:limit] + "\r", step] and whole.health.skipped == {"line_too_long": 1}


def test_one_poll_reads_a_bounded_batch(tmp_path: Path, follow: Follow) -> None:
    log = tmp_path / "vllm.log"
    data = blob(real_lines())
    log.write_bytes(data * (3 * MAX_BYTES_PER_POLL // len(data) + 1))
    f = follow(log, from_start=True)
    batch, more = f.poll()
    assert more and sum(len(x) + 1 for _, x in batch) <= MAX_BYTES_PER_POLL
    assert len(drain(f)) + len(batch) == len(real_lines()) * (3 * MAX_BYTES_PER_POLL // len(data) + 1)


def test_lines_follows_asynchronously(tmp_path: Path, follow: Follow) -> None:
    log, lines = tmp_path / "vllm.log", real_lines()
    log.write_bytes(b"")

    async def run() -> list[str]:
        f = follow(log, poll_interval_s=0.01, clock=time.time)
        got: list[str] = []

        async def write_later() -> None:
            await asyncio.sleep(0.05)
            append(log, blob(lines[:50]))

        writer = asyncio.create_task(write_later())
        async for _, line in f.lines():
            got.append(line)
            if len(got) == 50:
                f.close()
        await writer
        return got

    assert asyncio.run(asyncio.wait_for(run(), 10)) == list(lines[:50])


def test_splitter_flushes_an_unfinished_cut_line() -> None:
    s = LineSplitter(10, SourceHealth("log"))
    assert s.feed(real_lines()[0].encode()) == [] and s.pending_bytes == 10
    assert s.flush() == real_lines()[0][:10] and s.flush() is None


def test_stdin_lines_with_a_slow_consumer_and_an_unfinished_last_line() -> None:
    lines = real_lines()
    data = blob(lines) + lines[0].encode()

    async def run() -> list[str]:
        source = StdinLines(io.BytesIO(data), queue_size=2, max_line_bytes=1 << 20)
        got: list[str] = []
        async for _, line in source.lines():
            got.append(line)
            if len(got) % 100 == 0:
                await asyncio.sleep(0.01)
        return got

    assert asyncio.run(asyncio.wait_for(run(), 20)) == [*lines, lines[0]]


def test_stdin_long_line_is_cut() -> None:
    received = next(x for x in real_lines() if "Received request" in x)

    async def run() -> tuple[list[str], SourceHealth]:
        source = StdinLines(io.BytesIO(blob([received, received[:50]])), max_line_bytes=100)
        return [line async for _, line in source.lines()], source.health

    got, health = asyncio.run(asyncio.wait_for(run(), 10))
    assert got == [received[:100], received[:50]] and health.skipped == {"line_too_long": 1}


def test_stdin_reader_thread_stops_when_the_consumer_leaves() -> None:
    async def run() -> list[str]:
        source = StdinLines(io.BytesIO(blob(real_lines())), queue_size=1)
        got: list[str] = []
        async for _, line in source.lines():
            got.append(line)
            if len(got) == 2:
                break
        return got

    assert asyncio.run(asyncio.wait_for(run(), 10)) == list(real_lines()[:2])
    readers = [t for t in threading.enumerate() if t.name == "attrib-log-stdin"]
    for t in readers:
        t.join(timeout=5)
    assert not any(t.is_alive() for t in readers)
