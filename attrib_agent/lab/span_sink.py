"""A local OTLP/HTTP collector that keeps every export body it receives: where the lab's tests point the
agent's `--otlp-export`, to read back the `attrib.slowdown` spans exactly as a collector would get them.

It is the project's own receiver (`sources/otlp/http_receiver.py`) served by uvicorn on a thread, on 127.0.0.1.
"""

from __future__ import annotations

import threading
import time

import uvicorn
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from attrib_agent.health import SourceHealth
from attrib_agent.http_server import uvicorn_config
from attrib_agent.lab.server import free_port
from attrib_agent.sources.otlp.http_receiver import otlp_http_app


class SpanSink:
    """Start it (or use it as a context manager), export to `url`, read `bodies` or `spans(name)`."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1/traces"
        app = otlp_http_app(lambda res: None, health=SourceHealth("span_sink"),
                            on_raw=lambda ts, ctype, body, enc: self.bodies.append(body))
        self._server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", self.port))
        self._thread = threading.Thread(target=self._server.run, name="span-sink", daemon=True)

    def start(self, timeout_s: float = 20.0) -> SpanSink:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the span sink did not start on port {self.port}")
            time.sleep(0.05)
        return self

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)

    def __enter__(self) -> SpanSink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def spans(self, name: str) -> list[Span]:
        """Every span called `name` in the bodies received so far (bodies are protobuf, as the SDK exports)."""
        out: list[Span] = []
        for body in list(self.bodies):
            for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
                for ss in rs.scope_spans:
                    out += [s for s in ss.spans if s.name == name]
        return out
