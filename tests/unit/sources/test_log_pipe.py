"""`attrib-agent run --log-stdin` widens the pipe vLLM writes its log into (sources/log/pipe.py): vLLM logs from
its API server's event loop, so with the kernel's 64 KiB pipe an agent that stalls for half a second would stop
vLLM receiving requests. Driven through the real command, the pipe read from the writer's side."""

from __future__ import annotations

import asyncio
import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

import pytest

from attrib_agent.health import SourceHealth
from attrib_agent.sources.log.pipe import LOG_PIPE_BYTES, pipe_filling
from attrib_agent.sources.log.tailer import BinaryReader, StdinLines
from tests.unit.sources.test_log_tailer import blob, real_lines


@pytest.mark.timeout(60)
def test_the_agent_widens_the_log_pipe_it_reads_from_stdin() -> None:
    r, w = os.pipe()
    default = fcntl.fcntl(w, fcntl.F_GETPIPE_SZ)
    proc = subprocess.Popen([sys.executable, "-m", "attrib_agent", "run", "--vllm-url", "http://127.0.0.1:9",
                             "--log-stdin", "--listen", "127.0.0.1:0", "--otlp-http-port", "0",
                             "--otlp-grpc-port", "0", "--no-nvml"],
                            stdin=r, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    os.close(r)
    try:
        size = default
        deadline = time.monotonic() + 40
        while size < LOG_PIPE_BYTES and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
            size = fcntl.fcntl(w, fcntl.F_GETPIPE_SZ)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
        os.close(w)
    assert default < LOG_PIPE_BYTES
    assert size >= LOG_PIPE_BYTES, err[-2000:]
    assert f"reading vLLM's log from a pipe of {size} bytes" in err


def _write_all(fd: int, data: bytes, seconds: float) -> int:
    """Write `data` to a non-blocking `fd` as vLLM's logger would, for at most `seconds`: the bytes written
    (fewer than len(data) means the writer would have blocked: vLLM's API server frozen in its log write)."""
    os.set_blocking(fd, False)
    done, deadline = 0, time.monotonic() + seconds
    while done < len(data) and time.monotonic() < deadline:
        try:
            done += os.write(fd, data[done:done + 4096])
        except BlockingIOError:
            time.sleep(0.005)
    return done


def _stalled_reader(spill: bool) -> tuple[int, SourceHealth, list[str]]:
    """A StdinLines on a real (default-sized) pipe whose consumer takes one line, then stalls while ~1.3 MB of
    real vLLM log lines are written: returns how much the writer got in, the source's health, what it delivered
    once the consumer came back."""
    r, w = os.pipe()
    lines = [x for x in real_lines() if "Iteration" in x or "request" in x] * 4
    data = blob(lines)
    reader = open(r, "rb")  # noqa: SIM115 - closed below; BufferedReader, as sys.stdin.buffer
    source = StdinLines(cast(BinaryReader, reader), queue_size=8, spill=pipe_filling(r) if spill else None)

    async def run() -> tuple[int, list[str]]:
        gen = source.lines()
        os.write(w, blob(lines[:1]))
        got = [(await anext(gen))[1]]
        written = await asyncio.to_thread(_write_all, w, data, 8.0)  # the consumer stalls meanwhile
        os.close(w)
        got += [line async for _, line in gen]
        return written, got

    try:
        written, got = asyncio.run(asyncio.wait_for(run(), 60))
    finally:
        reader.close()
    return written, source.health, got


@pytest.mark.timeout(90)
def test_a_stalled_agent_drops_lines_rather_than_block_vllms_log_writes() -> None:
    """`log_stdin_when_full=drop_newest` (the default): the writer is never blocked; the lines that did not fit
    are counted, and every line delivered is a whole real line in order."""
    written, health, got = _stalled_reader(spill=True)
    lines = [x for x in real_lines() if "Iteration" in x or "request" in x] * 4
    assert written == len(blob(lines))  # vLLM's writes all went through
    dropped = health.skipped["queue_full"]
    assert dropped > 0 and len(got) - 1 + dropped == len(lines)
    assert set(got) <= set(lines)


@pytest.mark.timeout(90)
def test_block_keeps_every_line_and_stalls_the_writer() -> None:
    """`log_stdin_when_full=block`: nothing is lost, but the writer stops once the pipe is full: what the
    default avoids."""
    r, w = os.pipe()
    capacity = fcntl.fcntl(w, fcntl.F_GETPIPE_SZ)
    os.close(r)
    os.close(w)
    written, health, got = _stalled_reader(spill=False)
    lines = [x for x in real_lines() if "Iteration" in x or "request" in x] * 4
    assert written < len(blob(lines)) and written <= capacity + 64 * 1024  # blocked near the pipe's size
    assert health.skipped["queue_full"] == 0


def test_no_spill_check_when_stdin_is_a_file(tmp_path: Path) -> None:
    """A file redirected to stdin never blocks its writer: the reader may always wait."""
    f = tmp_path / "log"
    f.write_bytes(b"x\n")
    with f.open("rb") as fh:
        assert pipe_filling(fh.fileno()) is None
    r, w = os.pipe()
    try:
        filling = pipe_filling(r)
        assert filling is not None and not filling()
        os.write(w, b"x" * (fcntl.fcntl(w, fcntl.F_GETPIPE_SZ) // 2))
        assert filling()
    finally:
        os.close(r)
        os.close(w)


def test_a_failing_reader_ends_the_stream_instead_of_hanging_its_consumer() -> None:
    """A stream that raises something unforeseen (here a raw file object without read1) is counted and ends the
    lines; the consumer is not left waiting on a dead thread."""
    r, w = os.pipe()
    os.write(w, b"x\n")
    os.close(w)
    with open(r, "rb", buffering=0) as raw:  # FileIO: no read1
        source = StdinLines(cast(BinaryReader, raw))

        async def run() -> list[str]:
            return [line async for _, line in source.lines()]

        assert asyncio.run(asyncio.wait_for(run(), 10)) == []
    assert source.health.errors["reader_failed"] == 1
