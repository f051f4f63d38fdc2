"""The live agent tells its log parser of each span (vLLM logs no line for a normal finish), so the parser's id
memory follows the requests in flight (sources/log/parser.RequestIds)."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from attrib_agent.agent.live import LiveAgent
from attrib_agent.config.load import add_run_arguments, load_config
from attrib_agent.events import RequestSpan
from attrib_agent.sources.log.source import NAME as LOG_NAME
from attrib_agent.sources.log.source import LogSource

PREFIX = "(APIServer pid=7) INFO 11-22 00:29:19 [serving.py:1] "


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
