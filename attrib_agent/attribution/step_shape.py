"""A step's shape in the terms every step-cost fit reads, defined once.

The agent's online fit (attribution/cost_model.py, on the timeline's inferred members) and the lab's truth fit
(lab/step_marginals.py, on the step plugin's exact members) regress step time on the same make-up: per decoding
request, per KV token the decodes attend to, per prefill token, per causal query-key pair of a chunk, per
prefilling request. They must count it the same way, or the truth would check the agent against other terms;
each keeps its own solver (robust and online there, plain least squares over a whole recording here). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


def prefill_pairs(prior_context: int, tokens: int) -> int:
    """Causal query-key pairs of a prefill chunk of `tokens` after `prior_context` cached tokens: each new token
    attends to everything before it and to itself."""
    return tokens * prior_context + tokens * (tokens + 1) // 2


class StepShape(NamedTuple):
    """A step's make-up as sums over its members."""

    prefill_tokens: int  # tokens of members not simply decoding (prefill chunks, recompute)
    decode_requests: int
    decode_context_sum: int  # KV tokens the decodes attend to: each one's earlier context plus its new token
    prefill_pairs: int
    prefill_requests: int  # members not simply decoding


def step_shape(members: Iterable[tuple[int, int, bool]]) -> StepShape:
    """The shape of a step whose members are (new tokens, tokens computed before the step, decoding)."""
    tokens = requests = context = pairs = prefilling = 0
    for new, done, decode in members:
        if decode:
            requests += 1
            context += done + new
        else:
            tokens += new
            pairs += prefill_pairs(max(done, 0), new)
            prefilling += 1
    return StepShape(tokens, requests, context, pairs, prefilling)


__all__ = ["StepShape", "prefill_pairs", "step_shape"]
