"""The committed `vllm bench serve` recordings (tests/fixtures/README.md): accepted runs with the probe's
lateness, the client's own `/tokenize` call left in, continuous mixed traffic with whales mid-stream, and
shared-prefix traffic whose prefix cache hits are at least half the prompt tokens (vLLM's own counters)."""

from __future__ import annotations

import pytest

from attrib_agent.lab.bench import traffic_figures
from attrib_agent.recording import LOG, METRICS, OTLP, Recording

NAMES = ["bench-mixed", "bench-prefix"]


@pytest.fixture(scope="module", params=NAMES)
def rec(request, fixtures_dir):
    return Recording(fixtures_dir / "recordings" / request.param)


@pytest.fixture(scope="module")
def traffic(fixtures_dir):
    return {n: traffic_figures(Recording(fixtures_dir / "recordings" / n)) for n in NAMES}


def test_accepted_runs_of_vllm_bench_serve_with_the_probes_lateness(rec):
    m = rec.meta
    assert m["accepted"] is True and m["vllm_version"] == "0.32.0"
    assert m["command"].startswith("attrib-agent lab bench ") and m["client"]["name"] == "vllm bench serve"
    late = m["client_lateness"]
    assert late["source"] == "probe" and late["heartbeat_samples"] > 100
    assert late["lateness_s"] <= m["max_lateness_s"]
    assert m["spans_seen"] >= m["spans_expected"] > 0


def test_every_stream_parses(rec):
    for stream in (LOG, METRICS, OTLP):
        assert sum(1 for _ in rec.records(stream)) > 0
        assert rec.stats[stream].skipped == 0, rec.stats[stream].skipped_examples


def test_the_clients_tokenize_call_is_in_the_log_and_never_ran(traffic):
    for name, t in traffic.items():
        assert any(r.startswith("tokenize-") for r in t["received_without_span"]), (name, t)


def test_mixed_is_continuous_four_shapes_with_whales_mid_stream(fixtures_dir, traffic):
    t = traffic["bench-mixed"]
    assert t["requests"] >= 100 and t["duration_s"] >= 60.0, t
    meta = Recording(fixtures_dir / "recordings" / "bench-mixed").meta
    assert {"siso", "silo", "liso", "lilo"} <= set(meta["dataset"]["by_class"])
    mid = [at for at in t["long_prompts_at_s"] if 0.2 * t["duration_s"] < at < 0.8 * t["duration_s"]]
    assert len(mid) >= 2, t["long_prompts_at_s"]


def test_shared_prefix_run_hits_the_prefix_cache_for_half_the_prompt_tokens(traffic):
    t = traffic["bench-prefix"]
    assert t["requests"] >= 40 and t["prefix_hit_share"] >= 0.5, t
    assert traffic["bench-mixed"]["prefix_hit_share"] < 0.5  # random prompts: little to share
