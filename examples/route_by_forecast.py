"""Route long requests to the vLLM instance they would hurt least, by each instance's attrib-agent forecast.

A router's decision, in one function (`choose`): ask every agent's POST /v1/forecast for the request, send it
where the forecast extra TTFT for the others (in flight and expected) is lowest; on a tie, where its own TTFT is
lowest. Pass `in_flight_prompts` (per instance, the prompt lengths of what you sent there and is not finished):
the agent cannot see a prompt's length before vLLM prefills it. Copy `choose` (and `newest`) into your router;
everything else here is the demo.

Against running agents (one per vLLM instance):

    .venv/bin/python examples/route_by_forecast.py --agent http://10.0.0.1:9400 --agent http://10.0.0.2:9400 \\
        --prompt-tokens 6000 --max-tokens 600 [--token-file TOKEN]

Without any (the default): two agents replayed in-process from the committed recordings to a moment, served by
the real API (instance A: the `whale2` recording as its second whale arrives, one whale decoding and shorts
arriving; instance B: the `shorts` recording midway, short requests only), and a few candidate sizes routed.

What this rule does to the short requests' TTFT, against round-robin and least-loaded routing, over two
instances of vLLM's own scheduler: `attrib-agent lab routing-study` (docs/forecast.md, "Routing example"),
which calls this file's `choose`.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "recordings"
MAX_IN_FLIGHT_PROMPTS = 1024  # POST /v1/forecast takes at most this many in_flight_prompts


async def forecast_of(client: httpx.AsyncClient, prompt_tokens: int, max_tokens: int,
                      in_flight_prompts: Mapping[str, int] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt_tokens": prompt_tokens, "max_tokens": max_tokens}
    if in_flight_prompts:
        body["in_flight_prompts"] = dict(in_flight_prompts)
    r = await client.post("/v1/forecast", json=body)
    r.raise_for_status()
    forecast: dict[str, Any] = r.json()["forecasts"][0]
    return forecast


async def choose(clients: Sequence[httpx.AsyncClient], prompt_tokens: int, max_tokens: int,
                 in_flight_prompts: Sequence[Mapping[str, int]] | None = None) -> tuple[int, list[dict[str, Any]]]:
    """(index of the instance to send the request to, every instance's forecast). A refused request (it can never
    fit there) is never sent there. `in_flight_prompts[i]`: {vLLM request id: prompt tokens} of the requests
    this router sent to instance i that have not finished (at most MAX_IN_FLIGHT_PROMPTS, the newest): the agent
    sees a prompt's length only once vLLM prefills it, so without them a whale sent a moment ago is taken
    for a median-sized request."""
    if in_flight_prompts is not None and len(in_flight_prompts) != len(clients):
        raise ValueError("in_flight_prompts needs one mapping per instance")
    known: list[Mapping[str, int] | None] = [newest(p) for p in in_flight_prompts] if in_flight_prompts else \
        [None] * len(clients)
    forecasts = await asyncio.gather(*(forecast_of(c, prompt_tokens, max_tokens, k)
                                       for c, k in zip(clients, known, strict=True)))

    def key(i: int) -> tuple[bool, float, float]:
        f = forecasts[i]
        return (f["refused"], f["ttft_extra_sum_s"], f["own_ttft_s"] if f["own_ttft_s"] is not None else 1e9)

    return min(range(len(clients)), key=key), list(forecasts)


def newest(prompts: Mapping[str, int]) -> dict[str, int]:
    """The last MAX_IN_FLIGHT_PROMPTS entries (in insertion order: the most recently sent), the endpoint's limit."""
    items = list(prompts.items())
    return dict(items[-MAX_IN_FLIGHT_PROMPTS:])


def _replayed_agents() -> list[tuple[str, httpx.AsyncClient]]:
    """Two in-process agents at recorded moments, behind the real API."""
    from attrib_agent.events import RequestReceived
    from attrib_agent.pipeline import AttributionPipeline
    from attrib_agent.read_model import AgentState
    from attrib_agent.sinks.api.app import api_app
    from attrib_agent.sources.replay import ReplaySource

    def at(name: str, stop: str | None, fraction: float = 1.0) -> AttributionPipeline:
        events = list(ReplaySource(FIXTURES / name).events())
        p = AttributionPipeline()
        for ev in events[: int(len(events) * fraction)]:
            if stop is not None and isinstance(ev, RequestReceived) and stop in ev.request_id:
                break
            p.feed(ev)
        return p

    moments = [("A: whale2, a whale decoding", at("whale2", "-w2-")), ("B: shorts only", at("shorts", None, 0.5))]
    return [(name, httpx.AsyncClient(transport=httpx.ASGITransport(app=api_app(AgentState(p))),
                                     base_url="http://agent")) for name, p in moments]


async def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agent", action="append", default=[], help="an agent's base URL (give two or more)")
    ap.add_argument("--token-file", type=Path, help="the agents' bearer token (ATTRIB_API_TOKEN)")
    ap.add_argument("--prompt-tokens", type=int, action="append", help="candidate prompt (repeatable)")
    ap.add_argument("--max-tokens", type=int, default=600)
    args = ap.parse_args(argv)
    if args.agent:
        headers = {"Authorization": f"Bearer {args.token_file.read_text().strip()}"} if args.token_file else {}
        agents = [(url, httpx.AsyncClient(base_url=url, headers=headers, timeout=5.0)) for url in args.agent]
    else:
        agents = _replayed_agents()
    sizes = args.prompt_tokens or [32, 2000, 6000]
    print(f"{'candidate':>14}  " + "  ".join(f"{name[:28]:>28}" for name, _ in agents) + "  -> route to")
    for prompt in sizes:
        best, forecasts = await choose([c for _, c in agents], prompt, args.max_tokens)
        cells = "  ".join(f"{f['ttft_extra_sum_s']:>8.3f} s harm, {f['own_ttft_s'] or 0:>5.2f} s own"
                          for f in forecasts)
        print(f"{prompt:>8}/{args.max_tokens:<5}  {cells}  -> {agents[best][0].split(':')[0]}")
    for _, c in agents:
        await c.aclose()
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
