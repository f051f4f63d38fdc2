"""What a step member costs the others between their tokens: the step-cost fit on step *periods*.

A running request's inter-token latency is the period from one step's start to the next's: the step's compute
plus vLLM's work before the next one (each request's output handling, detokenising, streaming), and that work
grows with the step's members too. Measured on vLLM (`lab marginal`, docs/attribution.md section 6): a decoder
adds 0.3-1.3 ms to an ~11 ms period, more than half of it after the step ends. The re-simulation's fit
(`Attributor.cost`) reads each step's *elapsed* time and adds a mean gap, which is right for adding steps up but
leaves a decoder's cost barely identified (0 on shared-prefix traffic, where 4-5 decoders are in nearly every
step). So the causes price co-members with a second fit of the same model on the periods of steps run back to
back (the next step starts within the model's `max_step_gap_s` of this one's end), and nothing else reads it:
the counterfactual seconds stay the elapsed fit's. Until it has its own `min_steps` periods the elapsed fit
prices the causes, as before. Memory: the same bounded window as the elapsed fit, and one step held back (its
period is known when the next step is seen). Pure.

A price the non-negative fit puts at its bound (0) is read as its posterior mean instead (`posterior_at_bound`):
a decoder's ~0.1 ms in a 2-3 ms period with ~0.7 ms of noise, over a window where 1 to 3 decoders run, is not
identified apart from the intercept, and the fit's mode then said a decoder adds *nothing* (8 of the held-out mixed
runs' 12): every decode-only step gave its co-decoders no label and their ITL blame read `other`. The mean of the
same Gaussian cut at 0 is small and positive, by how uncertain the price is, from the window's own spread.
"""

from __future__ import annotations

from collections.abc import Mapping
from math import erfc, exp, pi, sqrt

from attrib_agent.attribution.cost_model import StepCostModel, StepFeatures, row_ok
from attrib_agent.attribution.sim_cache import FrozenCost
from attrib_agent.timeline.model import StepRecord


class PeriodCost:
    """Fed every step in order (`observe`); `cost(elapsed)` is the model the causes price members with."""

    def __init__(self, elapsed: StepCostModel) -> None:
        """The period fit has `elapsed`'s prior, window and refit cadence."""
        self.model = StepCostModel(elapsed.prior, min_steps=elapsed.min_steps, refit_every=elapsed.refit_every,
                                   max_window=elapsed.max_window, min_support=elapsed.min_support,
                                   max_step_gap_s=elapsed.max_step_gap_s)
        self._last: tuple[tuple[float, ...], bool, StepRecord] | None = None  # seen, its period not yet known
        self._frozen: tuple[tuple[int, tuple[float, ...]], FrozenCost] | None = None  # per fit: its prices

    def observe(self, record: StepRecord, features: StepFeatures) -> None:
        """The step before `record` is fitted on its period when `record` followed it back to back (the gap
        within log stamps' jitter of 0 up to `max_step_gap_s`); `record` waits for its successor."""
        row = features.row()
        self.observe_row(record, row, row_ok(row))

    def observe_row(self, record: StepRecord, row: tuple[float, ...], ok: bool) -> None:
        """`observe` with the step's row as the elapsed fit read it, and whether it was valid (`row_ok`): a step
        fed to both fits is shaped and checked once (`Attributor.learn`)."""
        last, self._last = self._last, (row, ok, record)
        if last is None:
            return
        prev_row, prev_ok, prev = last
        gap = record.start_ts - prev.end_ts
        if abs(gap) <= self.model.max_step_gap_s and record.end_ts > prev.end_ts:
            self.model.observe_row(prev_row, max(prev.elapsed_s + gap, 0.0), gap_s=0.0, checked=prev_ok)

    def forget_last(self) -> None:
        """A new timeline (a replaced engine): the held step has no successor to come."""
        self._last = None

    def cost(self, elapsed: StepCostModel) -> StepCostModel:
        """The period fit once fitted, else `elapsed` (the attributor's current elapsed fit)."""
        return self.model if self.model.fitted else elapsed

    def prices(self, elapsed: StepCostModel) -> FrozenCost:
        """What the causes price members with: `cost(elapsed)` frozen, the period fit's prices at their bound
        read as their posterior mean (`posterior_at_bound`). Worked out once a fit."""
        model = self.cost(elapsed)
        if model is not self.model or not model.window_steps:
            return FrozenCost.of(model)
        k = model.coefficients
        key = (model.fits, k.as_tuple())
        if self._frozen is None or self._frozen[0] != key:
            coef = k.as_tuple()  # the posterior (a window's matrix inverse) only where a price sits at its bound
            a, b, c, d, e, f = posterior_at_bound(coef, model.posterior()) if 0.0 in coef else coef
            self._frozen = key, FrozenCost(a, b, c, d, e, k.step_gap_s, f)
        return self._frozen[1]


def _truncated_mean(mu: float, sd: float) -> float:
    """E[x | x >= 0] for x ~ N(mu, sd^2); for mu far below 0 its limit sd^2 / |mu| (no 0/0)."""
    if sd <= 0:
        return max(mu, 0.0)
    z = mu / sd
    tail = 0.5 * erfc(-z / sqrt(2.0))
    if z < -30 or tail <= 0:
        return sd * sd / -mu
    return mu + sd * exp(-0.5 * z * z) / sqrt(2.0 * pi) / tail


def posterior_at_bound(coef: tuple[float, ...], posterior: Mapping[int, tuple[float, float]]) -> tuple[float, ...]:
    """`coef` (a non-negative fit) with each coefficient at 0 the fit may move replaced by its posterior mean given
    >= 0: the fit's own Gaussian for it (`StepCostModel.posterior`: its Huber weights, MAD scale and prior
    penalty, the bound dropped), cut at 0. Only the bound's degenerate answer changes: a coefficient the data put
    above 0 keeps its fitted value."""
    return tuple(_truncated_mean(*posterior[j]) if v == 0.0 and j in posterior else v for j, v in enumerate(coef))
