"""The live agent tells its log parser of each span (vLLM logs no line for a normal finish), so the parser's id
memory follows the requests in flight (sources/log/parser.RequestIds)."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from attrib_agent.agent.core import AgentCore
from attrib_agent.agent.live import LiveAgent
from attrib_agent.agent.replay import replay_into, tell_spans_to_log
from attrib_agent.config.load import add_run_arguments, load_config
from attrib_agent.events import RequestSpan
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.recording import LOG
from attrib_agent.sources.log.source import NAME as LOG_NAME
from attrib_agent.sources.log.source import LogRecordParser, LogSource
from attrib_agent.sources.registry import SOURCES
from attrib_agent.sources.replay import ReplaySource
from attrib_agent.sources.source import SourceContext

PREFIX = "(APIServer pid=7) INFO 11-22 00:29:19 [serving.py:1] "
RECORDINGS = Path(__file__).parents[2] / "fixtures" / "recordings"


def test_a_span_received_live_ends_its_request_in_the_log_parser(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text("")
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    args = parser.parse_args(["--vllm-url", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--log-file", str(log),
                              "--otlp-grpc-port", "0", "--otlp-http-port", "0"])
    agent = LiveAgent(load_config(args, {}))
    sizes: list[dict[str, int]] = []

    async def main() -> None:
        stop = asyncio.Event()
        run = asyncio.create_task(agent.run(stop))
        while agent.api_port is None:
            await asyncio.sleep(0.02)
        source = next(s for s in agent.sources if s.name == LOG_NAME)
        assert isinstance(source, LogSource)
        ids = source.parser.ids
        with log.open("a") as f:
            f.write(PREFIX + "Received request cmpl-a-0: params: SamplingParams(n=1, max_tokens=8), "
                             "lora_request: None.\n")
            f.write(PREFIX + "Added request cmpl-a-0-0123abcd.\n")
        for _ in range(200):
            if ids.sizes()["in_flight"]:
                break
            await asyncio.sleep(0.02)
        sizes.append(ids.sizes())
        now = time.time()
        agent.core.submit(RequestSpan(now, "cmpl-a-0", "1" * 32, "2" * 16, now - 1, now, 0.0, 0.1, 1.0, 0.1, 0.9,
                                      1.0, 10, 8, 8))  # as the OTLP source emits it
        sizes.append(ids.sizes())
        stop.set()
        await run

    asyncio.run(main())
    assert sizes == [{"received": 0, "in_flight": 1, "ended": 0}, {"received": 0, "in_flight": 0, "ended": 1}]


def test_live_sources_and_a_replay_s_parsers_are_wired_by_one_rule_to_the_same_effect(tmp_path: Path) -> None:
    """`AgentCore.hear_spans` over every live source and over a replay's record parsers: only the log's line parser
    hears spans, once, and the same lines and span leave both parsers' id memories alike."""
    log = tmp_path / "vllm.log"
    log.write_text("")
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    args = parser.parse_args(["--vllm-url", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--log-file", str(log),
                              "--otlp-grpc-port", "0", "--otlp-http-port", "0", "--log-from", "start"])
    cfg = load_config(args, {})
    live = AgentCore.from_config(cfg, live=True)
    state = live.state
    sources = [s for spec in SOURCES
               if (s := spec.build(cfg, SourceContext(state.source, time.time, state.adopt))) is not None]
    assert len(sources) >= 3  # OTLP, metrics and the log at least
    live.hear_spans(sources)
    (source,) = [s for s in sources if isinstance(s, LogSource)]

    replayed = AgentCore(AttributionPipeline())
    replay = ReplaySource(RECORDINGS / "shorts")
    assert len(replay.parsers) >= 3
    tell_spans_to_log(replayed, replay)
    record_parser = replay.parsers[LOG]
    assert isinstance(record_parser, LogRecordParser)

    lines = [PREFIX + "Received request cmpl-a-0: params: SamplingParams(n=1, max_tokens=8), lora_request: None.",
             PREFIX + "Added request cmpl-a-0-0123abcd.", PREFIX + "Received request cmpl-b-0: params: "
             "SamplingParams(n=1, max_tokens=8), lora_request: None.", PREFIX + "Added request cmpl-b-0-4567abcd."]
    for ts, line in enumerate(lines):
        source.parser.parse_all(line, float(ts))
        record_parser({"ts": float(ts), "line": line}, float(ts))
    span = RequestSpan(9.0, "cmpl-a-0", "1" * 32, "2" * 16, 8.0, 9.0, 0.0, 0.1, 1.0, 0.1, 0.9, 1.0, 10, 8, 8)
    for core in (live, replayed):
        assert len(core.span_seen) == 1
        core.span_arrived(span)
    sizes = source.parser.ids.sizes()
    assert sizes == {"received": 0, "in_flight": 1, "ended": 1}
    assert record_parser.line_parser.ids.sizes() == sizes
    for s in sources:
        asyncio.run(s.aclose())
    live.shutdown()
    replayed.shutdown()


def test_a_core_replayed_into_again_and_again_keeps_no_finished_replay_s_parser() -> None:
    """The span listeners are bounded: each replay's log parser hears spans while it plays, not after."""
    core = AgentCore(AttributionPipeline())
    during: list[int] = []
    for _ in range(3):  # bench-mixed: ~3,100 events, progress told every 1,000
        n = asyncio.run(replay_into(core, RECORDINGS / "bench-mixed",
                                    progress=lambda _: during.append(len(core.span_seen))))
        assert n > 0 and core.span_seen == []
    assert during and set(during) == {1}
    core.shutdown()
