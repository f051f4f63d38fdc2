"""OTLP/HTTP receiver: `POST /v1/traces` (protobuf or JSON, optionally gzip/deflate) as a Starlette app.

Answers as the OTLP/HTTP spec asks (an empty ExportTraceServiceResponse on success, a google.rpc.Status
body on failure, both in the request's encoding), reads the body incrementally so an oversized one is refused
(413) before it is all in memory, and counts every bad request in `health` instead of raising.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Final

from google.protobuf import json_format
from google.rpc.status_pb2 import Status
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from attrib_agent.health import SourceHealth
from attrib_agent.sources.otlp.decode import (
    JSON,
    MAX_EXPORT_BYTES,
    PROTOBUF,
    DecodeResult,
    OtlpDecodeError,
    OtlpError,
    OtlpTooLarge,
    content_coding,
    decode_export,
    media_type,
)
from attrib_agent.sources.otlp.forward import OtlpForwarder

logger = logging.getLogger(__name__)

TRACES_PATH: Final = "/v1/traces"
DEFAULT_MAX_BODY: Final = MAX_EXPORT_BYTES
# The google.rpc.Code each refusal carries (OTLP clients log it; the HTTP status is what they act on).
_RPC_CODES: Final = {400: 3, 413: 8, 415: 3, 500: 13}  # INVALID_ARGUMENT, RESOURCE_EXHAUSTED, INTERNAL

Sink = Callable[[DecodeResult], None]
OnRaw = Callable[[float, str, bytes, str | None], None]


def otlp_http_app(
    sink: Sink,
    *,
    health: SourceHealth,
    max_body: int = DEFAULT_MAX_BODY,
    max_decompressed: int | None = None,
    on_raw: OnRaw | None = None,
    forwarder: OtlpForwarder | None = None,
    clock: Callable[[], float] = time.time,
) -> Starlette:
    """The receiver app; `sink` gets each decoded export, `on_raw(ts, content_type, body, encoding)` the raw one.

    `max_body` bounds the bytes on the wire, `max_decompressed` (default 4 x max_body) what gzip may expand to.
    """
    limit_decompressed = max_decompressed if max_decompressed is not None else 4 * max_body

    async def traces(request: Request) -> Response:
        content_type = request.headers.get("content-type", "")
        encoding = request.headers.get("content-encoding")
        reply_json = content_type.split(";", 1)[0].strip().lower() == JSON
        try:
            media_type(content_type)
            content_coding(encoding)
            body = await _read_body(request, max_body)
        except OtlpError as e:
            health.skip(e.kind)
            return _refusal(e.http_status, str(e), reply_json)
        except ClientDisconnect:
            health.skip("client_disconnect")
            return Response(status_code=400)  # nobody is listening; this only ends the request cleanly
        ts = clock()
        if on_raw is not None:
            try:
                on_raw(ts, content_type, body, encoding)
            except Exception as e:  # journaling is best effort: the export is still handled
                logger.exception("OTLP raw journal failed")
                health.error("journal", ts, type(e).__name__)
        decode = functools.partial(decode_export, body, content_type=content_type, content_encoding=encoding,
                                   ts=ts, max_decompressed=limit_decompressed)
        try:
            result = await run_in_threadpool(decode)
        except OtlpError as e:
            health.skip(e.kind)
            return _refusal(e.http_status, str(e), reply_json)
        if forwarder is not None:
            forwarder.submit(body, content_type, encoding)
        try:
            sink(result)
        except Exception as e:  # a downstream bug: answer 500 (not retried by OTLP clients), keep serving
            logger.exception("OTLP sink failed")
            health.error("sink", ts, type(e).__name__)
            return _refusal(500, "internal error", reply_json)
        health.success(ts)
        if reply_json:
            return Response(b"{}", media_type=JSON)
        return Response(b"", media_type=PROTOBUF)  # an empty ExportTraceServiceResponse is zero bytes

    return Starlette(routes=[Route(TRACES_PATH, traces, methods=["POST"])])


async def _read_body(request: Request, limit: int) -> bytes:
    """The whole body, or OtlpTooLarge as soon as Content-Length or the bytes read so far pass `limit`."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            n = int(declared)
        except ValueError:
            raise OtlpDecodeError("invalid Content-Length") from None
        if n > limit:
            raise OtlpTooLarge(f"body of {n} bytes is over the limit of {limit}")
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > limit:
            raise OtlpTooLarge(f"body is over the limit of {limit} bytes")
    return bytes(buf)


def _refusal(http_status: int, message: str, reply_json: bool) -> Response:
    status = Status(code=_RPC_CODES.get(http_status, 2), message=message)
    if reply_json:
        return Response(json_format.MessageToJson(status, indent=None), status_code=http_status, media_type=JSON)
    return Response(status.SerializeToString(), status_code=http_status, media_type=PROTOBUF)
