"""Shedding never hides the requests that were visibly slowed: while the agent attributes a share of the finishing
requests (by a hash of the id), one the hash leaves out is attributed all the same when it finished slowed past the
victim threshold over what the step-cost model says it would take alone; bounded (a rate from the CPU budget, and
the pass bound), counted apart from the hash sample, and said in its result and on /metrics."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from attrib_agent.agent.core import AgentCore
from attrib_agent.agent.shedding import MIN_SHARE, Shedder
from attrib_agent.attribution.result import AttributionResult, Culprit
from attrib_agent.attribution.result_codec import from_dict, to_dict
from attrib_agent.attribution.tally import phase_slowdowns, slowed
from attrib_agent.events import Event, RequestSpan
from attrib_agent.pipeline import AttributionPipeline, chosen
from attrib_agent.read_model import AgentState
from attrib_agent.sinks.prometheus.collector import registry_for
from attrib_agent.sinks.prometheus.engine import live_pipeline_families
from attrib_agent.sinks.prometheus.families import CAUSE_VALUES
from attrib_agent.sources.replay import ReplaySource
from tests.unit.agent.test_shed_start import BUDGET_CORES, gpu_rate_events, run_live

RECORDINGS = Path(__file__).parents[2] / "fixtures" / "recordings"


@cache
def recording(name: str) -> tuple[Event, ...]:
    return tuple(ReplaySource(RECORDINGS / name).events())


def replay(name: str, share: float, tune: Callable[[AttributionPipeline], None] | None = None,
           ) -> tuple[AttributionPipeline, dict[str, AttributionResult]]:
    """The recording through a pipeline attributing `share` of the requests (as the shedding agent sets it)."""
    p = AttributionPipeline()
    p.attribute_share = share
    if tune is not None:
        tune(p)
    final: dict[str, AttributionResult] = {}
    for ev in recording(name):
        final.update((r.request_id, r) for r in p.feed(ev) if r.final)
    final.update((r.request_id, r) for r in p.settle() if r.final)
    return p, final


def visibly_slowed(r: AttributionResult, threshold_s: float) -> bool:
    return any(slowed(s, threshold_s) for _, s in phase_slowdowns(r.ttft_slowdown_s, r.itl_slowdown_s, r.itl_gaps))


@cache
def unshed(name: str) -> dict[str, AttributionResult]:
    return replay(name, 1.0)[1]


SHARE = 0.05  # the hash leaves out all but ~1 in 20


def test_the_whales_victims_are_attributed_and_name_the_whale_though_the_hash_skips_them() -> None:
    """whale2 (two whales among 20 shorts): at a share of 5 % the hash takes none or one, yet every request slowed
    in the unshed replay is attributed, `chosen_by` "slowed", with the culprits the unshed replay names (its top
    one a whale for every short)."""
    full = unshed("whale2")
    p, low = replay("whale2", SHARE)
    slow = {rid for rid, r in full.items() if visibly_slowed(r, p.victim_threshold_s)}
    left_out = {rid for rid in slow if not chosen(rid, SHARE)}
    assert len(left_out) >= 15  # the hash alone would have skipped these
    for rid in left_out:
        r = low[rid]
        assert r.chosen_by == "slowed"
        assert r.culprits == full[rid].culprits
        top = r.top_culprit()
        assert top is not None and (top.is_whale or r.is_whale)
    assert sum(r.chosen_by == "slowed" for r in low.values()) == p.slowed_attributed == len(low) - sum(
        chosen(rid, SHARE) for rid in low)
    assert p.slowed_skipped == 0 and all(p.status(rid) == "final" for rid in left_out)


def test_unslowed_requests_are_still_sampled_and_the_sample_is_tallied_apart() -> None:
    """bench-mixed: requests the hash leaves out are skipped unless they finished slowed (none slowed in the unshed
    replay is skipped; the call is made before the pass, so a request near the threshold may go either way);
    every one the hash takes is attributed (`chosen_by` "share"); the counters' tally holds the hash sample only
    (its rates, e.g. slowed over attributed, stay unbiased), the slowed taken outside it are counted apart."""
    full = unshed("bench-mixed")
    p, low = replay("bench-mixed", 0.2)
    taken = {rid for rid in full if chosen(rid, 0.2)}
    assert taken and all(low[rid].chosen_by == "share" for rid in taken)
    skipped = set(full) - set(low)
    assert skipped and not any(visibly_slowed(full[rid], p.victim_threshold_s) for rid in skipped)
    assert all(p.status(rid) == "skipped" for rid in skipped)
    slowed_ids = {rid for rid, r in full.items() if visibly_slowed(r, p.victim_threshold_s) and rid not in taken}
    assert slowed_ids and slowed_ids <= {rid for rid, r in low.items() if r.chosen_by == "slowed"}
    assert sum(p.tally.requests.values()) == len(taken)
    assert len(low) - len(taken) == p.slowed_attributed
    assert p.victims_skipped == len(full) - len(low)


def test_at_share_one_nothing_is_taken_as_slowed() -> None:
    """No shedding (a replay): every result in the sample, the slowed counters at zero."""
    p, results = replay("whale2", 1.0)
    assert results and all(r.chosen_by == "share" for r in results.values())
    assert p.slowed_rescued == p.slowed_attributed == p.slowed_skipped == p.victims_skipped == 0


def test_the_slowed_outside_the_share_are_bounded_by_rate_and_by_pass() -> None:
    """A rate bound (victims a second of event time, a bucket of one second's worth) and the pass bound: the slowed
    past them are skipped and counted; the hash sample is unaffected."""
    rate = 0.5
    p, low = replay("bench-mixed", 0.2, lambda q: setattr(q, "rescue_per_s", rate))
    evs = recording("bench-mixed")
    span_s = evs[-1].ts - evs[0].ts
    took = sum(r.chosen_by == "slowed" for r in low.values())
    assert 0 < took <= 1 + rate * span_s
    assert p.slowed_skipped > 0 and p.slowed_rescued == took
    full = unshed("bench-mixed")
    assert all(low[rid].chosen_by == "share" for rid in full if chosen(rid, 0.2))
    assert p.victims_skipped == len(full) - len(low)

    taken: list[set[str]] = []

    def capped(q: AttributionPipeline) -> None:
        q.max_pass_victims = 2
        real = q.attributor.attribute

        def attribute(timeline: Any, ids: Any) -> Any:
            taken.append(set(ids) - seen)
            seen.update(ids)
            return real(timeline, ids)

        q.attributor.attribute = attribute  # type: ignore[method-assign]

    seen: set[str] = set()
    p, low = replay("bench-mixed", 0.2, capped)
    assert taken and max(len(ids) for ids in taken) <= 2  # new victims a pass (partial results come again)
    assert p.slowed_skipped > 0 and all(p.status(rid) in ("final", "skipped") for rid in full)


def test_under_the_rate_bound_the_most_slowed_of_a_settle_are_taken_first() -> None:
    """When the bound leaves some slowed requests out, the ones taken are the most slowed of what the settle found
    (the tail an operator asks about), not the ones that happened to land first."""
    calls: list[tuple[dict[str, float], set[str]]] = []

    def spy(q: AttributionPipeline) -> None:
        q.rescue_per_s = 0.5
        real = q._rescue

        def rescue(left: list[str], now: float) -> set[str]:
            by = {rid: s for rid in left if (s := q.visible_slowdown(rid)) > 0}
            took = real(left, now)
            calls.append((by, took))
            return took

        q._rescue = rescue  # type: ignore[method-assign]

    replay("bench-mixed", 0.2, spy)
    bound = [(by, took) for by, took in calls if took and len(took) < len(by)]
    assert bound, "the bound never left a slowed request out: the test shows nothing"
    for by, took in bound:
        assert min(by[r] for r in took) >= max(s for r, s in by.items() if r not in took), (by, took)


def test_the_result_says_why_it_was_attributed_through_json_and_the_store() -> None:
    p, low = replay("whale2", SHARE)
    r = next(r for r in low.values() if r.chosen_by == "slowed")
    assert p.result(r.request_id) == r  # packed in the store and back
    assert to_dict(r)["chosen_by"] == "slowed" and from_dict(to_dict(r)) == r
    assert from_dict(to_dict(r)).chosen_by == "slowed"


def test_the_share_is_priced_on_what_the_slowed_leave() -> None:
    """The budget affords so many victims a second; those taken as slowed come off the share's part."""
    def priced(rescued_per_s: float) -> tuple[float | None, float | None]:
        s = Shedder(0.25)
        s.learn_pass(1, 0.01, 0.01)
        for i in range(40):  # 10 s: 20 spans a second, `rescued_per_s` of them taken as slowed
            s.update(i * 0.25, 0.1 * i * 0.25, 0.0, spans=5 * i, rescued=int(rescued_per_s * i * 0.25))
        return s.rescue_rate(), s.affordable()

    rate, share = priced(0.0)
    rate_slowed, share_slowed = priced(8.0)
    assert rate is not None and share is not None and rate_slowed is not None and share_slowed is not None
    assert rate_slowed == pytest.approx(rate, rel=0.05)
    assert share_slowed == pytest.approx(share - 8.0 / 20.0, abs=0.02)
    _, none_left = priced(40.0)  # more slowed than the budget affords: nothing left for the share
    assert none_left == 0.0


def test_the_agent_attributes_slowed_requests_while_it_sheds(tmp_path_factory: pytest.TempPathFactory,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent in process, on the GPU-rate stream with a tiny CPU budget: it sheds (share far below 1), yet the
    visibly slowed requests the share leaves out are attributed (final, `chosen_by` "slowed"), some of them naming
    a whale; no more a second than the budget affords, and /metrics counts them."""
    stream = gpu_rate_events(str(tmp_path_factory.mktemp("gpu-rate")))
    cores: list[AgentCore] = []

    def core() -> AgentCore:
        cores.append(AgentCore(AttributionPipeline(), budget_cores=BUDGET_CORES))
        return cores[0]

    run = run_live(stream, monkeypatch, core)
    agent = cores[0]
    p = agent.pipeline
    assert max(share for wall, share in run.shares if wall >= stream[0].ts + 3.0) < 0.3
    rescued = [r for rid in run.final_at if (r := p.result(rid)) is not None and r.chosen_by == "slowed"]
    assert len(rescued) >= 5 and all(r.final and not chosen(r.request_id, MIN_SHARE) for r in rescued)
    assert all(visibly_slowed(r, p.victim_threshold_s) or r.victim_seconds() > 0 for r in rescued)
    assert any(c.is_whale for r in rescued for c in r.culprits)
    landed = sum(isinstance(ev, RequestSpan) for ev in stream)
    assert p.slowed_rescued < landed / 2  # bounded: the rest are sampled or skipped
    assert p.victims_skipped > 0
    family = next(m for m in live_pipeline_families(agent.state) if m.name == "attrib_slowed_outside_share")
    got = {s.labels["outcome"]: s.value for s in family.samples if s.name.endswith("_total")}
    assert got["attributed"] == p.slowed_attributed == len(rescued)
    assert got["skipped"] == p.slowed_skipped


def test_metrics_serve_the_slowed_results_blame_by_cause_apart_from_the_sample() -> None:
    """Through the real /metrics (the agent's registry, OpenMetrics): the results taken outside the share as slowed
    have their blame by cause in a family of their own, every cause served; the sample's series hold only the
    results the share chose."""
    p, low = replay("whale2", 0.3)
    rescued = [r for r in low.values() if r.chosen_by == "slowed"]
    sample = [r for r in low.values() if r.chosen_by == "share"]
    assert len(rescued) > 3 and len(sample) > 3
    text = generate_openmetrics(registry_for(AgentState(p))).decode()
    families = {f.name: f for f in parse_openmetrics(text)}

    def by_cause(name: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in families[name].samples:
            if s.name.endswith("_total"):
                out[s.labels["cause"]] = out.get(s.labels["cause"], 0.0) + s.value
        return out

    def blamed(results: list[AttributionResult]) -> dict[str, float]:
        out = dict.fromkeys(CAUSE_VALUES, 0.0)
        for r in results:
            for c in r.culprits:
                for cause, secs in c.blame_by_cause(r.itl_gaps).items():
                    out[cause] += secs
        return out

    got = by_cause("attrib_slowed_outside_share_slowdown_seconds")
    assert got == pytest.approx(blamed(rescued), abs=1e-9) and sum(got.values()) > 0.05
    assert by_cause("attrib_attributed_slowdown_seconds") == pytest.approx(blamed(sample), abs=1e-9)


def test_the_slowed_results_blame_keeps_to_the_known_causes() -> None:
    """A cause this agent does not know (a newer agent's) is counted as `other`: the map, and the series, stay the
    closed set of causes."""
    p = AttributionPipeline()
    r = AttributionResult(request_id="v", finished_ts=1.0, ttft_s=0.3, ttft_baseline_s=0.1, ttft_slowdown_s=0.2,
                          itl_s=None, itl_baseline_s=0.0, itl_slowdown_s=0.0, unexplained_ttft_s=0.0,
                          unexplained_itl_s=0.0, no_interference=False, quality=1.0, final=True, chosen_by="slowed",
                          culprits=(Culprit("w", ttft_s=0.2, itl_s=0.0, share=1.0,
                                            causes={"a_newer_cause": 1.0, "kv_pressure": 1.0}),))
    p._keep(r)  # noqa: SLF001 (what a pass does with a final result)
    assert tuple(p.slowed_blamed_s) == CAUSE_VALUES
    assert p.slowed_blamed_s["other"] == pytest.approx(0.1) == p.slowed_blamed_s["kv_pressure"]
    assert p.slowed_attributed == 1 and sum(p.tally.requests.values()) == 0
