"""Against a real vLLM: whales slow shorts, and every raw source is recorded."""

import json
import re
import subprocess
import sys

import pytest

from attrib_agent.lab.metrics_peek import peek
from attrib_agent.lab.spans import decode_export, iter_spans, span_attr
from attrib_agent.lab.summary import group_latency, shorts, ttft_s
from attrib_agent.recording import CLIENT, LOG, METRICS, OTLP, Recording, otlp_body

CLI = [sys.executable, "-m", "attrib_agent"]
MS_STAMP = re.compile(r"\b\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3}\b")


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def recorded(lab_state, tmp_path_factory) -> dict[str, Recording]:
    root = tmp_path_factory.mktemp("rec")
    out = {}
    for scenario in ("shorts", "preempt"):
        run_cli("lab", "record", "--scenario", scenario, "--out", str(root / scenario), "--attach", str(lab_state),
                "--attempts", "5")
        out[scenario] = Recording(root / scenario)
    return out


def test_whales_slow_short_requests_at_least_5x(recorded):
    """Which shorts the whales hit depends on timing (the median moved 33-260 ms between runs); the tail does not."""
    alone = group_latency(shorts(recorded["shorts"].records(CLIENT)))
    crowded_rows = shorts(recorded["preempt"].records(CLIENT))
    crowded = group_latency(crowded_rows)
    assert alone.ok == alone.count and crowded.ok == crowded.count
    assert crowded.ttft_p95_s >= 10 * alone.ttft_p95_s, (alone, crowded)
    hit = [t for r in crowded_rows if (t := ttft_s(r)) is not None and t >= 5 * alone.ttft_p50_s]
    assert len(hit) >= 3, (alone, crowded, hit)


def test_runs_are_accepted_only_when_the_client_was_punctual(recorded):
    for rec in recorded.values():
        late = rec.meta["client_lateness"]
        assert rec.meta["accepted"] is True
        assert late["lateness_s"] <= rec.meta["max_lateness_s"]
        assert late["heartbeat_samples"] > 100
        for r in rec.records(CLIENT):
            assert r["actual_send_ts"] - r["intended_send_ts"] <= rec.meta["max_lateness_s"]


def test_every_raw_source_is_recorded(recorded):
    rec = recorded["preempt"]
    meta = rec.meta
    assert meta["format"] == "attrib-recording" and meta["version"] == 1
    assert meta["vllm_version"] == "0.32.0" and meta["block_size"] == 128 and meta["num_gpu_blocks"] > 0
    assert meta["command"].startswith("attrib-agent lab record --scenario preempt")
    clients = list(rec.records(CLIENT))
    assert {c["spec_id"] for c in clients} == {r["spec_id"] for r in meta["scenario"]["requests"]}
    for c in clients:
        assert c["status"] == "ok" and c["output_tokens"] == c["max_tokens"] == len(c["token_ts"])
    ids = {c["vllm_request_id"] for c in clients}

    # /metrics: raw bodies, several scrapes, vLLM's own series.
    scrapes = list(rec.records(METRICS))
    assert len(scrapes) >= 10
    assert max(peek(s["text"]).kv_usage for s in scrapes) > 0.5
    # logs: raw lines with millisecond stamps, request lines for every request, iteration lines.
    lines = [r["line"] for r in rec.records(LOG)]
    assert all(MS_STAMP.search(x) for x in lines if "Engine 000: Iteration(" in x)
    assert sum("Engine 000: Iteration(" in x for x in lines) > 50
    received = {m.group(1) for x in lines if (m := re.search(r"Received request (\S+): params:", x))}
    assert ids <= received
    # OTLP: raw export bodies holding one llm_request span per finished request.
    spans = {}
    for r in rec.records(OTLP):
        for s in iter_spans(decode_export(otlp_body(r), r.get("content_encoding"))):
            spans[span_attr(s, "gen_ai.request.id")] = s
    assert ids <= set(spans)
    assert all(spans[i].name == "llm_request" for i in ids)


def test_preemption_is_recorded(recorded):
    rec = recorded["preempt"]
    assert rec.meta["preemptions"] >= 1
    counters = [peek(s["text"]).preemptions for s in rec.records(METRICS)]
    assert counters[-1] > counters[0]


def test_truth_cli_runs_every_condition(lab_state, tmp_path):
    out = tmp_path / "truth"
    proc = run_cli("lab", "truth", "--scenario", "smoke", "--reps", "1", "--out", str(out), "--attach", str(lab_state),
                   "--attempts", "5")
    assert "Shapley TTFT share of w1" in proc.stdout
    truth = json.loads((out / "truth.json").read_text())
    assert truth["conditions"] == ["none", "w1"]
    assert {r["condition"] for r in truth["runs"] if r["accepted"]} == {"none", "w1"}
    slowed = 0
    for spec, s in truth["shorts"].items():
        assert set(s["conditions"]) == {"none", "w1"}, spec
        sd = s["slowdown"]["ttft_s"]
        assert sd["none"] == 0.0
        # One whale: its Shapley share is the whole slowdown.
        assert s["shapley"]["ttft_s"]["w1"] == pytest.approx(sd["w1"])
        slowed += sd["w1"] > 0.05
    assert slowed >= len(truth["shorts"]) // 2


def test_demo_prints_the_slowdown(lab_state, tmp_path):
    proc = run_cli("demo", "--scenario", "smoke", "--out", str(tmp_path / "demo"), "--attach", str(lab_state),
                   "--attempts", "5", "--listen", "127.0.0.1:0", "--duration", "0.5")
    assert "alone (0 whales)" in proc.stdout and "with-whales (1 whales)" in proc.stdout
    assert "who slowed the" in proc.stdout and "[whale]" in proc.stdout  # the agent's API named the whale
    assert (tmp_path / "demo" / "alone" / "meta.json").is_file()
    assert (tmp_path / "demo" / "with-whales" / "meta.json").is_file()
