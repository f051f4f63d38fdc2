"""/metrics through the agent's real HTTP API (AgentCore.asgi_app, its pipeline thread): the kept pipeline part is
rebuilt ahead at most every `ahead_s`, never served older than its bound (a scrape waits for the build past it),
and the live part (vLLM's gap, health, backlog) is current in every body, even one served while the pipeline
thread is in a long pass."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from attrib_agent.agent import core as core_mod
from attrib_agent.agent.core import AgentCore
from attrib_agent.events import RequestReceived
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.read_model import AgentState
from attrib_agent.sinks.api.render_cache import Renderer
from attrib_agent.sinks.prometheus.collector import registry_for, split_registries
from attrib_agent.sinks.prometheus.exposition import render

OM = {"accept": "application/openmetrics-text; version=1.0.0", "accept-encoding": "gzip"}


def _value(text: str, name: str, **labels: str) -> float | None:
    for fam in text_string_to_metric_families(text):  # type: ignore[no-untyped-call]
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def test_stale_body_bounded_and_live_series_current(monkeypatch: pytest.MonkeyPatch) -> None:
    # The bound is 3 s and each scrape may take 2.5 s: a scrape that waited for the held thread never returns, so
    # the margin only absorbs a loaded machine's stalls (1 s once failed with five benchmarks on 2 cores).
    monkeypatch.setattr(core_mod, "METRICS_STALE_S", 3.0)
    core = AgentCore(AttributionPipeline(), threaded=True)
    app = core.asgi_app(None)
    received = RequestReceived(ts=time.time(), log_ts=None, request_id="r1", max_tokens=None)

    async def main() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
            first = (await c.get("/metrics", headers=OM)).text
            assert _value(first, "attrib_events_total", kind="request_received") == 0.0
            assert _value(first, "attrib_vllm_gap_seconds") == 0.0
            await core.state.read(lambda: core.process(received))
            gate = threading.Event()
            long_pass = asyncio.ensure_future(core.state.read(gate.wait))  # the pipeline thread held
            try:
                await asyncio.sleep(0.05)
                core.state.vllm_gap_since = time.time() - 48.0
                t0 = time.monotonic()
                down = await asyncio.wait_for(c.get("/metrics", headers=OM), 2.5)
                # the kept part (before the event: the thread could not build), the gap as it is now
                assert time.monotonic() - t0 < 2.5 and down.headers["content-encoding"] == "gzip"
                assert _value(down.text, "attrib_events_total", kind="request_received") == 0.0
                assert 47.9 <= (_value(down.text, "attrib_vllm_gap_seconds") or 0.0) < 60
                core.state.vllm_gap_since = None
                closed = (await asyncio.wait_for(c.get("/metrics", headers=OM), 2.5)).text
                assert _value(closed, "attrib_vllm_gap_seconds") == 0.0 and closed.endswith("# EOF\n")
                await asyncio.sleep(3.1)  # the kept part is now older than its bound: no scrape may get it
                late = asyncio.ensure_future(c.get("/metrics", headers=OM))
                await asyncio.sleep(0.3)
                assert not late.done()
            finally:
                gate.set()
            await long_pass
            text = (await late).text
            assert _value(text, "attrib_events_total", kind="request_received") == 1.0

    try:
        asyncio.run(main())
    finally:
        core.shutdown()


def test_hot_body_rebuilt_ahead_once_per_ahead_s_not_at_every_change() -> None:
    version, now = [0], [0.0]

    async def inline(fn: Any) -> Any:
        return fn()

    async def ticks(ahead_s: float) -> int:
        r: Renderer[int] = Renderer(lambda: version[0], inline, max_age_s=1.0, serve_stale_s=5.0, ahead_s=ahead_s,
                                    clock=lambda: now[0])
        now[0] = 0.0
        await r.get("k", lambda: version[0])
        for _ in range(40):  # 10 s of refresher ticks, the state changing at every one (GPU rates)
            now[0] += 0.25
            version[0] += 1
            await r.refresh()
        return r.builds

    assert asyncio.run(ticks(0.0)) == 41
    assert asyncio.run(ticks(2.5)) == 1 + 4


def test_the_two_parts_serve_what_one_registry_serves() -> None:
    state = AgentState(AttributionPipeline(), clock=lambda: 100.0)
    state.vllm_gap_since = 90.0
    state.source("vllm_metrics").success(99.0)
    pipeline_part, live_part = split_registries(state)
    for accept, encode in (("", generate_latest), (OM["accept"], generate_openmetrics)):
        _, body = render(pipeline_part, accept, (), False, live_part)
        assert sorted(body.decode().splitlines()) == sorted(encode(registry_for(state)).decode().splitlines())
        assert body.decode().count("# EOF") == (1 if accept else 0)
    _, only = render(pipeline_part, "", ("attrib_vllm_gap_seconds",), False, live_part)
    assert only.decode().splitlines()[-1] == "attrib_vllm_gap_seconds 10.0"


def test_live_texts_kept_are_bounded_and_follow_the_values() -> None:
    from attrib_agent.sinks.prometheus.exposition import _LiveText

    now = [100.0]
    state = AgentState(AttributionPipeline(), clock=lambda: now[0])
    live = _LiveText(split_registries(state)[1], max_entries=8)
    for i in range(50):  # a gap open for longer at every scrape: that family's text changes, the others are kept
        state.vllm_gap_since = now[0] - i
        text = live.encode(OM["accept"], ()).decode()
        assert _value(text, "attrib_vllm_gap_seconds") == float(i) and text.endswith("# EOF\n")
        assert len(live._texts) <= 8


def test_gzip_body_is_one_stream_of_the_plain_body_and_keeps_only_bytes() -> None:
    """The kept part is compressed once (blocks ended byte-aligned), the live part appended at each scrape: one
    gzip member (Prometheus, curl and browsers read it), the same text as the plain body, and no compressor state
    kept per body (it was ~256 KB each)."""
    import zlib

    from attrib_agent.sinks.prometheus.exposition import _Kept, _pipeline_part

    state = AgentState(AttributionPipeline(), clock=lambda: 100.0)
    pipeline_part, live_part = split_registries(state)
    for accept in ("", OM["accept"]):
        _, plain = render(pipeline_part, accept, (), False, live_part)
        headers, zipped = render(pipeline_part, accept, (), True, live_part)
        assert (b"content-encoding", b"gzip") in headers
        d = zlib.decompressobj(31)  # a gzip stream
        assert d.decompress(zipped) == plain and d.eof and d.unused_data == b""  # one member, nothing after it
    kept = _pipeline_part(pipeline_part, OM["accept"], (), True, True)
    assert all(isinstance(getattr(kept, slot), str | bytes | int) for slot in _Kept.__slots__)
    for live in (b"", b"x" * 70_000):  # an empty live part, and one larger than deflate's window
        _, body = kept.finish(live)
        assert zlib.decompress(body, 31) == kept.text + live
