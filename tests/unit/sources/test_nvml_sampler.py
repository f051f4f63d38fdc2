"""NvmlSampler: the real no-driver path with the real pynvml, and the sampling logic through a stand-in.

No GPU is available to this project. `FakeNvml` mirrors the few nvidia-ml-py calls the sampler uses: the
same names and signatures, the real pynvml ctypes structs as results, and real pynvml NVMLError subclasses
built from the real error codes. Its GPM model keeps a DRAM byte counter per GPU and computes bandwidth %
from a pair of samples as the driver does, so the sampler's pairing shows in the numbers it reports.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attrib_agent.events import GpuSample
from attrib_agent.sources.nvml.sampler import MAX_GPUS, NvmlSampler

GIB = 1 << 30
PEAK_BPS = 2_000_000_000_000  # the fake GPU's theoretical DRAM bandwidth, bytes/s


class FakeClock:
    def __init__(self, now: float = 1_795_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeGpu:
    uuid: str
    total: int = 80 * GIB
    used: int = 70 * GIB  # vLLM reserved its KV cache up front: flat
    reserved: int = 512 * 1024 * 1024
    rates_memory: int = 37  # nvmlDeviceGetUtilizationRates().memory
    mem_samples: list[tuple[int, int]] = field(default_factory=list)  # (CPU timestamp us, percent)
    samples_supported: bool = True
    memory_v2: bool = True
    gpm_supported: bool = True
    dram_bytes: int = 0  # DRAM bytes moved since boot, what GPM samples capture
    gpm_metric_return: int = pynvml.NVML_SUCCESS


@dataclass
class _GpmData:
    gpu: int
    ts: float
    dram_bytes: int


def _address(pointer: Any) -> int:
    return int(ctypes.cast(pointer, ctypes.c_void_p).value or 0)


# constants, structs and NVMLError classes exactly as the real module has them
PYNVML_DATA = {name: getattr(pynvml, name) for name in dir(pynvml)
               if name.startswith(("NVML_", "NVMLError", "c_nvml")) or name == "nvmlMemory_v2"}


class FakeNvml:
    """The nvidia-ml-py calls the sampler uses, over scripted GPUs; any other call is an AttributeError."""

    def __init__(self, gpus: list[FakeGpu], clock: FakeClock, *, init_error: int | None = None,
                 gpm_api: bool = True) -> None:
        self.__dict__.update(PYNVML_DATA)
        self.gpus, self.clock, self.init_error, self.gpm_api = gpus, clock, init_error, gpm_api
        self.fail: dict[str, int | str] = {}  # call -> NVML error code raised on every call ("exc": RuntimeError)
        self.calls: Counter[str] = Counter()
        self.live: dict[int, _GpmData | None] = {}  # allocated GPM samples by address: filled or not yet
        self.max_live = 0
        self.alloc_limit: int | None = None  # GPM samples the driver will hand out at once
        self.initialised = False
        self._next_address = 0x10_0000

    def _enter(self, call: str) -> None:
        self.calls[call] += 1
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if call.startswith("nvmlGpm") and not self.gpm_api:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        code = self.fail.get(call)
        if code == "exc":
            raise RuntimeError("binding broke")
        if code is not None:
            raise pynvml.NVMLError(code)

    def _gpu(self, handle: Any) -> FakeGpu:
        index = (_address(handle) - 0x1000) // 0x10
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return ctypes.cast(ctypes.c_void_p(0x1000 + 0x10 * index), pynvml.c_nvmlDevice_t)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        self._enter("nvmlDeviceGetUUID")
        return self._gpu(handle).uuid

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        self._enter("nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo")
        gpu = self._gpu(handle)
        if not version:  # v1 counts the driver's reserved memory as used
            return pynvml.c_nvmlMemory_t(total=gpu.total, free=gpu.total - gpu.used - gpu.reserved,
                                         used=gpu.used + gpu.reserved)
        if not gpu.memory_v2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if version != pynvml.nvmlMemory_v2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return pynvml.c_nvmlMemory_v2_t(version=version, total=gpu.total, reserved=gpu.reserved,
                                        free=gpu.total - gpu.used - gpu.reserved, used=gpu.used)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates")
        return pynvml.c_nvmlUtilization_t(gpu=90, memory=self._gpu(handle).rates_memory)

    def nvmlDeviceGetSamples(self, device: Any, sampling_type: int, timeStamp: int) -> tuple[int, list[Any]]:
        self._enter("nvmlDeviceGetSamples")
        gpu = self._gpu(device)
        if not gpu.samples_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if sampling_type != pynvml.NVML_MEMORY_UTILIZATION_SAMPLES:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        newer = [(t, v) for t, v in gpu.mem_samples if t > timeStamp]
        if not newer:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        array = (pynvml.c_nvmlSample_t * len(newer))()
        for slot, (t, v) in zip(array, newer, strict=True):
            slot.timeStamp, slot.sampleValue.uiVal = t, v
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, array[0 : len(newer)]

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        self._enter("nvmlGpmQueryDeviceSupport")
        return pynvml.c_nvmlGpmSupport_t(version=pynvml.NVML_GPM_SUPPORT_VERSION,
                                         isSupportedDevice=int(self._gpu(device).gpm_supported))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        if self.alloc_limit is not None and len(self.live) >= self.alloc_limit:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_MEMORY)
        self._next_address += 0x40
        self.live[self._next_address] = None
        self.max_live = max(self.max_live, len(self.live))
        return ctypes.cast(ctypes.c_void_p(self._next_address), pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        if _address(gpmSample) not in self.live:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        del self.live[_address(gpmSample)]

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        self._enter("nvmlGpmSampleGet")
        gpu = self._gpu(device)
        if _address(gpmSample) not in self.live:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self.live[_address(gpmSample)] = _GpmData(self.gpus.index(gpu), self.clock(), gpu.dram_bytes)
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        if metricsGet.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first = self.live.get(_address(metricsGet.sample1))
        second = self.live.get(_address(metricsGet.sample2))
        if first is None or second is None or first.gpu != second.gpu or second.ts <= first.ts:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for i in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[i]
            if metric.metricId != pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            metric.nvmlReturn = self.gpus[first.gpu].gpm_metric_return
            metric.value = 100.0 * (second.dram_bytes - first.dram_bytes) / ((second.ts - first.ts) * PEAK_BPS)
        return metricsGet


def make(n_gpus: int = 1, **kw: Any) -> tuple[NvmlSampler, FakeNvml, FakeClock]:
    clock = FakeClock()
    fake = FakeNvml([FakeGpu(uuid=f"GPU-{i:08x}-aaaa-bbbb-cccc-0123456789ab") for i in range(n_gpus)], clock, **kw)
    return NvmlSampler(nvml=fake, interval_s=1.0, clock=clock), fake, clock


def tick(sampler: NvmlSampler, fake: FakeNvml, clock: FakeClock, dt: float = 1.0,
         dram_bps: float = 0.0) -> list[GpuSample]:
    """Let `dt` seconds pass on every fake GPU (DRAM traffic at `dram_bps`), then sample."""
    clock.now += dt
    for gpu in fake.gpus:
        gpu.dram_bytes += int(dram_bps * max(dt, 0.0))
    return sampler.sample()


# --- the real library on this GPU-less machine ----------------------------------------------------------------


def test_real_pynvml_without_driver_reports_unavailable_once(caplog: pytest.LogCaptureFixture) -> None:
    sampler = NvmlSampler()  # lazy `import pynvml`: the real nvidia-ml-py
    with caplog.at_level(logging.WARNING):
        assert sampler.start() is False
        assert sampler.start() is False
    reason = sampler.unavailable_reason or ""
    assert "library not found" in reason and "driver" in reason
    assert sampler.health.errors == Counter({"unavailable": 1})
    assert sampler.health.last_error == f"unavailable: {reason}"
    assert [r.getMessage() for r in caplog.records].count(
        f"NVML sampler unavailable: {reason}; running without GPU metrics") == 1
    assert sampler.sample() == []
    sampler.close()
    emitted: list[GpuSample] = []
    asyncio.run(sampler.run(emitted.append, asyncio.Event()))  # returns at once: nothing to sample
    assert emitted == [] and sampler.health.errors == Counter({"unavailable": 1})


def test_nvidia_ml_py_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # what `import pynvml` meets when the package is absent
    sampler = NvmlSampler()
    assert sampler.start() is False
    assert sampler.unavailable_reason == "nvidia-ml-py (pynvml) is not installed"


@pytest.mark.parametrize(("code", "reason"), [
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "NVIDIA driver not loaded"),
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver installed"),
    (pynvml.NVML_ERROR_NO_PERMISSION, "no permission to open the NVIDIA driver"),
    (pynvml.NVML_ERROR_UNKNOWN, "nvmlInit failed: unknown"),
])
def test_init_failure_reasons(code: int, reason: str) -> None:
    sampler, fake, _ = make(init_error=code)
    assert sampler.start() is False and sampler.unavailable_reason == reason
    assert sampler.health.last_error == f"unavailable: {reason}"


def test_driver_without_gpus_is_unavailable_and_shuts_down() -> None:
    sampler, fake, _ = make(n_gpus=0)
    assert sampler.start() is False and sampler.unavailable_reason == "no GPU found"
    assert fake.calls["nvmlShutdown"] == 1 and not fake.initialised


# --- memory and memory utilisation ------------------------------------------------------------------------------


def test_sample_reads_memory_v2_and_buffered_memory_utilisation() -> None:
    sampler, fake, clock = make()
    gpu = fake.gpus[0]
    assert sampler.start()
    now_us = int((clock.now + 1.0) * 1e6)
    # NVML buffers samples for longer than one interval; only the last interval's count on the first read
    gpu.mem_samples = [(now_us - 5_000_000, 99), (now_us - 500_000, 40), (now_us - 333_000, 50), (now_us, 60)]
    (s,) = tick(sampler, fake, clock)
    assert s == GpuSample(ts=clock.now, gpu=0, uuid=gpu.uuid, memory_used_bytes=70 * GIB,
                          memory_total_bytes=80 * GIB, memory_util_pct=50.0, dram_bw_util_pct=None)
    gpu.mem_samples.append((now_us + 166_000, 10))  # next read: only what is newer than the last one seen
    assert tick(sampler, fake, clock)[0].memory_util_pct == 10.0
    # nothing new buffered (NVML_ERROR_NOT_FOUND): the utilisation rate instead, and that is no error
    assert tick(sampler, fake, clock)[0].memory_util_pct == 37.0
    assert sampler.health.errors == Counter() and sampler.health.ok_total == 3 and sampler.health.up
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == 0  # v2 only: v1 would count reserved memory as used


def test_samples_unsupported_falls_back_to_rates_and_stops_asking() -> None:
    sampler, fake, clock = make()
    fake.gpus[0].samples_supported = False
    assert sampler.start()
    assert [s.memory_util_pct for _ in range(3) for s in tick(sampler, fake, clock)] == [37.0] * 3
    assert fake.calls["nvmlDeviceGetSamples"] == 1
    assert sampler.health.errors == Counter({"nvmlDeviceGetSamples:not_supported": 1})


def test_memory_v1_on_a_driver_without_v2() -> None:
    sampler, fake, clock = make()
    fake.gpus[0].memory_v2 = False
    assert sampler.start()
    for _ in range(3):
        (s,) = tick(sampler, fake, clock)
        assert (s.memory_used_bytes, s.memory_total_bytes) == (70 * GIB + 512 * 1024 * 1024, 80 * GIB)
    assert fake.calls["nvmlDeviceGetMemoryInfo_v2"] == 1
    assert sampler.health.errors == Counter({"nvmlDeviceGetMemoryInfo_v2:function_not_found": 1})


# --- GPM DRAM bandwidth -------------------------------------------------------------------------------------------


def test_gpm_dram_bandwidth_from_pairs_of_samples() -> None:
    sampler, fake, clock = make()
    assert sampler.start()
    assert tick(sampler, fake, clock)[0].dram_bw_util_pct is None  # first reading: nothing to pair with yet
    assert tick(sampler, fake, clock, dram_bps=0.5 * PEAK_BPS)[0].dram_bw_util_pct == pytest.approx(50.0)
    assert tick(sampler, fake, clock, dram_bps=0.25 * PEAK_BPS)[0].dram_bw_util_pct == pytest.approx(25.0)
    # 50 ms later is too close: no value, and the older reading stays the pair's first half ...
    assert tick(sampler, fake, clock, dt=0.05, dram_bps=1.0 * PEAK_BPS)[0].dram_bw_util_pct is None
    # ... so the next value covers the whole 1.05 s: (0.05 s at 100% + 1 s at 10%) / 1.05 s
    got = tick(sampler, fake, clock, dram_bps=0.1 * PEAK_BPS)[0].dram_bw_util_pct
    assert got == pytest.approx(100 * (0.05 + 0.1) / 1.05)
    assert sampler.health.skipped == Counter({"gpm_pair_too_close": 1}) and sampler.health.errors == Counter()
    assert fake.calls["nvmlGpmSampleAlloc"] == 2 and fake.max_live == 2  # two buffers, reused in turn
    sampler.close()
    assert fake.live == {} and not fake.initialised


def test_gpm_failed_reading_keeps_the_previous_one() -> None:
    sampler, fake, clock = make()
    assert sampler.start()
    tick(sampler, fake, clock)
    fake.fail["nvmlGpmSampleGet"] = pynvml.NVML_ERROR_TIMEOUT
    (s,) = tick(sampler, fake, clock, dram_bps=0.8 * PEAK_BPS)
    assert s.dram_bw_util_pct is None and s.memory_used_bytes == 70 * GIB  # only the failed call's field
    del fake.fail["nvmlGpmSampleGet"]
    assert tick(sampler, fake, clock, dram_bps=0.2 * PEAK_BPS)[0].dram_bw_util_pct == pytest.approx(50.0)
    assert sampler.health.errors == Counter({"nvmlGpmSampleGet:timeout": 1})


def test_gpm_stale_or_backwards_pair_starts_over() -> None:
    sampler, fake, clock = make()
    assert sampler.start()
    tick(sampler, fake, clock)
    assert tick(sampler, fake, clock, dt=60.0, dram_bps=PEAK_BPS)[0].dram_bw_util_pct is None  # a minute-long mean
    assert tick(sampler, fake, clock, dt=-5.0)[0].dram_bw_util_pct is None  # wall clock stepped back
    assert tick(sampler, fake, clock, dram_bps=0.3 * PEAK_BPS)[0].dram_bw_util_pct == pytest.approx(30.0)
    assert fake.calls["nvmlGpmMetricsGet"] == 1 and sampler.health.errors == Counter()


def test_gpm_metric_level_error_is_counted() -> None:
    sampler, fake, clock = make()
    fake.gpus[0].gpm_metric_return = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert sampler.start()
    assert [tick(sampler, fake, clock)[0].dram_bw_util_pct for _ in range(3)] == [None] * 3
    assert sampler.health.errors == Counter({"nvmlGpmMetricsGet:not_supported": 2})


def test_gpm_not_on_this_gpu_or_driver() -> None:
    sampler, fake, clock = make()
    fake.gpus[0].gpm_supported = False  # pre-Hopper: the query succeeds and says no
    assert sampler.start()
    assert [tick(sampler, fake, clock)[0].dram_bw_util_pct for _ in range(3)] == [None] * 3
    assert fake.calls["nvmlGpmSampleAlloc"] == fake.calls["nvmlGpmSampleGet"] == 0
    assert sampler.health.errors == Counter()

    sampler, fake, clock = make(gpm_api=False)  # a driver older than GPM
    assert sampler.start()
    assert tick(sampler, fake, clock)[0].memory_util_pct is not None
    assert sampler.health.errors == Counter({"nvmlGpmQueryDeviceSupport:function_not_found": 1})


def test_gpm_alloc_failure_frees_what_was_allocated() -> None:
    sampler, fake, clock = make()
    fake.alloc_limit = 1  # the second buffer cannot be had
    assert sampler.start()
    assert fake.live == {} and fake.calls["nvmlGpmSampleFree"] == 1
    assert tick(sampler, fake, clock)[0].dram_bw_util_pct is None
    assert sampler.health.errors == Counter({"nvmlGpmSampleAlloc:memory": 1})


# --- per-call failures -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("call", "blank"), [
    ("nvmlDeviceGetMemoryInfo_v2", {"memory_used_bytes", "memory_total_bytes"}),
    ("nvmlDeviceGetUtilizationRates", {"memory_util_pct"}),
    ("nvmlGpmSampleGet", {"dram_bw_util_pct"}),
    ("nvmlGpmMetricsGet", {"dram_bw_util_pct"}),
])
@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_UNKNOWN, 12345, "exc"])
def test_a_failed_call_blanks_only_its_field(call: str, blank: set[str], code: int | str) -> None:
    sampler, fake, clock = make()
    fake.gpus[0].samples_supported = False  # so utilisation comes from nvmlDeviceGetUtilizationRates
    assert sampler.start()
    tick(sampler, fake, clock)
    fake.fail[call] = code
    (s,) = tick(sampler, fake, clock, dram_bps=0.5 * PEAK_BPS)
    fields = {"memory_used_bytes", "memory_total_bytes", "memory_util_pct", "dram_bw_util_pct"}
    assert {f for f in fields if getattr(s, f) is None} == blank
    name = {pynvml.NVML_ERROR_GPU_IS_LOST: "gpu_is_lost", pynvml.NVML_ERROR_UNKNOWN: "unknown"}.get(code, "other")
    kind = f"{call}:{'unexpected' if code == 'exc' else name}"
    assert sampler.health.errors[kind] == 1


def test_lost_gpu_never_raises_and_marks_health_down() -> None:
    sampler, fake, clock = make(n_gpus=2)
    assert sampler.start()
    for call in ("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetSamples", "nvmlDeviceGetUtilizationRates",
                 "nvmlGpmSampleGet", "nvmlGpmMetricsGet"):
        fake.fail[call] = pynvml.NVML_ERROR_GPU_IS_LOST
    for _ in range(5):
        samples = tick(sampler, fake, clock)
        assert [(s.gpu, s.memory_used_bytes, s.memory_util_pct, s.dram_bw_util_pct) for s in samples] == [
            (0, None, None, None), (1, None, None, None)]
    assert not sampler.health.up and sampler.health.ok_total == 0
    assert sampler.health.errors["nvmlDeviceGetMemoryInfo_v2:gpu_is_lost"] == 10


def test_a_gpu_whose_handle_fails_is_skipped() -> None:
    sampler, fake, clock = make(n_gpus=2)
    fake.fail["nvmlDeviceGetHandleByIndex"] = pynvml.NVML_ERROR_NO_PERMISSION
    assert sampler.start() is False and sampler.unavailable_reason == "no GPU could be opened"
    assert not fake.initialised

    sampler, fake, clock = make(n_gpus=2)
    fake.fail["nvmlDeviceGetUUID"] = pynvml.NVML_ERROR_UNKNOWN
    assert sampler.start()
    assert [(s.gpu, s.uuid) for s in tick(sampler, fake, clock)] == [(0, None), (1, None)]


def test_gpu_count_is_bounded() -> None:
    sampler, fake, clock = make(n_gpus=MAX_GPUS + 8)
    assert sampler.start() and sampler.gpus == MAX_GPUS
    assert len(tick(sampler, fake, clock)) == MAX_GPUS
    assert len(fake.live) == 2 * MAX_GPUS
    sampler.close()
    assert fake.live == {}


def test_a_binding_shaped_differently_is_contained() -> None:
    sampler, fake, clock = make()
    fake.nvmlGpmQueryDeviceSupport = lambda device: object()  # type: ignore[method-assign]
    assert sampler.start() is False
    assert sampler.unavailable_reason == "opening GPUs failed: AttributeError" and not fake.initialised

    sampler, fake, clock = make()
    assert sampler.start()
    fake.nvmlDeviceGetMemoryInfo = lambda handle, version=None: object()  # type: ignore[method-assign]
    (s,) = tick(sampler, fake, clock)
    assert (s.gpu, s.memory_used_bytes, s.memory_util_pct) == (0, None, None)
    assert sampler.health.errors == Counter({"gpu0:unexpected": 1})


# --- arbitrary sequences ------------------------------------------------------------------------------------------

CALLS = ["nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetSamples",
         "nvmlDeviceGetUtilizationRates", "nvmlGpmSampleGet", "nvmlGpmMetricsGet", "nvmlGpmSampleFree",
         "nvmlShutdown", "nvmlGpmSampleAlloc", "nvmlGpmQueryDeviceSupport", "nvmlDeviceGetUUID"]
CODES = [getattr(pynvml, n) for n in dir(pynvml) if n.startswith("NVML_ERROR_")] + [4242, "exc"]
FAILURE = st.none() | st.tuples(st.sampled_from(CALLS), st.sampled_from(CODES))  # one call failing, or none
STEP = st.tuples(
    st.sampled_from([-1.0, 0.0, 0.05, 0.1, 0.5, 1.0, 1.5, 30.0]),  # clock step, s
    st.integers(0, 200),  # DRAM traffic, % of peak
    st.none() | st.integers(0, 100),  # a new buffered memory-utilisation sample
    FAILURE,
)


@settings(max_examples=2_000, deadline=None)  # not 10k: ~5 ms each, mostly drawing
@given(n_gpus=st.integers(1, 2), gpm=st.booleans(), steps=st.lists(STEP, max_size=6), start_failure=FAILURE)
def test_any_sequence_never_raises_and_stays_bounded(n_gpus: int, gpm: bool, steps: list[Any],
                                                     start_failure: tuple[str, int | str] | None) -> None:
    sampler, fake, clock = make(n_gpus=n_gpus, gpm_api=gpm)
    fake.fail = dict([start_failure] if start_failure else [])
    started = sampler.start()
    for dt, dram_pct, new_sample, failure in steps:
        fake.fail = dict([failure] if failure else [])
        if new_sample is not None:
            for gpu in fake.gpus:
                gpu.mem_samples.append((int(clock.now * 1e6) + 1, new_sample))
        samples = tick(sampler, fake, clock, dt=dt, dram_bps=dram_pct / 100 * PEAK_BPS)
        assert len(samples) == (n_gpus if started else 0)
        assert len(fake.live) <= 2 * n_gpus
        for s in samples:
            assert s.memory_util_pct is None or 0 <= s.memory_util_pct <= 100
            assert s.dram_bw_util_pct is None or s.dram_bw_util_pct >= 0
    assert all(":" in kind or kind == "unavailable" for kind in sampler.health.errors)
    fake.fail = {}
    sampler.close()
    assert fake.live == {} and not fake.initialised


# --- the loop -----------------------------------------------------------------------------------------------------


def run_for(sampler: NvmlSampler, seconds: float, emit: Any) -> float:
    """Run the sampler for `seconds`, then set stop; how long it took to return after that."""

    async def scenario() -> float:
        stop = asyncio.Event()
        task = asyncio.create_task(sampler.run(emit, stop))
        await asyncio.sleep(seconds)
        stop.set()
        began = time.monotonic()
        await task
        return time.monotonic() - began

    return asyncio.run(scenario())


def test_run_samples_at_the_interval_and_closes() -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-0"), FakeGpu(uuid="GPU-1")], FakeClock())
    emitted: list[GpuSample] = []
    run_for(NvmlSampler(nvml=fake, interval_s=0.05, clock=time.time), 0.33, emitted.append)
    assert 4 <= len(emitted) <= 16 and {s.gpu for s in emitted} == {0, 1}  # ~7 ticks of 2 GPUs, never a burst
    assert all(isinstance(s, GpuSample) for s in emitted)
    assert fake.live == {} and not fake.initialised and fake.calls["nvmlShutdown"] == 1

    fake = FakeNvml([FakeGpu(uuid="GPU-0")], FakeClock())
    emitted = []
    assert run_for(NvmlSampler(nvml=fake, interval_s=60.0, clock=time.time), 0.1, emitted.append) < 1.0
    assert len(emitted) == 1 and not fake.initialised  # stop woke the minute-long wait at once


def test_run_survives_a_failing_emit_and_counts_overrun_ticks() -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-0")], FakeClock())
    real_rates = fake.nvmlDeviceGetUtilizationRates

    def slow_rates(handle: Any) -> Any:  # a driver call that takes 2.5 intervals
        time.sleep(0.05)
        return real_rates(handle)

    fake.nvmlDeviceGetUtilizationRates = slow_rates  # type: ignore[method-assign]
    fake.gpus[0].samples_supported = False
    sampler = NvmlSampler(nvml=fake, interval_s=0.02, clock=time.time)

    def emit(sample: GpuSample) -> None:
        raise ValueError("downstream bug")

    run_for(sampler, 0.2, emit)
    ticks = sampler.health.skipped["emit_failed"]
    assert 1 <= ticks <= 5 and sampler.health.skipped["missed_tick"] >= 2 * ticks
    assert not fake.initialised
