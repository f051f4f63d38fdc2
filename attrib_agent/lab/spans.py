"""Lab-side reading of recorded OTLP bodies: which requests' spans have arrived.

The recorder waits on this before closing a recording, because vLLM's BatchSpanProcessor exports
spans up to ~5 s after a request finishes.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from attrib_agent.recording import otlp_body

REQUEST_ID_ATTR = "gen_ai.request.id"


def decode_export(body: bytes, content_encoding: str | None = None) -> ExportTraceServiceRequest:
    if content_encoding == "gzip":
        body = gzip.decompress(body)
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    return req


def iter_spans(req: ExportTraceServiceRequest) -> Iterator[Span]:
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            yield from ss.spans


def span_attr(span: Span, key: str) -> str | int | float | None:
    for kv in span.attributes:
        if kv.key == key:
            which = kv.value.WhichOneof("value")
            return getattr(kv.value, which) if which else None
    return None


def span_request_ids(otlp_jsonl: Path) -> set[str]:
    """Request ids of every span in a (possibly still growing) otlp.jsonl; bad lines are skipped."""
    ids: set[str] = set()
    try:
        lines = otlp_jsonl.read_text().splitlines()
    except FileNotFoundError:
        return ids
    for line in lines:
        try:
            rec = json.loads(line)
            req = decode_export(otlp_body(rec), rec.get("content_encoding"))
        except (ValueError, KeyError, DecodeError, OSError):
            continue
        for span in iter_spans(req):
            rid = span_attr(span, REQUEST_ID_ATTR)
            if isinstance(rid, str):
                ids.add(rid)
    return ids
