"""Fuzz OTLP decoding where it matters: 10,000 bodies with valid framing (identity, gzip, deflate) around mutated
real protobuf exports, each counted when it reaches the protobuf decoder (after decompression), plus mutated
framing. Every body decodes or raises a typed OtlpError with an HTTP status."""

from __future__ import annotations

import gzip
import random
import zlib
from typing import Any

import pytest

from attrib_agent.recording import OTLP, Recording, otlp_body

from .mutate import CASES, Mutator, Tally

PB = "application/x-protobuf"


def _decoder() -> Any:
    """The one import of the code under test (its module path may move)."""
    from attrib_agent.sources.otlp import decode as otlp_decode

    return otlp_decode


def test_fuzz_otlp_protobuf(fixtures_dir: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    od = _decoder()
    reached = 0
    real_decompress = od.decompress

    def counting_decompress(body: bytes, coding: str | None, max_decompressed: int) -> bytes:
        nonlocal reached
        out = real_decompress(body, coding, max_decompressed)
        reached += 1  # what follows in parse_export_request is the protobuf (or JSON) decoder
        return bytes(out)

    monkeypatch.setattr(od, "decompress", counting_decompress)
    corpus = []
    for name in ("canary", "preempt"):
        for r in Recording(fixtures_dir / "recordings" / name).records(OTLP):
            corpus.append(real_decompress(otlp_body(r), od.content_coding(r.get("content_encoding")), 1 << 24))
    mut, rng, tally = Mutator(corpus, seed=1304), random.Random(1304), Tally("otlp protobuf")
    framed = {None: lambda b: b, "gzip": gzip.compress, "deflate": zlib.compress,
              "deflate-raw": _raw_deflate}
    before_framing_cases = 0
    for i in range(CASES + CASES // 10):
        inner = mut.one() if i % 3 else _mutate_fields(corpus, rng)
        coding = rng.choice([None, "gzip", "deflate", "deflate-raw"])
        body = framed[coding](inner)
        header = None if coding is None else coding.removesuffix("-raw")
        if i >= CASES:  # the last tenth: break the framing too (truncated, flipped gzip/deflate)
            body = Mutator([body], seed=i).one(max_ops=2)
            before_framing_cases += 1
        try:
            res = od.decode_export(body, content_type=PB, content_encoding=header, ts=1.0, max_decompressed=1 << 20)
        except od.OtlpError as e:
            assert e.http_status in (400, 413, 415)
            tally.add("typed_error")
            continue
        assert res.other_spans >= 0 and all(s.request_id for s in res.spans)
        tally.add("spans" if res.spans else "no_request_spans")
    tally.report(reached_protobuf_decoder=reached)
    print(f"framing mutated: {before_framing_cases:,}")


def _raw_deflate(data: bytes) -> bytes:
    """Raw deflate (no zlib header), which some clients send as Content-Encoding: deflate."""
    c = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


def _mutate_fields(corpus: list[bytes], rng: random.Random) -> bytes:
    """A well-formed export whose llm_request spans have attributes of the wrong type, missing, or out of range,
    and odd times: these decode as protobuf and exercise what the decoder reads out of a span."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    req = ExportTraceServiceRequest.FromString(rng.choice(corpus))
    spans = [s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]
    for span in rng.sample(spans, min(len(spans), rng.randint(1, 3))):
        for kv in list(span.attributes):
            r = rng.random()
            if r < 0.15:
                kv.value.string_value = rng.choice(["", "x", "nan", "1e999", "-5", "\u0000", "é" * 300])
            elif r < 0.3:
                kv.value.int_value = rng.choice([0, -1, 2**63 - 1, -(2**63)])
            elif r < 0.45:
                kv.value.double_value = rng.choice([float("nan"), float("inf"), -1.0, 1e308, 0.0])
            elif r < 0.5:
                kv.value.bool_value = True
            elif r < 0.55:
                kv.value.ClearField("value")
            elif r < 0.6:
                kv.key = rng.choice(["", "gen_ai.request.id", kv.key + "x"])
        if rng.random() < 0.3:
            span.start_time_unix_nano, span.end_time_unix_nano = rng.choice(
                [(0, 0), (2**64 - 1, 0), (span.end_time_unix_nano, span.start_time_unix_nano)])
        if rng.random() < 0.1:
            span.name = rng.choice(["", "llm_request", "llm_request\x00"])
    return req.SerializeToString()
