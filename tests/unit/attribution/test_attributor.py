"""The attribution engine on real recordings: invariants hold, null runs stay quiet, whales get the blame."""

import json

import pytest

from attrib_agent.attribution.attributor import Attributor, busy_periods
from attrib_agent.attribution.result import AttributionResult, Culprit
from attrib_agent.attribution.sim_types import SimRequest
from attrib_agent.attribution.store import ResultStore
from attrib_agent.lab.naive import overlap_blame
from attrib_agent.lab.score import NULL_BLAME_S, SLOWED_RATIO
from attrib_agent.recording import CLIENT, Recording
from attrib_agent.sources.replay import ReplaySource
from attrib_agent.timeline.engine_timeline import EngineTimeline
from attrib_agent.timeline.model import RequestLifecycle

NAMES = ["shorts", "whale1", "whale2", "preempt"]


def attribute(path):
    tl = EngineTimeline()
    tl.feed_all(ReplaySource(path).events())
    spec = {c["vllm_request_id"]: c["spec_id"] for c in Recording(path).records(CLIENT)}
    return {spec[r.request_id]: r for r in Attributor().attribute(tl)}, spec


@pytest.fixture(scope="module", params=NAMES)
def attributed(request, fixtures_dir):
    return request.param, *attribute(fixtures_dir / "recordings" / request.param)


def test_every_finished_request_gets_a_result(attributed):
    name, results, spec = attributed
    assert set(results) == set(spec.values()), name


def test_parts_add_up_and_nothing_is_negative(attributed):
    _, results, _ = attributed
    for r in results.values():
        assert r.ttft_slowdown_s >= 0 and r.itl_slowdown_s >= 0 and r.unexplained_ttft_s >= 0
        assert sum(c.ttft_s for c in r.culprits) + r.unexplained_ttft_s == pytest.approx(r.ttft_slowdown_s, abs=1e-9)
        assert sum(c.itl_s for c in r.culprits) + r.unexplained_itl_s == pytest.approx(r.itl_slowdown_s, abs=1e-9)
        for c in r.culprits:
            assert c.ttft_s >= 0 and c.itl_s >= 0 and 0 <= c.share <= 1 + 1e-9
            assert c.request_id != r.request_id
            if c.causes:
                assert sum(c.causes.values()) == pytest.approx(c.ttft_s, rel=1e-6, abs=1e-9)
        if r.culprits:
            assert sum(c.share for c in r.culprits) == pytest.approx(1.0)
        assert 0 <= r.quality <= 1


def test_null_run_reports_no_interference(fixtures_dir):
    results, _ = attribute(fixtures_dir / "recordings" / "shorts")
    flagged = [s for s, r in results.items() if any(c.ttft_s > 0.05 for c in r.culprits)]
    assert len(flagged) <= 0.05 * len(results)


def test_whales_are_blamed_where_they_slowed_shorts(fixtures_dir):
    results, spec = attribute(fixtures_dir / "recordings" / "preempt")
    ids = {v: k for k, v in spec.items()}
    slowed = [r for s, r in results.items() if s.startswith("s") and r.ttft_slowdown_s > 0.5]
    assert len(slowed) >= 5
    for r in slowed:
        top = r.top_culprit()
        assert top is not None and top.is_whale and top.request_id in {ids["w1"], ids["w2"], ids["w3"]}


@pytest.mark.parametrize("rep", [0, 1, 2])
def test_a_delay_only_both_whales_cause_is_explained_and_split_fairly(fixtures_dir, rep):
    """s015 of the whale2 truth waits ~270 ms only when both whales run (~20 ms beside either alone). The
    world that happened is observed, not re-simulated, so the whales' Shapley shares add up to the delay they
    caused even where the re-simulation drifts from the real preemption timing; and each gets about half.

    Every rep runs. Whether s015 was slowed in a rep is read from what the client measured in that rep (its TTFT
    against 2x its no-whale mean in the truth), not from the engine: in rep 0 the timing fell the other way
    (TTFT 14 ms) and then the engine must blame nobody. That was whale2's first recording (a slow host, one or two
    preemptions in each all-whale run). Re-recorded by truth13 on a quiet host, no run preempts and s015 is slowed in
    no rep (13-21 ms, 12.9 ms without a whale), so every rep checks that nobody is blamed; the one delay only both
    whales cause there is s002's, which the re-simulation misses and the observed steps explain
    (`test_score.test_whale2_scores_hold_todays_figures`)."""
    truth_dir = fixtures_dir / "truth" / "whale2"
    path = truth_dir / "runs" / f"w1+w2-r{rep}"
    results, spec = attribute(path)
    ids = {v: k for k, v in spec.items()}
    client = next(c for c in Recording(path).records(CLIENT) if c["spec_id"] == "s015")
    alone = json.loads((truth_dir / "truth.json").read_text())["shorts"]["s015"]["conditions"]["none"]["ttft_s"]
    measured = client["first_token_ts"] - client["actual_send_ts"]
    r = results["s015"]
    blamed = {c.request_id: c.ttft_s for c in r.culprits}
    whales = blamed.get(ids["w1"], 0.0) + blamed.get(ids["w2"], 0.0)
    if measured < SLOWED_RATIO * alone["mean"]:
        assert r.ttft_slowdown_s <= NULL_BLAME_S and whales <= NULL_BLAME_S
        return
    # the engine's slowdown is the client's own measured wait beyond s015's no-whale TTFT, within its spread
    assert r.ttft_slowdown_s == pytest.approx(measured - alone["mean"], abs=2 * alone["std"] + 0.01)
    assert whales >= 0.9 * r.ttft_slowdown_s
    assert r.unexplained_ttft_s <= 0.1 * r.ttft_slowdown_s
    assert min(blamed.get(ids["w1"], 0.0), blamed.get(ids["w2"], 0.0)) >= 0.3 * whales


def test_same_result_fed_at_once_or_one_by_one(fixtures_dir):
    path = fixtures_dir / "recordings" / "whale1"
    a = EngineTimeline()
    a.feed_all(ReplaySource(path).events())
    b = EngineTimeline()
    for ev in ReplaySource(path).events():
        b.feed(ev)
    ra = sorted(Attributor().attribute(a), key=lambda r: r.request_id)
    rb = sorted(Attributor().attribute(b), key=lambda r: r.request_id)
    assert ra == rb


def test_busy_periods_split_on_idle_and_bound():
    reqs = [(SimRequest(f"r{i}", float(i), 10, 10), i + 0.5) for i in range(5)]
    assert [len(p) for p in busy_periods(reqs, 100)] == [1, 1, 1, 1, 1]
    overlapping = [(SimRequest(f"r{i}", i * 0.1, 10, 10), 10.0) for i in range(7)]
    assert [len(p) for p in busy_periods(overlapping, 3)] == [3, 3, 1]


def test_naive_overlap_blame():
    victim = RequestLifecycle("v", arrival_ts=10.0, first_token_ts=12.0, finish_ts=13.0)
    a = RequestLifecycle("a", arrival_ts=9.0, finish_ts=11.0)  # overlaps 1 s
    b = RequestLifecycle("b", arrival_ts=10.0, finish_ts=20.0)  # overlaps 2 s
    c = RequestLifecycle("c", arrival_ts=12.5, finish_ts=14.0)  # after the wait
    blame = overlap_blame(victim, [a, b, c, victim], 3.0)
    assert blame == pytest.approx({"a": 1.0, "b": 2.0})
    assert overlap_blame(victim, [a], 0.0) == {}


def _result(rid: str, ts: float) -> AttributionResult:
    return AttributionResult(rid, ts, 0.1, 0.01, 0.09, None, None, 0.0, (Culprit("w", 0.09, 0.0, 1.0),), 0.0, 0.0,
                             False, 1.0)


def test_result_store_is_bounded_by_count_and_age():
    store = ResultStore(max_results=3, max_age_s=10.0)
    for i in range(5):
        store.put(_result(f"r{i}", float(i)))
    assert len(store) == 3 and store.get("r0") is None and store.get("r4") is not None
    assert store.expire(now=12.5) == 1  # r2 finished at 2.0, older than 10 s; r3 is not
    assert [r.request_id for r in store] == ["r3", "r4"]
    with pytest.raises(ValueError):
        ResultStore(max_results=0)
