"""Start Debian's `prometheus` on loopback with a throw-away config and data dir, scraping every second.

Each target is labelled with namespace/pod by relabelling, as a PodMonitor would, so the dashboards'
variables have the values they have in Kubernetes. Exemplar storage is on: the agent's slowdown histogram
carries each victim's trace_id.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from dashboards.prom_api import PrometheusApi

PROMETHEUS_BIN = shutil.which("prometheus") or "/usr/bin/prometheus"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Target:
    job: str
    url: str  # http://host:port/path
    labels: dict[str, str]


def config(targets: list[Target], rule_files: list[Path]) -> dict[str, object]:
    scrape_configs = []
    for t in targets:
        u = urlsplit(t.url)
        scrape_configs.append({
            "job_name": t.job,
            "metrics_path": u.path or "/metrics",
            "static_configs": [{"targets": [u.netloc]}],
            "relabel_configs": [{"target_label": k, "replacement": v} for k, v in sorted(t.labels.items())],
        })
    return {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in rule_files], "scrape_configs": scrape_configs}


class PrometheusServer:
    def __init__(self, workdir: Path, targets: list[Target], rule_files: list[Path] | None = None) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(json.dumps(config(targets, rule_files or []), indent=1))  # JSON is YAML
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "prometheus.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [PROMETHEUS_BIN, f"--config.file={self.config_path}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--enable-feature=exemplar-storage",
             "--storage.tsdb.retention.time=1h", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT)
        self.api = PrometheusApi(self.url)

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
            if self.api.ready():
                return
            time.sleep(0.2)
        raise TimeoutError(f"prometheus not ready after {timeout_s}s: {self.log_path.read_text()[-2000:]}")

    def close(self) -> None:
        self.api.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
