"""The step inference's short way for a step that only decodes (`steps._decodes_only`): on every fixture recording
and the GPU-rate input it is taken for most steps and gives the outcomes and the state the general path gives."""

from __future__ import annotations

import importlib.util
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from types import ModuleType

import pytest

import attrib_agent.timeline.steps as steps
from attrib_agent.events import Event
from attrib_agent.timeline import EngineTimeline
from attrib_agent.timeline.sched_state import SchedState
from attrib_agent.timeline.step_outcome import StepOutcome
from tests.unit.timeline.test_reinference_exact import RECORDINGS, TRUTH, TRUTH_RUNS, events, gpu_rate


def python_steps() -> ModuleType:
    """steps.py as Python: the module itself, or on the compiled build (mypyc: its globals are not looked up, so not
    patched) its source loaded afresh, calling the same compiled helpers."""
    path = Path(steps.__file__ or "")
    if not path.name.endswith(tuple(EXTENSION_SUFFIXES)):
        return steps
    spec = importlib.util.spec_from_file_location("_steps_as_python", path.with_name("steps.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def inferred(evs: tuple[Event, ...], infer: ModuleType = steps) -> tuple[list[StepOutcome], SchedState]:
    tl = EngineTimeline(keep_s=1e12, max_steps=10**7, max_requests=10**6)
    tl.feed_all(evs)
    inference = tl._inference
    st = SchedState(budget=0)
    return [infer.infer_step(st, si, inference.book, inference.geometry) for si, _ in tl.outcomes()], st


def check(evs: tuple[Event, ...], monkeypatch: pytest.MonkeyPatch, least: float) -> None:
    taken: list[bool] = []
    module = python_steps()
    real = module._decodes_only

    def counted(st: SchedState, si: object) -> bool:
        taken.append(real(st, si))
        return taken[-1]

    built, built_state = inferred(evs)  # as the build runs it (compiled or not), before anything is patched
    monkeypatch.setattr(module, "_decodes_only", counted)
    fast, fast_state = inferred(evs, module)
    monkeypatch.setattr(module, "_decodes_only", lambda st, si: False)
    general, general_state = inferred(evs, module)
    assert built == fast == general
    assert built_state.same_as(general_state) and fast_state.same_as(general_state)
    assert sum(taken) >= least * len(taken)


@pytest.mark.parametrize("name", ["whale2", "preempt", "preempt-steps", "bench-prefix-steps", "canary"])
def test_recordings(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    check(events(RECORDINGS / name), monkeypatch, 0.3)


@pytest.mark.parametrize("run", TRUTH_RUNS)
def test_truth_runs(run: str, monkeypatch: pytest.MonkeyPatch) -> None:
    check(events(TRUTH / run), monkeypatch, 0.3)


def test_gpu_rate_input(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    check(gpu_rate(tmp_path_factory.mktemp("gpu")), monkeypatch, 0.8)
