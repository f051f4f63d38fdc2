"""Adding a source and a sink: each is its own small class plus one registration line, and the live agent
runs them like the built-in ones (built from the settings, started, fed, flushed, closed)."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from attrib_agent.agent.live import LiveAgent
from attrib_agent.attribution.result import AttributionResult
from attrib_agent.config.load import AgentConfig, add_run_arguments, load_config
from attrib_agent.read_model import AgentState
from attrib_agent.sinks import registry as sink_registry
from attrib_agent.sinks.sink import SinkSpec
from attrib_agent.sources import registry as source_registry
from attrib_agent.sources.replay import ReplaySource
from attrib_agent.sources.source import Emit, SourceContext, SourceSpec

RECORDING = Path(__file__).resolve().parents[2] / "fixtures" / "recordings" / "whale1"


class ToySource:
    """Emits a recording's events once, as fast as the queue takes them."""

    name = "toy"

    def __init__(self, ctx: SourceContext) -> None:
        self.started = asyncio.Event()
        self.health = ctx.health(self.name)
        self.emitted = 0
        self.closed = False

    async def run(self, emit: Emit, stop: asyncio.Event) -> None:
        self.started.set()
        for ev in ReplaySource(RECORDING).events():
            emit(ev)
            self.emitted += 1
        self.health.success(0.0)
        await stop.wait()

    async def aclose(self) -> None:
        self.closed = True


class ToySink:
    name = "toy"

    def __init__(self, state: AgentState) -> None:
        self.state = state
        self.results: list[AttributionResult] = []
        self.flushes = 0
        self.shut = False

    def on_results(self, results: Sequence[AttributionResult]) -> None:
        self.results.extend(results)

    def flush(self) -> None:
        self.flushes += 1

    def shutdown(self) -> None:
        self.shut = True


BUILT: dict[str, object] = {}


def build_source(cfg: AgentConfig, ctx: SourceContext) -> ToySource:
    BUILT["source"] = ToySource(ctx)
    return BUILT["source"]  # type: ignore[return-value]


def build_sink(cfg: AgentConfig, state: AgentState) -> ToySink:
    BUILT["sink"] = ToySink(state)
    return BUILT["sink"]  # type: ignore[return-value]


@pytest.mark.timeout(60)
def test_a_toy_source_and_sink_run_with_one_registration_each(monkeypatch: pytest.MonkeyPatch) -> None:
    # The one registration line each:
    monkeypatch.setattr(source_registry, "SOURCES", (*source_registry.SOURCES, SourceSpec("toy", (), build_source)))
    monkeypatch.setattr(sink_registry, "SINKS", (*sink_registry.SINKS, SinkSpec("toy", (), build_sink)))

    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    args = parser.parse_args(["--vllm-url", "http://127.0.0.1:9", "--listen", "127.0.0.1:0",
                              "--otlp-grpc-port", "0", "--otlp-http-port", "0"])
    agent = LiveAgent(load_config(args, {}))
    sink = BUILT["sink"]
    assert isinstance(sink, ToySink)

    async def main() -> None:
        stop = asyncio.Event()
        run = asyncio.create_task(agent.run(stop))
        for _ in range(600):
            await asyncio.sleep(0.05)
            if any(r.final for r in sink.results) and not agent.core._queue.qsize():  # type: ignore[union-attr]
                break
        stop.set()
        await run

    asyncio.run(main())
    source = BUILT["source"]
    assert isinstance(source, ToySource)
    assert source.emitted > 0 and source.closed
    assert agent.state.health["toy"].ok_total == 1
    finals = [r for r in sink.results if r.final]
    assert finals and all(r.request_id for r in finals)
    assert sink.flushes >= 1 and sink.shut
    # the sink saw what the pipeline settled, and reads answers through the state
    assert all(sink.state.status(r.request_id) in ("final", "partial") for r in finals)
