"""POST /v1/forecast: what admitting these requests now would cost the requests on the engine (a thin sink).

Body: one candidate `{"prompt_tokens": N, "max_tokens": N[, "cached_prefix_tokens": N]}` or
`{"candidates": [...]}` (at most MAX_CANDIDATES, each forecast alone), optionally `"load"` (the arrivals a
router expects: `{"rate_per_s", "prompt_tokens", "max_tokens"[, "first_in_s", "mix", "cached_prefix_tokens"]}`,
`mix` a list of at most MAX_MIX `[prompt_tokens, max_tokens]` sizes taken in turn, replacing the learnt one) and
`"in_flight_prompts"` (`{request id: prompt tokens}` a router knows for requests not prefilled yet). Every
field is checked; anything else is a 400 naming the field. The forecast runs on the event loop, like the other
handlers, so it reads a consistent state; its cost is bounded by the forecast's horizon and step limit.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from attrib_agent.attribution.forecast import ArrivalLoad, Candidate
from attrib_agent.read_model import AgentState
from attrib_agent.sinks.api.plumbing import error, json_response

PATH: Final = "/v1/forecast"
MAX_BODY_BYTES: Final = 64 * 1024
MAX_CANDIDATES: Final = 16
MAX_PROMPTS: Final = 1024
MAX_TOKENS: Final = 10_000_000
_CANDIDATE_KEYS: Final = frozenset({"prompt_tokens", "max_tokens", "cached_prefix_tokens"})
MAX_MIX: Final = 64
_LOAD_KEYS: Final = frozenset({"rate_per_s", "prompt_tokens", "max_tokens", "first_in_s", "mix",
                               "cached_prefix_tokens"})


class BadForecast(ValueError):
    """The body is not a valid forecast request; the message says which field and why."""


def _int(d: Mapping[str, Any], key: str, where: str, *, required: bool = True, low: int = 1) -> int:
    if key not in d:
        if required:
            raise BadForecast(f"{where}{key} is required")
        return 0
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= MAX_TOKENS:
        raise BadForecast(f"{where}{key} must be an integer from {low} to {MAX_TOKENS}")
    return v


def _number(d: Mapping[str, Any], key: str, where: str) -> float:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1e6:
        raise BadForecast(f"{where}{key} must be a number from 0 to 1e6")
    return float(v)


def _object(v: Any, where: str, keys: frozenset[str]) -> Mapping[str, Any]:
    if not isinstance(v, dict):
        raise BadForecast(f"{where} must be a JSON object")
    unknown = sorted(set(v) - keys)
    if unknown:
        raise BadForecast(f"{where} has unknown field {unknown[0][:40]!r}; known: {', '.join(sorted(keys))}")
    return v


def parse_candidate(v: Any, where: str) -> Candidate:
    d = _object(v, where or "the body", _CANDIDATE_KEYS)
    prefix = f"{where}." if where else ""
    prompt, max_tokens = _int(d, "prompt_tokens", prefix), _int(d, "max_tokens", prefix)
    cached = _int(d, "cached_prefix_tokens", prefix, required=False, low=0)
    if cached > prompt:
        raise BadForecast(f"{prefix}cached_prefix_tokens must not exceed prompt_tokens")
    return Candidate(prompt, max_tokens, cached)


def _mix(v: Any) -> tuple[tuple[int, int], ...]:
    """load.mix: sizes of a mixed stream, `[prompt_tokens, max_tokens]` pairs taken in turn."""
    if v is None:
        return ()
    if not isinstance(v, list) or not 1 <= len(v) <= MAX_MIX:
        raise BadForecast(f"load.mix must be a list of 1 to {MAX_MIX} [prompt_tokens, max_tokens] pairs")
    out = []
    for i, pair in enumerate(v):
        if not isinstance(pair, list) or len(pair) != 2:
            raise BadForecast(f"load.mix[{i}] must be a [prompt_tokens, max_tokens] pair")
        named = dict(zip(("prompt_tokens", "max_tokens"), pair, strict=True))
        out.append((_int(named, "prompt_tokens", f"load.mix[{i}]."), _int(named, "max_tokens", f"load.mix[{i}].")))
    return tuple(out)


def parse_body(raw: bytes) -> tuple[list[Candidate], ArrivalLoad | None, dict[str, int]]:
    """(candidates, declared load or None, known prompt lengths) from the request body."""
    if len(raw) > MAX_BODY_BYTES:
        raise BadForecast(f"body larger than {MAX_BODY_BYTES} bytes")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadForecast("body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadForecast("body must be a JSON object")
    extra = {"load", "in_flight_prompts"}
    if "candidates" in body:
        top = _object(body, "the body", frozenset({"candidates", *extra}))
        cands = top["candidates"]
        if not isinstance(cands, list) or not 1 <= len(cands) <= MAX_CANDIDATES:
            raise BadForecast(f"candidates must be a list of 1 to {MAX_CANDIDATES} objects")
        candidates = [parse_candidate(c, f"candidates[{i}]") for i, c in enumerate(cands)]
    else:
        top = _object(body, "the body", _CANDIDATE_KEYS | extra)
        candidates = [parse_candidate({k: v for k, v in body.items() if k not in extra}, "")]
    load = None
    if top.get("load") is not None:
        d = _object(top["load"], "load", _LOAD_KEYS)
        load = ArrivalLoad(_number(d, "rate_per_s", "load."), _int(d, "prompt_tokens", "load."),
                           _int(d, "max_tokens", "load."),
                           _number(d, "first_in_s", "load.") if d.get("first_in_s") is not None else None,
                           _mix(d.get("mix")), _int(d, "cached_prefix_tokens", "load.", required=False, low=0))
    prompts = top.get("in_flight_prompts") or {}
    if not isinstance(prompts, dict) or len(prompts) > MAX_PROMPTS:
        raise BadForecast(f"in_flight_prompts must be an object of at most {MAX_PROMPTS} request ids")
    known = {str(k)[:256]: _int(prompts, k, "in_flight_prompts.") for k in prompts}
    return candidates, load, known


class ForecastRoute:
    """`POST /v1/forecast` answered directly, the rest to `app` (the Starlette stack): a POST is a forecast of
    ~0.5-2 ms, and the router, request object and exception layer around it cost ~0.1-0.2 ms more of the agent's
    CPU (benchmarks/forecast_latency.py). Other methods on the path (405) and a mounted app (a root path) still
    go through Starlette's route. A failure propagates as a route's does: to the app's outermost error handler."""

    def __init__(self, app: ASGIApp, answer: Callable[[bytes], Awaitable[Response]]) -> None:
        self.app, self.answer = app, answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == PATH
                and not scope.get("root_path")):
            raw = await read_body(receive)
            if raw is not None:  # None: the client left before its body came
                await (await self.answer(raw))(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def read_body(receive: Receive) -> bytes | None:
    """The request's body (None if the client disconnected first), read no further than one byte past
    MAX_BODY_BYTES: enough for `parse_body` to refuse it as too large."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        if size + len(chunk) > MAX_BODY_BYTES:
            chunks.append(chunk[:MAX_BODY_BYTES + 1 - size])
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def forecast_answer(state: AgentState, errs: Counter[str]) -> Callable[[bytes], Awaitable[Response]]:
    """The endpoint's answer to a body: the forecasts, a 400 naming what is wrong, or a 503 before any event."""

    async def answer(raw: bytes) -> Response:
        try:
            candidates, load, prompts = parse_body(raw)
        except BadForecast as exc:
            return error(400, str(exc), errs, "bad_forecast")
        got = await state.read(lambda: state.forecast(candidates, load, prompts))  # off the loop, live
        if got is None:
            return error(503, "no engine state yet: the agent has seen no events from vLLM", errs, "no_state")
        now, out = got
        cfg = state.forecast_settings.config
        return json_response({
            "engine": now.engine, "at": now.now, "running": sum(r.running for r in now.requests),
            "waiting": sum(not r.running for r in now.requests), "cost_model_fitted": state.cost_model.fitted,
            "slo": {"ttft_s": cfg.ttft_slo_s, "itl_p95_s": cfg.itl_p95_slo_s}, "horizon_s": cfg.horizon_s,
            "harmless_arrival_chance": cfg.harmless_arrival_chance,
            "forecasts": [f.as_dict() | {"harmless": f.harmless(cfg)} for f in out]})

    return answer


def forecast_routes(answer: Callable[[bytes], Awaitable[Response]]) -> list[Route]:
    """The Starlette route: a POST under a root path, and the 405 for other methods (`ForecastRoute` takes the
    rest of the POSTs)."""

    async def post(request: Request) -> Response:
        return await answer(await request.body())

    return [Route(PATH, post, methods=["POST"])]
