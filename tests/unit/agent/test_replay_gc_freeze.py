"""`attrib-agent replay` freezes the collector's survivors as the live agent does (agent/gc_freeze.py), with the
core's one freezer ticked by the consumer, and the results do not change (issue 14 item 4)."""

from __future__ import annotations

import gc
import hashlib
from pathlib import Path

import pytest

from attrib_agent.agent import core as core_module
from attrib_agent.agent.core import AgentCore
from attrib_agent.agent.gc_freeze import GcFreezer
from attrib_agent.cli import main
from attrib_agent.cli.report import json_lines
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sources.replay import ReplaySource

BENCH_MIXED = Path(__file__).parents[2] / "fixtures" / "recordings" / "bench-mixed"


def _pipeline_digest() -> str:
    """The CLI's `--digest` of the recording fed to a bare pipeline: no loop, no consumer, no freezer."""
    p = AttributionPipeline()
    for ev in ReplaySource(BENCH_MIXED).events():
        p.feed(ev)
    p.settle()
    h = hashlib.sha256()
    for line in json_lines(sorted(p.store, key=lambda r: (r.finished_ts, r.request_id))):
        h.update(line.encode() + b"\n")
    return h.hexdigest()


def test_a_plain_replay_runs_freezer_passes_and_keeps_its_digest(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    cores: list[AgentCore] = []
    from_config = AgentCore.from_config

    def keep(*args: object, **kwargs: object) -> AgentCore:
        core = from_config(*args, **kwargs)  # type: ignore[arg-type]
        cores.append(core)
        return core

    class EveryTick(GcFreezer):  # a pass at every tick of the consumer, so a short recording sees many
        def __init__(self) -> None:
            super().__init__(every_s=0.0, freeze_at=0)

    monkeypatch.setattr(AgentCore, "from_config", staticmethod(keep))
    monkeypatch.setattr(core_module, "GcFreezer", EveryTick)
    monkeypatch.setattr(core_module, "IDLE_SETTLE_S", 1e-6)  # the consumer wakes at every yield of the replay
    frozen: list[int] = []  # objects frozen after each tick
    fed: list[int] = []  # events the pipeline had seen at each tick
    tick = EveryTick.tick

    def counting(self: GcFreezer) -> bool:
        ran = tick(self)
        frozen.append(gc.get_freeze_count())
        fed.append(sum(cores[0].pipeline.events.values()))
        return ran

    monkeypatch.setattr(EveryTick, "tick", counting)
    assert main(["replay", str(BENCH_MIXED), "--digest"]) == 0
    digest = capsys.readouterr().out.strip()

    assert len(cores) == 1
    freezer = cores[0].freezer
    assert isinstance(freezer, EveryTick)
    assert len(freezer.pauses_s) == len(fed) >= 2
    total = sum(cores[0].pipeline.events.values())
    assert total > 1000 and any(0 < n < total for n in fed)  # ticked during the replay, not only at its start
    assert max(frozen) > 0  # the passes froze the survivors
    assert gc.get_freeze_count() == 0  # ... and the core's shutdown unfroze them
    assert digest == _pipeline_digest()


def test_the_consumer_and_the_api_share_the_core_s_one_freezer() -> None:
    core = AgentCore(AttributionPipeline())
    assert core.freezer is core.freezer and isinstance(core.freezer, GcFreezer)
    try:
        assert core.freezer.tick()  # the first tick starts it: everything collected and frozen
        assert gc.get_freeze_count() > 0
        assert not core.freezer.tick()  # another loop's tick within the second runs no second pass
    finally:
        core.shutdown()
    assert gc.get_freeze_count() == 0
    assert core.freezer.tick()  # stopped: the next tick starts afresh
    core.freezer.stop()


@pytest.mark.parametrize("ticks", [0, 1])
def test_stop_unfreezes_only_what_a_started_freezer_froze(ticks: int) -> None:
    f = GcFreezer(clock=lambda: 0.0)
    gc.freeze()
    try:
        for _ in range(ticks):
            f.tick()
        f.stop()
        assert (gc.get_freeze_count() == 0) == bool(ticks)
    finally:
        gc.unfreeze()
