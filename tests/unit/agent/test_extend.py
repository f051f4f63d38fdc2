"""Adding a source and a sink: each is its own small class plus one registration line, and the live agent
runs them like the built-in ones (built from the settings, started, fed, flushed, closed). The toy source's
setting is one row beside it, carried by its registration: it has a flag, an ATTRIB_* variable and a TOML key
(in its own table) with nothing else to edit, and its value reaches the source."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from attrib_agent.agent.live import LiveAgent
from attrib_agent.attribution.result import AttributionResult
from attrib_agent.config import ConfigError
from attrib_agent.config import values as v
from attrib_agent.config.load import AgentConfig, add_run_arguments, load_config
from attrib_agent.config.setting import Setting
from attrib_agent.health import SourceHealth
from attrib_agent.read_model import AgentState
from attrib_agent.sinks import registry as sink_registry
from attrib_agent.sinks.sink import SinkSpec
from attrib_agent.sources import registry as source_registry
from attrib_agent.sources.replay import ReplaySource
from attrib_agent.sources.source import Emit, SourceContext, SourceSpec

RECORDING = Path(__file__).resolve().parents[2] / "fixtures" / "recordings" / "whale1"


# The toy source's one setting: a row beside it, handed over with its registration.
DELAY: Setting[float] = Setting("toy_delay_s", "toy", v.seconds(0), 0.0, "wait this long before emitting", "SECONDS",
                                live=True)


class ToySource:
    """Emits a recording's events once, `toy_delay_s` after it starts, as fast as the queue takes them."""

    name = "toy"

    def __init__(self, ctx: SourceContext, delay_s: float = DELAY.default) -> None:
        self.delay_s = delay_s
        self.started = asyncio.Event()
        self.health = ctx.health(self.name)
        self.emitted = 0
        self.closed = False

    async def run(self, emit: Emit, stop: asyncio.Event) -> None:
        self.started.set()
        await asyncio.sleep(self.delay_s)
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
    BUILT["source"] = ToySource(ctx, cfg[DELAY])
    return BUILT["source"]  # type: ignore[return-value]


def build_sink(cfg: AgentConfig, state: AgentState) -> ToySink:
    BUILT["sink"] = ToySink(state)
    return BUILT["sink"]  # type: ignore[return-value]


@pytest.mark.timeout(60)
def test_a_toy_source_and_sink_run_with_one_registration_each(monkeypatch: pytest.MonkeyPatch) -> None:
    # The one registration line each:
    register_toy_source(monkeypatch)
    monkeypatch.setattr(sink_registry, "SINKS", (*sink_registry.SINKS, SinkSpec("toy", (), build_sink)))

    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    args = parser.parse_args(["--vllm-url", "http://127.0.0.1:9", "--listen", "127.0.0.1:0",
                              "--otlp-grpc-port", "0", "--otlp-http-port", "0", "--toy-delay-s", "0.01"])
    agent = LiveAgent(load_config(args, {}))
    sink = BUILT["sink"]
    assert isinstance(sink, ToySink)

    async def main() -> None:
        stop = asyncio.Event()
        run = asyncio.create_task(agent.run(stop))
        for _ in range(600):
            await asyncio.sleep(0.05)
            if any(r.final for r in sink.results) and not agent.core.backlog().events:
                break
        stop.set()
        await run

    asyncio.run(main())
    source = BUILT["source"]
    assert isinstance(source, ToySource)
    assert source.delay_s == 0.01  # the flag of its own setting reached it
    assert source.emitted > 0 and source.closed
    assert agent.state.health["toy"].ok_total == 1
    finals = [r for r in sink.results if r.final]
    assert finals and all(r.request_id for r in finals)
    assert sink.flushes >= 1 and sink.shut
    # the sink saw what the pipeline settled, and reads answers through the state
    assert all(sink.state.status(r.request_id) in ("final", "partial") for r in finals)


def register_toy_source(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one registration line, its setting row included."""
    monkeypatch.setattr(source_registry, "SOURCES",
                        (*source_registry.SOURCES, SourceSpec("toy", (DELAY,), build_source)))


@pytest.mark.parametrize("layer", ["file", "env", "flag"])
def test_a_toy_sources_setting_reaches_it_from_every_layer(layer: str, monkeypatch: pytest.MonkeyPatch,
                                                           tmp_path: Path) -> None:
    register_toy_source(monkeypatch)
    argv, env = ["--vllm-url", "http://127.0.0.1:9"], {}
    if layer == "file":
        (tmp_path / "agent.toml").write_text("[toy]\ntoy_delay_s = 0.5\n")
        argv += ["--config", str(tmp_path / "agent.toml")]
    elif layer == "env":
        env = {"ATTRIB_TOY_DELAY_S": "0.5"}
    else:
        argv += ["--toy-delay-s", "0.5"]
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    cfg = load_config(parser.parse_args(argv), env)
    assert cfg.toy_delay_s == 0.5 and cfg.origin["toy_delay_s"].startswith(layer)
    assert ("toy_delay_s", "0.5", cfg.origin["toy_delay_s"]) in cfg.describe()
    assert not any("TOY" in w for w in cfg.warnings)  # a registered setting's variable is known
    source = build_source(cfg, SourceContext(SourceHealth, time.time, lambda health: None))
    assert source.delay_s == 0.5
    assert load_config(parser.parse_args(["--vllm-url", "http://127.0.0.1:9"]), {}).toy_delay_s == 0.0


def test_an_unregistered_toy_setting_is_unknown(tmp_path: Path) -> None:
    (tmp_path / "agent.toml").write_text("[toy]\ntoy_delay_s = 0.5\n")
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    with pytest.raises(ConfigError, match="unknown table"):
        load_config(parser.parse_args(["--config", str(tmp_path / "agent.toml")]), {})
    cfg = load_config(parser.parse_args(["--vllm-url", "http://127.0.0.1:9"]), {"ATTRIB_TOY_DELAY_S": "0.5"})
    assert any("ATTRIB_TOY_DELAY_S is not a setting" in w for w in cfg.warnings)
