"""The agent's own tracer provider: a BatchSpanProcessor feeding an OTLP exporter (gRPC or HTTP/protobuf).

Kept apart from the spans so the span code is tested against an in-memory exporter and this against a real
receiver. The processor's queue (`max_queue_size`) is the memory bound: past it the SDK drops new spans and
logs it, so a collector that is down never grows the agent. Environment variables the exporters read
(OTEL_EXPORTER_OTLP_*) still apply where an argument here is left None.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal
from urllib.parse import urlsplit

from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from attrib_agent import __version__

Protocol = Literal["grpc", "http"]
PROTOCOLS: Final = ("grpc", "http", "http/protobuf")  # `http/protobuf` is OTEL_EXPORTER_OTLP_PROTOCOL's spelling
TRACES_PATH: Final = "/v1/traces"


def tracer_provider_for(endpoint: str, *, protocol: str = "grpc", headers: Mapping[str, str] | None = None,
                        service_name: str = "attrib-agent", insecure: bool | None = None,
                        compression: str | None = None, timeout_s: float = 10.0, max_queue_size: int = 2048,
                        schedule_delay_ms: float = 1000.0) -> TracerProvider:
    """A provider exporting to `endpoint` over OTLP; call its `shutdown()` on exit to send what is queued.

    gRPC takes `host:port` or `http://host:port` (plaintext) or `https://host:port` (TLS; `insecure` overrides);
    HTTP takes a URL, and one with no path gets `/v1/traces` as OTEL_EXPORTER_OTLP_ENDPOINT does.
    `compression` is `gzip` or None.
    """
    kind = _protocol(protocol)
    if compression not in (None, "gzip"):
        raise ValueError(f"compression must be 'gzip' or None, not {compression!r}")
    if max_queue_size < 1 or timeout_s <= 0 or schedule_delay_ms <= 0:
        raise ValueError("max_queue_size must be >= 1, timeout_s and schedule_delay_ms > 0")
    exporter = (_grpc_exporter(endpoint, headers, insecure, compression, timeout_s) if kind == "grpc"
                else _http_exporter(endpoint, headers, compression, timeout_s))
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name, SERVICE_VERSION: __version__}))
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=max_queue_size,
                                                   schedule_delay_millis=schedule_delay_ms,
                                                   max_export_batch_size=min(512, max_queue_size)))
    return provider


def http_traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL: as given, or with `/v1/traces` when the URL names only the collector."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"OTLP/HTTP endpoint must be an http(s) URL, not {endpoint!r}")
    return endpoint.rstrip("/") + TRACES_PATH if parts.path in ("", "/") else endpoint


def _protocol(protocol: str) -> Protocol:
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, not {protocol!r}")
    return "grpc" if protocol == "grpc" else "http"


def _grpc_exporter(endpoint: str, headers: Mapping[str, str] | None, insecure: bool | None,
                   compression: str | None, timeout_s: float) -> SpanExporter:
    import grpc
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    if insecure is None:  # the exporter would take a bare host:port for TLS; plaintext unless https:// says so
        insecure = urlsplit(endpoint).scheme != "https"
    return OTLPSpanExporter(endpoint=endpoint, insecure=insecure, headers=dict(headers) if headers else None,
                            timeout=timeout_s, compression=grpc.Compression.Gzip if compression else None)


def _http_exporter(endpoint: str, headers: Mapping[str, str] | None, compression: str | None,
                   timeout_s: float) -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=http_traces_url(endpoint), headers=dict(headers) if headers else None,
                            timeout=timeout_s, compression=Compression.Gzip if compression else None)
