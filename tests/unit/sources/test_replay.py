"""Replay runs the live parsers over real recordings, merged by receipt time."""

import asyncio
import json
import lzma
import shutil

import pytest

from attrib_agent.events import EngineStep, GpuSample, MetricsSnapshot, RequestAdded, RequestReceived, RequestSpan
from attrib_agent.recording import CLIENT, LOG, METRICS, OTLP, Recording
from attrib_agent.sources.replay import ReplaySource


@pytest.fixture(scope="module")
def preempt(fixtures_dir):
    return fixtures_dir / "recordings" / "preempt"


def test_every_input_becomes_its_events_in_time_order(preempt):
    rec = Recording(preempt)
    events = list(ReplaySource(preempt).events())
    ts = [e.ts for e in events]
    assert ts == sorted(ts)
    by_type = {}
    for e in events:
        by_type.setdefault(type(e), []).append(e)
    iteration_lines = sum("Iteration(" in r["line"] for r in rec.records(LOG))
    assert len(by_type[EngineStep]) == iteration_lines
    assert len(by_type[MetricsSnapshot]) == len(list(rec.records(METRICS)))
    client_ids = {c["vllm_request_id"] for c in rec.records(CLIENT)}
    assert {s.request_id for s in by_type[RequestSpan]} == client_ids
    assert {e.request_id for e in by_type[RequestReceived]} == client_ids
    assert {e.request_id for e in by_type[RequestAdded]} == client_ids
    assert by_type[MetricsSnapshot][-1].block_size == 128
    # the preemptions counter rose across the run
    pre = [s.preemptions_total for s in by_type[MetricsSnapshot]]
    assert pre[-1] - pre[0] == rec.meta["preemptions"]


def test_replay_is_deterministic(preempt):
    assert list(ReplaySource(preempt).events()) == list(ReplaySource(preempt).events())


def test_bad_records_are_counted_not_raised(preempt, tmp_path):
    d = tmp_path / "rec"
    shutil.copytree(preempt, d)
    for name, extra in (("metrics", {"ts": 1e12, "text": "vllm:num_requests_running{ 1 garbage"}),
                        ("otlp", {"ts": 1e12, "content_type": "application/x-protobuf", "body_b64": "AAEC/w=="})):
        p = d / f"{name}.jsonl.xz"
        data = lzma.decompress(p.read_bytes()) + (json.dumps(extra) + "\n").encode() + b'{"ts": 5, "trunc'
        p.write_bytes(lzma.compress(data))
    src = ReplaySource(d)
    events = list(src.events())
    assert len([e for e in events if isinstance(e, MetricsSnapshot)]) == len(list(Recording(preempt).records(METRICS)))
    assert src.health[METRICS].skipped["malformed"] == 1 and src.health[METRICS].skipped["malformed_record"] == 1
    assert src.health[OTLP].skipped["malformed"] == 1 and src.health[OTLP].skipped["malformed_record"] == 1


def test_nvml_samples_replay(tmp_path, preempt):
    d = tmp_path / "rec"
    shutil.copytree(preempt, d)
    sample = {"ts": 1.0, "gpu": 0, "uuid": "GPU-x", "memory_used_bytes": 1, "memory_total_bytes": 2,
              "memory_util_pct": 3.0, "dram_bw_util_pct": None, "future": True}
    (d / "nvml.jsonl").write_text(json.dumps(sample) + "\n")
    events = list(ReplaySource(d).events())
    assert events[0] == GpuSample(1.0, 0, "GPU-x", 1, 2, 3.0, None)


def test_paced_play_follows_recorded_time(preempt):
    now = [0.0]
    slept = []

    async def fake_sleep(s):
        slept.append(s)
        now[0] += s

    got = []
    src = ReplaySource(preempt)
    n = asyncio.run(src.play(got.append, speed=4.0, sleep=fake_sleep, clock=lambda: now[0]))
    assert n == len(got) > 0
    span = got[-1].ts - got[0].ts
    assert now[0] == pytest.approx(span / 4.0, rel=1e-6)
    with pytest.raises(ValueError):
        asyncio.run(ReplaySource(preempt).play(got.append, speed=0))


def test_canary_prompt_text_survives_no_source(fixtures_dir, caplog):
    """A real recording at DEBUG with canary prompts: the raw log holds the text, no parser output may."""
    import logging

    path = fixtures_dir / "recordings" / "canary"
    canary = Recording(path).meta["canary"]
    raw = "".join(r["line"] for r in Recording(path).records(LOG))
    assert raw.count(canary) >= 8  # the recording really carries it (prompt, body, per request)
    with caplog.at_level(logging.DEBUG):
        src = ReplaySource(path)
        events = list(src.events())
    assert any(isinstance(e, RequestSpan) for e in events) and any(isinstance(e, EngineStep) for e in events)
    assert canary not in repr(events)
    assert canary not in repr(src.health)
    assert canary not in caplog.text
    assert src.health[LOG].skipped["content_dropped"] >= 8
