"""decode_export on the real recorded OTLP exports of vLLM 0.32, their gzip/deflate/JSON variants and mutations."""

from __future__ import annotations

import ast
import base64
import gzip
import importlib.util
import json
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from attrib_agent.recording import CLIENT, OTLP, Recording, otlp_body
from attrib_agent.sources.otlp.decode import (
    FLOAT_ATTRS,
    INT_ATTRS,
    REQUEST_ID_ATTR,
    DecodeResult,
    OtlpDecodeError,
    OtlpError,
    OtlpTooLarge,
    OtlpUnsupportedMedia,
    decode_export,
    request_spans,
)

RECORDINGS = ("shorts", "whale1", "whale2", "preempt")
FIXTURES = Path(__file__).parents[2] / "fixtures" / "recordings"
PB, JS = "application/x-protobuf", "application/json"
LIMIT = 8 * 1024 * 1024


def recorded_exports(name: str) -> list[dict[str, Any]]:
    return list(Recording(FIXTURES / name).records(OTLP))


ALL_BODIES = [otlp_body(r) for name in RECORDINGS for r in recorded_exports(name)]


def otlp_json(body: bytes) -> bytes:
    """A protobuf export re-encoded by the OTLP/JSON rules: camelCase keys, enums as integers, int64 as
    decimal strings (proto3 JSON), and trace/span ids as hex instead of proto3 JSON's base64."""
    obj = json_format.MessageToDict(ExportTraceServiceRequest.FromString(body), use_integers_for_enums=True)
    for rs in obj.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for holder in [span, *span.get("links", [])]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in holder:
                            holder[key] = base64.b64decode(holder[key]).hex()
    return json.dumps(obj).encode()


def decode(body: bytes, content_type: str = PB, encoding: str | None = None, ts: float = 1.0,
           limit: int = LIMIT) -> DecodeResult:
    return decode_export(body, content_type=content_type, content_encoding=encoding, ts=ts, max_decompressed=limit)


def render(name: str) -> str:
    lines = []
    for rec in recorded_exports(name):
        res = decode(otlp_body(rec), rec["content_type"], rec.get("content_encoding"), rec["ts"])
        lines.append(f"# export ts={rec['ts']!r} request_spans={len(res.spans)} other_spans={res.other_spans}")
        lines.extend(repr(s) for s in res.spans)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("name", RECORDINGS)
def test_golden_request_spans_for_whole_recording(name: str, golden: Any) -> None:
    golden(f"otlp/{name}.txt", render(name))


@pytest.mark.parametrize("name", RECORDINGS)
def test_one_span_per_client_request_with_matching_counts(name: str) -> None:
    spans = [s for rec in recorded_exports(name)
             for s in decode(otlp_body(rec), rec["content_type"], rec.get("content_encoding"), rec["ts"]).spans]
    client = {c["vllm_request_id"]: c for c in Recording(FIXTURES / name).records(CLIENT)}
    assert len(spans) == len(client) and {s.request_id for s in spans} == set(client)
    for s in spans:
        c = client[s.request_id]
        assert (s.prompt_tokens, s.completion_tokens, s.max_tokens) == (c["prompt_tokens"], c["output_tokens"],
                                                                        c["max_tokens"])
        assert len(s.trace_id) == 32 and len(s.span_id) == 16 and s.start_ts < s.end_ts < s.ts
        assert s.start_ts <= c["actual_send_ts"] + 1.0 and abs(s.e2e_s - (c["finish_ts"] - s.start_ts)) < 0.5
        assert all(v is not None for v in (s.queue_s, s.ttft_s, s.prefill_s, s.decode_s, s.inference_s))


def test_other_spans_pass_through_counted() -> None:
    first = otlp_body(recorded_exports("shorts")[0])  # vLLM start-up spans ("Worker init", ...) only
    assert decode(first) == DecodeResult(spans=(), other_spans=6)


@pytest.mark.parametrize("encoding,compress", [
    ("gzip", gzip.compress),
    ("x-gzip", gzip.compress),
    ("gzip", lambda b: gzip.compress(b[:100]) + gzip.compress(b[100:])),  # two gzip members
    ("deflate", zlib.compress),
    ("deflate", lambda b: zlib.compress(b)[2:-4]),  # raw deflate, as some clients send it
    ("identity", lambda b: b),
])
def test_compressed_variants_decode_the_same(encoding: str, compress: Any) -> None:
    for body in ALL_BODIES:
        assert decode(compress(body), encoding=encoding) == decode(body)


def test_otlp_json_variant_decodes_the_same() -> None:
    for body in ALL_BODIES:
        as_json = otlp_json(body)
        res = decode(as_json, "application/json; charset=utf-8")
        assert res == decode(body)
        for s in res.spans:
            assert f'"traceId": "{s.trace_id}"' in as_json.decode()  # hex on the wire, as OTLP/JSON requires
        assert decode(gzip.compress(as_json), JS, "gzip") == res


def test_otlp_json_unknown_fields_ignored_and_base64_ids_refused() -> None:
    body = ALL_BODIES[3]
    obj = json.loads(otlp_json(body))
    obj["someFutureField"] = {"x": 1}
    obj["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["futureSpanField"] = [1, 2]
    assert decode(json.dumps(obj).encode(), JS) == decode(body)
    proto3_json = json_format.MessageToJson(ExportTraceServiceRequest.FromString(body)).encode()  # base64 ids
    with pytest.raises(OtlpDecodeError, match="traceId is not hex"):
        decode(proto3_json, JS)


def test_attribute_table_uses_vllm_semantic_convention_names() -> None:
    """Read vLLM's SpanAttributes from its source (importing vllm takes ~10 s): every name we look for exists."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("vllm (the lab extra) is not installed")
    tree = ast.parse((Path(spec.origin).parent / "tracing" / "utils.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpanAttributes"]
    names = {n.value.value for n in cls.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)}
    assert {REQUEST_ID_ATTR, *FLOAT_ATTRS.values(), *INT_ATTRS.values()} <= names


def test_span_without_request_id_is_other_and_int_double_swaps_are_tolerated() -> None:
    req = ExportTraceServiceRequest.FromString(ALL_BODIES[3])
    spans = req.resource_spans[0].scope_spans[0].spans
    n = len(spans)
    base = request_spans(req, 1.0).spans[1]
    for kv in spans[1].attributes:
        if kv.key == "gen_ai.usage.prompt_tokens":
            kv.value.double_value = float(kv.value.int_value)
        elif kv.key == "gen_ai.latency.e2e":
            kv.value.int_value = 2
    del spans[0].attributes[:]  # a real llm_request with its attributes stripped: not a request span
    res = request_spans(req, 1.0)
    assert res.other_spans == 1 and len(res.spans) == n - 1
    assert res.spans[0].prompt_tokens == base.prompt_tokens and res.spans[0].e2e_s == 2.0


@pytest.mark.parametrize("content_type,encoding", [("text/plain", None), ("", None), (PB, "br"), (PB, "gzip, br")])
def test_unsupported_media_is_415(content_type: str, encoding: str | None) -> None:
    with pytest.raises(OtlpUnsupportedMedia) as e:
        decode(ALL_BODIES[3], content_type, encoding)
    assert e.value.http_status == 415 and isinstance(e.value, OtlpDecodeError)


@pytest.mark.parametrize("body,content_type,encoding", [
    (b"\xff\xff\xff\xff", PB, None),
    (b"\x0a\x05abc", PB, None),
    (b"not json", JS, None),
    (b"[1, 2]", JS, None),
    ('{"resourceSpans": "\u00e9"}'.encode("utf-16"), JS, None),
    (b"\x1f\x8b\x08\x00garbage", PB, "gzip"),
    (b"\x78\x9cgarbage", PB, "deflate"),
])
def test_garbage_is_decode_error(body: bytes, content_type: str, encoding: str | None) -> None:
    with pytest.raises(OtlpDecodeError) as e:
        decode(body, content_type, encoding)
    assert e.value.http_status == 400 and e.value.kind == "malformed"


def test_truncated_bodies_never_escape_and_truncated_gzip_is_an_error() -> None:
    body = ALL_BODIES[3]
    for cut in range(len(body)):
        try:
            res = decode(body[:cut])
        except OtlpDecodeError:
            continue
        assert len(res.spans) <= len(decode(body).spans)  # a cut on a field boundary is a smaller valid export
    gz = gzip.compress(body)
    for cut in range(len(gz)):
        with pytest.raises(OtlpDecodeError):
            decode(gz[:cut], encoding="gzip")


def test_gzip_and_deflate_bombs_stop_at_the_limit() -> None:
    zeros = b"\0" * (32 * 1024 * 1024)
    for encoding, bomb in (("gzip", gzip.compress(zeros, 1)), ("deflate", zlib.compress(zeros, 1))):
        assert len(bomb) < 200_000
        tracemalloc.start()
        try:
            with pytest.raises(OtlpTooLarge) as e:
                decode(bomb, encoding=encoding, limit=4 * 1024 * 1024)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert e.value.http_status == 413 and peak < 8 * 1024 * 1024  # the limit plus one step, not 32 MiB


def test_limit_is_exact_for_plain_and_compressed_bodies() -> None:
    body = ALL_BODIES[3]
    for encoding, data in ((None, body), ("gzip", gzip.compress(body)), ("deflate", zlib.compress(body))):
        assert decode(data, encoding=encoding, limit=len(body)) == decode(body)
        with pytest.raises(OtlpTooLarge):
            decode(data, encoding=encoding, limit=len(body) - 1)


def test_error_messages_never_quote_the_body() -> None:
    body = ALL_BODIES[3]
    rid = decode(body).spans[0].request_id
    obj = json.loads(otlp_json(body))
    span = obj["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    bad = [
        json.dumps({**obj, "resourceSpans": rid}),
        json.dumps(obj).replace(span["traceId"], rid, 1),
        json.dumps(obj).replace('"intValue": "', f'"intValue": "{rid}', 1),
        json.dumps(obj).replace('"startTimeUnixNano": "', f'"startTimeUnixNano": "{rid}', 1),
        json.dumps(obj)[:-200],
    ]
    for text in bad:
        with pytest.raises(OtlpDecodeError) as e:
            decode(text.encode(), JS)
        assert rid not in str(e.value)


# --- properties: whatever arrives, only the typed errors escape ---------------------------------------------

MEDIA = st.sampled_from([PB, JS, "application/json; charset=utf-8", "text/plain"])
CODINGS = st.sampled_from([None, "gzip", "deflate", "identity", "br"])
VARIANTS = [(b, PB, None) for b in ALL_BODIES] + [(gzip.compress(b), PB, "gzip") for b in ALL_BODIES] + [
    (otlp_json(b), JS, None) for b in ALL_BODIES]


def _check(body: bytes, content_type: str, encoding: str | None) -> None:
    try:
        res = decode(body, content_type, encoding, limit=256 * 1024)
    except OtlpError as e:
        assert e.http_status in (400, 413, 415)
        return
    assert isinstance(res, DecodeResult) and res.other_spans >= 0


# Volume (>= 10,000 cases a parser, counted where the parsing happens) is the seeded mutation fuzzer's job
# (tests/unit/fuzz/test_fuzz_otlp.py, ~1 s); these properties draw structured inputs beside it. Each except
# clause of the parser narrowed in turn (an injected bug): those they catch, they catch in the first
# ~20 examples.
PROPERTY_EXAMPLES = 1_000


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.binary(max_size=2048), content_type=MEDIA, encoding=CODINGS)
def test_property_arbitrary_bytes_only_typed_errors(body: bytes, content_type: str, encoding: str | None) -> None:
    _check(body, content_type, encoding)


@st.composite
def mutated_real_body(draw: st.DrawFn) -> tuple[bytes, str, str | None]:
    body, content_type, encoding = draw(st.sampled_from(VARIANTS))
    data = bytearray(body)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "splice", "insert", "delete"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        elif op == "truncate":
            del data[at:]
        elif op == "splice":
            other, _, _ = draw(st.sampled_from(VARIANTS))
            start = draw(st.integers(0, len(other)))
            data[at:] = other[start:]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del data[at:at + draw(st.integers(1, 16))]
    return bytes(data), content_type, encoding


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated_real_body())
def test_property_mutated_real_bodies_only_typed_errors(case: tuple[bytes, str, str | None]) -> None:
    _check(*case)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=3),
    max_leaves=6,
)
SMALL_JSON = [otlp_json(b) for b in ALL_BODIES[1:3]]  # start-up spans, and one llm_request beside them


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.sampled_from(SMALL_JSON), path=st.lists(st.integers(0, 63), min_size=1, max_size=9),
       replacement=JSON_VALUES)
def test_property_json_with_a_subtree_replaced_only_typed_errors(
        text: bytes, path: list[int], replacement: Any) -> None:
    obj = json.loads(text)
    node: Any = obj
    for depth, step in enumerate(path):  # walk down the real export, then put arbitrary JSON in one place
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            break
        key = keys[step % len(keys)]
        if depth == len(path) - 1 or not isinstance(node[key], dict | list) or not node[key]:
            node[key] = replacement
            break
        node = node[key]
    _check(json.dumps(obj).encode(), JS, None)
