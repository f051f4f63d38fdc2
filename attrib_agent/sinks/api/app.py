"""The agent's HTTP API and page: who slowed request X, who slows everyone lately, and the timeline behind it.

Endpoints (JSON; errors are `{"error": "..."}`):
  GET /v1/requests/{id}/culprits   200 final result (or `aborted`, `skipped` under load: no result will come),
                                   202 partial or still running, 404 unknown, 400 bad id
  GET /v1/culprits/top?window=5m&limit=10   culprits ranked by victim seconds caused
  GET /v1/timeline?window=2m&since=&until=&max_steps=   steps, KV ledger, request lanes, victims
                                   (bounded; `window`: the last 2 minutes before the newest step)
  POST /v1/forecast                what admitting a request now would cost the others (api_forecast.py)
  GET /healthz, /readyz            probes (never need the token); /readyz also says whether vLLM is in a
                                   gap now (`vllm_gap_since`, `vllm_gap_s`) and how many there were, and
                                   the pipeline's backlog and load shedding (`pipeline`: `degraded`, ...)
  GET /metrics                     the ASGI app the caller passes (Prometheus exposition)
  GET /                            the page (static shell; it fetches /v1/timeline)

Handlers run on the event loop; whatever reads the pipeline beyond one stored result runs where the pipeline
lives (`AgentState.read`: the live agent's pipeline thread, between two of its batches), so it sees a
consistent state without locks and never holds the loop. The heavier bodies (`/v1/timeline`, `/v1/culprits/top`,
`/metrics`) are kept and rebuilt there ahead of requests (render_cache.py `Renderer`); every read is bounded
(steps, lanes, results).
"""

from __future__ import annotations

from collections import Counter
from importlib import resources
from typing import Final

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from attrib_agent.attribution.result_codec import to_dict
from attrib_agent.read_model import AgentState
from attrib_agent.sinks.api.forecast import ForecastRoute, forecast_answer, forecast_routes
from attrib_agent.sinks.api.hot_path import CulpritsRoute, GZip
from attrib_agent.sinks.api.ids import BadRequestId, resolve
from attrib_agent.sinks.api.plumbing import NO_STORE, PAGE_CSP, BearerAuth, error, error_handlers, json_response
from attrib_agent.sinks.api.render_cache import GZIP_LEVEL, GZIP_MIN_BYTES, Body, Renderer
from attrib_agent.sinks.api.timeline import parse_max_steps, parse_ts, parse_window
from attrib_agent.sinks.api.timeline_body import StepTexts, timeline_body
from attrib_agent.sinks.api.top import BadQuery, parse_duration, parse_limit

DEFAULT_WINDOW: Final = "5m"
DEGRADED_BACKLOG_S: Final = 1.0  # /readyz says `degraded` while events wait longer than this for the pipeline
PAGE_FILES: Final = {"index.html": "text/html; charset=utf-8", "page.js": "text/javascript; charset=utf-8",
                     "draw.js": "text/javascript; charset=utf-8", "page.css": "text/css; charset=utf-8"}
# The probes, and the page's static shell: a browser cannot add a header when it navigates, the shell holds no data.
OPEN_PATHS: Final = ("/healthz", "/readyz", "/", *(f"/page/{name}" for name in PAGE_FILES if name != "index.html"))


def api_app(state: AgentState, *, token: str | None = None, metrics_app: ASGIApp | None = None,
            errors: Counter[str] | None = None, max_stale_s: float = 0.0, serve_stale_s: float = 0.0) -> Starlette:
    """The API over `state`. With `token`, everything but the probes and the page shell needs the bearer token.
    `/v1/timeline` and `/v1/culprits/top` bodies are kept per state version; `max_stale_s`: how old one built
    before the last change may still be served (render_cache.py; the agent serves with READS_MAX_STALE_S, 0
    rebuilds after every change); `serve_stale_s`: how old one may be served while its successor is built.
    `app.state.renderers` are what the agent keeps fresh ahead of requests (`refresh_forever`).

    `errors` (also at `app.state.api_errors`) counts rejected requests by kind: bad_id, bad_query,
    unauthorized, http_404, internal ...
    """
    if token is not None and not isinstance(token, str):  # e.g. a config Secret not revealed: fail at start-up
        raise TypeError(f"the API token must be a str, not {type(token).__name__}")
    if token is not None and not token:
        raise ValueError("the API token must not be empty (None turns auth off)")
    errs: Counter[str] = Counter() if errors is None else errors

    async def culprits(request: Request) -> Response:
        return await culprits_of(request.path_params["request_id"])

    async def culprits_of(raw: str) -> Response:  # GET comes here directly (hot_path.CulpritsRoute)
        stored = state.result(raw)  # a stored result, or a request waiting or skipped: answered on the loop
        if stored is not None:
            status = "final" if stored.final else "partial"
            return json_response(to_dict(stored) | {"status": status}, 200 if stored.final else 202)
        settled = state.settled_status(raw)
        if settled in ("running", "skipped"):
            return json_response({"request_id": raw, "status": settled}, 202 if settled == "running" else 200)
        return await state.read(lambda: lookup(raw))

    def lookup(raw: str) -> Response:  # where the pipeline lives: status() may read the timeline
        try:
            found = resolve(raw, lambda rid: state.status(rid) != "unknown", state.client_id)
        except BadRequestId as exc:
            return error(400, str(exc), errs, "bad_id")
        if found.request_id is None and found.candidates:
            return error(400, f"ambiguous request id: {len(found.candidates)} requests match; use vLLM's full id",
                         errs, "ambiguous_id", candidates=list(found.candidates))
        if found.request_id is None:
            return error(404, "unknown request id (never seen, or older than the result store keeps)", errs,
                         "unknown_id")
        rid = found.request_id
        status = state.status(rid)
        result = state.result(rid)
        if result is None:  # running: ask again (202); aborted, skipped (load shed): no result will come
            return json_response({"request_id": rid, "status": status}, 202 if status == "running" else 200)
        return json_response(to_dict(result) | {"status": status}, 200 if status == "final" else 202)

    def renderer() -> Renderer[Body]:
        return Renderer(lambda: state.pipeline.version, state.reads, max_stale_s=max_stale_s,
                        serve_stale_s=serve_stale_s)

    tops = renderer()

    async def top(request: Request) -> Response:
        try:
            window_s = parse_duration(request.query_params.get("window", DEFAULT_WINDOW))
            limit = parse_limit(request.query_params.get("limit"))
        except BadQuery as exc:
            return error(400, str(exc), errs, "bad_query")

        def render() -> Body:  # the window ends at event time (the agent's clock live): one body per version
            since, until, top = state.top_culprits(window_s, limit)
            return Body(bytes(json_response({"window_s": window_s, "since": since, "until": until,
                                             "results": top.results, "partial_results": top.partial_results,
                                             "culprits": [t.as_dict() for t in top.culprits]}).body))

        return cached_response(await tops.get((window_s, limit), render), request)

    timelines = renderer()
    step_texts = StepTexts()  # each step's JSON, kept while it is the same step (timeline_body.py)

    async def timeline(request: Request) -> Response:
        q = request.query_params
        try:
            args = (parse_ts("since", q.get("since")), parse_ts("until", q.get("until")),
                    parse_max_steps(q.get("max_steps")), parse_window(q.get("window")))
        except BadQuery as exc:
            return error(400, str(exc), errs, "bad_query")

        def render() -> Body:  # built (and gzipped) once per state version and query: pollers share it
            return Body(timeline_body(state, args[0], args[1], step_texts, max_steps=args[2], window_s=args[3],
                                      extra={"live": state.live, "version": state.version}))

        try:
            return cached_response(await timelines.get(args, render), request)
        except BadQuery as exc:
            return error(400, str(exc), errs, "bad_query")

    async def healthz(request: Request) -> Response:
        return json_response({"status": "ok", "version": state.version, "uptime_s": state.clock() - state.started_ts})

    async def readyz(request: Request) -> Response:
        readiness = state.readiness()
        ready = readiness.ready
        # vLLM's gaps (unreachable, or restarted): `vllm_gap_since` is set while one is open.
        gap = {"vllm_gaps": state.vllm_gaps, "vllm_gap_since": state.vllm_gap_since,
               "vllm_gap_s": state.vllm_gap_seconds()}
        backlog = state.pipeline_backlog()  # behind the stream, or shedding: degraded, still ready (a sidecar
        # unready would take vLLM's pod out of service for the agent's sake)
        load = {"backlog_events": backlog.events, "backlog_s": backlog.oldest_s,
                "attributed_share": backlog.attributed_share, "victims_skipped": backlog.victims_skipped,
                "degraded": backlog.shedding or backlog.oldest_s > DEGRADED_BACKLOG_S}
        # the step budget the re-simulation runs with, and whether it is known (docs/sources.md: `guessed` until a
        # step cuts a prefill chunk, when the agent read no start-up line and `token_budget` is not set)
        budget = {"tokens": state.token_budget(), "source": state.token_budget_source()}
        body = {"ready": ready, "missing": list(readiness.reasons), "mode": state.mode()} | gap | {
            "pipeline": load, "token_budget": budget}
        return json_response(body, 200 if ready else 503)

    forecast = forecast_answer(state, errs)

    page = {name: resources.files("attrib_agent.sinks.api").joinpath("page", name).read_bytes() for name in PAGE_FILES}

    async def page_file(request: Request) -> Response:
        name = request.path_params.get("name", "index.html")
        if name not in page:
            return error(404, "not found", errs, "http_404")
        return Response(page[name], media_type=PAGE_FILES[name],
                        headers={"Content-Security-Policy": PAGE_CSP, "X-Content-Type-Options": "nosniff",
                                 "Cache-Control": "no-cache"})

    routes = [
        Route("/v1/requests/{request_id}/culprits", culprits, methods=["GET"]),
        Route("/v1/culprits/top", top, methods=["GET"]),
        Route("/v1/timeline", timeline, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/", page_file, methods=["GET"]),
        Route("/page/{name}", page_file, methods=["GET"]),
        *forecast_routes(forecast),  # POST /v1/forecast under a root path; 405 for other methods
    ]
    if metrics_app is not None:
        routes.append(Route("/metrics", _Asgi(metrics_app)))
    # the timeline's ids repeat: ~10x smaller (its cached bodies come gzipped already, and pass through)
    middleware = [Middleware(GZip, minimum_size=GZIP_MIN_BYTES, compresslevel=GZIP_LEVEL)]
    if token is not None:
        middleware.append(Middleware(BearerAuth, token=token, open_paths=OPEN_PATHS, errors=errs))
    middleware.append(Middleware(CulpritsRoute, handler=culprits_of))  # innermost: after the token check
    middleware.append(Middleware(ForecastRoute, answer=forecast))  # POST /v1/forecast without the router
    app = Starlette(routes=routes, middleware=middleware, exception_handlers=error_handlers(errs))
    app.state.api_errors = errs
    app.state.renderers = [tops, timelines]
    return app


def cached_response(body: Body, request: Request) -> Response:
    """A kept JSON body, gzipped (once, kept with it) for a client that takes it."""
    content, headers = body.for_client(request.headers.get("accept-encoding", ""))
    return Response(content, media_type="application/json", headers=NO_STORE | headers)


class _Asgi:
    """Wraps an ASGI callable so that Starlette's Route passes it the raw scope (a plain function, like
    prometheus_client's `make_asgi_app()`, would be taken for a request handler)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)
