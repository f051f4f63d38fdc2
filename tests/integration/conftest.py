"""A real Prometheus scraping a replayed recording: vLLM's recorded /metrics bodies and the agent replaying it.

One session-wide stack (about 25 s): Prometheus (Debian's, loopback, 1 s scrapes, the alert rules loaded)
scrapes a server replaying the `preempt` recording's vLLM /metrics bodies at recorded pace, and
`attrib-agent replay ... --speed 1 --serve`, both labelled namespace/pod as a PodMonitor would.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import chart_check
import httpx
import pytest
from prometheus_server import PrometheusServer, Target, free_port
from recorded_vllm import RecordedMetricsServer

from dashboards.prom_api import PrometheusApi

REPO = Path(__file__).resolve().parents[2]

RECORDING = REPO / "tests" / "fixtures" / "recordings" / "preempt"
RULES = REPO / "dashboards" / "rules" / "attrib-agent.rules.yml"
LABELS = {"namespace": "attrib-lab", "pod": "vllm-tiny-0"}
MODEL = "tiny"  # vLLM's model_name label in the recording
RATE_INTERVAL = "10s"
ATTRIB_AGENT = str(REPO / ".venv" / "bin" / "attrib-agent")


@pytest.fixture(scope="session")
def renderer() -> Path:
    """The Helm renderer (tools/helm_render, Go text/template + Sprig), built once per source digest."""
    if shutil.which("go") is None:
        pytest.skip("go is not installed: run scripts/setup-system.sh (Debian's golang-go and Sprig)")
    return Path(chart_check.build_renderer())


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "integration: runs real Prometheus/promtool/chromium from Debian's packages "
                                       "against replayed recordings (about 30 s)")


@dataclass
class ReplayStack:
    prometheus: PrometheusServer
    vllm: RecordedMetricsServer
    start: float  # unix time the replay started (both halves)
    end: float  # unix time the stack had scraped everything
    recording_start: float  # first receipt time in the recording (exemplars carry recorded times)

    @property
    def api(self) -> PrometheusApi:
        return self.prometheus.api

    @property
    def variables(self) -> dict[str, str]:
        return {**LABELS, "model": MODEL, "datasource": "prometheus", "trace_datasource": "tempo"}


def _metrics_status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return None


def _start(cmd: list[str], url: str, log: IO[bytes], timeout_s: float) -> subprocess.Popen[bytes] | None:
    """Start `cmd`; the process once `url` answers 200, None (process stopped) if it answers otherwise or exits."""
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        status = _metrics_status(url)
        if status == 200:
            return proc
        if status is not None:
            break
        time.sleep(0.1)
    _stop(proc)
    return None


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for(api: PrometheusApi, expr: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if api.query(expr):
            return
        time.sleep(0.5)
    raise TimeoutError(f"Prometheus never saw {expr} within {timeout_s}s")


def _wait_scraped(api: PrometheusApi, jobs: set[str], timeout_s: float) -> None:
    """The jobs' targets up in Prometheus, or fail with Prometheus's own scrape error (format, encoding ...)."""
    deadline = time.monotonic() + timeout_s
    targets: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        targets = [t for t in api.targets() if t["labels"]["job"] in jobs]
        if len(targets) == len(jobs) and all(t["health"] == "up" for t in targets):
            return
        time.sleep(0.25)
    pytest.fail("Prometheus cannot scrape: " + "; ".join(f"{t['labels']['job']}: {t['health']} {t['lastError']}"
                                                         for t in targets))


@pytest.fixture(scope="session")
def replay_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplayStack]:
    work = tmp_path_factory.mktemp("prometheus")
    vllm = RecordedMetricsServer(RECORDING)
    port = free_port()
    agent_url = f"http://127.0.0.1:{port}/metrics"
    prom = PrometheusServer(work, [Target("vllm", vllm.url, LABELS), Target("attrib-agent", agent_url, LABELS)],
                            rule_files=[RULES])
    log = open(work / "agent.log", "wb")
    agent: subprocess.Popen[bytes] | None = None
    try:
        prom.wait_ready()
        # Prometheus starts scraping ~5 s after it is ready (its discovery manager's start-up delay): wait, so
        # the scrapes cover the replay from its first second.
        _wait_scraped(prom.api, {"vllm"}, timeout_s=20)
        listen = f"127.0.0.1:{port}"
        agent = _start([ATTRIB_AGENT, "replay", str(RECORDING), "--speed", "1", "--serve", "--listen", listen,
                        "--duration", "300"], agent_url, log, timeout_s=20)
        if agent is None:
            pytest.fail(f"the agent never served {agent_url}: {(work / 'agent.log').read_text()[-3000:]}")
        vllm.start()
        start = time.time()
        _wait_scraped(prom.api, {"vllm", "attrib-agent"}, timeout_s=10)
        time.sleep(max(0.0, vllm.duration_s - (time.time() - start)))
        # The replay marks its own source successful when it has fed the last event.
        _wait_for(prom.api, 'attrib_source_success_total{source="replay"} > 0', timeout_s=30)
        time.sleep(2.5)  # two more scrapes of both targets at their final values
        yield ReplayStack(prom, vllm, start, time.time(), vllm.recording_start)
    finally:
        if agent is not None:
            _stop(agent)
        log.close()
        prom.close()
        vllm.close()
