"""`attrib-agent run --log-stdin` widens the pipe vLLM writes its log into (sources/log/pipe.py): vLLM logs from
its API server's event loop, so with the kernel's 64 KiB pipe an agent that stalls for half a second would stop
vLLM receiving requests. Driven through the real command, the pipe read from the writer's side."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time

import pytest

from attrib_agent.sources.log.pipe import LOG_PIPE_BYTES


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
