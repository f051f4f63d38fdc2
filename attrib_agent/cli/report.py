"""Human and machine renderings of attribution results for the command line (`replay`, `explain`, `demo`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attrib_agent.attribution.result import AttributionResult, itl_gaps
from attrib_agent.attribution.result_codec import culprit_from_dict, to_dict


def _ms(x: float | None) -> str:
    """Sub-millisecond figures keep a decimal: a culprit's 0.4 ms per token over 100 tokens is no "0 ms"."""
    if x is None:
        return "-"
    if abs(x) >= 1:
        return f"{x:.2f} s"
    return f"{x * 1000:.1f} ms" if 0 < abs(x) < 0.0095 else f"{x * 1000:.0f} ms"


def _causes_text(c: Mapping[str, Any], gaps: int, evidence: Mapping[str, str]) -> str:
    """A culprit's blame in seconds of the victim's time by cause (TTFT and ITL together), with its evidence."""
    culprit = culprit_from_dict(c)
    by_cause = sorted(culprit.blame_by_cause(gaps).items(), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {_ms(v)}" + (f" ({evidence[k]})" if k in evidence else "")
                     for k, v in by_cause) or "-"


def _short_id(rid: str, width: int = 34) -> str:
    return rid if len(rid) <= width else rid[: width - 1] + "…"


def json_lines(results: Iterable[AttributionResult]) -> Iterable[str]:
    for r in results:
        yield json.dumps(to_dict(r), sort_keys=False)


def summary_row(r: AttributionResult) -> str:
    top = r.top_culprit()
    who = "-"
    if top is not None:
        by_cause = top.blame_by_cause(r.itl_gaps)
        cause = max(by_cause.items(), key=lambda kv: kv[1])[0] if by_cause else "-"
        who = f"{_short_id(top.request_id)} {top.share:.0%} {cause}{' (whale)' if top.is_whale else ''}"
    quiet = "no interference" if r.no_interference else who
    return (f"{_short_id(r.request_id):<35} ttft {_ms(r.ttft_s):>9} (+{_ms(r.ttft_slowdown_s):>9})  "
            f"itl {_ms(r.itl_s):>7} (+{_ms(r.itl_slowdown_s):>7})  {quiet}")


def explain_table(d: Mapping[str, Any]) -> str:
    """A human table of who slowed one request, from its API JSON (result_codec.to_dict plus status)."""
    lines = [f"request {d['request_id']}  ({d.get('status', 'final')})"]
    lines.append(f"  TTFT {_ms(d.get('ttft_s'))}: uncontended {_ms(d.get('ttft_baseline_s'))}, "
                 f"slowed by {_ms(d.get('ttft_slowdown_s'))}")
    lines.append(f"  ITL  {_ms(d.get('itl_s'))}: uncontended {_ms(d.get('itl_baseline_s'))}, "
                 f"slowed by {_ms(d.get('itl_slowdown_s'))} per token")
    culprits: Sequence[Mapping[str, Any]] = d.get("culprits") or []
    if d.get("no_interference") or not culprits:
        lines.append("  no interference above the noise floor" if d.get("no_interference")
                     else "  no culprit found")
    else:
        lines.append(f"  {'culprit':<36}{'TTFT blamed':>12}{'ITL blamed':>12}{'share':>7}  causes (evidence)")
        gaps = itl_gaps(d.get("completion_tokens"), d.get("sequences") or 1)  # (an n>1 request: its children's)
        for c in culprits:
            causes = _causes_text(c, gaps, d.get("evidence") or {})
            tag = " [whale]" if c.get("is_whale") else ""
            lines.append(f"  {_short_id(str(c['request_id'])) + tag:<36}{_ms(c['ttft_s']):>12}"
                         f"{_ms(c['itl_s']):>12}{c['share']:>7.0%}  {causes}")
    if d.get("preempted_s"):
        lines.append(f"  preempted by vLLM: stalled and recomputed for {_ms(d['preempted_s'])} (observed)")
    lines.append(f"  unexplained: TTFT {_ms(d.get('unexplained_s'))}, ITL {_ms(d.get('unexplained_itl_s'))} per token")
    if d.get("trace_id"):
        lines.append(f"  trace {d['trace_id']}")
    return "\n".join(lines)


def write_parquet(results: Sequence[AttributionResult], path: Path) -> None:
    """One row per request; culprits as a list of structs (polars)."""
    import polars as pl

    rows = []
    for r in results:
        d = to_dict(r)
        d["culprits"] = [{**c, "causes": json.dumps(c["causes"], sort_keys=True),
                          "itl_causes": json.dumps(c["itl_causes"], sort_keys=True)} for c in d["culprits"]]
        d["evidence"] = json.dumps(d["evidence"], sort_keys=True)
        rows.append(d)
    path.parent.mkdir(parents=True, exist_ok=True)
    pl.DataFrame(rows, infer_schema_length=None).write_parquet(path)
