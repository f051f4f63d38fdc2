"""The OTLP source: vLLM's spans over gRPC and/or HTTP (and the optional forwarder to the user's collector).

Receivers push decoded exports from their callbacks, so `run` binds them, reports `started`, and waits for
stop; `aclose` stops them and drains the forwarder.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from attrib_agent.config import values as v
from attrib_agent.config.setting import Setting
from attrib_agent.events import Event
from attrib_agent.http_server import start_server
from attrib_agent.recording import OTLP, otlp_body
from attrib_agent.sources.otlp.decode import MAX_EXPORT_BYTES, DecodeResult, OtlpError, decode_export
from attrib_agent.sources.otlp.forward import OtlpForwarder
from attrib_agent.sources.otlp.grpc_receiver import DEFAULT_HOST, DEFAULT_PORT, OtlpGrpcReceiver
from attrib_agent.sources.otlp.http_receiver import otlp_http_app
from attrib_agent.sources.source import (
    Emit,
    RecordParse,
    ReplayContext,
    SourceContext,
    SourceSpec,
    checked_record_parse,
    wait_for_stop,
)

if TYPE_CHECKING:
    import uvicorn

    from attrib_agent.config.load import AgentConfig

NAME = "otlp"
HTTP_PORT: Final = 4318  # OTLP/HTTP's registered port, as 4317 is OTLP/gRPC's
ROWS: Final[tuple[Setting[Any], ...]] = (
    Setting("otlp_grpc_port", "otlp", v.port, DEFAULT_PORT, "OTLP/gRPC receiver port for vLLM's spans (0: off)",
            "PORT", live=True),
    Setting("otlp_http_port", "otlp", v.port, HTTP_PORT, "OTLP/HTTP receiver port for vLLM's spans (0: off)",
            "PORT", live=True),
    Setting("otlp_bind", "otlp", v.host, DEFAULT_HOST, "address the OTLP receivers listen on", "HOST", live=True),
    Setting("otlp_max_body_bytes", "otlp", v.size_bytes(1024, 2**30), MAX_EXPORT_BYTES,
            "largest OTLP export accepted (HTTP body or gRPC message)", "BYTES", live=True, default_text="8MiB"),
    Setting("otlp_forward", "otlp", v.otlp_target, None, "pass every received export on to this collector; the "
            "scheme picks the protocol (http(s):// or grpc(s)://; `none`: off)", "URL", live=True,
            default_text="off"),
)


class OtlpSource:
    name = NAME

    def __init__(self, cfg: AgentConfig, ctx: SourceContext) -> None:
        self._cfg, self._ctx = cfg, ctx
        self.started = asyncio.Event()
        self.forwarder: OtlpForwarder | None = None
        self.grpc: OtlpGrpcReceiver | None = None
        self.http_port: int | None = None
        self._http: uvicorn.Server | None = None
        self._http_task: asyncio.Task[Any] | None = None

    @property
    def grpc_port(self) -> int | None:
        return self.grpc.port if self.grpc is not None else None

    async def run(self, emit: Emit, stop: asyncio.Event) -> None:
        cfg, ctx = self._cfg, self._ctx

        def spans_in(result: DecodeResult) -> None:
            for span in result.spans:
                emit(span)

        if cfg.otlp_forward is not None:
            self.forwarder = OtlpForwarder(cfg.otlp_forward.endpoint, protocol=cfg.otlp_forward.protocol,
                                           health=ctx.health("otlp_forward"), clock=ctx.clock)
            await self.forwarder.start()
        if cfg.otlp_grpc_port:
            self.grpc = OtlpGrpcReceiver(spans_in, host=cfg.otlp_bind, port=cfg.otlp_grpc_port,
                                         health=ctx.health(NAME), forwarder=self.forwarder, clock=ctx.clock,
                                         max_message_bytes=cfg.otlp_max_body_bytes)
            await self.grpc.start()
        if cfg.otlp_http_port:
            await self._start_http(spans_in)
        self.started.set()
        await wait_for_stop(stop)

    async def _start_http(self, spans_in: Any) -> None:
        cfg, ctx = self._cfg, self._ctx
        app = otlp_http_app(spans_in, health=ctx.health(NAME), forwarder=self.forwarder, clock=ctx.clock,
                            max_body=cfg.otlp_max_body_bytes)
        self._http, self._http_task, self.http_port = await start_server(
            app, cfg.otlp_bind, cfg.otlp_http_port, "OTLP/HTTP receiver", name="otlp_http")

    async def aclose(self) -> None:
        if self._http is not None and self._http_task is not None:
            self._http.should_exit = True
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self._http_task, 10)
        if self.grpc is not None:
            await self.grpc.stop()
        if self.forwarder is not None:
            await self.forwarder.stop()


def build(cfg: AgentConfig, ctx: SourceContext) -> OtlpSource:
    return OtlpSource(cfg, ctx)


def record_parser(ctx: ReplayContext) -> RecordParse:
    """A recorded export (`{"ts", "content_type", "body_b64", "content_encoding"}`) through the receivers' decoder."""

    def parse(rec: Mapping[str, Any], ts: float) -> Sequence[Event]:
        return decode_export(otlp_body(rec), content_type=rec.get("content_type"),
                             content_encoding=rec.get("content_encoding"), ts=ts,
                             max_decompressed=ctx.max_otlp_decompressed).spans

    # KeyError ... ValueError: no body_b64, or not base64
    return checked_record_parse(parse, ctx.health, bad_input=(OtlpError,), bad_record=(KeyError, TypeError, ValueError))


SPEC = SourceSpec(NAME, ROWS, build, stream=OTLP, parser=record_parser)
