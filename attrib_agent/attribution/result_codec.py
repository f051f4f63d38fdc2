"""One JSON shape for an attribution result: the API, `replay --json`, the journal and Parquet all use it.

Ids, counts and times only. `from_dict(to_dict(r)) == r`, and unknown keys are ignored so an older agent
reads a newer journal.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from attrib_agent.attribution.result import NO_CAUSES, NO_EVIDENCE, AttributionResult, Culprit


def culprit_to_dict(c: Culprit) -> dict[str, Any]:
    ttft_s, itl_s, share, kv_block_seconds = c.numbers()  # one read of the packed culprit
    # items(): a packed map's pairs in one unpack (dict(map) would look each key up: the API's hot path)
    return {"request_id": c.request_id, "ttft_s": ttft_s, "itl_s": itl_s, "share": share,
            "causes": dict(c.causes.items()), "kv_block_seconds": kv_block_seconds, "is_whale": c.is_whale,
            "itl_causes": dict(c.itl_causes.items())}


def to_dict(r: AttributionResult) -> dict[str, Any]:
    """The public JSON of a result (issue #5's field names), culprits largest first."""
    return {
        "request_id": r.request_id, "engine": r.engine, "final": r.final,
        "trace_id": r.trace_id, "span_id": r.span_id,
        "arrival_ts": r.arrival_ts, "finished_ts": r.finished_ts,
        "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens, "is_whale": r.is_whale,
        "ttft_s": r.ttft_s, "ttft_baseline_s": r.ttft_baseline_s, "ttft_slowdown_s": r.ttft_slowdown_s,
        "itl_s": r.itl_s, "itl_baseline_s": r.itl_baseline_s, "itl_slowdown_s": r.itl_slowdown_s,
        "unexplained_s": r.unexplained_ttft_s, "unexplained_itl_s": r.unexplained_itl_s,
        "no_interference": r.no_interference, "quality": r.quality, "preempted_s": r.preempted_s, "mode": r.mode,
        "sequences": r.sequences, "chosen_by": r.chosen_by, "evidence": dict(r.evidence),
        "culprits": [culprit_to_dict(c) for c in r.culprits],
    }


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _sequences(v: Any) -> int:
    """An n>1 client request's output sequences: at least 1 (a journal line saying less is not one we wrote)."""
    n = int(v)
    if n < 1:
        raise ValueError(f"sequences must be >= 1, got {n}")
    return n


def _opt_str(v: Any) -> str | None:
    return None if v is None else str(v)


def _causes(raw: Any) -> Mapping[str, float]:
    return {str(k): float(v) for k, v in dict(raw).items()} if raw else NO_CAUSES


def _evidence(raw: Any) -> Mapping[str, str]:
    return {str(k): str(v) for k, v in dict(raw).items()} if raw else NO_EVIDENCE


def culprit_from_dict(c: Mapping[str, Any]) -> Culprit:
    """Inverse of culprit_to_dict (fields a journal from before them lacks take their defaults)."""
    return Culprit(request_id=sys.intern(str(c["request_id"])), ttft_s=float(c["ttft_s"]), itl_s=float(c["itl_s"]),
                   share=float(c["share"]), causes=_causes(c.get("causes")),
                   kv_block_seconds=float(c.get("kv_block_seconds", 0.0)), is_whale=bool(c.get("is_whale", False)),
                   itl_causes=_causes(c.get("itl_causes")))


def from_dict(d: dict[str, Any]) -> AttributionResult:
    """Inverse of to_dict; raises KeyError/TypeError/ValueError on a record that is not a result. Request ids
    are interned: a journal restored holds one string per id, not one per result and culprit naming it."""
    culprits = tuple(culprit_from_dict(c) for c in d.get("culprits") or [])
    return AttributionResult(
        request_id=sys.intern(str(d["request_id"])), finished_ts=float(d["finished_ts"]),
        ttft_s=_opt_float(d.get("ttft_s")),
        ttft_baseline_s=_opt_float(d.get("ttft_baseline_s")), ttft_slowdown_s=float(d["ttft_slowdown_s"]),
        itl_s=_opt_float(d.get("itl_s")), itl_baseline_s=_opt_float(d.get("itl_baseline_s")),
        itl_slowdown_s=float(d["itl_slowdown_s"]), culprits=culprits,
        unexplained_ttft_s=float(d.get("unexplained_s", 0.0)), unexplained_itl_s=float(d.get("unexplained_itl_s", 0.0)),
        no_interference=bool(d.get("no_interference", False)), quality=float(d.get("quality", 0.0)),
        is_whale=bool(d.get("is_whale", False)), engine=int(d.get("engine", 0)),
        arrival_ts=_opt_float(d.get("arrival_ts")), prompt_tokens=_opt_int(d.get("prompt_tokens")),
        completion_tokens=_opt_int(d.get("completion_tokens")), trace_id=_opt_str(d.get("trace_id")),
        span_id=_opt_str(d.get("span_id")), final=bool(d.get("final", True)),
        preempted_s=float(d.get("preempted_s", 0.0)), evidence=_evidence(d.get("evidence")),
        mode=str(d.get("mode", "inferred")), sequences=_sequences(d.get("sequences", 1)),
        chosen_by=str(d.get("chosen_by", "share")))
