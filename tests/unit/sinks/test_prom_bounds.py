"""The series count is bounded whatever the traffic: label values come from closed sets, and the one open set
(`kind` of skipped or failed input) is folded past MAX_KINDS per source without breaking monotonicity."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from attrib_agent.health import SourceHealth
from attrib_agent.pipeline import AttributionPipeline, PipelineConfig
from attrib_agent.read_model import AgentState
from attrib_agent.sinks.prometheus.collector import registry_for
from attrib_agent.sinks.prometheus.families import MAX_KINDS, OTHER, fold_kinds
from attrib_agent.sources.replay import ReplaySource

RECORDINGS = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "recordings"
# In recording order. canary was remade later than the others (hours after): results must not expire by age here.
ALL = ("shorts", "whale1", "whale2", "preempt", "canary")
AGELESS = 1e9
SERIES_BOUND = 250  # closed label sets: 56 blame + 4 x 16 histogram lines + ~80 others, per configured source


def series(state: AgentState) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    text = generate_openmetrics(registry_for(state)).decode()
    return {(s.name, tuple(sorted(s.labels.items()))) for f in parse_openmetrics(text) for s in f.samples}


def test_series_count_does_not_grow_with_traffic() -> None:
    small = AttributionPipeline(PipelineConfig(max_results=10))
    small.feed_all(list(ReplaySource(RECORDINGS / "canary").events()))
    small.settle()
    big = AttributionPipeline(PipelineConfig(max_results=10, max_result_age_s=AGELESS))
    for name in ALL:
        big.feed_all(list(ReplaySource(RECORDINGS / name).events()))
    big.settle()
    assert big.tally.requests.total() == 90  # every request of every recording, each counted once
    assert len(big.store) == 10 and big.store.evicted >= 80  # partial results evicted too
    few, many = series(AgentState(small)), series(AgentState(big))
    assert many == few, "a label value appeared that the closed sets do not hold"
    assert len(many) <= SERIES_BOUND
    stored = {s for s in many if s[0] == "attrib_results_stored"}
    assert len(stored) == 1


def test_many_kinds_fold_into_other_and_stay_monotonic() -> None:
    health = SourceHealth("vllm_log")
    pipeline = AttributionPipeline()
    state = AgentState(pipeline, health={"vllm_log": health})
    before: dict[str, float] = {}
    for round_ in range(3):
        for i in range(200):  # a source that invents a new kind for every odd line
            health.skip(f"odd_{i}_{round_}")
            health.error(f"failure_{i % 50}", ts=float(i))
        fams = {f.name: f for f in parse_openmetrics(generate_openmetrics(registry_for(state)).decode())}
        skipped = {s.labels["kind"]: s.value for s in fams["attrib_source_skipped"].samples}
        errors = {s.labels["kind"]: s.value for s in fams["attrib_source_errors"].samples}
        assert len(skipped) == MAX_KINDS + 1 and len(errors) == MAX_KINDS + 1
        assert sum(skipped.values()) == health.skipped.total() == 200 * (round_ + 1)
        assert sum(errors.values()) == health.errors.total()
        assert skipped.keys() >= before.keys()
        assert all(skipped[k] >= v for k, v in before.items())
        assert skipped[OTHER] > before.get(OTHER, 0)
        before = skipped


def test_fold_keeps_first_seen_kinds_and_merges_a_real_other() -> None:
    counts = {f"k{i}": 1 for i in range(MAX_KINDS + 5)} | {OTHER: 2}
    folded = fold_kinds(counts)
    assert list(folded)[:MAX_KINDS] == [f"k{i}" for i in range(MAX_KINDS)]
    assert folded[OTHER] == 5 + 2
    assert fold_kinds({"timeout": 3}) == {"timeout": 3}
