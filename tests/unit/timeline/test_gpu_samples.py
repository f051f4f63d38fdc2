"""The timeline's NVML readings: bounded, in time order, and the bandwidth a step saw."""

from __future__ import annotations

from attrib_agent.events import GpuSample
from attrib_agent.timeline import EngineTimeline
from attrib_agent.timeline.gpu_samples import MAX_SAMPLE_AGE_S, GpuSamples


def sample(ts: float, gpu: int = 0, bw: float | None = 50.0, util: float | None = 20.0) -> GpuSample:
    return GpuSample(ts, gpu, f"GPU-{gpu}", 70 << 30, 80 << 30, util, bw)


def test_bounded_and_kept_in_time_order() -> None:
    g = GpuSamples(max_samples=8)
    for i in range(20):
        g.add(sample(100.0 + i))
    g.add(sample(115.5))  # a late reading slots in by time (and the oldest leaves)
    assert len(g) == 8
    ts = [s.ts for s in g.samples()]
    assert ts == sorted(ts) and ts[-1] == 119.0 and 115.5 in ts and ts[0] == 113.0
    g.forget_before(115.0)
    assert [s.ts for s in g.samples()] == [115.0, 115.5, 116.0, 117.0, 118.0, 119.0]


def test_bandwidth_of_a_step() -> None:
    g = GpuSamples()
    assert g.bandwidth(0.0, 1.0) is None  # no GPU: the cost model decides
    g.add(sample(10.0, bw=40.0))
    g.add(sample(10.5, bw=60.0))
    g.add(sample(10.5, gpu=1, bw=90.0))
    g.add(sample(20.0, bw=None, util=30.0))  # no GPM (before Hopper): NVML's memory utilisation
    assert g.bandwidth(10.0, 10.5) == 0.9  # the busiest GPU's mean inside the step
    assert g.bandwidth(9.9, 10.2) == 0.4
    assert g.bandwidth(12.0, 12.1) == 0.6  # the nearest reading within MAX_SAMPLE_AGE_S
    assert g.bandwidth(10.6 + MAX_SAMPLE_AGE_S + 0.5, 11.0 + MAX_SAMPLE_AGE_S + 0.5) is None
    assert g.bandwidth(19.9, 20.1) == 0.3


def test_the_timeline_keeps_them_instead_of_skipping() -> None:
    tl = EngineTimeline(max_samples=4)
    for i in range(10):
        tl.feed(sample(float(i)))
    assert "GpuSample" not in tl.skipped and len(tl.gpu) == 4
