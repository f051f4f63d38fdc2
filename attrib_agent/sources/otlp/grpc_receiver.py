"""OTLP/gRPC receiver (vLLM's default span protocol): the TraceService `Export` RPC on grpc.aio.

The servicer takes the request's raw bytes (no deserializer) so the export is journaled and forwarded
byte-identical and a malformed one is counted here (INVALID_ARGUMENT) rather than failing inside gRPC.
gRPC itself enforces `max_message_bytes` on the decompressed message (RESOURCE_EXHAUSTED, so a gzip bomb
never inflates past it); `max_concurrent_rpcs` and `read_timeout_s` bound what is in flight. Export is registered
stream-unary (the same bytes on the wire as unary) only so that a message gRPC refused still reaches us
as "no message" and gets counted.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import grpc
import grpc.aio
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceServicer

from attrib_agent.health import SourceHealth
from attrib_agent.sources.otlp.decode import (
    MAX_EXPORT_BYTES,
    PROTOBUF,
    DecodeResult,
    OtlpError,
    OtlpTooLarge,
    decode_export,
)
from attrib_agent.sources.otlp.forward import OtlpForwarder

logger = logging.getLogger(__name__)

SERVICE_NAME: Final = "opentelemetry.proto.collector.trace.v1.TraceService"
DEFAULT_PORT: Final = 4317
DEFAULT_HOST: Final = "127.0.0.1"  # loopback: vLLM beside the agent; a pod's other containers share it
DEFAULT_MAX_MESSAGE: Final = MAX_EXPORT_BYTES
_EMPTY_RESPONSE: Final[bytes] = bytes(ExportTraceServiceResponse().SerializeToString())

Sink = Callable[[DecodeResult], None]
OnRaw = Callable[[float, str, bytes, str | None], None]


class _RawTraceService(TraceServiceServicer):
    def __init__(self, receiver: OtlpGrpcReceiver) -> None:
        self._receiver = receiver

    async def Export(  # noqa: N802 - the gRPC method name
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> bytes:
        body: bytes | None = None
        try:
            async with asyncio.timeout(self._receiver.read_timeout_s):  # a stalled client must free its slot
                async for message in requests:
                    if body is not None:
                        self._receiver.health.skip("malformed")
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Export is unary: one request message")
                    body = message
        except TimeoutError:
            self._receiver.health.skip("read_timeout")
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "request message not received in time")
        if body is None:  # gRPC refused the message (over max_message_bytes, also after decompression),
            # or, rarely, the client cancelled before sending it: a unary call has no other way to arrive empty
            self._receiver.health.skip("too_large")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "request message over the size limit")
            raise AssertionError("unreachable: abort() raises")
        return await self._receiver.handle(body, context)


class OtlpGrpcReceiver:
    """Serves TraceService/Export on `host:port` (port 0 picks a free one; `port` is the bound one after start)."""

    def __init__(
        self,
        sink: Sink,
        *,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        health: SourceHealth,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE,
        max_concurrent_rpcs: int = 16,
        read_timeout_s: float = 30.0,
        on_raw: OnRaw | None = None,
        forwarder: OtlpForwarder | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sink = sink
        self.host = host
        self.port = port
        self.health = health
        self.max_message_bytes = max_message_bytes
        self.max_concurrent_rpcs = max_concurrent_rpcs
        self.read_timeout_s = read_timeout_s
        self.on_raw = on_raw
        self.forwarder = forwarder
        self._clock = clock
        self._server: Any = None

    @property
    def target(self) -> str:
        """`host:port` for a client channel."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    async def start(self) -> None:
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", 1024 * 1024),
            ],
            maximum_concurrent_rpcs=self.max_concurrent_rpcs,
        )
        servicer = _RawTraceService(self)
        handler = grpc.stream_unary_rpc_method_handler(servicer.Export)  # no (de)serializers: raw bytes
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, {"Export": handler}),))
        bound = server.add_insecure_port(self.target)
        if not bound:
            raise OSError(f"OTLP/gRPC receiver could not bind {self.target}")
        self.port = bound
        await server.start()
        self._server = server
        logger.info("OTLP/gRPC receiver listening on %s", self.target)

    async def stop(self, grace_s: float = 1.0) -> None:
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None

    async def handle(self, body: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """One Export call; bad input is counted and answered with a gRPC status, never raised further."""
        ts = self._clock()
        if self.on_raw is not None:
            try:
                self.on_raw(ts, PROTOBUF, body, None)
            except Exception as e:  # journaling is best effort: the export is still handled
                logger.exception("OTLP raw journal failed")
                self.health.error("journal", ts, type(e).__name__)
        try:
            result = await asyncio.to_thread(functools.partial(  # off the loop the HTTP receiver shares
                decode_export, body, content_type=PROTOBUF, content_encoding=None, ts=ts,
                max_decompressed=self.max_message_bytes))
        except OtlpError as e:
            self.health.skip(e.kind)
            too_large = isinstance(e, OtlpTooLarge)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED if too_large else grpc.StatusCode.INVALID_ARGUMENT,
                                str(e))
            raise  # abort() raises; this line only makes that plain
        if self.forwarder is not None:
            self.forwarder.submit(body, PROTOBUF, None)
        try:
            self.sink(result)
        except Exception as e:  # a downstream bug: INTERNAL (not retried by OTLP exporters), keep serving
            logger.exception("OTLP sink failed")
            self.health.error("sink", ts, type(e).__name__)
            await context.abort(grpc.StatusCode.INTERNAL, "internal error")
            raise
        self.health.success(ts)
        return _EMPTY_RESPONSE
