"""`attrib-agent replay`: a recording through the same pipeline and sinks as live, driven as a user runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import polars as pl
import pytest

from attrib_agent.attribution.result_codec import to_dict
from attrib_agent.lab.server import free_port
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sources.replay import ReplaySource

RECORDINGS = Path(__file__).parents[1] / "fixtures" / "recordings"
CLI = [sys.executable, "-m", "attrib_agent"]


def pipeline_results(name: str) -> list[dict]:
    p = AttributionPipeline()
    for ev in ReplaySource(RECORDINGS / name).events():
        p.feed(ev)
    p.settle()
    return [to_dict(r) for r in sorted(p.store, key=lambda r: (r.finished_ts, r.request_id))]


@pytest.mark.parametrize("name", ["shorts", "whale1", "whale2", "preempt", "canary"])
def test_replay_json_equals_the_pipeline_fed_event_by_event(name, tmp_path):
    out = tmp_path / "results.parquet"
    proc = subprocess.run([*CLI, "replay", str(RECORDINGS / name), "--json", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    assert got == pipeline_results(name)
    for row in got:
        assert {"request_id", "ttft_s", "ttft_baseline_s", "ttft_slowdown_s", "itl_s", "itl_baseline_s",
                "itl_slowdown_s", "culprits", "unexplained_s"} <= set(row)
        for c in row["culprits"]:
            assert {"request_id", "ttft_s", "itl_s", "share", "causes", "is_whale"} <= set(c)
    table = pl.read_parquet(out)
    assert table.height == len(got) and set(table["request_id"]) == {r["request_id"] for r in got}


def test_replay_human_output_names_the_whale(tmp_path):
    proc = subprocess.run([*CLI, "replay", str(RECORDINGS / "preempt")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "(whale)" in proc.stdout and "23 requests attributed" in proc.stderr


def test_replay_of_a_directory_that_is_not_a_recording_is_a_clear_error(tmp_path):
    proc = subprocess.run([*CLI, "replay", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not a recording" in proc.stderr


def test_replay_serve_keeps_the_api_up_after_the_replay(tmp_path):
    port = free_port()
    proc = subprocess.Popen([*CLI, "replay", str(RECORDINGS / "whale2"), "--serve", "--listen", f"127.0.0.1:{port}",
                             "--duration", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        expected = {r["request_id"]: r for r in pipeline_results("whale2")}
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        body = None
        with httpx.Client(trust_env=False, timeout=5) as c:
            while time.monotonic() < deadline:
                try:
                    resp = c.get(f"{url}/v1/culprits/top", params={"window": "1h"})
                    if resp.status_code == 200 and resp.json().get("culprits"):
                        body = resp.json()
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.3)
            assert body is not None, "the API never served the replayed results"
            rid = max(expected.values(), key=lambda r: r["ttft_slowdown_s"])["request_id"]
            resp = c.get(f"{url}/v1/requests/{rid}/culprits")
            assert resp.status_code == 200 and resp.json()["culprits"] == expected[rid]["culprits"]
            assert "attrib_attributed_slowdown_seconds_total" in c.get(f"{url}/metrics").text
            assert c.get(f"{url}/healthz").status_code == 200
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)


def test_replay_serve_on_a_port_taken_stops_with_the_reason(tmp_path):
    """The API cannot listen: the replay ends at once with the reason, it does not replay unseen."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([*CLI, "replay", str(RECORDINGS / "whale2"), "--serve", "--listen",
                               f"127.0.0.1:{port}", "--duration", "60"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert f"attrib-agent: error: [Errno 98] API server cannot listen on 127.0.0.1:{port}: Address already in use" \
        in proc.stderr
    assert "Traceback" not in proc.stderr and "requests attributed" not in proc.stderr
