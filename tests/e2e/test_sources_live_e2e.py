"""All live sources at once beside a real vLLM, checked against the recording of the same run."""

import asyncio
import contextlib

import httpx
import uvicorn

from attrib_agent.events import EngineStep, MetricsSnapshot, RequestReceived, RequestSpan
from attrib_agent.health import SourceHealth
from attrib_agent.lab.record import record_run
from attrib_agent.lab.server import free_port
from attrib_agent.lab.workload import get_scenario
from attrib_agent.recording import CLIENT, Recording
from attrib_agent.sources.log.parser import LogLineParser
from attrib_agent.sources.log.tailer import LogFollower
from attrib_agent.sources.metrics.poller import MetricsPoller
from attrib_agent.sources.nvml.sampler import NvmlSampler
from attrib_agent.sources.otlp.http_receiver import otlp_http_app
from attrib_agent.sources.replay import ReplaySource


async def _live_run(lab, out):
    events: list = []
    stop = asyncio.Event()
    otlp_health = SourceHealth("otlp")
    port = free_port()
    app = otlp_http_app(lambda res: events.extend(res.spans), health=otlp_health)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    tasks = [asyncio.create_task(server.serve())]
    poller = MetricsPoller(f"{lab.vllm_url}/metrics", interval_s=0.25)
    follower = LogFollower(lab.server_log, from_start=False)
    parser = LogLineParser(SourceHealth("log"))
    nvml = NvmlSampler()

    async def follow() -> None:
        async for ts, line in follower.lines():
            events.extend(parser.parse_all(line, ts))

    tasks += [asyncio.create_task(poller.run(events.append, stop)), asyncio.create_task(follow())]
    if nvml.start():
        tasks.append(asyncio.create_task(nvml.run(events.append, stop)))
    async with httpx.AsyncClient(trust_env=False) as c:
        while not server.started:
            await asyncio.sleep(0.05)
        await c.post(f"{lab.capture_url}/lab/forward", json={"url": f"http://127.0.0.1:{port}/v1/traces"})
        try:
            res = await asyncio.to_thread(record_run, lab, get_scenario("smoke"), out, compress=False,
                                          attempts=5)
            await asyncio.sleep(1.0)  # the last log lines and a last scrape
        finally:
            await c.post(f"{lab.capture_url}/lab/forward", json={"url": None})
            stop.set()
            follower.close()
            server.should_exit = True
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait_for(t, 10)
            await poller.aclose()
    return res, events, otlp_health, poller.health, parser.health, nvml


def test_all_live_sources_agree_with_the_recording(lab, tmp_path):
    out = tmp_path / "rec"
    res, events, otlp_health, metrics_health, log_health, nvml = asyncio.run(_live_run(lab, out))
    rec = Recording(out)
    ids = {c["vllm_request_id"] for c in rec.records(CLIENT)}

    # A late attempt is repeated with a new run tag; the live sources saw every attempt, the recording the last.
    tag = rec.meta["run_tag"]
    spans = [e for e in events if isinstance(e, RequestSpan) and e.request_id.split("-")[1] == tag]
    assert sorted(s.request_id for s in spans) == sorted(ids)  # one span per completed request, no more
    assert otlp_health.ok_total >= 1 and not otlp_health.skipped

    received = {e.request_id for e in events if isinstance(e, RequestReceived)}
    assert ids <= received
    live_steps = {(e.iteration, e.context_tokens, e.generation_tokens, e.elapsed_ms)
                  for e in events if isinstance(e, EngineStep)}
    replayed = [e for e in ReplaySource(out).events() if isinstance(e, EngineStep)]
    assert len(replayed) > 20
    assert {(e.iteration, e.context_tokens, e.generation_tokens, e.elapsed_ms) for e in replayed} <= live_steps
    assert log_health.skipped["unknown_line"] == 0

    snaps = [e for e in events if isinstance(e, MetricsSnapshot)]
    assert len(snaps) >= 8 and metrics_health.ok_total == len(snaps)
    assert max(s.kv_usage or 0 for s in snaps) > 0.5
    assert not metrics_health.errors

    if nvml.unavailable_reason is not None:  # no GPU here: reported once, and the rest ran on
        assert nvml.health.errors["unavailable"] == 1
