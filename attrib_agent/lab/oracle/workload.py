"""Request streams for the oracle: one workload feeds both vLLM's scheduler and the re-simulation.

Arrivals are in seconds; both sides advance their clock by the same cost model, so as long as they schedule
the same steps they see the same arrivals at the same step boundaries. A request may share its first
`prefix_tokens` prompt tokens with the others of its `prefix_group` (vLLM's prefix cache can then reuse them);
the re-simulation gets the same group and length.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from attrib_agent.attribution.sim_step import blocks_for
from attrib_agent.attribution.sim_types import SchedulerConfig, SimRequest

KINDS = ("burst", "poisson", "kv_exhaustion", "shared_prefix")


@dataclass(frozen=True, slots=True)
class OracleRequest:
    request_id: str
    arrival_ts: float
    prompt_tokens: int
    output_tokens: int
    prefix_group: int | None = None  # requests of one group share their first `prefix_tokens` tokens
    prefix_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    config: SchedulerConfig
    requests: tuple[OracleRequest, ...]

    @property
    def async_scheduling(self) -> bool:
        return self.config.async_scheduling

    def sim_requests(self) -> list[SimRequest]:
        return [SimRequest(r.request_id, r.arrival_ts, r.prompt_tokens, r.output_tokens,
                           None if r.prefix_group is None else str(r.prefix_group), r.prefix_tokens)
                for r in self.requests]

    @property
    def max_model_len(self) -> int:
        """vLLM refuses a request longer than this; the pool must hold one such request (it does at start-up)."""
        return max(r.prompt_tokens + r.output_tokens for r in self.requests)


def generate(kind: str, seed: int, *, token_budget: int = 2048, max_num_seqs: int = 256,
             prefix_caching: bool = False, async_scheduling: bool = False, block_size: int = 16,
             requests: int = 24) -> Workload:
    """A seeded workload of one `kind` (see KINDS). The pool is sized per kind: roomy for bursts and mixes,
    a few whales' worth for `kv_exhaustion` (preemptions), always big enough for the longest request."""
    if kind not in KINDS:
        raise ValueError(f"unknown workload kind {kind!r}; expected one of {KINDS}")
    rng = random.Random(f"{kind}:{seed}")
    reqs: list[OracleRequest] = []
    t = 0.0
    for i in range(requests):
        whale = rng.random() < (0.35 if kind == "kv_exhaustion" else 0.15)
        prompt = rng.randint(1500, 5000) if whale else rng.randint(8, 400)
        output = rng.randint(64, 400) if kind == "kv_exhaustion" and whale else rng.randint(1, 96)
        if kind == "burst":
            t = rng.choice((0.0, 0.0, 0.5, 1.0))
        else:  # Poisson arrivals at a few per second
            t += rng.expovariate(6.0 if kind != "kv_exhaustion" else 3.0)
        group, shared = None, 0
        if kind == "shared_prefix" and rng.random() < 0.8:
            group = rng.randrange(3)
            shared = min(prompt - 1, (256, 700, 1500)[group])
            prompt = max(prompt, shared + rng.randint(1, 200))
        reqs.append(OracleRequest(f"r{i:03d}", round(t, 4), prompt, output, group, shared))
    longest = max(blocks_for(r.prompt_tokens + r.output_tokens, block_size) for r in reqs)
    total = sum(blocks_for(r.prompt_tokens + r.output_tokens, block_size) for r in reqs)
    if kind == "kv_exhaustion":
        num_blocks = longest + rng.randint(2, max(3, total // 8)) + 1
    else:
        num_blocks = max(longest + 1, total + 1, 64)
    config = SchedulerConfig(block_size=block_size, num_blocks=num_blocks, token_budget=token_budget,
                             max_num_seqs=max_num_seqs, prefix_caching=prefix_caching,
                             async_scheduling=async_scheduling)
    name = (f"{kind}#{seed} budget={token_budget} seqs={max_num_seqs} caching={int(prefix_caching)} "
            f"async={int(async_scheduling)}")
    return Workload(name, config, tuple(reqs))
