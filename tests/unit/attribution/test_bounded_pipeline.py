"""Through the real pipeline on a never-idle stream (long generations keep the busy period open): every window is
bounded in time and started from the observed state, each victim is attributed once a pass (in its own window,
not in every neighbour's that holds it), the run cache answers across settles, and its answers are exact (the
same results with the cache off)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import attrib_agent.attribution.attributor as attributor_mod
from attrib_agent.attribution.attributor import AttributionConfig
from attrib_agent.attribution.result import AttributionResult
from attrib_agent.attribution.sim_types import SimRequest, SimResult
from attrib_agent.events import Event
from attrib_agent.pipeline import AttributionPipeline, PipelineConfig
from benchmarks.cpu_per_request import T0, StreamConfig, stream
from tests.unit.timeline.test_finalize_fresh import whole_second_stamps

SECONDS = 30.0


@pytest.fixture(scope="module")
def events() -> list[Event]:
    """With vLLM's default 1 s log stamps: each victim's first pass comes before its `settle_margin_s`, so it is
    attributed again, final, at a later pass, and the run cache has runs to share across settles."""
    cfg = StreamConfig(minutes=SECONDS / 60 + 0.5, rate_per_s=1.0)
    return whole_second_stamps(e for e in stream(cfg) if e.ts < T0 + SECONDS)


def run(events: list[Event], attribution: AttributionConfig, settle_interval_s: float = 0.25
        ) -> tuple[AttributionPipeline, list[AttributionResult]]:
    p = AttributionPipeline(PipelineConfig(block_size=16, num_blocks=2048, token_budget=2048,
                                           settle_interval_s=settle_interval_s, attribution=attribution))
    out: list[AttributionResult] = []
    for e in events:
        settled = p.feed(e)
        assert len({r.request_id for r in settled}) == len(settled)  # each victim once, in its own window
        out += settled
    return p, out


def test_windows_start_from_the_observed_state_within_the_lookback(events: list[Event],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    windows: list[tuple[float, float]] = []  # (start, earliest victim's arrival)
    starts: list[float | None] = []
    real_windows, real_sim = attributor_mod.bounded_neighbourhoods, attributor_mod.simulate  # type: ignore[attr-defined]

    def spy_windows(chain: list[tuple[SimRequest, float]], victims: set[str], *args: object
                    ) -> list[tuple[float, list[SimRequest], set[str]]]:
        out = real_windows(chain, victims, *args)  # type: ignore[arg-type]
        for lo, window, mine in out:
            windows.append((lo, min(r.arrival_ts for r in window if r.request_id in mine)))
        return out

    def spy_sim(requests: list[SimRequest], *args: object, **kw: object) -> SimResult:
        start = kw.get("start")
        starts.append(start.ts if start is not None else None)  # type: ignore[attr-defined]
        return real_sim(requests, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(attributor_mod, "bounded_neighbourhoods", spy_windows)
    monkeypatch.setattr(attributor_mod, "simulate", spy_sim)
    cfg = AttributionConfig(window_lookback_s=4.0, window_grid_s=1.0)
    p, results = run(events, cfg)
    assert sum(r.final for r in results) >= 20
    assert len(windows) >= 10 and sum(s is not None for s in starts) >= len(starts) // 2
    # lookback + grid + the step before the grid point (a CPU step is well under 0.2 s here)
    assert all(a - lo <= cfg.window_lookback_s + cfg.window_grid_s + 0.2 for lo, a in windows)
    assert p.attributor.runs.hits > 0 and len(p.attributor.runs) <= cfg.run_cache_size


def test_the_run_cache_changes_no_result(events: list[Event]) -> None:
    cached, with_cache = run(events, AttributionConfig())
    off, without = run(events, AttributionConfig(run_cache_size=0))
    assert cached.attributor.runs.hits > 0 and off.attributor.runs.hits == 0
    assert len(with_cache) == len(without) > 0
    assert [replace(r) for r in with_cache] == [replace(r) for r in without]


def test_a_victim_is_attributed_once_a_pass_though_its_neighbours_windows_hold_it(events: list[Event]) -> None:
    """Many victims a pass and small windows: each window holds its neighbours' victims too (the uniqueness
    check in `run`), and each result is tallied once."""
    p, results = run(events, AttributionConfig(max_period_requests=8), settle_interval_s=5.0)
    finals = [r for r in results if r.final]
    assert len(finals) >= 10 and sum(p.tally.requests.values()) == len(finals)
    assert len({r.request_id for r in finals}) == len(finals)


def test_a_world_is_simulated_once_a_window_traced_or_not(events: list[Event], monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """A slowed victim's world without the other whales is the run its light-crowd split traces: one run, traced,
    not an untraced one for its value and a traced one for the split. (The world with every whale is run before
    anyone is known to be slowed, for all victims: untraced, and traced again only when a split needs it.)"""
    asked: dict[int, dict[frozenset[str], set[bool]]] = {}
    plans: list[attributor_mod._PeriodPlan] = []  # held, so no later plan reuses a freed one's id
    real = attributor_mod._PeriodPlan._simulate

    def spy(plan: attributor_mod._PeriodPlan, removed: frozenset[str], readers: object, traced: bool) -> SimResult:
        if id(plan) not in asked:
            plans.append(plan)
        asked.setdefault(id(plan), {}).setdefault(removed, set()).add(traced)
        return real(plan, removed, readers, traced)  # type: ignore[arg-type]

    monkeypatch.setattr(attributor_mod._PeriodPlan, "_simulate", spy)
    _, results = run(events, AttributionConfig(run_cache_size=0))
    assert any(r.culprits for r in results)
    assert any(True in kinds for by in asked.values() for removed, kinds in by.items() if removed)
    assert all(len(kinds) == 1 for by in asked.values() for removed, kinds in by.items() if removed)


def test_plans_on_one_window_share_its_runs_and_change_no_result(events: list[Event],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Victims of a pass whose windows are the same requests from the same start read one set of runs, each run
    waiting for (and tracing) all their slowed victims, instead of one set per victim: fewer runs, and the same
    results as plans running their own (the run cache off, so only the sharing answers)."""
    runs = [0]
    real_sim = attributor_mod.simulate  # type: ignore[attr-defined]

    def counted(*args: object, **kw: object) -> SimResult:
        runs[0] += 1
        return real_sim(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(attributor_mod, "simulate", counted)
    cfg = AttributionConfig(run_cache_size=0, max_period_requests=8)  # small windows, many a pass
    _, shared = run(events, cfg, settle_interval_s=5.0)  # many victims a pass: windows in common
    shared_runs, runs[0] = runs[0], 0
    monkeypatch.setattr(attributor_mod, "_window_key", lambda period, start: object())  # every plan its own
    _, alone = run(events, cfg, settle_interval_s=5.0)
    assert any(r.culprits for r in shared) and len(shared) == len(alone) > 0
    assert [replace(r) for r in shared] == [replace(r) for r in alone]
    assert shared_runs < runs[0]
