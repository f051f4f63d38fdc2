"""Many real-looking attribution results from few real ones: the committed recordings replayed, then copied.

Shared by the memory benchmark (RSS of a full result store) and the API load benchmark (a full store behind
the real API). Every recording replayed through the pipeline gives ~90 real final results; each copy gets
the ids a later copy of the recording would have (`_recordings.copy_tag`) and is decoded afresh through the
result codec, so every copy owns its strings and floats as a result built by the pipeline would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

from attrib_agent.attribution.result import AttributionResult
from attrib_agent.attribution.result_codec import from_dict, to_dict
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sources.replay import ReplaySource
from benchmarks._recordings import SourceRecording, copy_tag, load_sources

_ZERO = 0.0


def real_results(sources: list[SourceRecording]) -> list[tuple[str, AttributionResult]]:
    """(run tag, final result) of every request of every recording."""
    out = []
    for src in sources:
        p = AttributionPipeline()
        for ev in ReplaySource(src.path).events():
            p.feed(ev)
        p.settle()
        out += [(src.tag, r) for r in p.store if r.final]
    return out


def copied_result(tag: str, r: AttributionResult, copy: int, ids: dict[str, str]) -> AttributionResult:
    """`r` as copy `copy` would have produced it: ids retagged, every value its own object (decoded afresh),
    except that one request's id is one string throughout a copy (`ids`), as the pipeline makes it: results
    and culprits take it from the same timeline lifecycle."""
    old, new = f"-{tag}-", f"-{copy_tag(tag, copy)}-"
    d = json.loads(json.dumps(to_dict(r)))
    d["request_id"] = ids.setdefault(d["request_id"], d["request_id"].replace(old, new))
    for c in d["culprits"]:
        c["request_id"] = ids.setdefault(c["request_id"], c["request_id"].replace(old, new))
    for key, width in (("trace_id", 8), ("span_id", 8)):
        if d[key]:
            d[key] = d[key][:-width] + f"{int(d[key][-width:], 16) ^ copy:0{width}x}"
    d["finished_ts"] += copy * 0.036  # 100,000 results over the hour the store keeps
    for obj in (d, *d["culprits"]):  # the attributor's zeros are its literal 0.0, one object
        for k, v in obj.items():
            if isinstance(v, float) and v == 0.0:
                obj[k] = _ZERO
    return from_dict(d)


def base_results() -> list[tuple[str, AttributionResult]]:
    """real_results, made in a child process: replaying leaves garbage in this one's heap that RSS would count."""
    cmd = [sys.executable, "-m", "benchmarks._results"]
    out = json.loads(subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout)
    return [(tag, from_dict(d)) for tag, d in out]


def fill_store(p: AttributionPipeline, base: list[tuple[str, AttributionResult]], n: int,
               adjust: Callable[[int, AttributionResult], AttributionResult] | None = None) -> None:
    """Copies of `base` into `p`'s store until it holds `n`, copy numbers as the concatenation gives them (one
    per round and recording), and the span ids the pipeline keeps beside them (its last `max_pending`).
    `adjust(i, result)` may change the i-th copy before it is stored (e.g. its finish time)."""
    tags = {tag: i for i, tag in enumerate(dict.fromkeys(tag for tag, _ in base))}
    rnd = i = 0
    while len(p.store) < n and not p.store.evicted:  # (its byte bound, reached first, would stop it short)
        ids: dict[str, str] = {}
        for tag, r in base:
            r = copied_result(tag, r, rnd * len(tags) + tags[tag], ids)
            if adjust is not None:
                r = adjust(i, r)
            i += 1
            p.store.put(r)
            if r.trace_id is not None and r.span_id is not None:  # as the pipeline keeps the ids of the
                p._spans[r.request_id] = (r.trace_id, r.span_id)  # last max_pending spans
                while len(p._spans) > p.config.max_pending:
                    p._spans.popitem(last=False)
        rnd += 1  # (whole rounds: the store's own bound drops the oldest past max_results)


if __name__ == "__main__":  # base_results' child: the real results as JSON on stdout
    print(json.dumps([(tag, to_dict(r)) for tag, r in real_results(load_sources())]))
