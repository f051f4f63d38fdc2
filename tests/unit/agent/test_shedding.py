"""Load shedding: the share of finishing requests attributed follows the pipeline's CPU towards its budget and
drops while events wait; the pipeline skips the rest by a stable hash of the id, counts them, and says so."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from attrib_agent.agent.shedding import BEHIND_FOR_S, MAX_BACKLOG_S, MAX_PASS_GAP_S, MIN_SHARE, Shedder
from attrib_agent.events import Event
from attrib_agent.pipeline import AttributionPipeline, PipelineConfig
from attrib_agent.sinks.api.app import api_app
from tests.unit.sinks.api_replayed import call, events, replayed, state_of

BEHIND_FOR = int(BEHIND_FOR_S)


def run(shedder: Shedder, seconds: int, cores: float, backlog_s: float = 0.0, t0: float = 0.0) -> list[float]:
    """Feed `seconds` of wall time at `cores` of pipeline CPU; the share after each second."""
    shares = []
    for i in range(seconds * 4):
        t = t0 + i * 0.25
        shares.append(shedder.update(t, cores * t, backlog_s))
    return shares[3::4]


def test_within_budget_everything_is_attributed() -> None:
    s = Shedder(0.25)
    assert run(s, 30, cores=0.2)[-1] == 1.0 and not s.shedding


def test_over_budget_the_share_falls_until_the_cpu_fits() -> None:
    s = Shedder(0.25)
    shares = run(s, 60, cores=1.0)  # the pipeline saturates a core: 4x the budget
    assert shares[-1] < 0.5 and s.shedding
    assert all(b <= a for a, b in zip(shares, shares[1:], strict=False))  # only down while over budget
    assert shares[-1] >= MIN_SHARE


def test_it_rises_back_once_load_allows() -> None:
    s = Shedder(0.25)
    run(s, 60, cores=1.0)
    low = s.share
    assert low < 1.0
    back = run(s, 120, cores=0.05, t0=60.0)
    assert back[-1] == 1.0 and not s.shedding


def test_a_lasting_backlog_halves_the_share_whatever_the_cpu() -> None:
    s = Shedder(4.0)  # a budget the CPU never reaches
    shares = run(s, 15, cores=0.1, backlog_s=MAX_BACKLOG_S + 1)
    assert shares[:BEHIND_FOR - 1] == [1.0] * (BEHIND_FOR - 1)  # a few seconds behind: a long pass, not shed
    assert shares[-1] <= 0.5 ** 3  # still behind after BEHIND_FOR_S: halved each second since


def test_a_long_pass_is_not_falling_behind() -> None:
    s = Shedder(1.0)
    for k in range(6):  # every 10 s one pass holds the queue for 5 s: it catches up between them
        run(s, 5, cores=0.5, backlog_s=MAX_BACKLOG_S + 3, t0=10.0 * k)
        run(s, 5, cores=0.5, t0=10.0 * k + 5.0)
    assert s.share == 1.0 and not s.shedding


def test_budget_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Shedder(0.0)


def test_the_pipeline_skips_by_a_stable_hash_and_counts_it() -> None:
    full = replayed("shorts")
    half = AttributionPipeline()
    half.attribute_share = 0.5
    half.feed_all(events("shorts"))
    half.settle()
    again = AttributionPipeline()
    again.attribute_share = 0.5
    again.feed_all(events("shorts"))
    again.settle()
    kept = {r.request_id for r in half.store}
    assert kept == {r.request_id for r in again.store}  # the same requests every time
    assert 0 < len(kept) < len(full.store)
    assert half.victims_skipped == len(full.store) - len(kept)
    skipped = sorted({r.request_id for r in full.store} - kept)
    assert all(half.status(rid) == "skipped" for rid in skipped)
    # Through the API: a skipped request answers 200 `skipped` (no result will come), its series count it.
    resp = call(api_app(state_of(half)), f"/v1/requests/{skipped[0]}/culprits")
    assert resp.status_code == 200 and resp.json() == {"request_id": skipped[0], "status": "skipped"}


def test_a_pass_with_nothing_to_attribute_infers_no_step() -> None:
    """Every victim shed and no partial result waiting: a pass leaves the steps to be inferred when something reads
    them (each inference ahead of need is re-inferred when a span lands); the shed victims are still counted."""
    p = AttributionPipeline()
    p.attribute_share = 0.0
    fed = inferred = 0
    for ev in events("shorts"):
        p.feed(ev)
        fed, inferred, _ = p.timeline.inference_work()
        if p.victims_skipped and fed > inferred:  # spans landed and shed, steps fed and not inferred yet
            break
    assert fed > inferred and p.victims_skipped
    assert p.settle() == []
    assert p.timeline.inference_work()[1] == inferred


def test_a_replay_attributes_everything() -> None:
    assert replayed("shorts").victims_skipped == 0


def test_passes_are_spaced_as_the_share_falls() -> None:
    s = Shedder(0.25)
    assert s.pass_gap_s(0.25) == 0.0
    s.share = 0.5
    assert s.pass_gap_s(0.25) == 0.5
    s.share = MIN_SHARE
    assert s.pass_gap_s(0.25) == MAX_PASS_GAP_S


@cache
def gpu_rate_2s() -> tuple[Event, ...]:
    """2 s of the GPU-rate stream (~60 finished requests a second)."""
    import tempfile

    from attrib_agent.sources.replay import ReplaySource
    from benchmarks._gpu_rate import GPU_RATE_SOURCES, build_gpu_rate, load_source
    from benchmarks._recordings import FIXTURES

    with tempfile.TemporaryDirectory() as d:
        info = build_gpu_rate(d, duration_s=2.0, sources=[load_source(FIXTURES / n) for n in GPU_RATE_SOURCES])
        return tuple(ReplaySource(info.path).events())


def passes_with(gap_s: float) -> tuple[AttributionPipeline, int]:
    """Settle ticks 20 ms apart, under `MAX_PASS_WAIT_S`: at GPU rates a pass every tick takes one victim or two."""
    p = AttributionPipeline(PipelineConfig(settle_interval_s=0.02))
    p.pass_gap_s = gap_s
    passes = sum(bool(p.feed(ev)) for ev in gpu_rate_2s())
    p.pass_gap_s = 0.0
    p.settle()
    return p, passes


def test_spaced_passes_gather_the_victims_in_between() -> None:
    """With passes 5 s of event time apart (`MAX_PASS_WAIT_S` in effect), fewer passes attribute the same requests
    (share 1)."""
    every, n_every = passes_with(0.0)
    spaced, n_spaced = passes_with(5.0)
    assert {r.request_id for r in spaced.store} == {r.request_id for r in every.store}
    assert spaced.victims_skipped == 0
    assert 0 < n_spaced < n_every


def test_the_budget_counts_the_whole_agent_not_only_the_pipeline_thread() -> None:
    """The loop's ingest (OTLP, log, /metrics, the API) is CPU the sidecar takes from the host as well: a core
    whose loop burns CPU while the pipeline thread is idle measures it (`cores` ~ CPU burned / WINDOW_S here)."""
    import threading
    import time

    from attrib_agent.agent.core import AgentCore
    from attrib_agent.agent.shedding import WINDOW_S

    core = AgentCore(AttributionPipeline(), budget_cores=0.25)
    core._run_batch([], time.monotonic() + 1.0)  # the shedder's first reading
    assert core.shedder is not None and core.shedder.cores == 0.0
    burn_s = 0.5

    def burn() -> None:
        t0 = time.thread_time()
        while time.thread_time() - t0 < burn_s:
            pass

    other = threading.Thread(target=burn)
    other.start()
    other.join()
    core._run_batch([], time.monotonic() + 1.0)
    assert core.shedder.cores >= 0.8 * burn_s / WINDOW_S  # was ~0: only the pipeline thread's own CPU counted


def test_passes_wait_at_most_the_pipelines_bound_whatever_the_gap(tmp_path: Path) -> None:
    """The agent's gap (10 s at the share floor, also its forecast refresh spacing) spaces attribution passes only
    up to `MAX_PASS_WAIT_S` of event time: a victim's result is not held ten seconds for a pass (GPU-rate input:
    spans land all the time)."""
    from attrib_agent.pipeline import MAX_PASS_WAIT_S
    from attrib_agent.sources.replay import ReplaySource
    from benchmarks._gpu_rate import GPU_RATE_SOURCES, build_gpu_rate, load_source
    from benchmarks._recordings import FIXTURES

    info = build_gpu_rate(tmp_path, duration_s=5.0, sources=[load_source(FIXTURES / n) for n in GPU_RATE_SOURCES])

    p = AttributionPipeline()
    p.pass_gap_s, p.attribute_share = 10.0, 0.1  # as the agent sheds
    seen: list[float] = []
    real = p.attributor.attribute

    def attribute(timeline: object, ids: object) -> object:
        seen.append(p.last_event_ts or 0.0)
        return real(timeline, ids)  # type: ignore[arg-type]

    p.attributor.attribute = attribute  # type: ignore[method-assign,assignment]
    for ev in ReplaySource(info.path).events():
        p.feed(ev)
    gaps = [b - a for a, b in zip(seen, seen[1:], strict=False)]
    assert len(seen) > 3 and min(gaps) >= MAX_PASS_WAIT_S
    assert any(g < 2 * MAX_PASS_WAIT_S for g in gaps)  # not the agent's 10 s
