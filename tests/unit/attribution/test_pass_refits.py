"""While the live agent sheds load (passes seconds apart), an attribution pass refits the step-cost model once,
however many steps it learns; otherwise every refit runs where it falls (replay's results exactly as before)."""

from __future__ import annotations

import pytest

from attrib_agent.attribution.cost_model import StepCostModel
from attrib_agent.pipeline import AttributionPipeline
from tests.unit.sinks.api_replayed import events


def learns(gap_s: float, *, period: bool = False) -> tuple[AttributionPipeline, list[tuple[int, int]]]:
    """(steps learnt, cost-model fits) of each pass over the `shorts` recording, passes `gap_s` apart: of the
    elapsed fit, or with `period` of the causes' period fit (attribution/period_cost.py). Read from the model's
    counts around each event fed (an event begins at most one pass), not by spying on the attributor: a compiled
    build has no such seam."""
    p = AttributionPipeline()
    p.pass_gap_s = gap_s
    model = p.attributor.period.model if period else p.attributor.cost
    out: list[tuple[int, int]] = []
    for ev in events("shorts"):
        seen, fits, passes = model.steps_seen, model.fits, p.settles
        p.feed(ev)
        assert p.settles - passes <= 1
        if model.steps_seen > seen or model.fits > fits:
            out.append((model.steps_seen - seen, model.fits - fits))
    return p, out


@pytest.mark.parametrize("period", [False, True], ids=["elapsed", "period"])
def test_a_spaced_pass_refits_once(period: bool) -> None:
    refit_every = StepCostModel().refit_every
    _, spaced = learns(5.0, period=period)
    assert any(steps > 2 * refit_every for steps, _ in spaced)  # eagerly, some pass would refit twice or more
    assert all(fits <= 1 for _, fits in spaced) and any(fits == 1 for _, fits in spaced)


def test_unshed_passes_refit_every_128_steps() -> None:
    p, every = learns(0.0)
    assert not p.attributor.one_refit_a_pass
    steps = sum(s for s, _ in every)
    cost = p.attributor.cost
    assert sum(f for _, f in every) == len(range(cost.min_steps, steps + 1, cost.refit_every))
