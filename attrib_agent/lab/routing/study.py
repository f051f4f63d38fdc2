"""The routing study: the short requests' TTFT with and without forecast-based routing of long requests.

The world is two instances of vLLM 0.32's own `Scheduler` + `KVCacheManager` (run standalone on CPU, as the
oracle does) whose steps take what the lab's step-cost model says: not a GPU, not a model. Both run on one event
clock; at each arrival the router picks an instance by its policy:
- `round-robin`: every request to the next instance in turn;
- `least-loaded`: fewest running + waiting (production-stack's and vLLM's DP balancer's signal, read exactly);
- `forecast`: long requests where each instance's attrib-agent forecasts the least harm (the example's `choose`
  over the real `POST /v1/forecast`, each agent fed only the events its vLLM would have produced by then, with
  the load it learnt and the prompt lengths of the requests the router sent there that have not finished, as
  `in_flight_prompts`); short requests round-robin;
- `forecast+least-loaded` (not in the default set): long requests by forecast, short ones least-loaded.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

from attrib_agent.lab.oracle.compare import default_cost
from attrib_agent.lab.oracle.workload import OracleRequest
from attrib_agent.lab.routing.instance import Instance
from attrib_agent.lab.routing.report import RunResult, format_table
from attrib_agent.lab.routing.workload import StudyShape, arrivals, instance_workload, is_long

POLICIES = ("round-robin", "least-loaded", "forecast", "forecast+least-loaded")
DEFAULT_POLICIES = POLICIES[:3]
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "route_by_forecast.py"

Route = Callable[[OracleRequest, Sequence[Instance], float], Awaitable[int]]


def load_example() -> ModuleType:
    """examples/route_by_forecast.py, whose `choose` the forecast policy calls as a user's router would."""
    spec = importlib.util.spec_from_file_location("route_by_forecast", EXAMPLE)
    if spec is None or spec.loader is None or not EXAMPLE.is_file():
        raise FileNotFoundError(f"the routing example is not at {EXAMPLE} (run from a source checkout)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Router:
    """One policy's state: round-robin counters, and how often it asked the agents."""

    policy: str
    api_calls: int = 0
    fallbacks: int = 0  # long requests routed round-robin because an agent could not forecast yet
    _next: int = 0
    _choose: Any = field(default=None, repr=False)

    def _round_robin(self, n: int) -> int:
        i = self._next % n
        self._next += 1
        return i

    async def route(self, r: OracleRequest, instances: Sequence[Instance], now: float) -> int:
        n = len(instances)
        if self.policy == "round-robin" or (self.policy == "forecast" and not is_long(r)):
            return self._round_robin(n)
        if self.policy == "least-loaded" or not is_long(r):
            start = self._round_robin(n)  # ties go round-robin, not always to the first instance
            return min(range(n), key=lambda i: (instances[i].load, (i - start) % n))
        if self._choose is None:
            self._choose = load_example().choose
        for inst in instances:
            inst.feed_agent(now)
        clients = [inst.client for inst in instances]
        assert all(c is not None for c in clients), "forecast routing needs an agent per instance"
        try:
            best, _ = await self._choose(clients, r.prompt_tokens, r.output_tokens,
                                         [sent_not_finished(inst) for inst in instances])
        except httpx.HTTPStatusError as e:
            if e.response.status_code != 503:  # 503: an agent has seen no event from its vLLM yet
                raise
            self.fallbacks += 1
            return self._round_robin(n)
        return int(best)


def sent_not_finished(inst: Instance) -> dict[str, int]:
    """What a router knows of an instance and its agent cannot see before the prefill: the prompt lengths of the
    requests it sent there whose responses have not ended (in the order sent)."""
    return {rid: sv.prompt_tokens for rid, sv in inst.served.items() if sv.finished is None}


async def run_once(shape: StudyShape, seed: int, policy: str) -> RunResult:
    """One run: every arrival routed by `policy`, then every instance drained."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; expected one of {POLICIES}")
    reqs = arrivals(shape, seed)
    router = Router(policy)

    async def count(_: httpx.Request) -> None:
        router.api_calls += 1

    workload, cost = instance_workload(shape, reqs), default_cost()
    instances = [Instance(workload, cost, agent=policy.startswith("forecast"), on_request=count) for _ in range(2)]
    placed: dict[str, int] = {}
    try:
        for r in reqs:
            for inst in instances:
                inst.advance(r.arrival_ts)
            placed[r.request_id] = target = await router.route(r, instances, r.arrival_ts)
            instances[target].submit(r)
        for inst in instances:
            inst.advance(None)
    finally:
        for inst in instances:
            await inst.close()
    return RunResult.collect(policy, shape.short_rate, seed, reqs, placed, [i.served for i in instances],
                             router.api_calls, router.fallbacks, sum(i.preemptions for i in instances))


async def study(shape: StudyShape, seeds: Sequence[int], rates: Sequence[float], policies: Sequence[str],
                progress: Callable[[str], None] | None = None) -> list[RunResult]:
    results = []
    for rate in rates:
        for seed in seeds:
            for policy in policies:
                s = StudyShape(shape.duration_s, rate, shape.whales, shape.block_size, shape.num_blocks,
                               shape.token_budget, shape.max_num_seqs)
                results.append(await run_once(s, seed, policy))
                if progress is not None:
                    progress(results[-1].line())
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = StudyShape()
    parser.add_argument("--seeds", type=int, default=5, help="seeds per load level (default 5)")
    parser.add_argument("--rate", type=float, action="append",
                        help="short requests per second over both instances (repeatable; default 6 and 10)")
    parser.add_argument("--duration", type=float, default=d.duration_s, help="seconds of arrivals per run")
    parser.add_argument("--whales", type=int, default=d.whales, help="long requests per run")
    parser.add_argument("--policy", action="append", choices=POLICIES,
                        help="these policies (repeatable; default: the first three)")
    parser.add_argument("--verbose", action="store_true", help="a line per run as it finishes")
    parser.add_argument("--json", action="store_true", help="every run's figures and placements, as JSON")


def run(args: argparse.Namespace) -> int:
    shape = StudyShape(duration_s=args.duration, whales=args.whales)
    rates = args.rate or [6.0, 10.0]
    started, cpu = time.perf_counter(), time.process_time()
    results = asyncio.run(study(shape, range(args.seeds), rates, args.policy or DEFAULT_POLICIES,
                                progress=(lambda s: print(s, flush=True)) if args.verbose else None))
    if args.json:
        print(json.dumps([r.as_dict() for r in results], indent=1))
        return 0
    print(format_table(results))
    print(f"({len(results)} runs, {time.perf_counter() - started:.0f} s wall, {time.process_time() - cpu:.0f} s CPU)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attrib-agent lab routing-study", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
