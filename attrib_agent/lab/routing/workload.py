"""The routing study's traffic: a continuous Poisson stream of short requests (seed 002's short-input shapes,
siso and silo, in the lab's sizes and the bench mix's proportions) and whales arriving mid-stream, some of them
with long outputs; and the pool each instance gets, sized so that two whales on one instance exhaust it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from attrib_agent.attribution.sim_types import SchedulerConfig
from attrib_agent.lab.oracle.workload import OracleRequest, Workload
from attrib_agent.lab.workload import SILO, SISO

SHORTS = ((SISO, 0.55), (SILO, 0.15))  # the short-input classes' weights in the lab's `mixed` bench traffic
WHALE_PROMPT = (5_000, 7_000)  # two of these fill most of the pool before any output
WHALE_OUTPUT_LONG, WHALE_OUTPUT_SHORT = (400, 600), (16, 64)  # half the whales each
LONG_PROMPT = 2_048  # what the router calls a long request (routed by forecast under that policy)


@dataclass(frozen=True, slots=True)
class StudyShape:
    """The size of one run: how long shorts arrive, at what rate (both instances together), how many whales."""

    duration_s: float = 30.0
    short_rate: float = 4.0
    whales: int = 6
    block_size: int = 16
    num_blocks: int = 768  # 12,288 tokens: one whale and the shorts fit, two whales do not
    token_budget: int = 2_048  # vLLM's CPU default max_num_batched_tokens
    max_num_seqs: int = 256


def arrivals(shape: StudyShape, seed: int) -> list[OracleRequest]:
    """Every request of one run in arrival order; ids say the kind (`s…` short, `w…` whale)."""
    rng = random.Random(f"routing:{seed}:{float(shape.short_rate)}")
    reqs: list[OracleRequest] = []
    t, i = rng.expovariate(shape.short_rate), 0
    classes, weights = [c for c, _ in SHORTS], [w for _, w in SHORTS]
    while t < shape.duration_s:
        c = rng.choices(classes, weights)[0]
        reqs.append(OracleRequest(f"s{i:04d}-{c.name}", round(t, 4), c.prompt_tokens, c.output_tokens))
        t += rng.expovariate(shape.short_rate)
        i += 1
    # whales in the middle 70 % of the stream, so every instance has seen traffic before the first one
    lo, hi = 0.15 * shape.duration_s, 0.85 * shape.duration_s
    for j, at in enumerate(sorted(rng.uniform(lo, hi) for _ in range(shape.whales))):
        out = WHALE_OUTPUT_LONG if j % 2 == 0 else WHALE_OUTPUT_SHORT
        reqs.append(OracleRequest(f"w{j:02d}", round(at, 4), rng.randint(*WHALE_PROMPT), rng.randint(*out)))
    return sorted(reqs, key=lambda r: (r.arrival_ts, r.request_id))


def instance_workload(shape: StudyShape, reqs: list[OracleRequest]) -> Workload:
    """The scheduler limits and pool of each instance (the requests only bound vLLM's max_model_len)."""
    config = SchedulerConfig(block_size=shape.block_size, num_blocks=shape.num_blocks,
                             token_budget=shape.token_budget, max_num_seqs=shape.max_num_seqs)
    return Workload("routing-study", config, tuple(reqs))


def is_long(r: OracleRequest) -> bool:
    return r.prompt_tokens >= LONG_PROMPT
