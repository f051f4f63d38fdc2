"""What each member of a step cost it, by vLLM's own account of the steps (the step plugin's stream).

The cause truth (lab/cause_truth.py) splits a step's time among its members by what each added to it. The plugin
gives each step's exact make-up (every member's new and already computed tokens) and when it was scheduled; the
time to the next step's scheduling, for steps run back to back, is regressed on the make-up: an intercept, per
decoding request, per decoded context token, per prefill token, per causal query-key pair of a chunk and per
prefilling request. Coefficients come out non-negative (a term fitted below zero is dropped and the rest refitted)
and steps far off the fit, relative to their size (the 2-core machine busy with other work), are left out of a
second pass. This fit is the lab's, made on the truth (exact members), not the agent's (inferred members, online);
`lab marginal` checks the prices it finds against the controlled measurement. Its limit: where the decodes'
contexts only grow while the machine's load changes (tests/fixtures/marginal/http-2, load 10-12), the context term
takes the load (intercept 0, a decoder at 1,000 tokens 6.9 ms against 0.3-1.3 ms measured); without the term a
whale's long-context decodes go unpriced (preempt-midstream: 13.7 s of blame left unlabelled, agreement 96 -> 92 %).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attrib_agent.attribution.step_shape import prefill_pairs, step_shape
from attrib_agent.vllm_ids import external_id

_OUTLIER_MADS = 4.0  # a step this many median absolute deviations (relative) off the first fit is left out
_MIN_STEPS = 8  # fewer back-to-back steps than this: no fit, every member counts its step time equally


@dataclass(frozen=True, slots=True)
class StepMarginals:
    """Seconds a step costs: intercept + what each member adds (see the module docstring)."""

    intercept_s: float = 0.0
    per_decode_s: float = 0.0
    per_decode_context_token_s: float = 0.0
    per_prefill_token_s: float = 0.0
    per_prefill_pair_s: float = 0.0
    per_prefill_request_s: float = 0.0
    steps: int = 0  # back-to-back steps the fit read (0: not fitted)

    def member_s(self, new: int, done: int) -> float:
        """What one member computing `new` tokens after `done` adds to its step."""
        if new == 1:
            return self.per_decode_s + self.per_decode_context_token_s * done
        return (self.per_prefill_request_s + self.per_prefill_token_s * new
                + self.per_prefill_pair_s * prefill_pairs(done, new))

    def shares(self, members: Mapping[str, tuple[int, int]]) -> dict[str, float]:
        """Each member's fraction of its step's time (the rest is the intercept); equal fractions, 1 / members,
        when the fit prices the whole step at nothing (not fitted, or too few steps)."""
        cost = {rid: self.member_s(n, d) for rid, (n, d) in members.items()}
        total = self.intercept_s + sum(cost.values())
        if total <= 0:
            return {rid: 1.0 / len(members) for rid in members} if members else {}
        return {rid: c / total for rid, c in cost.items()}


def members(step: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """A plugin step's members by frontend id: (new tokens, tokens computed before the step)."""
    return {external_id(s["id"]): (int(s.get("new", 0)), int(s.get("done") or 0)) for s in step.get("scheduled", ())}


def _row(ms: Mapping[str, tuple[int, int]]) -> list[float]:
    """The step's terms (attribution/step_shape.py, as the agent's fit counts them) in this fit's order; a decode's
    context here is what it attended to before its token (the per-decode term takes the token itself)."""
    s = step_shape((n, d, n == 1) for n, d in ms.values() if n >= 1)
    return [1.0, float(s.decode_requests), float(s.decode_context_sum - s.decode_requests), float(s.prefill_tokens),
            float(s.prefill_pairs), float(s.prefill_requests)]


def fit(steps: Sequence[Mapping[str, Any]]) -> StepMarginals:
    """The fit over `steps` (plugin messages sorted by `t`) run back to back: a member of a step is in the next
    one too (vLLM schedules a step as soon as the last returns while a request is running)."""
    rows, times = [], []
    for k in range(len(steps) - 1):
        a, b = members(steps[k]), members(steps[k + 1])
        dt = float(steps[k + 1]["t"]) - float(steps[k]["t"])
        if a and dt > 0 and set(a) & set(b):
            rows.append(_row(a))
            times.append(dt)
    if len(rows) < _MIN_STEPS:
        return StepMarginals()
    x, y = np.array(rows), np.array(times)
    coef = _nonnegative(x, y)
    rel = (y - x @ coef) / np.maximum(x @ coef, 1e-4)  # relative: a long chunk's step is far off in seconds only
    dev = np.abs(rel - np.median(rel))
    keep = dev <= _OUTLIER_MADS * max(float(np.median(dev)), 1e-3)
    if keep.sum() >= _MIN_STEPS:
        coef = _nonnegative(x[keep], y[keep])
    icpt, dec, ctx, tok, pairs, req = (float(v) for v in coef)
    return StepMarginals(icpt, dec, ctx, tok, pairs, req, steps=int(keep.sum()))


def _nonnegative(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: the most negative term is dropped until none is; a term no step
    exercises is 0."""
    active = [j for j in range(x.shape[1]) if np.any(x[:, j] != 0)]
    coef = np.zeros(x.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return coef
