"""Pure decoding of an OTLP trace export (protobuf or OTLP/JSON, optionally gzip/deflate) into `RequestSpan`s.

Shared by the OTLP/HTTP and OTLP/gRPC receivers and by replay of recorded `otlp` streams. No clock, no I/O:
bytes and the receipt time in, events out. Bad input raises only the typed errors below, whose messages
never quote the body (it may carry request content):

    OtlpError
     +-- OtlpDecodeError            not a decodable export (HTTP 400, gRPC INVALID_ARGUMENT)
     |    +-- OtlpUnsupportedMedia  content type or encoding we do not speak (HTTP 415)
     +-- OtlpTooLarge              over a size or decompression limit (HTTP 413)
"""

from __future__ import annotations

import base64
import json
import math
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from attrib_agent.events import RequestSpan

# vLLM 0.32's per-request span (v1/engine/output_processor.py `do_tracing`) and its attribute names
# (vllm/tracing/utils.py `SpanAttributes`). A span is a request span only when it carries the request id.
REQUEST_SPAN_NAME: Final = "llm_request"
REQUEST_ID_ATTR: Final = "gen_ai.request.id"
FLOAT_ATTRS: Final[Mapping[str, str]] = {  # RequestSpan field -> attribute (seconds, double)
    "queue_s": "gen_ai.latency.time_in_queue",
    "ttft_s": "gen_ai.latency.time_to_first_token",
    "e2e_s": "gen_ai.latency.e2e",
    "prefill_s": "gen_ai.latency.time_in_model_prefill",
    "decode_s": "gen_ai.latency.time_in_model_decode",
    "inference_s": "gen_ai.latency.time_in_model_inference",
}
INT_ATTRS: Final[Mapping[str, str]] = {  # RequestSpan field -> attribute (count, int)
    "prompt_tokens": "gen_ai.usage.prompt_tokens",
    "completion_tokens": "gen_ai.usage.completion_tokens",
    "max_tokens": "gen_ai.request.max_tokens",  # only set by vLLM when the request gave one
}
_WANTED: Final = frozenset((REQUEST_ID_ATTR, *FLOAT_ATTRS.values(), *INT_ATTRS.values()))

MAX_EXPORT_BYTES: Final = 8 * 1024 * 1024  # the largest export either receiver takes (HTTP body, gRPC message)
PROTOBUF: Final = "application/x-protobuf"
JSON: Final = "application/json"
_MEDIA_TYPES: Final[Mapping[str, str]] = {PROTOBUF: PROTOBUF, "application/protobuf": PROTOBUF, JSON: JSON}
_ENCODINGS: Final[Mapping[str, str | None]] = {"": None, "identity": None, "gzip": "gzip", "x-gzip": "gzip",
                                               "deflate": "deflate"}
_STEP: Final = 1024 * 1024
_HEX: Final = re.compile(r"(?:[0-9a-fA-F]{2})*")


class OtlpError(Exception):
    """Base of the decode errors; `kind` is the SourceHealth counter key, `http_status` the OTLP/HTTP answer."""

    kind = "malformed"
    http_status = 400


class OtlpDecodeError(OtlpError):
    pass


class OtlpUnsupportedMedia(OtlpDecodeError):
    kind = "unsupported_media_type"
    http_status = 415


class OtlpTooLarge(OtlpError):
    kind = "too_large"
    http_status = 413


@dataclass(frozen=True, slots=True)
class DecodeResult:
    spans: tuple[RequestSpan, ...]
    other_spans: int  # spans that are not vLLM request spans: passed over, not parsed


def media_type(content_type: str | None) -> str:
    """`application/x-protobuf` or `application/json` (parameters such as charset ignored), else 415."""
    mt = _MEDIA_TYPES.get((content_type or "").split(";", 1)[0].strip().lower())
    if mt is None:
        raise OtlpUnsupportedMedia("unsupported Content-Type; use application/x-protobuf or application/json")
    return mt


def content_coding(content_encoding: str | None) -> str | None:
    """`gzip`, `deflate` or None (identity), else 415."""
    key = (content_encoding or "").strip().lower()
    if key not in _ENCODINGS:
        raise OtlpUnsupportedMedia("unsupported Content-Encoding; use gzip, deflate or none")
    return _ENCODINGS[key]


def decompress(body: bytes, coding: str | None, max_decompressed: int) -> bytes:
    """Undo gzip (all members) or deflate (zlib or raw), never producing more than `max_decompressed` bytes."""
    if coding is None:
        if len(body) > max_decompressed:
            raise OtlpTooLarge("body over the size limit")
        return body
    if coding == "gzip":
        wbits = 16 + zlib.MAX_WBITS
    else:  # HTTP says zlib-wrapped; some clients send raw deflate, recognisable by the missing zlib header
        zlib_header = len(body) >= 2 and body[0] & 0x0F == 8 and (body[0] << 8 | body[1]) % 31 == 0
        wbits = zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS
    out = bytearray()
    data = body
    while True:  # one pass per gzip member (RFC 1952 allows several)
        d = zlib.decompressobj(wbits)
        pending = data
        try:
            while not d.eof:  # in 1 MiB steps, so a bomb stops within a step of the limit
                chunk = d.decompress(pending, _STEP)
                pending = d.unconsumed_tail
                out += chunk
                if len(out) > max_decompressed:
                    raise OtlpTooLarge(f"{coding} body decompresses past the limit of {max_decompressed} bytes")
                if not chunk and not pending:
                    raise OtlpDecodeError(f"truncated {coding} stream")
        except zlib.error:
            raise OtlpDecodeError(f"corrupt {coding} stream") from None
        data = d.unused_data
        if not data:
            return bytes(out)
        if coding != "gzip":
            raise OtlpDecodeError(f"trailing bytes after the {coding} stream")


def parse_export_request(
    body: bytes, *, content_type: str | None, content_encoding: str | None, max_decompressed: int
) -> ExportTraceServiceRequest:
    """The ExportTraceServiceRequest in a body as POSTed to /v1/traces."""
    mt = media_type(content_type)
    data = decompress(body, content_coding(content_encoding), max_decompressed)
    if mt == PROTOBUF:
        req = ExportTraceServiceRequest()
        try:
            req.ParseFromString(data)
        except (DecodeError, RecursionError, ValueError):
            raise OtlpDecodeError("not a valid ExportTraceServiceRequest protobuf") from None
        return req
    return _parse_otlp_json(data)


def decode_export(
    body: bytes, *, content_type: str | None, content_encoding: str | None, ts: float, max_decompressed: int
) -> DecodeResult:
    req = parse_export_request(
        body, content_type=content_type, content_encoding=content_encoding, max_decompressed=max_decompressed
    )
    return request_spans(req, ts)


def request_spans(req: ExportTraceServiceRequest, ts: float) -> DecodeResult:
    """Every vLLM `llm_request` span in an export, in export order; other spans are only counted."""
    spans: list[RequestSpan] = []
    other = 0
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                rspan = _request_span(span, ts) if span.name == REQUEST_SPAN_NAME else None
                if rspan is None:
                    other += 1
                else:
                    spans.append(rspan)
    return DecodeResult(spans=tuple(spans), other_spans=other)


def _request_span(span: Span, ts: float) -> RequestSpan | None:
    attrs = {kv.key: kv.value for kv in span.attributes if kv.key in _WANTED}
    rid = attrs.get(REQUEST_ID_ATTR)
    if rid is None or rid.WhichOneof("value") != "string_value" or not rid.string_value:
        return None
    f = {name: _as_float(attrs.get(key)) for name, key in FLOAT_ATTRS.items()}
    n = {name: _as_int(attrs.get(key)) for name, key in INT_ATTRS.items()}
    return RequestSpan(
        ts=ts,
        request_id=rid.string_value,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        start_ts=span.start_time_unix_nano / 1e9,
        end_ts=span.end_time_unix_nano / 1e9,
        queue_s=f["queue_s"],
        ttft_s=f["ttft_s"],
        e2e_s=f["e2e_s"],
        prefill_s=f["prefill_s"],
        decode_s=f["decode_s"],
        inference_s=f["inference_s"],
        prompt_tokens=n["prompt_tokens"],
        completion_tokens=n["completion_tokens"],
        max_tokens=n["max_tokens"],
    )


def _as_float(v: AnyValue | None) -> float | None:
    """A latency: vLLM sends doubles; an integer is taken too, a NaN or infinity is not a time."""
    if v is None:
        return None
    which = v.WhichOneof("value")
    if which == "double_value":
        return v.double_value if math.isfinite(v.double_value) else None
    return float(v.int_value) if which == "int_value" else None


def _as_int(v: AnyValue | None) -> int | None:
    """A token count: vLLM sends ints; a whole-number double is taken too."""
    if v is None:
        return None
    which = v.WhichOneof("value")
    if which == "int_value":
        return v.int_value
    d = v.double_value
    return int(d) if which == "double_value" and math.isfinite(d) and d.is_integer() else None


def _parse_otlp_json(data: bytes) -> ExportTraceServiceRequest:
    """OTLP/JSON is proto3 JSON except that trace and span ids are hex (not base64) and enums may be integers."""
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise OtlpDecodeError("JSON body is not UTF-8") from None
    except json.JSONDecodeError as e:
        raise OtlpDecodeError(f"invalid JSON at char {e.pos}") from None
    except (RecursionError, ValueError):
        raise OtlpDecodeError("invalid JSON") from None
    if not isinstance(obj, dict):
        raise OtlpDecodeError("JSON body is not an object")
    for span, keys in _id_holders(obj):
        for key in keys:
            value = span.get(key)
            if isinstance(value, str):
                if not _HEX.fullmatch(value):
                    raise OtlpDecodeError(f"{key} is not hex")
                span[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
    req = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(obj, req, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, AttributeError, RecursionError):
        raise OtlpDecodeError("JSON is not a valid ExportTraceServiceRequest") from None
    return req


_SPAN_IDS: Final = ("traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id")
_LINK_IDS: Final = ("traceId", "trace_id", "spanId", "span_id")


def _id_holders(obj: dict[str, Any]) -> list[tuple[dict[str, Any], tuple[str, ...]]]:
    """The span and link objects whose id fields OTLP/JSON writes as hex (camelCase or proto field names)."""
    found: list[tuple[dict[str, Any], tuple[str, ...]]] = []
    for rs in _objects(obj, "resourceSpans", "resource_spans"):
        for ss in _objects(rs, "scopeSpans", "scope_spans"):
            for span in _objects(ss, "spans"):
                found.append((span, _SPAN_IDS))
                found.extend((link, _LINK_IDS) for link in _objects(span, "links"))
    return found


def _objects(parent: dict[str, Any], *keys: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for key in keys:
        items = parent.get(key)
        if isinstance(items, list):
            out.extend(item for item in items if isinstance(item, dict))
    return out
