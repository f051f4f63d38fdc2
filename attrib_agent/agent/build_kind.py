"""Which build of the agent runs: the re-simulation's core compiled by mypyc (`ATTRIB_MYPYC=1 pip install .`, see
setup.py and docs/deployment.md) or pure Python. Read from the modules themselves, never from a flag, so the start-up
log and `--version` cannot claim a build the process does not run.

This file is also read by setup.py (and benchmarks/replay_throughput.py `--compiled`) for the module list, so it
imports the standard library only.
"""

from __future__ import annotations

import importlib
from importlib.machinery import EXTENSION_SUFFIXES
from typing import Final

PACKAGE: Final = "attrib_agent.attribution"
# the re-simulation's per-step code, its step prices, the observed causes and the step-cost fits: the modules a
# GPU-rate replay pass spends most of its attribution in (docs/attribution.md, eighth session); the others stay Python
COMPILED_MODULES: Final = ("block_pool", "causes", "cost_model", "period_cost", "scheduler_sim", "sim_cache",
                           "sim_step", "sim_stretch", "sim_trace")
KIND_COMPILED: Final = "compiled (mypyc)"
KIND_PURE: Final = "pure Python"


def compiled_sources() -> list[str]:
    """The modules mypyc builds, as source paths relative to the project's root (what `mypycify` and mypyc take)."""
    return [f"{PACKAGE.replace('.', '/')}/{m}.py" for m in COMPILED_MODULES]


def compiled_modules() -> list[str]:
    """Those of `COMPILED_MODULES` this process imported as extension modules (their `__file__` a .so/.pyd)."""
    out = []
    for name in COMPILED_MODULES:
        path = getattr(importlib.import_module(f"{PACKAGE}.{name}"), "__file__", None) or ""
        if path.endswith(tuple(EXTENSION_SUFFIXES)):
            out.append(name)
    return out


def build_kind() -> str:
    """"compiled (mypyc)", "pure Python", or which modules are compiled when only some are (a broken install)."""
    done = compiled_modules()
    if len(done) == len(COMPILED_MODULES):
        return KIND_COMPILED
    if not done:
        return KIND_PURE
    return f"partly compiled (mypyc: {', '.join(done)}; pure Python: " \
           f"{', '.join(m for m in COMPILED_MODULES if m not in done)})"
