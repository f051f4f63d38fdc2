"""examples/route_by_forecast.py: the copyable routing rule, run against two agents replayed to recorded moments
(through the real API), sends the whale to the instance without a whale and never to one that would refuse it."""

from __future__ import annotations

import asyncio
import importlib.util
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
