"""NVML GPU sampler: per-GPU memory, memory utilisation and GPM DRAM bandwidth, once a second.

vLLM reserves its KV cache up front, so NVML "memory used" stays flat while serving: the signal that moves
with load is memory bandwidth (NVML's memory utilisation %, and GPM's DRAM bandwidth utilisation on Hopper
and newer). nvidia-ml-py is imported lazily and can be replaced by any object with the same API (tests do),
so a machine with no driver or no GPU records one "unavailable: <reason>" and the agent runs on without it.

NVML calls used: nvmlInit, nvmlShutdown, nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex, nvmlDeviceGetUUID,
nvmlDeviceGetMemoryInfo, nvmlDeviceGetUtilizationRates, nvmlDeviceGetSamples, nvmlGpmQueryDeviceSupport,
nvmlGpmSampleAlloc, nvmlGpmSampleGet, nvmlGpmMetricsGet, nvmlGpmSampleFree.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Final

from attrib_agent.events import GpuSample
from attrib_agent.health import SourceHealth

logger = logging.getLogger(__name__)

MAX_GPUS: Final = 64  # devices opened at most: bounds per-device state
GPM_MIN_PAIR_S: Final = 0.1  # NVML wants GPM samples more than 100 ms apart for a meaningful rate
GPM_MAX_PAIR_INTERVALS: Final = 10  # an older pair would report a long average as if it were current
_GIVE_UP: Final = frozenset({"not_supported", "function_not_found"})  # the device can't: stop asking it
_INIT_REASONS: Final = {
    "library_not_found": "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver installed",
    "driver_not_loaded": "NVIDIA driver not loaded",
    "no_permission": "no permission to open the NVIDIA driver",
    "lib_rm_version_mismatch": "NVML library and kernel driver versions differ",
}
_VALUE_FIELDS: Final = {  # NVML_VALUE_TYPE_* -> the c_nvmlValue_t union member holding a sample
    "DOUBLE": "dVal", "UNSIGNED_INT": "uiVal", "UNSIGNED_LONG": "ulVal", "UNSIGNED_LONG_LONG": "ullVal",
    "SIGNED_LONG_LONG": "sllVal", "SIGNED_INT": "siVal", "UNSIGNED_SHORT": "usVal",
}
_CAMEL_HUMP: Final = re.compile(r"(?<!^)(?=[A-Z])")
_FAILED: Final = object()  # what _call returns when the NVML call did not succeed


@dataclass
class _GpmPair:
    """Two GPM sample buffers used in turn: `prev` holds the older reading, the other is filled next."""

    buffers: list[Any]
    prev: int | None = None
    prev_ts: float = 0.0


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str | None
    unsupported: set[str] = field(default_factory=set)  # calls this device refused for good; not retried
    samples_seen_us: int = 0  # newest nvmlDeviceGetSamples timestamp already averaged
    gpm: _GpmPair | None = None


DEFAULT_INTERVAL_S: Final = 1.0


class NvmlSampler:
    """Reads every GPU once per `sample()`; each NVML call that fails leaves its field None and is counted."""

    def __init__(
        self, *, nvml: Any | None = None, interval_s: float = DEFAULT_INTERVAL_S, clock: Callable[[], float] = time.time
    ) -> None:
        self._nvml: Any = nvml  # the pynvml module, or a stand-in with its API
        self._interval_s = interval_s
        self._clock = clock
        self.health = SourceHealth("nvml")
        self.unavailable_reason: str | None = None
        self._devices: list[_Device] = []
        self._initialised = False
        self._value_fields: dict[int, str] = {}
        self._logged: set[str] = set()

    @property
    def gpus(self) -> int:
        return len(self._devices)

    def start(self) -> bool:
        """Initialise NVML and open every GPU; False (recorded once in health) when there is nothing to sample."""
        if self._devices:
            return True
        if self.unavailable_reason is not None:
            return False
        ts = self._clock()
        if self._nvml is None:
            try:
                import pynvml
            except ImportError:
                return self._unavailable(ts, "nvidia-ml-py (pynvml) is not installed")
            self._nvml = pynvml
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            name = self._error_name(e)
            return self._unavailable(ts, _INIT_REASONS.get(name, f"nvmlInit failed: {name}"))
        except Exception as e:  # a broken binding (OSError, version mismatch) must not stop the agent
            return self._unavailable(ts, f"nvmlInit failed: {type(e).__name__}")
        self._initialised = True
        try:
            reason = self._open_devices(ts)
        except Exception as e:  # a binding shaped unlike nvidia-ml-py: the boundary
            logger.warning("NVML sampler: opening GPUs failed", exc_info=True)
            reason = f"opening GPUs failed: {type(e).__name__}"
        if reason is not None:
            self.close()
            return self._unavailable(ts, reason)
        logger.info("NVML sampler: %d GPU(s), DRAM bandwidth (GPM) on %d", len(self._devices),
                    sum(d.gpm is not None for d in self._devices))
        return True

    def sample(self) -> list[GpuSample]:
        """One reading per GPU; never raises: a failed call is counted and its field is None."""
        out: list[GpuSample] = []
        for dev in self._devices:
            ts = self._clock()
            used = total = mem_util = dram = None
            try:
                used, total = self._memory(dev, ts)
                mem_util = self._memory_util(dev, ts)
                dram = self._dram_bw_util(dev, ts)
            except Exception:  # a struct the binding shaped differently: the boundary, count and carry on
                self._count(f"gpu{dev.index}:unexpected", ts, exc=True)
            out.append(GpuSample(ts=ts, gpu=dev.index, uuid=dev.uuid, memory_used_bytes=used,
                                 memory_total_bytes=total, memory_util_pct=mem_util, dram_bw_util_pct=dram))
            if (used, total, mem_util, dram) != (None, None, None, None):
                self.health.success(ts)
        return out

    def close(self) -> None:
        """Free the GPM buffers and shut NVML down; safe to call twice or after a failed start."""
        ts = self._clock()
        nvml = self._nvml
        for dev in self._devices:
            if dev.gpm is not None:
                for buf in dev.gpm.buffers:
                    self._call(None, "nvmlGpmSampleFree", ts, nvml.nvmlGpmSampleFree, buf)
                dev.gpm = None
        self._devices = []
        if self._initialised:
            self._initialised = False
            self._call(None, "nvmlShutdown", ts, nvml.nvmlShutdown)

    async def run(self, emit: Callable[[GpuSample], None], stop: asyncio.Event) -> None:
        """Start, sample every `interval_s` until `stop` is set, close. NVML runs in a worker thread so a slow
        driver call never stalls the event loop; a call that overruns skips the ticks it covered."""
        if not await asyncio.to_thread(self.start):
            return
        loop = asyncio.get_running_loop()
        try:
            due = loop.time()
            while not stop.is_set():
                for gpu_sample in await asyncio.to_thread(self.sample):
                    try:
                        emit(gpu_sample)
                    except Exception:
                        logger.exception("GPU sample emit failed; sample of GPU %d dropped", gpu_sample.gpu)
                        self.health.skip("emit_failed")
                due += self._interval_s
                now = loop.time()
                if now >= due:
                    missed = int((now - due) // self._interval_s) + 1
                    self.health.skip("missed_tick", missed)
                    due += missed * self._interval_s
                try:
                    await asyncio.wait_for(stop.wait(), timeout=due - now)
                except TimeoutError:
                    pass
        finally:
            self.close()

    def _open_devices(self, ts: float) -> str | None:
        """Open up to MAX_GPUS GPUs; the reason there is nothing to sample, or None."""
        nvml = self._nvml
        self._value_fields = {getattr(nvml, f"NVML_VALUE_TYPE_{t}"): f for t, f in _VALUE_FIELDS.items()}
        count = self._call(None, "nvmlDeviceGetCount", ts, nvml.nvmlDeviceGetCount)
        if count is _FAILED:
            return "cannot count GPUs"
        for i in range(min(int(count), MAX_GPUS)):
            handle = self._call(None, "nvmlDeviceGetHandleByIndex", ts, nvml.nvmlDeviceGetHandleByIndex, i)
            if handle is _FAILED:
                continue
            uuid = self._call(None, "nvmlDeviceGetUUID", ts, nvml.nvmlDeviceGetUUID, handle)
            dev = _Device(i, handle, uuid if isinstance(uuid, str) and uuid else None)
            self._devices.append(dev)
            dev.gpm = self._open_gpm(dev, ts)
        if not self._devices:
            return "no GPU found" if not count else "no GPU could be opened"
        return None

    def _memory(self, dev: _Device, ts: float) -> tuple[int | None, int | None]:
        nvml = self._nvml
        mem = self._call(dev, "nvmlDeviceGetMemoryInfo_v2", ts, nvml.nvmlDeviceGetMemoryInfo, dev.handle,
                         nvml.nvmlMemory_v2)
        if mem is _FAILED and "nvmlDeviceGetMemoryInfo_v2" in dev.unsupported:  # drivers before v2
            mem = self._call(dev, "nvmlDeviceGetMemoryInfo", ts, nvml.nvmlDeviceGetMemoryInfo, dev.handle)
        return (None, None) if mem is _FAILED else (int(mem.used), int(mem.total))

    def _memory_util(self, dev: _Device, ts: float) -> float | None:
        """Mean of NVML's buffered samples since the last read (covers the whole interval), else the rate."""
        nvml = self._nvml
        got = self._call(dev, "nvmlDeviceGetSamples", ts, nvml.nvmlDeviceGetSamples, dev.handle,
                         nvml.NVML_MEMORY_UTILIZATION_SAMPLES, dev.samples_seen_us, quiet={"not_found"})
        if got is not _FAILED:
            value_type, samples = got
            value_field = self._value_fields.get(value_type)
            if value_field is None or not samples:
                self.health.skip("nvml_samples_unreadable")
            else:
                newest = max(int(s.timeStamp) for s in samples)
                since = max(dev.samples_seen_us, newest - int(self._interval_s * 1e6))
                recent = [float(getattr(s.sampleValue, value_field)) for s in samples if s.timeStamp > since]
                dev.samples_seen_us = max(dev.samples_seen_us, newest)
                if recent:
                    return sum(recent) / len(recent)
                self.health.skip("nvml_samples_not_newer")
        rates = self._call(dev, "nvmlDeviceGetUtilizationRates", ts, nvml.nvmlDeviceGetUtilizationRates,
                           dev.handle)
        return None if rates is _FAILED else float(rates.memory)

    def _open_gpm(self, dev: _Device, ts: float) -> _GpmPair | None:
        nvml = self._nvml
        support = self._call(dev, "nvmlGpmQueryDeviceSupport", ts, nvml.nvmlGpmQueryDeviceSupport, dev.handle)
        if support is _FAILED or not support.isSupportedDevice:
            return None
        pair = _GpmPair([])
        for _ in range(2):
            buf = self._call(dev, "nvmlGpmSampleAlloc", ts, nvml.nvmlGpmSampleAlloc)
            if buf is _FAILED:
                for allocated in pair.buffers:
                    self._call(None, "nvmlGpmSampleFree", ts, nvml.nvmlGpmSampleFree, allocated)
                return None
            pair.buffers.append(buf)
        return pair

    def _dram_bw_util(self, dev: _Device, ts: float) -> float | None:
        """DRAM bandwidth % from the previous GPM reading and this one, when at least 100 ms apart."""
        pair, nvml = dev.gpm, self._nvml
        if pair is None:
            return None
        target = 0 if pair.prev is None else 1 - pair.prev
        if self._call(dev, "nvmlGpmSampleGet", ts, nvml.nvmlGpmSampleGet, dev.handle,
                      pair.buffers[target]) is _FAILED:
            return None
        age = ts - pair.prev_ts
        if pair.prev is None or age < 0 or age > GPM_MAX_PAIR_INTERVALS * max(self._interval_s, GPM_MIN_PAIR_S):
            pair.prev, pair.prev_ts = target, ts  # first, clock went back, or stale: start a new pair
            return None
        if age < GPM_MIN_PAIR_S:
            self.health.skip("gpm_pair_too_close")  # keep the older reading; this buffer is refilled next time
            return None
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1 = pair.buffers[pair.prev]
        request.sample2 = pair.buffers[target]
        request.metrics[0].metricId = nvml.NVML_GPM_METRIC_DRAM_BW_UTIL
        pair.prev, pair.prev_ts = target, ts
        got = self._call(dev, "nvmlGpmMetricsGet", ts, nvml.nvmlGpmMetricsGet, request)
        if got is _FAILED:
            return None
        metric = got.metrics[0]
        if metric.nvmlReturn != nvml.NVML_SUCCESS:
            self._count(f"nvmlGpmMetricsGet:{self._error_name(nvml.NVMLError(metric.nvmlReturn))}", ts)
            return None
        return float(metric.value)

    def _call(self, dev: _Device | None, call: str, ts: float, fn: Callable[..., Any], *args: Any,
              quiet: Collection[str] = ()) -> Any:
        """fn(*args), or _FAILED with the failure counted as `<call>:<nvml error>`; never raises."""
        if dev is not None and call in dev.unsupported:
            return _FAILED
        try:
            return fn(*args)
        except self._nvml.NVMLError as e:
            name = self._error_name(e)
            if name not in quiet:
                self._count(f"{call}:{name}", ts)
            if dev is not None and name in _GIVE_UP:
                dev.unsupported.add(call)
                logger.info("GPU %d: %s is %s; not asking again", dev.index, call, name)
        except Exception:  # the boundary: a broken binding or driver must not stop the agent
            self._count(f"{call}:unexpected", ts, exc=True)
        return _FAILED

    def _count(self, kind: str, ts: float, exc: bool = False) -> None:
        self.health.error(kind, ts)
        if kind not in self._logged:  # once per kind: a lost GPU would otherwise log every second
            self._logged.add(kind)
            logger.warning("NVML %s (further ones are only counted)", kind, exc_info=exc)

    @staticmethod
    def _error_name(e: BaseException) -> str:
        """`NVMLError_GpuIsLost` -> "gpu_is_lost": pynvml names one subclass per NVML_ERROR_* code this way."""
        name = type(e).__name__
        if not name.startswith("NVMLError_"):
            return "other"  # a code this binding does not know: one bounded kind
        return _CAMEL_HUMP.sub("_", name[len("NVMLError_") :]).lower()

    def _unavailable(self, ts: float, reason: str) -> bool:
        self.unavailable_reason = reason
        self.health.error("unavailable", ts, reason)
        logger.warning("NVML sampler unavailable: %s; running without GPU metrics", reason)
        return False
