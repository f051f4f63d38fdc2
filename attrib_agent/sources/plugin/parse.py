"""The step plugin's messages (docs/exact-mode.md, format v1) into typed events, ids mapped to the frontend's.

Pure: bytes or a decoded record in, an event out. Live datagrams and replayed `vllm_steps` records go through
the same `parse_message`, so replay of a recording exercises exactly what the live source runs. A message of
a version or kind this reader does not know is skipped (`PluginSkip`); one that breaks the format raises
`PluginParseError` with a short reason (counted by the caller, never fatal).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from attrib_agent.events import QueueHead, ScheduledRequest, SchedulerHello, SchedulerStep
from attrib_agent.vllm_ids import external_id

VERSION: Final = 1
MAX_DATAGRAM: Final = 256 * 1024  # the plugin sends at most 200,000 bytes per message
MAX_IDS: Final = 16_384  # requests named in one step: far beyond max_num_seqs; more is not a real step
MAX_ID_CHARS: Final = 512


class PluginParseError(ValueError):
    """A message that breaks format v1; `reason` is the health skip reason."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class PluginSkip(Exception):
    """A well-formed message this reader ignores (a newer version, an unknown kind)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def decode_datagram(data: bytes) -> dict[str, Any]:
    """One datagram (one JSON object) into a dict; PluginParseError when it is not one."""
    if len(data) > MAX_DATAGRAM:
        raise PluginParseError("too_large", f"{len(data)} bytes")
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise PluginParseError("not_json", type(e).__name__) from None
    if not isinstance(obj, dict):
        raise PluginParseError("not_object")
    return obj


def parse_datagram(data: bytes, ts: float, engine: int = 0) -> SchedulerStep | SchedulerHello:
    return parse_message(decode_datagram(data), ts, engine)


def parse_message(m: Mapping[str, Any], ts: float, engine: int = 0) -> SchedulerStep | SchedulerHello:
    """A decoded message; `ts` is when the agent received it."""
    v = m.get("v")
    if not isinstance(v, int) or isinstance(v, bool):
        raise PluginParseError("no_version")
    if v != VERSION:
        raise PluginSkip("version")
    kind = m.get("kind")
    if kind == "hello":
        return SchedulerHello(ts, engine, _int(m, "block_size", lo=1), _int(m, "total_blocks"),
                              _opt_int(m, "max_num_seqs"), _opt_int(m, "token_budget"))
    if kind != "step":
        raise PluginSkip("kind")
    return _step(m, ts, engine)


def _step(m: Mapping[str, Any], ts: float, engine: int) -> SchedulerStep:
    scheduled = tuple(_scheduled(s) for s in _list(m, "scheduled"))
    blocks_raw = m.get("blocks") or {}
    if not isinstance(blocks_raw, dict) or len(blocks_raw) > MAX_IDS:
        raise PluginParseError("bad_field", "blocks")
    blocks = tuple((external_id(_id(k)), _count(n, "blocks")) for k, n in blocks_raw.items())
    head_raw = m.get("head")
    head = None
    if head_raw is not None:
        if not isinstance(head_raw, dict):
            raise PluginParseError("bad_field", "head")
        head = QueueHead(external_id(_id(head_raw.get("id"))), str(head_raw.get("reason", "other"))[:32],
                         _int(head_raw, "tokens"), _int(head_raw, "need_blocks"), _int(head_raw, "preemptions"))
    return SchedulerStep(
        ts=ts, sched_ts=_float(m, "t"), engine=engine, step=_int(m, "step"), iteration=_opt_int(m, "iter"),
        tokens=_int(m, "tokens"), scheduled=scheduled, admitted=_ids(m, "admitted"), resumed=_ids(m, "resumed"),
        preempted=_ids(m, "preempted"), finished=_ids(m, "finished"), running=_int(m, "running"),
        waiting=_int(m, "waiting"), blocks=blocks, free_blocks=_opt_int(m, "free_blocks"),
        total_blocks=_opt_int(m, "total_blocks"), head=head, drops=_opt_int(m, "drops") or 0)


def _scheduled(s: Any) -> ScheduledRequest:
    if not isinstance(s, dict):
        raise PluginParseError("bad_field", "scheduled")
    return ScheduledRequest(external_id(_id(s.get("id"))), _int(s, "new"), _opt_int(s, "done"), _opt_int(s, "hit"))


def _list(m: Mapping[str, Any], key: str) -> list[Any]:
    raw = m.get(key) or []
    if not isinstance(raw, list) or len(raw) > MAX_IDS:
        raise PluginParseError("bad_field", key)
    return raw


def _ids(m: Mapping[str, Any], key: str) -> tuple[str, ...]:
    return tuple(external_id(_id(x)) for x in _list(m, key))


def _id(x: Any) -> str:
    if not isinstance(x, str) or not x or len(x) > MAX_ID_CHARS:
        raise PluginParseError("bad_id")
    return x


def _count(x: Any, key: str) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or x < 0:
        raise PluginParseError("bad_field", key)
    return x


def _int(m: Mapping[str, Any], key: str, lo: int = 0) -> int:
    x = m.get(key)
    if not isinstance(x, int) or isinstance(x, bool) or x < lo:
        raise PluginParseError("bad_field", key)
    return x


def _opt_int(m: Mapping[str, Any], key: str) -> int | None:
    return None if m.get(key) is None else _int(m, key)


def _float(m: Mapping[str, Any], key: str) -> float:
    x = m.get(key)
    if not isinstance(x, int | float) or isinstance(x, bool) or x != x or x in (float("inf"), float("-inf")):
        raise PluginParseError("bad_field", key)
    return float(x)
