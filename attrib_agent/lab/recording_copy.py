"""A recording moved in time, optionally with its request, trace and span ids made its own: what the replay
benchmarks concatenate copies with, and what the faults tests use to replay a recording as if it ran now.

Times move by whole seconds, so vLLM's millisecond digits and the time-stamp formats stay as recorded; ids
change only where the lab's run tag appears (`cmpl-<tag>-s003-0`) and, from copy 1 on, in trace/span ids.
"""

from __future__ import annotations

import base64
import gzip
import zlib
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from attrib_agent.recording import LOG, OTLP
from attrib_agent.sources.log.patterns import PREFIX

_PROTOBUF: Final = "application/x-protobuf"


def copy_tag(tag: str, copy: int) -> str:
    """The run tag of copy `copy`: hex, as long as the recorded tag, never equal to a lab tag in practice."""
    if copy >= 16 ** len(tag):
        raise ValueError(f"copy {copy} does not fit a {len(tag)}-character tag")
    return f"{copy:0{len(tag)}x}"


class CopyRewrite:
    """Rewrites the records of one copy: shift every time by `shift_s`, give ids the copy's tag and number."""

    def __init__(self, tag: str, copy: int, shift_s: int, new_tag: str | None = None) -> None:
        self.copy, self.shift_s = copy, shift_s
        self._old, self._new = f"-{tag}-", f"-{copy_tag(tag, copy) if new_tag is None else new_tag}-"
        self._stamps: dict[str, str] = {}  # recorded "YYYY-MM-DD HH:MM:SS" -> shifted (few per copy)

    def ids(self, text: str) -> str:
        return text.replace(self._old, self._new)

    def binary_id(self, raw: bytes) -> bytes:
        if len(raw) < 4 or not self.copy:
            return raw
        tail = int.from_bytes(raw[-4:], "big") ^ (self.copy & 0xFFFFFFFF)
        return raw[:-4] + tail.to_bytes(4, "big")

    def log_line(self, line: str, receipt_ts: float) -> str:
        m = PREFIX.match(line)
        if m is not None:
            start, end = (m.start("year") if m.group("year") else m.start("month")), m.end("second")
            old = line[start:end]
            new = self._stamps.get(old)
            if new is None:
                new = self._stamps[old] = self._shift_stamp(old, m.group("year") is not None, receipt_ts)
            line = line[:start] + new + line[end:]
        return self.ids(line)

    def _shift_stamp(self, stamp: str, has_year: bool, receipt_ts: float) -> str:
        if has_year:
            return (datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S") + timedelta(seconds=self.shift_s)).strftime(
                "%Y-%m-%d %H:%M:%S")
        year = datetime.fromtimestamp(receipt_ts, UTC).year  # vLLM's default stamp has no year
        d = datetime.strptime(f"{year}-{stamp}", "%Y-%m-%d %H:%M:%S") + timedelta(seconds=self.shift_s)
        return d.strftime("%m-%d %H:%M:%S")

    def otlp_body(self, body: bytes) -> bytes:
        msg = ExportTraceServiceRequest()
        msg.ParseFromString(body)
        ns = self.shift_s * 1_000_000_000
        for rs in msg.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    span.start_time_unix_nano += ns
                    span.end_time_unix_nano += ns
                    for ev in span.events:
                        ev.time_unix_nano += ns
                    span.trace_id = self.binary_id(span.trace_id)
                    span.span_id = self.binary_id(span.span_id)
                    if span.parent_span_id:
                        span.parent_span_id = self.binary_id(span.parent_span_id)
                    for link in span.links:
                        link.trace_id, link.span_id = self.binary_id(link.trace_id), self.binary_id(link.span_id)
                    for kv in span.attributes:
                        if kv.value.HasField("string_value"):
                            kv.value.string_value = self.ids(kv.value.string_value)
        return bytes(msg.SerializeToString())

    def otlp_record(self, rec: Mapping[str, Any]) -> dict[str, Any]:
        if rec.get("content_type") != _PROTOBUF:
            raise ValueError(f"only {_PROTOBUF} OTLP records can be copied, not {rec.get('content_type')!r}")
        body = base64.b64decode(rec["body_b64"])
        encoding = rec.get("content_encoding")
        if encoding == "gzip":
            body = gzip.compress(self.otlp_body(gzip.decompress(body)), mtime=0)
        elif encoding == "deflate":
            body = zlib.compress(self.otlp_body(zlib.decompress(body)))
        elif encoding in (None, "", "identity"):
            body = self.otlp_body(body)
        else:
            raise ValueError(f"unknown OTLP content_encoding {encoding!r}")
        return {**rec, "ts": rec["ts"] + self.shift_s, "body_b64": base64.b64encode(body).decode("ascii")}

    def record(self, stream: str, rec: Mapping[str, Any]) -> dict[str, Any]:
        ts = rec["ts"] + self.shift_s
        if stream == LOG:
            return {**rec, "ts": ts, "line": self.log_line(str(rec["line"]), float(rec["ts"]))}
        if stream == OTLP:
            return self.otlp_record(rec)
        return {**rec, "ts": ts}  # metrics bodies and NVML samples hold no ids and no times of their own


__all__ = ["CopyRewrite", "copy_tag"]
