"""The committed recordings are real, complete, and read by the lab-side peeks."""

import re

import pytest

from attrib_agent.lab.metrics_peek import peek
from attrib_agent.lab.spans import decode_export, iter_spans, span_attr
from attrib_agent.recording import CLIENT, LOG, METRICS, OTLP, Recording, otlp_body

NAMES = ["shorts", "whale1", "whale2", "preempt"]


@pytest.fixture(scope="module", params=NAMES)
def rec(request, fixtures_dir):
    return Recording(fixtures_dir / "recordings" / request.param)


def test_recordings_are_accepted_real_runs_with_their_command(rec):
    m = rec.meta
    assert m["accepted"] is True and m["vllm_version"] == "0.32.0"
    assert m["command"].startswith(f"attrib-agent lab record --scenario {m['scenario']['name']} ")
    assert m["client_lateness"]["lateness_s"] <= m["max_lateness_s"]
    assert m["spans_missing"] == []


def test_every_stream_present_and_consistent(rec):
    clients = list(rec.records(CLIENT))
    ids = {c["vllm_request_id"] for c in clients}
    assert len(clients) == len(rec.meta["scenario"]["requests"])
    spans = set()
    for r in rec.records(OTLP):
        # Other spans (vLLM's start-up instrumentation: "Worker init", "Load model", ...) may ride along.
        spans |= {span_attr(s, "gen_ai.request.id") for s in iter_spans(decode_export(otlp_body(r)))
                  if s.name == "llm_request"}
    assert ids == spans
    lines = [r["line"] for r in rec.records(LOG)]
    received = {m.group(1) for x in lines if (m := re.search(r"Received request (\S+): params", x))}
    assert ids <= received
    scrapes = [peek(r["text"]) for r in rec.records(METRICS)]
    assert scrapes[-1].block_size == rec.meta["block_size"] == 128
    assert scrapes[-1].num_gpu_blocks == rec.meta["num_gpu_blocks"]
    for stream in (CLIENT, LOG, METRICS, OTLP):
        assert rec.stats[stream].skipped == 0


def test_null_run_has_no_pressure_and_preempt_run_preempts(fixtures_dir):
    null = Recording(fixtures_dir / "recordings" / "shorts")
    assert max(peek(r["text"]).kv_usage for r in null.records(METRICS)) < 0.2
    assert null.meta["preemptions"] == 0
    pre = Recording(fixtures_dir / "recordings" / "preempt")
    assert pre.meta["preemptions"] >= 1
    counters = [peek(r["text"]).preemptions for r in pre.records(METRICS)]
    assert counters[-1] - counters[0] == pre.meta["preemptions"]


def test_fixtures_stay_small(fixtures_dir):
    """A clone stays quick: 9.5 MiB holds the 8 recordings and 11 counterfactual truths (continuous, shared-prefix,
    mid-stream preemption added 2.8 MB; the held-out whale1, mixed and kvpair 1.4 MB, 7.2 MiB in all; whale2-b4096,
    held out on a 4,096-token budget, 0.8 MB more: 8.6 MiB; continuous-b1024, held out on a 1,024-token budget and a
    48 MiB pool, 1.5 MiB more: 9.4 MiB); a truth bigger than ~1.5 MB should be made with fewer or shorter runs."""
    files = [p for p in fixtures_dir.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) <= 9.5 * 1024 * 1024
    for truth in (fixtures_dir / "truth").iterdir():
        assert sum(p.stat().st_size for p in truth.rglob("*") if p.is_file()) <= 1.6 * 1024 * 1024, truth.name


def test_each_recording_can_be_remade_by_its_command(rec):
    """The meta's command names a scenario that still sends what the recording's client stream holds."""
    from attrib_agent.lab.record import scenario_meta
    from attrib_agent.lab.workload import get_scenario

    keys = ("spec_id", "class", "offset_s", "is_whale", "prompt_tokens", "output_tokens")
    name = rec.meta["command"].split("--scenario ")[1].split()[0]
    now = {r["spec_id"]: tuple(r[k] for k in keys) for r in scenario_meta(get_scenario(name))["requests"]}
    sent = {c["spec_id"]: (c["spec_id"], c["klass"], None, c["is_whale"], c["prompt_tokens"], c["max_tokens"])
            for c in rec.records(CLIENT)}
    t0 = min(c["intended_send_ts"] for c in rec.records(CLIENT)) - min(r[2] for r in now.values())
    offsets = {c["spec_id"]: c["intended_send_ts"] - t0 for c in rec.records(CLIENT)}
    assert {k: v[:2] + v[3:] for k, v in now.items()} == {k: v[:2] + v[3:] for k, v in sent.items()}
    assert all(abs(offsets[k] - v[2]) < 0.01 for k, v in now.items()), name
