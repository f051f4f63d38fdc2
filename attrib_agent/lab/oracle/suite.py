"""The standard set of oracle workloads (the agreement report's and CI's), and the agreement command."""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Iterator

from attrib_agent.lab.oracle.compare import Agreement, compare, format_report
from attrib_agent.lab.oracle.workload import KINDS, Workload, generate

# (token budget, max_num_seqs): the CPU and H100 defaults, and tight sequence limits
LIMITS = ((2048, 256), (8192, 1024), (2048, 4), (8192, 3))


def standard_suite(seeds: int = 3, *, kinds: tuple[str, ...] = KINDS, async_scheduling: bool = False,
                   requests: int = 24) -> Iterator[Workload]:
    """Every kind x limits x prefix caching off/on x `seeds` seeds. `shared_prefix` only with caching on
    (with it off the shared ids change nothing)."""
    for kind, seed, (budget, seqs), caching in itertools.product(kinds, range(seeds), LIMITS, (False, True)):
        if kind == "shared_prefix" and not caching:
            continue
        yield generate(kind, seed, token_budget=budget, max_num_seqs=seqs, prefix_caching=caching,
                       async_scheduling=async_scheduling, requests=requests)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", type=int, default=3, help="seeds per kind and limits (default 3)")
    parser.add_argument("--kind", action="append", choices=KINDS, help="only these workload kinds (repeatable)")
    parser.add_argument("--async-scheduling", action="store_true",
                        help="drive vLLM's AsyncScheduler (two steps in flight, as on GPUs)")
    parser.add_argument("--summary", action="store_true", help="totals only, no line per workload")


def run(args: argparse.Namespace) -> int:
    """Print the agreement report; exit 1 when fewer than 99 % of steps are identical."""
    kinds = tuple(args.kind) if args.kind else KINDS
    started = time.perf_counter()
    agreement = Agreement()
    for w in standard_suite(args.seeds, kinds=kinds, async_scheduling=args.async_scheduling):
        agreement.add(compare(w))
    print(format_report(agreement, per_workload=not args.summary))
    print(f"({time.perf_counter() - started:.1f} s)")
    return 0 if agreement.share >= 0.99 else 1
