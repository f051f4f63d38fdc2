"""Lab-side reading of recorded OTLP bodies: which requests' spans have arrived.

The recorder waits on this before closing a recording, because vLLM's BatchSpanProcessor exports
spans up to ~5 s after a request finishes. Decoding is the agent's own (sources/otlp/decode.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Final

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from attrib_agent.events import RequestSpan
from attrib_agent.recording import otlp_body
from attrib_agent.sources.otlp.decode import OtlpError, parse_export_request, request_spans

MAX_DECOMPRESSED: Final = 64 * 1024 * 1024


def decode_export(body: bytes, content_encoding: str | None = None) -> ExportTraceServiceRequest:
    """A recorded protobuf export (the lab's vLLM sends http/protobuf)."""
    return parse_export_request(body, content_type="application/x-protobuf", content_encoding=content_encoding,
                                max_decompressed=MAX_DECOMPRESSED)


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
    """Request ids of every `llm_request` span in a (possibly still growing) otlp.jsonl; bad lines skipped."""
    return set(span_times(otlp_jsonl))


def span_times(otlp_jsonl: Path) -> dict[str, tuple[float, float]]:
    """Request id -> (span start = arrival, span end) for every `llm_request` span in an otlp.jsonl."""
    try:
        lines = otlp_jsonl.read_text().splitlines()
    except FileNotFoundError:
        return {}
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return span_times_of(records)


def span_times_of(records: Iterable[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """`span_times` over recorded OTLP records (e.g. `Recording.records("otlp")`); bad ones skipped."""
    return {rid: (s.start_ts, s.end_ts) for rid, s in request_spans_of(records).items()}


def request_spans_of(records: Iterable[dict[str, Any]]) -> dict[str, RequestSpan]:
    """Request id -> its decoded `llm_request` span, over recorded OTLP records; bad ones skipped."""
    spans: dict[str, RequestSpan] = {}
    for rec in records:
        try:
            req = decode_export(otlp_body(rec), rec.get("content_encoding"))
        except (ValueError, KeyError, TypeError, OtlpError):
            continue
        spans.update((s.request_id, s) for s in request_spans(req, 0.0).spans)
    return spans
