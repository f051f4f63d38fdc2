"""The API's lean per-request layers (sinks/api/hot_path.py): gzip by Starlette's GZipMiddleware's rules, byte for
byte, and the culprits route answered directly with the same answers as through the router."""

from __future__ import annotations

import asyncio
import gzip
from typing import Any

import pytest
from api_replayed import call, replayed, state_of
from starlette.middleware.gzip import GZipMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from attrib_agent.sinks.api.app import api_app
from attrib_agent.sinks.api.hot_path import CulpritsRoute, GZip

BIG = b'{"x":"' + b"abc" * 1000 + b'"}'


def _app(body: bytes, **kwargs: Any) -> ASGIApp:
    """A fresh response at each call (a middleware edits the headers of the one it sends)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await Response(body, **{"media_type": "application/json", **kwargs})(scope, receive, send)

    return app


async def _streamed(scope: Scope, receive: Receive, send: Send) -> None:
    """A body in two messages (no Content-Length), as a streaming response sends it."""
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": BIG, "more_body": True})
    await send({"type": "http.response.body", "body": BIG, "more_body": False})


def _run(app: ASGIApp, accept: bytes | None) -> list[Message]:
    out: list[Message] = []
    headers = [(b"host", b"x")] + ([(b"accept-encoding", accept)] if accept is not None else [])
    scope = {"type": "http", "method": "GET", "path": "/", "headers": headers, "query_string": b""}

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(m: Message) -> None:
        out.append(m)

    asyncio.run(app(scope, receive, send))
    return out


def _plain(messages: list[Message]) -> tuple[Any, ...]:
    """Status, headers in order, the body (decompressed) and whether it says it is gzipped."""
    start = messages[0]
    body = b"".join(m.get("body", b"") for m in messages[1:])
    encoded = (b"content-encoding", b"gzip") in start["headers"]
    compressed = body[:2] == b"\x1f\x8b"  # (the "encoded" app only says it is)
    return start["status"], start["headers"], gzip.decompress(body) if compressed else body, encoded


@pytest.mark.parametrize("accept", [None, b"gzip, deflate, br", b"br", b"identity"])
@pytest.mark.parametrize("app", [
    _app(b'{"small":1}'), _app(BIG), _app(BIG, headers={"Content-Encoding": "gzip"}),
    _app(BIG, headers={"Vary": "Accept-Encoding"}), _app(BIG, status_code=206), _app(BIG, media_type="image/png"),
    _app(BIG, media_type="text/event-stream"), _streamed], ids=["small", "big", "encoded", "vary", "partial",
                                                                  "png", "events", "streamed"])
def test_gzip_follows_starlettes_rules(app: ASGIApp, accept: bytes | None) -> None:
    ours = _run(GZip(app, minimum_size=2048, compresslevel=6), accept)
    theirs = _run(GZipMiddleware(app, minimum_size=2048, compresslevel=6), accept)
    assert _plain(ours) == _plain(theirs)
    assert [m["type"] for m in ours] == [m["type"] for m in theirs]


def test_culprits_route_takes_get_only_and_passes_the_rest() -> None:
    seen: list[str] = []

    async def rest(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(f"{scope['method']} {scope['path']}")
        await Response(b"rest")(scope, receive, send)

    async def handler(raw: str) -> Response:
        seen.append(f"handler {raw}")
        return Response(b"hot")

    route = CulpritsRoute(rest, handler)
    for method, path in [("GET", "/v1/requests/a-1/culprits"), ("HEAD", "/v1/requests/a-1/culprits"),
                         ("GET", "/v1/requests/a/b/culprits"), ("GET", "/v1/requests/a-1/culprits/"),
                         ("GET", "/v1/culprits/top")]:
        scope = {"type": "http", "method": method, "path": path, "headers": [], "query_string": b""}
        asyncio.run(route(scope, None, _sink))  # type: ignore[arg-type]
    assert seen == ["handler a-1", "HEAD /v1/requests/a-1/culprits", "GET /v1/requests/a/b/culprits",
                    "GET /v1/requests/a-1/culprits/", "GET /v1/culprits/top"]


async def _sink(message: Message) -> None:
    pass


def test_the_direct_route_answers_as_the_router_did() -> None:
    """HEAD still goes through Starlette's Route: its status and headers are GET's, for each kind of answer."""
    p = replayed("preempt")
    app = api_app(state_of(p))
    r = max(p.store, key=lambda r: len(r.culprits))
    for path in (f"/v1/requests/{r.request_id}/culprits", "/v1/requests/cmpl-nope-0/culprits",
                 "/v1/requests/%20/culprits"):
        got, head = call(app, path), call(app, path, method="HEAD")
        assert got.status_code == head.status_code and got.status_code in (200, 400, 404)
        assert {k: v for k, v in got.headers.items()} == {k: v for k, v in head.headers.items()}


def test_a_crash_on_the_direct_route_is_a_json_500() -> None:
    p = replayed("preempt")
    state = state_of(p)
    app = api_app(state)

    def broken(rid: str) -> None:
        raise RuntimeError("boom")

    state.result = broken  # type: ignore[method-assign]
    resp = call(app, "/v1/requests/cmpl-x-0/culprits", raise_app_exceptions=False)
    assert resp.status_code == 500 and resp.json() == {"error": "internal error"}
    assert app.state.api_errors["internal"] == 1
