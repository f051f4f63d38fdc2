"""Fuzz what the NVML sampler reads out of NVML's answers: 10,000 runs (start, three samples, close) against
tests/unit/sources' FakeNvml whose answers are arbitrary: memory structs with any counts (used > total, zero,
2**64-1), utilisation rates out of range, sample buffers of any value type, length, timestamps and values, GPM
metrics with any value (NaN, inf, negative) and return code, or an object of the wrong shape. The sampler never
raises: a reading is a number or None, and a shape it cannot read is counted (`gpuN:unexpected`)."""

from __future__ import annotations

import math
import random
from typing import Any

import pynvml

from .mutate import CASES, Tally

WILD_INTS = [0, 1, 7, 100, 101, 255, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1]
WILD_FLOATS = [0.0, -1.0, 37.5, 100.0, 250.0, 1e308, float("inf"), float("-inf"), float("nan")]


def _sampler() -> Any:
    """The one import of the code under test, and the NVML stand-in from its unit tests (paths may move)."""
    from attrib_agent.sources.nvml.sampler import NvmlSampler
    from tests.unit.sources.test_nvml_sampler import FakeClock, FakeGpu, FakeNvml

    return NvmlSampler, FakeNvml, FakeGpu, FakeClock


def _wild_fake(base: type, rng: random.Random) -> type:
    class WildNvml(base):  # type: ignore[misc, valid-type]
        """FakeNvml with NVML's answers replaced by arbitrary ones, half of the time."""

        def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:  # noqa: N802
            real = super().nvmlDeviceGetMemoryInfo(handle, version)
            if rng.random() < 0.5:
                return real
            if rng.random() < 0.1:
                return rng.choice([None, (1, 2), object()])
            return type(real)(**{f: rng.choice(WILD_INTS) for f, _ in real._fields_ if f != "version"})

        def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:  # noqa: N802
            return pynvml.c_nvmlUtilization_t(gpu=rng.choice(WILD_INTS) & 0xFFFFFFFF,
                                              memory=rng.choice(WILD_INTS) & 0xFFFFFFFF)

        def nvmlDeviceGetSamples(self, device: Any, sampling_type: int, timeStamp: int) -> Any:  # noqa: N802, N803
            if rng.random() < 0.3:
                return super().nvmlDeviceGetSamples(device, sampling_type, timeStamp)
            n = rng.choice([0, 1, 2, 5, 120])
            array = (pynvml.c_nvmlSample_t * max(n, 1))()
            for slot in array[:n]:
                slot.timeStamp = rng.choice([0, timeStamp, timeStamp + 1, 2**64 - 1, rng.randrange(2**40)])
                field = rng.choice(["uiVal", "ulVal", "ullVal", "sllVal", "dVal", "siVal"])
                value = rng.choice(WILD_FLOATS) if field == "dVal" else rng.choice(WILD_INTS) % (2**31 if field in (
                    "siVal", "sllVal") else 2**32 if field in ("uiVal", "ulVal") else 2**64)
                setattr(slot.sampleValue, field, value)
            value_type = rng.choice([pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, pynvml.NVML_VALUE_TYPE_DOUBLE,
                                     pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG,
                                     pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 99])
            return (value_type, array[:n]) if rng.random() < 0.95 else rng.choice([None, (value_type,), [1, 2]])

        def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:  # noqa: N802, N803
            got = super().nvmlGpmMetricsGet(metricsGet)
            if rng.random() < 0.6:
                got.metrics[0].value = rng.choice(WILD_FLOATS)
                got.metrics[0].nvmlReturn = rng.choice([pynvml.NVML_SUCCESS] * 4 + [pynvml.NVML_ERROR_NOT_SUPPORTED,
                                                                                   4242])
            return got

    return WildNvml


def test_fuzz_nvml_answers() -> None:
    sampler_cls, fake_cls, gpu_cls, clock_cls = _sampler()
    rng, tally = random.Random(1309), Tally("nvml samples")
    wild = _wild_fake(fake_cls, rng)
    readings = out_of_range = 0
    unexpected = 0
    for _ in range(CASES):
        clock = clock_cls()
        fake = wild([gpu_cls(uuid=f"GPU-{i:08x}") for i in range(rng.randint(1, 2))], clock,
                    gpm_api=rng.random() < 0.8)
        sampler = sampler_cls(nvml=fake, interval_s=1.0, clock=clock)
        started = sampler.start()
        for _ in range(3):
            clock.now += rng.choice([-1.0, 0.05, 0.5, 1.0, 1.0, 30.0])
            for gpu in fake.gpus:
                gpu.dram_bytes += rng.randrange(2**40)
                gpu.mem_samples.append((int(clock.now * 1e6), rng.randint(0, 100)))
            for s in sampler.sample():
                for v in (s.memory_used_bytes, s.memory_total_bytes):
                    assert v is None or isinstance(v, int)
                for v in (s.memory_util_pct, s.dram_bw_util_pct):
                    assert v is None or isinstance(v, float)
                    readings += v is not None
                    out_of_range += v is not None and not (math.isfinite(v) and 0 <= v <= 100)
        fake.fail = {}
        sampler.close()
        assert fake.live == {}
        unexpected += sum(n for k, n in sampler.health.errors.items() if k.endswith(":unexpected"))
        tally.add("sampled" if started else "not_started")
    tally.report()
    print(f"{readings:,} utilisation readings ({out_of_range:,} passed through outside 0-100 or not finite), "
          f"{unexpected:,} answers of an unreadable shape counted")
