"""The result store keeps each result packed (attribution/result_pack.py) and decodes it on read: what a read
returns is what was put, to the bit and in its JSON; and the store is bounded by bytes as well as by count and
age, the oldest going first."""

from __future__ import annotations

import gc
import json
import math
import struct
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attrib_agent.attribution.culprit_windows import top_of
from attrib_agent.attribution.result import AttributionResult, Cause, Culprit, Evidence
from attrib_agent.attribution.result_codec import from_dict, to_dict
from attrib_agent.attribution.result_pack import filed, pack, unpack
from attrib_agent.attribution.store import ResultStore
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sinks.api.plumbing import dumps
from attrib_agent.sources.replay import ReplaySource

RECORDINGS = Path(__file__).parents[2] / "fixtures" / "recordings"


def _bits(r: AttributionResult) -> list[tuple[str, Any]]:
    """Every field with its type, floats as their bits (so -0.0 and 0.0, or NaN payloads, differ)."""
    def one(v: Any) -> Any:
        return (float, struct.pack("<d", v)) if type(v) is float else (type(v), v)
    out = [(f.name, one(getattr(r, f.name))) for f in fields(r) if f.name not in ("culprits", "evidence")]
    out.append(("evidence", list(r.evidence.items())))
    for c in r.culprits:
        out.append(("culprit", (c.request_id, c.is_whale, [one(x) for x in c.numbers()],
                                [(k, one(v)) for k, v in c.causes.items()],
                                [(k, one(v)) for k, v in c.itl_causes.items()])))
    return out


def _replayed(name: str) -> list[AttributionResult]:
    """Every result the pipeline emitted over a recording, the last per request (what it stored)."""
    p = AttributionPipeline()
    last: dict[str, AttributionResult] = {}
    for ev in ReplaySource(RECORDINGS / name).events():
        for r in p.feed(ev):
            last[r.request_id] = r
    for r in p.settle():
        last[r.request_id] = r
    assert len(last) == len(p.store) > 0
    return list(last.values())


@pytest.mark.parametrize("name", ["preempt", "whale2", "bench-mixed", "canary", "nseq-steps"])
def test_every_result_of_a_replay_reads_back_as_it_was_put(name: str) -> None:
    results = _replayed(name)
    store = ResultStore(max_results=len(results), max_bytes=2**40)
    for r in results:
        store.put(r)
    assert all(type(v) is bytes and not gc.is_tracked(v) for v in store._items.values())  # every real result
    # packs, into one object the collector does not track; the culprit index files those same objects
    filed = {rid: v for bucket in store.culprits._buckets.values() for rid, v in bucket.items()}
    assert filed.keys() == store._items.keys() and all(filed[rid] is v for rid, v in store._items.items())
    for r in results:
        got = store.get(r.request_id)
        assert got is not None and got is not r
        assert got == r and _bits(got) == _bits(r)
        assert dumps(to_dict(got)) == dumps(to_dict(r))  # the API's JSON, byte for byte
        back = from_dict(json.loads(dumps(to_dict(r))))  # a journal restored: packs and reads back too
        assert pack(back) == store._items[r.request_id]
    assert [x.request_id for x in store] == [r.request_id for r in results]
    assert top_of(store, 10) == top_of(results, 10)


_float = st.floats() | st.sampled_from([0.0, -0.0, 5e-324, math.inf, -math.inf, math.nan])
_opt_float = st.none() | _float
_causes = st.dictionaries(st.sampled_from([c.value for c in Cause]), _float)
_ids = st.text(min_size=1, max_size=40) | st.sampled_from(["cmpl-a-0", "x" * 255, "é" * 128, "\ud800"])
_culprit = st.builds(Culprit, request_id=_ids, ttft_s=_float, itl_s=_float, share=_float, causes=_causes,
                     kv_block_seconds=_float, is_whale=st.booleans(), itl_causes=_causes)
_hexes = st.sampled_from([None, "0" * 32, "9501cd62ddfc08cd7ee3155428d438e0", "9501CD62DDFC08CD7EE3155428D438E0",
                          "not hex", "ab" * 15 + " a", "6d68b8c5bb93e424", "6d68b8c5bb93e42"])
_result = st.builds(
    AttributionResult, request_id=_ids,  # (the index files by finish time: a finite one)
    finished_ts=st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([-0.0]) | st.integers(0, 10),
    ttft_s=_opt_float, ttft_baseline_s=_opt_float, ttft_slowdown_s=_float, itl_s=_opt_float, itl_baseline_s=_opt_float,
    itl_slowdown_s=_float, culprits=st.lists(_culprit, max_size=4).map(tuple), unexplained_ttft_s=_float,
    unexplained_itl_s=_float, no_interference=st.booleans(), quality=_float, is_whale=st.booleans(),
    engine=st.integers(0, 70_000), arrival_ts=_opt_float, prompt_tokens=st.none() | st.integers(-1, 2**33),
    completion_tokens=st.none() | st.integers(-1, 2**33), trace_id=_hexes, span_id=_hexes,
    final=st.booleans(), preempted_s=_float,
    evidence=st.dictionaries(st.sampled_from([c.value for c in Cause]),
                             st.sampled_from([e.value for e in Evidence] + ["a_newer_evidence"])),
    mode=st.sampled_from(["inferred", "exact", "a_newer_mode"]), sequences=st.just(1) | st.integers(-1, 70_000))


@settings(max_examples=400, deadline=None)
@given(_result)
def test_any_result_reads_back_to_the_bit_packed_or_kept_whole(r: AttributionResult) -> None:
    """NaN, -0.0, None, ids of any text, span ids not hex, numbers out of range, a newer agent's evidence: a
    result packs exactly or is kept as the object, and reads back the same either way."""
    store = ResultStore()
    store.put(r)
    got = store.get(r.request_id)
    assert got is not None and _bits(got) == _bits(r)
    assert dumps(to_dict(got)) == dumps(to_dict(r))
    blob = pack(r)
    assert (type(store._items[r.request_id]) is bytes) == (blob is not None)
    if blob is not None:
        assert _bits(unpack(r.request_id, blob)) == _bits(r)
        assert filed(blob)[1] == r.itl_gaps  # what the culprit index reads, undecoded (an n>1 request's gaps too)


def _result(i: int, culprits: int = 3) -> AttributionResult:
    blame = tuple(Culprit(f"cmpl-w{i % 7}-{k}", 0.1 * k, 0.001, 0.5, {"kv_pressure": 1.0}) for k in range(culprits))
    return AttributionResult(f"cmpl-{i:06d}-0", 1000.0 + i, 0.5, 0.2, 0.3, 0.01, 0.008, 0.002, blame, 0.0, 0.0,
                             False, 0.9, completion_tokens=20, trace_id=f"{i:032x}", span_id=f"{i:016x}")


def _counted(store: ResultStore) -> int:
    return sum(store.cost(rid, v) for rid, v in store._items.items())


def test_the_store_is_bounded_by_bytes_oldest_first() -> None:
    one = ResultStore.cost("cmpl-000000-0", pack(_result(0)) or b"")
    store = ResultStore(max_results=10_000, max_bytes=50 * one + one // 2)
    for i in range(400):
        store.put(_result(i))
        assert store.bytes == _counted(store) <= store.max_bytes
    assert len(store) == 50 and store.evicted == 350
    assert [r.request_id for r in store] == [f"cmpl-{i:06d}-0" for i in range(350, 400)]  # the newest 50
    assert len(store.culprits) == 50
    store.put(_result(400, culprits=40))  # a large one pushes out as many of the oldest as it takes
    assert store.bytes == _counted(store) <= store.max_bytes
    assert [r.request_id for r in store][-1] == "cmpl-000400-0" and store.get("cmpl-000350-0") is None
    store.put(replace(_result(399), final=False))  # replaced: counted once, moved to the newest
    assert store.bytes == _counted(store) and [r.request_id for r in store][-1] == "cmpl-000399-0"
    before = len(store)  # by age (398 and newer stay), the byte count follows
    assert store.expire(1000.0 + 398 + 3600.0) == before - 3
    assert [r.request_id for r in store] == ["cmpl-000398-0", "cmpl-000400-0", "cmpl-000399-0"]
    assert store.bytes == _counted(store) and len(store.culprits) == 3
    with pytest.raises(ValueError):
        ResultStore(max_bytes=0)


_MEASURE = """
import gc, sys, tracemalloc
from tests.unit.attribution.test_store_packed import _result
from attrib_agent.attribution.store import ResultStore
culprits = int(sys.argv[1])
gc.collect()
tracemalloc.start()
before = tracemalloc.get_traced_memory()[0]
store = ResultStore(max_results=10**6, max_bytes=2**40)
for i in range(3000):
    store.put(_result(i, culprits))
gc.collect()
print(store.bytes, tracemalloc.get_traced_memory()[0] - before)
"""


@pytest.mark.parametrize("culprits", [0, 2, 7])
def test_the_bytes_counted_are_the_bytes_held(culprits: int) -> None:
    """What the store counts against max_bytes is what its results take in the heap (tracemalloc), within 25 %:
    the bound means megabytes of memory, not a nominal figure. Measured in a fresh interpreter, where nothing else
    allocates meanwhile (other tests' threads would)."""
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(culprits)], cwd=Path(__file__).parents[3],
                         capture_output=True, text=True, check=True).stdout
    counted, used = map(int, out.split())
    assert 0.8 < counted / used < 1.25, (counted, used)


@pytest.mark.parametrize("change", [
    {"trace_id": "9501CD62DDFC08CD7EE3155428D438E0"},  # not lowercase hex: its text would not come back
    {"evidence": {"kv_pressure": "a_newer_evidence"}},  # a journal from a newer agent
    {"mode": "a_newer_mode"},
    {"prompt_tokens": 2**32},
    {"quality": 1},  # an int where a float goes: JSON `1`, not `1.0`
    {"culprits": (Culprit("cmpl-w-0", 0.1, 0.0, 1.0, {"a_newer_cause": 1.0}),)},
])
def test_a_result_that_cannot_be_packed_exactly_is_kept_whole(change: dict[str, Any]) -> None:
    r = replace(_result(1), **change)
    assert pack(r) is None
    store = ResultStore()
    store.put(r)
    assert store.get(r.request_id) is r and store.bytes == ResultStore.cost(r.request_id, r) > 1000
    assert top_of(store, 3) == top_of([r], 3)
