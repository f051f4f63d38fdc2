"""GPU samples from NVML (memory, utilisation, DRAM bandwidth), off unless asked for."""

from attrib_agent.sources.nvml.sampler import NvmlSampler
from attrib_agent.sources.nvml.source import SPEC, NvmlSource

__all__ = ["SPEC", "NvmlSampler", "NvmlSource"]
