"""The HTTP plumbing under the API: JSON responses and errors, bearer-token auth, security headers.

Errors are always `{"error": "..."}` with a message written by us, never the input echoed back at length
nor a traceback. The token check is a plain ASGI middleware so it also guards the mounted /metrics app.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections import Counter
from collections.abc import Collection
from typing import Any, Final

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

NO_STORE: Final = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
# The page loads its own script and style and talks only to this server.
PAGE_CSP: Final = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                   "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


class ApiJSON(JSONResponse):
    """JSON that stays valid when a float is not finite (NaN/inf become null), never cached by proxies."""

    def render(self, content: Any) -> bytes:
        return dumps(content).encode("utf-8")


def dumps(content: Any) -> str:
    """The API's JSON text: compact, and a float that is not finite as null."""
    try:
        return json.dumps(content, allow_nan=False, separators=(",", ":"))
    except ValueError:
        return json.dumps(_finite(content), allow_nan=False, separators=(",", ":"))


def _finite(v: Any) -> Any:
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_finite(x) for x in v]
    return v


def json_response(content: Any, status: int = 200) -> ApiJSON:
    return ApiJSON(content, status_code=status, headers=NO_STORE)


def error(status: int, message: str, errors: Counter[str], kind: str, **extra: Any) -> ApiJSON:
    """A JSON error, counted by kind (the lead may export the counter as a metric)."""
    errors[kind] += 1
    return json_response({"error": message, **extra}, status)


def error_handlers(errors: Counter[str]) -> dict[Any, Any]:
    """Starlette exception handlers turning routing errors and crashes into JSON errors."""

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        messages = {404: "not found", 405: "method not allowed"}
        return error(exc.status_code, messages.get(exc.status_code, "bad request"), errors, f"http_{exc.status_code}")

    async def crash(request: Request, exc: Exception) -> Response:
        # The server logs the traceback (Starlette re-raises after this response); the client gets none of it.
        return error(500, "internal error", errors, "internal")

    return {HTTPException: http_error, Exception: crash}


class BearerAuth:
    """Requires `Authorization: Bearer <token>` (constant-time compare) on every path not in `open_paths`.

    Open paths are the probes and the page's static shell: a browser cannot add a header when it navigates,
    and the shell holds no data (it fetches the data with the token, see page/page.js).
    """

    def __init__(self, app: ASGIApp, token: str, open_paths: Collection[str], errors: Counter[str]) -> None:
        if not token:
            raise ValueError("the API token must not be empty")
        self.app = app
        self._expected = _digest(token.encode())
        self._open = frozenset(open_paths)
        self._errors = errors

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._open:
            await self.app(scope, receive, send)
            return
        scheme, _, given = Headers(scope=scope).get("authorization", "").partition(" ")
        ok = hmac.compare_digest(_digest(given.strip().encode("utf-8", "replace")), self._expected)
        if ok and scheme.lower() == "bearer":  # the scheme is case-insensitive (RFC 9110)
            await self.app(scope, receive, send)
            return
        self._errors["unauthorized"] += 1
        response = ApiJSON({"error": "missing or wrong bearer token"}, status_code=401,
                           headers={**NO_STORE, "WWW-Authenticate": 'Bearer realm="attrib-agent"'})
        await response(scope, receive, send)


def _digest(value: bytes) -> bytes:
    """Compared as digests so that neither the token's length nor its content leaks through timing."""
    return hashlib.sha256(value).digest()
