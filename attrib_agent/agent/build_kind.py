"""Which build of the agent runs: the re-simulation's core and the step inference compiled by mypyc (`ATTRIB_MYPYC=1
pip install .`, see setup.py and docs/deployment.md) or pure Python. Read from the modules themselves, never from a
flag, so the start-up log and `--version` cannot claim a build the process does not run.

This file is also read by setup.py (and benchmarks/replay_throughput.py `--compiled`) for the module list, so it
imports the standard library only.
"""

from __future__ import annotations

import importlib
from importlib.machinery import EXTENSION_SUFFIXES
from typing import Final

PACKAGE: Final = "attrib_agent"
# modules under the package, dotted. The re-simulation's per-step code, its step prices, the observed causes and the
# step-cost fits (eighth session); then the timeline's step inference and what it calls per step (ninth session: the
# GPU-rate pass's timeline CPU 0.54-0.64 -> 0.46-0.49 s). Measured and left out (docs/deployment.md, "A compiled
# agent"): the pipeline and the small attribution modules (shapley, sim_start, tally, neighbourhoods, whales,
# step_shape, culprit_windows: no gain over this set), engine_timeline, timeline_window, reinference, fact_reads and
# the attributor (0-10 % more, within the runs' spread; their tests spy on them through seams a compiled class
# lacks), the log parser (compiled, it raised TypeError on every line) and step_outcome (its class inherits from a
# plain Python one).
COMPILED_MODULES: Final = ("attribution.block_pool", "attribution.causes", "attribution.cost_model",
                           "attribution.period_cost", "attribution.scheduler_sim", "attribution.sim_cache",
                           "attribution.sim_step", "attribution.sim_stretch", "attribution.sim_trace",
                           "timeline.steps", "timeline.step_tokens", "timeline.step_counts", "timeline.sched_state",
                           "timeline.ledger", "timeline.lifecycle", "timeline.preemption", "timeline.exact",
                           "timeline.kv_share", "timeline.model", "timeline.gpu_samples")
KIND_COMPILED: Final = "compiled (mypyc)"
KIND_PURE: Final = "pure Python"


def compiled_sources() -> list[str]:
    """The modules mypyc builds, as source paths relative to the project's root (what `mypycify` and mypyc take)."""
    return [f"{PACKAGE}/{m.replace('.', '/')}.py" for m in COMPILED_MODULES]


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
