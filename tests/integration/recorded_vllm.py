"""vLLM's /metrics for Prometheus to scrape, from a recording: its real bodies at their recorded pace.

Before `start()` the first body is served, from it on the body vLLM had served by then (the last for ever
after), byte for byte (`attrib_agent.lab.metrics_stand_in`).
"""

from __future__ import annotations

import time
from pathlib import Path

from attrib_agent.lab.metrics_stand_in import RecordedMetricsServer as _Server
from attrib_agent.recording import METRICS, Recording


class RecordedMetricsServer:
    def __init__(self, recording: Path) -> None:
        records = list(Recording(recording).records(METRICS))
        if not records:
            raise ValueError(f"{recording} holds no /metrics bodies")
        t0 = self.recording_start = float(records[0]["ts"])
        self._bodies = [(float(r["ts"]) - t0, str(r["text"]).encode("utf-8")) for r in records]
        self.duration_s = self._bodies[-1][0]
        self._server = _Server(self._bodies)
        self.url = f"{self._server.url}/metrics"

    def start(self) -> None:
        """Start the recorded clock."""
        self._server.play(self._bodies, time.monotonic())

    def close(self) -> None:
        self._server.stop()
