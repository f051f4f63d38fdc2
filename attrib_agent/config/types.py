"""The typed values a configuration holds beyond plain numbers and strings, and how each is shown.

`Secret` keeps the API token out of every repr, log line and describe() row; `shown()` is the one way a
value is turned into text for people, masking secrets and URL passwords.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple
from urllib.parse import urlsplit

# How long the agent's HTTP servers (OTLP receiver, API) keep an idle connection. OpenTelemetry SDKs export a
# batch every 5 s (OTEL_BSP_SCHEDULE_DELAY) on one kept-alive connection, and uvicorn's default idle limit is
# also 5 s: the server closing just as the next batch is sent resets it ("connection reset by peer", a lost
# batch). 75 s is nginx's default and above Prometheus' usual 15-60 s scrape interval.
HTTP_KEEP_ALIVE_S = 75


class ConfigError(Exception):
    """A setting that cannot be used: one line naming the setting, where it came from, and what is wrong."""


class Secret:
    """A value that must reach no log, repr or describe() row; `reveal()` is the one way to read it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    def __str__(self) -> str:
        return "***"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash((Secret, len(self._value)))


class HostPort(NamedTuple):
    """A listen address; `str()` gives the form the user writes back (`[::1]:9400` for IPv6)."""

    host: str  # bare (no brackets), as socket.bind and uvicorn want it
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class OtlpTarget:
    """An OTLP endpoint; the URL's scheme picks the protocol: http(s):// -> http/protobuf, grpc(s):// -> grpc.

    `endpoint` is what `OtlpForwarder` takes: the full URL for http/protobuf, `host:port` (or
    `https://host:port` with TLS) for grpc, which is also what OTel's gRPC span exporter accepts.
    """

    url: str  # normalised: http(s) URLs end in a path (default /v1/traces), grpc(s) URLs carry a port
    protocol: Literal["http/protobuf", "grpc"]
    endpoint: str
    tls: bool


def mask_url(url: str) -> str:
    """The URL with any password replaced by ***, for messages and describe()."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    netloc = f"{user}:***@" + parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=netloc).geturl()


def shown(value: Any) -> str:
    """A value as describe() shows it: secrets masked, URL passwords masked, None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, Secret):
        return str(value)
    if isinstance(value, OtlpTarget):
        return mask_url(value.url)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and "://" in value:
        return mask_url(value)
    return str(value)
