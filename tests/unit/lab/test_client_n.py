"""The lab client with `"n"` > 1: vLLM streams each choice's chunks with that choice's own usage
(`continuous_usage_stats`), then one usage chunk summing them; the client must count every choice's tokens."""

from __future__ import annotations

import asyncio
import json

import httpx

from attrib_agent.lab.client import Clock, PlannedRequest, _one


def _stream(n: int, tokens: int) -> bytes:
    lines = []
    for k in range(1, tokens + 1):
        for i in range(n):
            lines.append({"id": "cmpl-x", "choices": [{"index": i, "text": "t"}],
                          "usage": {"prompt_tokens": 4, "completion_tokens": k, "total_tokens": 4 + k}})
    lines.append({"id": "cmpl-x", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": n * tokens}})
    return "".join(f"data: {json.dumps(x)}\n\n" for x in lines).encode() + b"data: [DONE]\n\n"


def _run(n: int) -> tuple[dict[str, object], int]:
    seen: dict[str, object] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.update(json.loads(request.content))
        return httpx.Response(200, content=_stream(n, 5))

    async def go() -> int:
        clock = Clock()
        req = PlannedRequest("p1", "par", False, "run-p1", 0.0, [1, 2, 3, 4], 5, n=n)
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as c:
            res = await _one(c, "http://vllm", "tiny", req, clock.now() - 1.0, clock)
        assert res.status == "ok" and res.n == n and len(res.token_ts) == res.output_tokens
        return res.output_tokens

    return seen, asyncio.run(go())


def test_n_gt_1_counts_every_choices_tokens_and_samples() -> None:
    body, tokens = _run(3)
    assert tokens == 15  # 3 choices x 5; counting the latest chunk's usage alone said 5
    assert body["n"] == 3 and body["temperature"] == 1.0 and isinstance(body["seed"], int)  # vLLM: no n>1 greedy


def test_n_1_is_sent_and_counted_as_before() -> None:
    body, tokens = _run(1)
    assert tokens == 5 and "n" not in body and body["temperature"] == 0.0 and "seed" not in body
