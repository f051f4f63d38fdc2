"""Request ids as the API accepts them: vLLM's own, or the client's X-Request-Id / response id forms.

vLLM 0.32 names a completion `cmpl-<X-Request-Id>-0` (the response body says `cmpl-<X-Request-Id>`), a chat
completion `chatcmpl-<X-Request-Id>` and a Responses API turn `<response id>_0`; its log names the engine's
id, `<id>-<8 hex>` (`vllm_ids`). A caller usually holds one of these other forms, so the API tries the few
forms vLLM derives from it and answers when exactly one of them is a request the agent knows.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from attrib_agent.vllm_ids import RESPONSES_FIRST_TURN, frontend_ids

MAX_ID_CHARS: Final = 256
# What X-Request-Id values look like in practice (uuids, tags, dashes): no slashes, spaces or control chars.
_ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+=~-]*")
_PREFIXES: Final = ("", "cmpl-", "chatcmpl-")
_SUFFIXES: Final = ("", "-0")


class BadRequestId(ValueError):
    """The id cannot be a request id (too long, empty, path-like or with characters ids never have)."""


@dataclass(frozen=True, slots=True)
class Resolved:
    request_id: str | None  # the vLLM id, when exactly one form is known
    candidates: tuple[str, ...]  # every known form (more than one: ambiguous)


def check_id(raw: str) -> str:
    """The id unchanged if it can be one; raises BadRequestId with a message safe to return to the caller."""
    if len(raw) > MAX_ID_CHARS:
        raise BadRequestId(f"request id longer than {MAX_ID_CHARS} characters")
    if not _ID_RE.fullmatch(raw) or ".." in raw:
        raise BadRequestId("malformed request id: expected letters, digits and . _ : @ + = ~ -")
    return raw


def id_forms(raw: str) -> tuple[str, ...]:
    """The id itself first, then the forms vLLM derives from a client id (`cmpl-X-0`, `chatcmpl-X`, `X-0`,
    `resp_..._0` ...), then the frontend's ids when `raw` is the engine's (a log line's `<id>-<8 hex>`, an n>1
    child's `<i>_<id>-<8 hex>`: the log parser's rule, `vllm_ids.frontend_ids`)."""
    forms = [raw] + [p + raw + s for p in _PREFIXES for s in _SUFFIXES] + [raw + RESPONSES_FIRST_TURN,
                                                                           *frontend_ids(raw)]
    return tuple(dict.fromkeys(f for f in forms if len(f) <= MAX_ID_CHARS))


def resolve(raw: str, known: Callable[[str], bool], filed: Callable[[str], str] | None = None) -> Resolved:
    """vLLM's id for `raw`: the id itself when known, else the single known derived form (none if ambiguous).
    `filed`: the request the agent reports a known id under (an n>1 child's client request): forms that name the
    same one are one answer, and it is that request's id."""
    check_id(raw)
    if known(raw):
        return Resolved(filed(raw) if filed else raw, (raw,))
    hits = tuple(f for f in id_forms(raw)[1:] if known(f))
    if filed is not None:
        hits = tuple(dict.fromkeys(filed(f) for f in hits))
    return Resolved(hits[0] if len(hits) == 1 else None, hits)
