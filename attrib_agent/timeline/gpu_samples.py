"""The GPU's own readings (NVML `GpuSample`s), bounded, for the attribution's bandwidth evidence and the page.

vLLM reserves its KV up front, so NVML's memory-used stays flat; what moves with the KV that decodes attend to
is DRAM bandwidth (GPM's DRAM bandwidth utilisation on Hopper and newer, else NVML's memory utilisation).
"""

from __future__ import annotations

import bisect
from collections import deque

from attrib_agent.events import GpuSample

MAX_SAMPLE_AGE_S = 2.0  # a reading this far from a step still describes it (the sampler reads once a second)


def bandwidth_ratio(s: GpuSample) -> float | None:
    """0..1 of the DRAM bandwidth in use: GPM's figure where the GPU has it, else NVML's memory utilisation."""
    pct = s.dram_bw_util_pct if s.dram_bw_util_pct is not None else s.memory_util_pct
    return None if pct is None else min(max(pct / 100.0, 0.0), 1.0)


class GpuSamples:
    """The last `max_samples` readings of every GPU, in receipt order (older ones leave first)."""

    def __init__(self, max_samples: int = 4096) -> None:
        self._samples: deque[GpuSample] = deque(maxlen=max_samples)

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, s: GpuSample) -> None:
        if self._samples and s.ts < self._samples[-1].ts:  # out of order: keep the deque sorted by time
            items = list(self._samples)
            bisect.insort(items, s, key=lambda x: x.ts)
            self._samples = deque(items, maxlen=self._samples.maxlen)
        else:
            self._samples.append(s)

    def samples(self, since: float | None = None) -> list[GpuSample]:
        return [s for s in self._samples if since is None or s.ts >= since]

    def forget_before(self, ts: float) -> None:
        while self._samples and self._samples[0].ts < ts:
            self._samples.popleft()

    def bandwidth(self, t0: float, t1: float) -> float | None:
        """Mean bandwidth ratio over [t0, t1] (the busiest GPU's, as one engine may span several), from the
        readings inside it, else the nearest within MAX_SAMPLE_AGE_S; None when the GPU says nothing."""
        near = [s for s in self._samples if t0 - MAX_SAMPLE_AGE_S <= s.ts <= t1 + MAX_SAMPLE_AGE_S]
        inside = [s for s in near if t0 <= s.ts <= t1] or sorted(near, key=lambda s: min(abs(s.ts - t0),
                                                                                         abs(s.ts - t1)))[:1]
        by_gpu: dict[int, list[float]] = {}
        for s in inside:
            r = bandwidth_ratio(s)
            if r is not None:
                by_gpu.setdefault(s.gpu, []).append(r)
        return max((sum(v) / len(v) for v in by_gpu.values()), default=None)
