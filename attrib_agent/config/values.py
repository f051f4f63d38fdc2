"""Parsers for the agent's setting values: one function per kind, shared by the file, env and flag layers.

A value comes typed from TOML or as a string from the environment and the command line; each parser takes
either and returns the typed value or raises `ValueError` with what is wrong, never the value of a secret.
`config.load_config` adds the setting's name and source to make the one-line `ConfigError`.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import re
from collections.abc import Callable, Iterable
from datetime import date, datetime, time
from pathlib import Path
from urllib.parse import SplitResult, urlsplit

from attrib_agent.config.types import HostPort, OtlpTarget, mask_url

OFF_WORDS = frozenset({"none", "off"})  # what turns a URL-valued setting off from env or a flag
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_SIZE = re.compile(r"^\s*(\d+)\s*(b|kb|mb|gb|kib|mib|gib)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}
_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})


def type_name(value: object) -> str:
    """The TOML name of a value's type, for 'expected X, got Y' messages."""
    kinds: list[tuple[type | tuple[type, ...], str]] = [
        (bool, "boolean"), (int, "integer"), (float, "float"), (str, "string"), (list, "array"),
        (dict, "table"), ((datetime, date, time), "date/time")]
    return next((name for t, name in kinds if isinstance(value, t)), type(value).__name__)


def did_you_mean(word: str, candidates: Iterable[str], prefix: str = "") -> str:
    """' (did you mean `x`?)' for the closest candidate, or ''; `prefix` is shared by all, so not compared."""
    close = difflib.get_close_matches(word.removeprefix(prefix), [c.removeprefix(prefix) for c in candidates],
                                      n=1, cutoff=0.6)
    return f" (did you mean `{prefix}{close[0]}`?)" if close else ""


def _text(value: object, what: str = "a string") -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected {what}, got {type_name(value)}")
    text = value.strip()
    if not text:
        raise ValueError(f"expected {what}, got an empty string")
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ValueError("contains control characters")
    return text


def parse_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    shown = repr(value) if isinstance(value, str) else type_name(value)
    raise ValueError(f"expected true/false (or 1/0, yes/no, on/off), got {shown}")


def _number(value: object, whole: bool) -> float:
    if isinstance(value, bool):  # a bool is an int in Python, never a number in a config
        raise ValueError(f"expected a number, got {type_name(value)}")
    if isinstance(value, int) or (isinstance(value, float) and not whole):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(int(value.strip(), 10)) if whole else float(value.strip())
        except ValueError:
            raise ValueError(f"expected {'a whole number' if whole else 'a number'}, got {value!r}") from None
    else:
        raise ValueError(f"expected {'a whole number' if whole else 'a number'}, got {type_name(value)}")
    if not math.isfinite(number):
        raise ValueError(f"must be a finite number, got {value!r}")
    return number


def seconds(minimum: float, *, inclusive: bool = True) -> Callable[[object], float]:
    """A duration in seconds, at least `minimum` (or above it when not `inclusive`)."""
    def parse(value: object) -> float:
        number = _number(value, whole=False)
        if number < minimum or (not inclusive and number == minimum):
            raise ValueError(f"must be {'at least' if inclusive else 'more than'} {minimum:g} s, got {number:g}")
        return number
    return parse


def ratio(minimum: float) -> Callable[[object], float]:
    """A plain factor above `minimum`."""
    def parse(value: object) -> float:
        number = _number(value, whole=False)
        if number <= minimum:
            raise ValueError(f"must be more than {minimum:g}, got {number:g}")
        return number
    return parse


def count(minimum: int, maximum: int) -> Callable[[object], int]:
    """A whole number in [minimum, maximum]."""
    def parse(value: object) -> int:
        number = int(_number(value, whole=True))
        if not minimum <= number <= maximum:
            raise ValueError(f"must be between {minimum} and {maximum}, got {number}")
        return number
    return parse


def port(value: object) -> int:
    """A TCP port; 0 means off for the OTLP receivers."""
    return count(0, 65535)(value)


def size_bytes(minimum: int, maximum: int) -> Callable[[object], int]:
    """A byte count: an integer, or a string with a unit (`64MiB`, `500 MB`, `4096`)."""
    def parse(value: object) -> int:
        if isinstance(value, str):
            m = _SIZE.match(value)
            if not m:
                raise ValueError(f"expected a size such as 1048576, 64MiB or 500MB, got {value!r}")
            number = int(m.group(1)) * _UNITS[(m.group(2) or "b").lower()]
        else:
            number = int(_number(value, whole=True))
        if not minimum <= number <= maximum:
            raise ValueError(f"must be between {minimum} and {maximum} bytes, got {number}")
        return number
    return parse


def choice(options: tuple[str, ...], *, upper: bool = False) -> Callable[[object], str]:
    """One of `options`, matched without regard to case."""
    def parse(value: object) -> str:
        text = _text(value)
        norm = text.upper() if upper else text.lower()
        if norm not in options:
            raise ValueError(f"must be one of {', '.join(options)}, got {text!r}")
        return norm
    return parse


def path(value: object) -> Path:
    """A file system path (`~` expanded); whether it must exist is the setting's own check."""
    return expand_user(Path(_text(value, "a path")))


def expand_user(path: Path) -> Path:
    """`~` and `~user` expanded; an unknown user is a ValueError (pathlib raises RuntimeError)."""
    try:
        return path.expanduser()
    except RuntimeError:
        raise ValueError(f"cannot expand {str(path).split('/', 1)[0]!r}: no such user or home directory") from None


def host(value: object) -> str:
    """An IPv4 or IPv6 address (brackets optional) or a DNS name, returned bare."""
    text = _text(value, "a host name or IP address")
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if ":" in text:
        try:
            ipaddress.IPv6Address(text)
        except ValueError:
            raise ValueError(f"{text!r} is not an IPv6 address") from None
        return text
    if re.fullmatch(r"[\d.]+", text):
        try:
            ipaddress.IPv4Address(text)
        except ValueError:
            raise ValueError(f"{text!r} is not an IPv4 address") from None
        return text
    if len(text) > 253 or not all(_HOST_LABEL.match(label) for label in text.rstrip(".").split(".")):
        raise ValueError(f"{text!r} is not a valid host name")
    return text


def host_port(value: object) -> HostPort:
    """`host:port`, `1.2.3.4:9400` or `[::1]:9400`; port 0 lets the OS pick one."""
    text = _text(value, "host:port")
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or not text[end + 1:].startswith(":"):
            raise ValueError(f"expected [IPv6]:port, got {text!r}")
        name, port_text = text[1:end], text[end + 2:]
    else:
        name, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(f"expected host:port (e.g. 127.0.0.1:9400), got {text!r}")
        if ":" in name:
            raise ValueError(f"an IPv6 address needs brackets, e.g. [::1]:9400, got {text!r}")
        if not name:
            raise ValueError(f"missing host in {text!r}: use 0.0.0.0:{port_text} (all IPv4) or [::]:{port_text}")
    return HostPort(host(name), port(port_text))


def _split_url(value: object, schemes: str, why: str = "") -> tuple[str, SplitResult]:
    text = _text(value, "a URL")
    if any(c.isspace() for c in text):
        raise ValueError("a URL has no spaces")
    parts = urlsplit(text)
    if "://" not in text or parts.scheme not in schemes.split():
        wanted = ", ".join(f"{s}://" for s in schemes.split())
        raise ValueError(f"expected a URL starting {wanted}{why}, got {mask_url(text)!r}")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError(f"bad port in URL {mask_url(text)!r}") from None
    if not parts.hostname:
        raise ValueError(f"no host in URL {mask_url(text)!r}")
    return text, parts


def http_url(value: object) -> str:
    """vLLM's base URL (http or https), without a trailing slash."""
    text, parts = _split_url(value, "http https")
    if parts.query or parts.fragment:
        raise ValueError(f"a base URL has no query or fragment, got {mask_url(text)!r}")
    return text.rstrip("/")


def otlp_target(value: object) -> OtlpTarget | None:
    """An OTLP endpoint URL, or None for `none`/`off`; http(s) without a path gets `/v1/traces` as OTel's does."""
    if isinstance(value, str) and value.strip().lower() in OFF_WORDS:
        return None
    text, parts = _split_url(value, "http https grpc grpcs", " (the scheme picks the protocol)")
    scheme = parts.scheme
    if scheme in ("http", "https"):
        url = text if parts.path not in ("", "/") else text.rstrip("/") + "/v1/traces"
        return OtlpTarget(url, "http/protobuf", url, scheme == "https")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError(f"a grpc:// URL is only host:port, got {mask_url(text)!r}")
    hostport = str(HostPort(parts.hostname or "", parts.port or 4317))
    return OtlpTarget(f"{scheme}://{hostport}", "grpc", ("https://" if scheme == "grpcs" else "") + hostport,
                      scheme == "grpcs")


def is_loopback(name: str) -> bool:
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
