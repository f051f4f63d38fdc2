"""examples/route_by_forecast.py: the copyable routing rule, run against two agents replayed to recorded moments
(through the real API), sends the whale to the instance without a whale and never to one that would refuse it."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import httpx
import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "route_by_forecast.py"


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("route_by_forecast", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_whale_goes_where_no_whale_runs(capsys: pytest.CaptureFixture[str]) -> None:
    mod = example()
    assert asyncio.run(mod.main(["--prompt-tokens", "6000", "--max-tokens", "600"])) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("    6000/600") and line.endswith("-> B")


def test_a_refusing_instance_is_never_chosen() -> None:
    mod = example()

    def agent(refused: bool, harm: float) -> httpx.AsyncClient:
        def handler(request: httpx.Request) -> httpx.Response:
            return httpx.Response(200, json={"forecasts": [{"refused": refused, "ttft_extra_sum_s": harm,
                                                            "own_ttft_s": None if refused else 0.5}]})
        return httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://agent")

    best, forecasts = asyncio.run(mod.choose([agent(True, 0.0), agent(False, 3.0), agent(False, 2.0)], 9000, 10))
    assert best == 2 and len(forecasts) == 3


def test_choose_passes_each_instance_the_prompts_sent_there() -> None:
    mod = example()
    bodies: list[dict[str, object]] = []

    def agent(harm: float) -> httpx.AsyncClient:
        def handler(request: httpx.Request) -> httpx.Response:
            bodies.append(json.loads(request.content))
            return httpx.Response(200, json={"forecasts": [{"refused": False, "ttft_extra_sum_s": harm,
                                                            "own_ttft_s": 0.5}]})
        return httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://agent")

    sent = [{"a": 6000}, {}]
    best, _ = asyncio.run(mod.choose([agent(1.0), agent(2.0)], 5000, 100, sent))
    assert best == 0
    assert bodies[0] == {"prompt_tokens": 5000, "max_tokens": 100, "in_flight_prompts": {"a": 6000}}
    assert bodies[1] == {"prompt_tokens": 5000, "max_tokens": 100}  # nothing sent there: no field
    many = {f"r{i}": 10 + i for i in range(mod.MAX_IN_FLIGHT_PROMPTS + 5)}
    assert list(mod.newest(many)) == [f"r{i}" for i in range(5, mod.MAX_IN_FLIGHT_PROMPTS + 5)]  # the API's limit
    with pytest.raises(ValueError):
        asyncio.run(mod.choose([agent(1.0)], 5000, 100, sent))  # one mapping per instance


def test_choose_with_in_flight_prompts_through_the_real_api() -> None:
    """The replayed whale2 agent at the second whale's arrival, asked with the first whale's prompt known: the
    real endpoint accepts the field and answers from a state that holds it."""
    mod = example()

    async def go() -> tuple[dict[str, object], dict[str, object]]:
        agents = mod._replayed_agents()
        try:
            client = agents[0][1]
            plain = await mod.forecast_of(client, 5000, 600)
            told = await mod.forecast_of(client, 5000, 600, {"no-such-request": 4000})
            return plain, told
        finally:
            for _, c in agents:
                await c.aclose()

    plain, told = asyncio.run(go())
    assert told["candidate"] == plain["candidate"] and isinstance(told["ttft_extra_sum_s"], float)
