"""`benchmarks.replay_throughput --run-stats`: the re-simulation questions of a pass counted as the run cache counts
them, without changing any result, the wrapped method restored after the pass, and the levers' bounds read off
each run's event time."""

from __future__ import annotations

from typing import Any

from attrib_agent.attribution import attributor
from attrib_agent.attribution.attributor import AttributionConfig
from attrib_agent.attribution.sim_types import SimRequest
from attrib_agent.events import Event
from attrib_agent.pipeline import AttributionPipeline, PipelineConfig
from benchmarks.cpu_per_request import T0, StreamConfig, stream
from benchmarks.replay_throughput import RunStats, _resumes, _share

SECONDS = 20.0


def _events() -> list[Event]:
    cfg = StreamConfig(minutes=SECONDS / 60 + 0.5, rate_per_s=1.0)
    return [e for e in stream(cfg) if e.ts < T0 + SECONDS]


def _run(events: list[Event]) -> tuple[AttributionPipeline, list[str]]:
    p = AttributionPipeline(PipelineConfig(block_size=16, num_blocks=2048, token_budget=2048,
                                           attribution=AttributionConfig()))
    out = [repr(r) for e in events for r in p.feed(e)]
    return p, out + [repr(r) for r in p.settle()]


def test_run_stats_counts_every_question_and_changes_no_result() -> None:
    events = _events()
    original = attributor._PeriodPlan._simulate
    _, plain = _run(events)
    with RunStats() as stats:
        assert attributor._PeriodPlan._simulate is not original
        p, counted = _run(events)
    assert attributor._PeriodPlan._simulate is original
    assert counted == plain and plain
    runs = p.attributor.runs
    assert len(stats.rows) == runs.hits + runs.misses > 0
    assert sum(not r["hit"] for r in stats.rows) == runs.misses
    assert all(r["steps"] > 0 and r["stop"] >= r["begin"] for r in stats.rows if not r["hit"])
    report = stats.report()
    assert f"re-simulation questions {len(stats.rows):,}, runs simulated {runs.misses:,}" in report
    assert "(a) resumable" in report and "(b) counterfactual runs" in report


def test_a_runs_share_before_a_time_is_its_event_time_before_it() -> None:
    row: dict[str, Any] = {"begin": 10.0, "stop": 14.0}
    assert _share(11.0, row) == 0.25
    assert _share(9.0, row) == 0.0 and _share(20.0, row) == 1.0
    assert _share(12.0, {"begin": 10.0, "stop": 10.0}) == 0.0  # a run that ran no time saves nothing


def test_an_earlier_run_resumes_a_later_one_only_when_it_ran_the_same_world_up_to_its_stop() -> None:
    a, b, late = (SimRequest(rid, ts, 100, 10) for rid, ts in (("a", 0.0), ("b", 1.0), ("late", 5.0)))
    before: dict[str, Any] = {"version": 3, "start": (0.0, frozenset()), "removed_ids": frozenset({"w"}),
                              "traced": True, "readers": frozenset({"a"}), "kept": [a, b], "stop": 2.0}
    row = dict(before, kept=[a, b, late], stop=6.0)
    assert _resumes(before, row)  # a later arrival past its stop: the earlier run is this one's first part
    assert not _resumes(before, dict(row, version=4))  # other prices
    assert not _resumes(before, dict(row, removed_ids=frozenset({"v"})))  # another world
    assert not _resumes(before, dict(row, kept=[a, late]))  # an arrival before its stop differs
    assert not _resumes(before, dict(row, readers=frozenset({"a", "b"})))  # a victim it did not trace
    assert _resumes(before, dict(row, traced=False, readers=frozenset({"a", "b"})))  # untraced: outcomes only
