"""While the live agent sheds load (passes seconds apart), an attribution pass refits the step-cost model once,
however many steps it learns; otherwise every refit runs where it falls (replay's results exactly as before)."""

from __future__ import annotations

import pytest

from attrib_agent.attribution.cost_model import StepCostModel
from attrib_agent.pipeline import AttributionPipeline
from tests.unit.sinks.api_replayed import events


def learns(gap_s: float, monkeypatch: pytest.MonkeyPatch, *, period: bool = False
           ) -> tuple[AttributionPipeline, list[tuple[int, int]]]:
    """(steps learnt, cost-model fits) of each pass over the `shorts` recording, passes `gap_s` apart: of the
    elapsed fit, or with `period` of the causes' period fit (attribution/period_cost.py)."""
    p = AttributionPipeline()
    p.pass_gap_s = gap_s
    fits = [0]
    real_fit = StepCostModel._fit
    model = p.attributor.period.model if period else p.attributor.cost

    def counting(self: StepCostModel, *args: object) -> None:
        fits[0] += self is model
        real_fit(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(StepCostModel, "_fit", counting)
    real_learn = p.attributor.learn
    out: list[tuple[int, int]] = []

    def learn(timeline: object) -> None:
        seen, fits[0] = model.steps_seen, 0
        real_learn(timeline)  # type: ignore[arg-type]
        out.append((model.steps_seen - seen, fits[0]))

    monkeypatch.setattr(p.attributor, "learn", learn)
    for ev in events("shorts"):
        p.feed(ev)
    return p, out


@pytest.mark.parametrize("period", [False, True], ids=["elapsed", "period"])
def test_a_spaced_pass_refits_once(monkeypatch: pytest.MonkeyPatch, period: bool) -> None:
    refit_every = StepCostModel().refit_every
    _, spaced = learns(5.0, monkeypatch, period=period)
    assert any(steps > 2 * refit_every for steps, _ in spaced)  # eagerly, some pass would refit twice or more
    assert all(fits <= 1 for _, fits in spaced) and any(fits == 1 for _, fits in spaced)


def test_unshed_passes_refit_every_128_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    p, every = learns(0.0, monkeypatch)
    assert not p.attributor.one_refit_a_pass
    steps = sum(s for s, _ in every)
    cost = p.attributor.cost
    assert sum(f for _, f in every) == len(range(cost.min_steps, steps + 1, cost.refit_every))
