"""The live agent starts each source, then the API, and waits for each to be up: one that ends before it is up
stops `run` with its own error (or says it ended), rather than leaving the agent half started."""

from __future__ import annotations

import argparse
import asyncio
import socket

import pytest

from attrib_agent.agent.core import AgentCore, ServeOptions
from attrib_agent.agent.live import LiveAgent
from attrib_agent.config.load import AgentConfig, add_run_arguments, load_config
from attrib_agent.sources import registry as source_registry
from attrib_agent.sources.source import Emit, SourceContext, SourceSpec


class EndsEarly:
    """A source whose `run` ends before it is up: raising `error`, or returning when it is None."""

    name = "early"

    def __init__(self, error: Exception | None) -> None:
        self.error = error
        self.started = asyncio.Event()
        self.closed = False

    async def run(self, emit: Emit, stop: asyncio.Event) -> None:
        await asyncio.sleep(0.01)
        if self.error is not None:
            raise self.error

    async def aclose(self) -> None:
        self.closed = True


def _agent(monkeypatch: pytest.MonkeyPatch, source: EndsEarly | None, listen: str = "127.0.0.1:0",
           otlp_http_port: int = 0) -> LiveAgent:
    def build(cfg: AgentConfig, ctx: SourceContext) -> EndsEarly | None:
        return source

    # first, so it is started before the others
    monkeypatch.setattr(source_registry, "SOURCES", (SourceSpec("early", (), build), *source_registry.SOURCES))
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    args = parser.parse_args(["--vllm-url", "http://127.0.0.1:9", "--listen", listen,
                              "--otlp-grpc-port", "0", "--otlp-http-port", str(otlp_http_port)])
    return LiveAgent(load_config(args, {}))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("error", [OSError(98, "address already in use"), None])
def test_a_source_that_ends_before_it_is_up_stops_the_agent_with_its_error(monkeypatch: pytest.MonkeyPatch,
                                                                           error: Exception | None) -> None:
    source = EndsEarly(error)
    agent = _agent(monkeypatch, source)
    stop = asyncio.Event()
    with pytest.raises(OSError) as raised:
        asyncio.run(asyncio.wait_for(agent.run(stop), 30))
    if error is not None:
        assert raised.value is error
    else:
        assert str(raised.value) == "source early ended before it started"
    assert agent.api_port is None  # the API was never started
    assert source.closed  # what had started is closed before the error leaves `run`
    agent.core.shutdown()


@pytest.mark.timeout(60)
def test_an_api_that_cannot_listen_stops_the_agent_with_its_error(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = OSError(98, "address already in use")

    async def serve(self: AgentCore, opts: ServeOptions, stop: asyncio.Event, started: object = None) -> None:
        await asyncio.sleep(0.01)
        raise taken

    monkeypatch.setattr(AgentCore, "serve", serve)
    agent = _agent(monkeypatch, None)  # the built-in sources only
    stop = asyncio.Event()
    with pytest.raises(OSError) as raised:
        asyncio.run(asyncio.wait_for(agent.run(stop), 30))
    assert raised.value is taken
    assert stop.is_set()  # the pipeline and the gap watch were told to stop
    assert agent.api_port is None
    agent.core.shutdown()


@pytest.mark.timeout(60)
def test_a_taken_api_port_raises_the_agents_error_and_frees_every_port_it_had_opened(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """uvicorn's own bind logs and `sys.exit(3)`s from inside the loop (SystemExit past the agent's error path and
    its clean-up: an OTLP receiver left listening); the agent binds the socket itself and closes what it started."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with socket.socket() as probe:  # a port free now, for the OTLP/HTTP receiver (0 turns it off)
            probe.bind(("127.0.0.1", 0))
            otlp_port = probe.getsockname()[1]
        agent = _agent(monkeypatch, None, listen=f"127.0.0.1:{port}", otlp_http_port=otlp_port)
        with pytest.raises(OSError) as raised:
            asyncio.run(asyncio.wait_for(agent.run(asyncio.Event()), 30))
    assert f"API server cannot listen on 127.0.0.1:{port}" in str(raised.value)
    assert agent.otlp_http_port == otlp_port  # the OTLP/HTTP receiver had started before the API failed
    with socket.socket() as again:
        again.bind(("127.0.0.1", otlp_port))  # and it no longer listens
