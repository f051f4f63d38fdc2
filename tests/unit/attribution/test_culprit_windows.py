"""The store's culprit index answers `top` exactly as a scan of the stored results would, while results arrive,
are replaced (partial -> final), evicted by count or expired by age, and windows slide, grow and shrink."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attrib_agent.attribution.culprit_windows import CulpritTotal, CulpritWindows, top_of
from attrib_agent.attribution.result import AttributionResult, Culprit
from attrib_agent.attribution.store import ResultStore

CULPRITS = [f"w{i}" for i in range(6)]


def _result(rid: str, finished: float, blame: list[tuple[str, float, float, bool]], final: bool,
            tokens: int) -> AttributionResult:
    culprits = tuple(Culprit(cid, ttft, itl, 0.0, {"kv_pressure": ttft / 2, "head_of_line": ttft / 2} if ttft > 0.2
                             else {}, is_whale=whale) for cid, ttft, itl, whale in blame)
    return AttributionResult(rid, finished, 1.0, 0.01, 0.99, 0.02, 0.01, 0.01, culprits, 0.0, 0.0, False, 1.0,
                             completion_tokens=tokens, final=final)


blames = st.lists(st.tuples(st.sampled_from(CULPRITS), st.floats(0, 2), st.floats(0, 0.01), st.booleans()),
                  max_size=3, unique_by=lambda t: t[0])
ops = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, 30), st.one_of(st.floats(0, 200), st.integers(0, 200).map(float)),
              blames, st.booleans(), st.integers(1, 40)),
    st.tuples(st.just("expire"), st.floats(0, 400)),
    # few distinct query times and lengths, so cached windows are met again after the store changed
    st.tuples(st.just("top"), st.one_of(st.integers(0, 30).map(lambda t: 10.0 * t), st.floats(0, 300)),
              st.sampled_from([5.0, 10.0, 25.0, 60.0, 300.0]), st.integers(1, 4)),
), max_size=80)


def _same(got: list[CulpritTotal], want: list[CulpritTotal]) -> None:
    assert [t.request_id for t in got] == [t.request_id for t in want]
    for g, w in zip(got, want, strict=True):
        assert g.victims == w.victims and g.is_whale == w.is_whale
        for a, b in ((g.seconds, w.seconds), (g.ttft_s, w.ttft_s), (g.itl_s, w.itl_s)):
            assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
        gc = g.as_dict()["causes"]
        wc = w.as_dict()["causes"]
        assert isinstance(gc, dict) and isinstance(wc, dict) and gc.keys() == wc.keys()
        for k in gc:
            assert math.isclose(gc[k], wc[k], rel_tol=1e-9, abs_tol=1e-9)


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(3, 20))
def test_top_equals_a_scan_of_the_store(script: list[tuple], max_results: int) -> None:  # type: ignore[type-arg]
    store = ResultStore(max_results=max_results, max_age_s=120.0)
    for op in script:
        if op[0] == "put":
            _, n, ts, blame, final, tokens = op
            store.put(_result(f"v{n}", ts, blame, final, tokens))
        elif op[0] == "expire":
            store.expire(op[1])
        else:
            _, until, window, limit = op
            got = store.culprits.top(until - window, until, limit)
            inside = [r for r in store if until - window <= r.finished_ts <= until]
            want = top_of(inside, limit)
            _same(got.culprits, want.culprits)
            assert (got.results, got.partial_results) == (want.results, want.partial_results)
        assert len(store.culprits) == len(store)


def test_a_sliding_window_is_moved_not_rebuilt_and_windows_are_bounded() -> None:
    windows = CulpritWindows(bucket_s=10.0, max_windows=2)
    results = [_result(f"v{i}", float(i), [("w1", 0.5, 0.0, True), (f"light{i}", 0.01, 0.0, False)], True, 5)
               for i in range(1000)]
    for r in results:
        windows.add(r.request_id, r)
    for until in range(300, 1000, 7):
        got = windows.top(until - 300.0, float(until), 3)
        want = top_of([r for r in results if until - 300 <= r.finished_ts <= until], 3)
        _same(got.culprits, want.culprits)
    assert got.culprits[0].request_id == "w1" and got.culprits[0].victims == 301
    for w in (60.0, 120.0, 600.0):
        windows.top(999.0 - w, 999.0, 1)
    assert windows.windows == 2  # the least recently asked window lengths are let go


def test_a_bad_limit_is_refused() -> None:
    with pytest.raises(ValueError):
        CulpritWindows().top(0.0, 1.0, 0)
    with pytest.raises(ValueError):
        CulpritWindows(bucket_s=0.0)
