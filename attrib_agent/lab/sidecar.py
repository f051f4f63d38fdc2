"""The agent as a real sidecar process beside the lab's vLLM (for the demo and the end-to-end tests).

It runs `attrib-agent run` in its own process, at a lower CPU priority than the load client so that the
lateness check still guards the measurements, tails vLLM's log file, scrapes /metrics, and receives vLLM's
spans: the lab's capture process forwards every OTLP export to the agent's OTLP/HTTP port.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx

from attrib_agent.lab.server import LabEndpoints, LabError, free_port, kill_group, stop_group

T = TypeVar("T")


@dataclass
class AgentProcess:
    endpoints: LabEndpoints
    args: list[str]
    log_path: Path
    api_url: str
    otlp_http_port: int
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(["nice", "-n", "10", sys.executable, "-m", "attrib_agent", *self.args],
                                     stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                                     start_new_session=True)
        log.close()
        healthy = wait_healthy(self.proc, self.api_url, timeout_s)
        if healthy:
            self._forward(f"http://127.0.0.1:{self.otlp_http_port}/v1/traces")
            return
        if self.proc.poll() is not None:
            raise LabError(f"attrib-agent run exited with {self.proc.returncode}; see {self.log_path}")
        self.stop()
        raise LabError(f"attrib-agent did not answer /healthz within {timeout_s:.0f} s; see {self.log_path}")

    def _forward(self, url: str | None) -> None:
        forward_spans(self.endpoints.capture_url, url)

    def kill(self) -> None:
        """SIGKILL: no chance to flush anything (the journal test's crash)."""
        kill_group(self.proc)

    def stop(self) -> int | None:
        with contextlib.suppress(Exception):
            self._forward(None)
        return stop_group(self.proc)


def forward_spans(capture_url: str, url: str | None) -> None:
    """Have the lab's capture process send every OTLP export from vLLM on to `url` too (None: stop)."""
    with httpx.Client(trust_env=False, timeout=5.0) as c:
        c.post(f"{capture_url}/lab/forward", json={"url": url}).raise_for_status()


def poll_until(fn: Callable[[], T], timeout_s: float, every_s: float = 0.5) -> T:
    """Call `fn` every `every_s` until it returns something truthy or `timeout_s` passes; its last answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every_s)


def wait_healthy(proc: subprocess.Popen[bytes], api_url: str, timeout_s: float, poll_s: float = 0.1) -> bool:
    """Poll the agent's /healthz until it answers 200 (True), the process exits or `timeout_s` passes (False)."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(trust_env=False, timeout=2.0) as c:
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if c.get(f"{api_url}/healthz").status_code == 200:
                    return True
            time.sleep(poll_s)
    return False


@contextlib.contextmanager
def agent_beside(endpoints: LabEndpoints, workdir: Path, *, api_port: int | None = None,
                 journal_dir: Path | None = None, otlp_export: str | None = None,
                 extra_args: Sequence[str] = (), env: dict[str, str] | None = None) -> Iterator[AgentProcess]:
    """`attrib-agent run` beside the lab's vLLM until the block ends (its output in workdir/agent.log)."""
    workdir.mkdir(parents=True, exist_ok=True)
    api = api_port or free_port()
    otlp = free_port()
    args = ["run", "--vllm-url", endpoints.vllm_url, "--log-file", endpoints.server_log,
            "--otlp-http-port", str(otlp), "--otlp-grpc-port", "0", "--listen", f"127.0.0.1:{api}",
            "--metrics-interval-s", "0.25"]
    if journal_dir is not None:
        args += ["--journal-dir", str(journal_dir)]
    if otlp_export is not None:
        args += ["--otlp-export", otlp_export]
    agent = AgentProcess(endpoints, [*args, *extra_args], workdir / "agent.log", f"http://127.0.0.1:{api}", otlp,
                         env=dict(env or {}))
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()
