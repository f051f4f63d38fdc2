"""Forward every received OTLP export, unchanged, to a downstream collector: the agent sits in vLLM's span path.

Intake only enqueues (never waits on the downstream); a background task sends from a bounded queue, so a
slow or dead collector costs dropped exports, counted in `health`, and never a blocked or crashed receiver.
Delivery is at most once: a failed send is counted, not retried.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import grpc
import grpc.aio
import httpx

from attrib_agent.health import SourceHealth
from attrib_agent.sources.otlp.decode import PROTOBUF, OtlpError, content_coding, media_type, parse_export_request

logger = logging.getLogger(__name__)

GRPC_EXPORT_METHOD: Final = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
Protocol = Literal["http/protobuf", "grpc"]


@dataclass(frozen=True, slots=True)
class _Export:
    body: bytes
    content_type: str
    content_encoding: str | None


class OtlpForwarder:
    """Tee to `endpoint`: a full URL for http/protobuf (`http://collector:4318/v1/traces`), `host:port` for grpc.

    Over HTTP the body goes out byte for byte with its Content-Type and Content-Encoding. gRPC carries only
    uncompressed protobuf, so a JSON or compressed body received over HTTP is re-encoded for a grpc downstream.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        protocol: Protocol = "http/protobuf",
        queue_limit: int = 64,
        queue_bytes_limit: int = 64 * 1024 * 1024,
        timeout_s: float = 5.0,
        headers: Mapping[str, str] | None = None,
        max_decompressed: int = 32 * 1024 * 1024,
        client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        channel: grpc.aio.Channel | None = None,
        health: SourceHealth | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if protocol not in ("http/protobuf", "grpc"):
            raise ValueError(f"unsupported OTLP forward protocol {protocol!r}; use http/protobuf or grpc")
        self.endpoint = endpoint
        self.protocol = protocol
        self.queue_limit = queue_limit
        self.queue_bytes_limit = queue_bytes_limit
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self.max_decompressed = max_decompressed
        self.health = health if health is not None else SourceHealth("otlp_forward")
        self._clock = clock
        self._client, self._owns_client = client, client is None
        self._transport = transport
        self._channel, self._owns_channel = channel, channel is None
        self._lock = threading.Lock()
        self._queue: deque[_Export] = deque()
        self._queued_bytes = 0
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._sending = False

    @property
    def queued(self) -> int:
        return len(self._queue)

    def submit(self, body: bytes, content_type: str, content_encoding: str | None) -> bool:
        """Enqueue one export without waiting; False (and counted) when the queue is full or stopped."""
        with self._lock:
            full = (len(self._queue) >= self.queue_limit
                    or self._queued_bytes + len(body) > self.queue_bytes_limit)
            if self._closed or full:
                self.health.skip("queue_full" if full else "stopped")
                return False
            self._queue.append(_Export(body, content_type, content_encoding))
            self._queued_bytes += len(body)
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop is closed: the export stays queued and is counted at stop
                pass
        return True

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        if self.protocol == "http/protobuf" and self._client is None:
            self._client = httpx.AsyncClient(transport=self._transport, timeout=self.timeout_s, trust_env=False)
        if self.protocol == "grpc" and self._channel is None:
            target = self.endpoint.removeprefix("http://")
            if target.startswith("https://"):
                self._channel = grpc.aio.secure_channel(target[8:], grpc.ssl_channel_credentials())
            else:
                self._channel = grpc.aio.insecure_channel(target)
        self._task = asyncio.create_task(self._run(), name="otlp-forward")

    async def stop(self, drain_s: float = 2.0) -> None:
        """Send what is queued for up to `drain_s`, then drop the rest (counted) and close what we opened."""
        with self._lock:
            self._closed = True
        if self._wake is not None:
            self._wake.set()
        cut_short = False
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), drain_s)
            except TimeoutError:
                cut_short = self._sending
                self._task.cancel()
                await asyncio.gather(self._task, return_exceptions=True)
        with self._lock:
            lost = len(self._queue) + cut_short
            if lost:
                self.health.skip("dropped_at_stop", lost)
            self._queue.clear()
            self._queued_bytes = 0
        self._task = None
        if self._owns_client and self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._owns_channel and self._channel is not None:
            await self._channel.close()
            self._channel = None

    def _pop(self) -> _Export | None:
        with self._lock:
            if not self._queue:
                return None
            item = self._queue.popleft()
            self._queued_bytes -= len(item.body)
            return item

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            item = self._pop()
            if item is None:
                if self._closed:
                    return
                self._wake.clear()
                if not self._queue and not self._closed:
                    await self._wake.wait()
                continue
            self._sending = True
            try:
                await self._send(item)
            finally:
                self._sending = False

    async def _send(self, item: _Export) -> None:
        try:
            failure = await (self._send_grpc(item) if self.protocol == "grpc" else self._send_http(item))
        except OtlpError:
            self.health.skip("unconvertible")
            return
        except httpx.TimeoutException:
            failure = "timeout"
        except httpx.ConnectError:
            failure = "refused"
        except httpx.HTTPError as e:
            failure = f"http_error:{type(e).__name__}"
        except grpc.aio.AioRpcError as e:
            failure = f"grpc_{e.code().name.lower()}"
        except Exception as e:  # the one boundary where a bug must not kill the forwarding task
            logger.exception("OTLP forward to %s failed", self.endpoint)
            failure = f"internal:{type(e).__name__}"
        if failure is None:
            self.health.success(self._clock())
        else:
            kind, _, detail = failure.partition(":")
            self.health.error(kind, self._clock(), detail)

    async def _send_http(self, item: _Export) -> str | None:
        assert self._client is not None
        headers = {**self.headers, "Content-Type": item.content_type}
        if item.content_encoding:
            headers["Content-Encoding"] = item.content_encoding
        resp = await self._client.post(self.endpoint, content=item.body, headers=headers)
        return None if resp.status_code // 100 == 2 else f"http_{resp.status_code // 100}xx:HTTP {resp.status_code}"

    async def _send_grpc(self, item: _Export) -> str | None:
        assert self._channel is not None
        body = item.body
        if media_type(item.content_type) != PROTOBUF or content_coding(item.content_encoding) is not None:
            body = parse_export_request(body, content_type=item.content_type,
                                        content_encoding=item.content_encoding,
                                        max_decompressed=self.max_decompressed).SerializeToString()
        export: Any = self._channel.unary_unary(GRPC_EXPORT_METHOD)  # bytes in, bytes out: no re-serialising
        metadata = tuple((k.lower(), v) for k, v in self.headers.items()) or None
        await export(body, timeout=self.timeout_s, metadata=metadata)
        return None
