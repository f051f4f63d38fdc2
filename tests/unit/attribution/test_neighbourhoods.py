"""The sweep finds the same windows as a scan (kept here as the reference: for each victim, every request of
the chain read twice), with and without a lookback and a grid, on random never-idle chains with ties, long and
unfinished requests.
(Its cost as the busy period grows is shown by benchmarks/cpu_per_request.py, not timed here.)"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import pytest

from attrib_agent.attribution.neighbourhoods import bounded_neighbourhoods
from attrib_agent.attribution.sim_types import SimRequest


def reference(chain: Sequence[tuple[SimRequest, float]], victims: set[str], max_len: int, lookback_s: float,
              snap: Callable[[float], float]) -> list[tuple[float, list[SimRequest], set[str]]]:
    ordered = sorted(chain, key=lambda x: (x[0].arrival_ts, x[0].request_id))

    def window(lo: float, hi: float) -> list[SimRequest]:
        return [r for r, e in ordered if e >= lo and r.arrival_ts <= hi]

    out: list[tuple[float, list[SimRequest], set[str]]] = []
    group: tuple[float, float] | None = None
    members: set[str] = set()
    for req, end in ordered:
        if req.request_id not in victims:
            continue
        first = min(r.arrival_ts for r, e in ordered if r.arrival_ts <= req.arrival_ts and e >= req.arrival_ts)
        lo = snap(max(first, req.arrival_ts - lookback_s))
        if group is not None and len(window(min(group[0], lo), max(group[1], end))) <= max_len:
            group = (min(group[0], lo), max(group[1], end))
            members.add(req.request_id)
            continue
        if group is not None:
            out.append((group[0], window(*group)[-max_len:], members))
        group, members = (lo, end), {req.request_id}
    if group is not None:
        out.append((group[0], window(*group)[-max_len:], members))
    return out


def chain(n: int, seed: int, rate: float = 4.0) -> list[tuple[SimRequest, float]]:
    """Shorts at `rate`/s, some long ones, a few without an end yet (given the caller's far end), ties in time."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a = round(i / rate + rng.uniform(0, 0.3), 2)  # rounding makes equal arrivals
        life = rng.choice([rng.uniform(0.05, 2.0)] * 8 + [rng.uniform(5, 30), 3600.0])
        out.append((SimRequest(f"r{i:05d}", a, rng.randint(16, 4000), rng.randint(1, 500)), a + life))
    rng.shuffle(out)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_same_windows_as_the_scan(seed: int) -> None:
    rng = random.Random(100 + seed)
    c = chain(rng.randint(1, 400), seed)
    victims = {r.request_id for r, _ in c if rng.random() < rng.choice([0.02, 0.2, 0.9])}
    for max_len in (1, 8, 64):
        for lookback_s, grid_s in ((math.inf, 0.0), (10.0, 1.0), (2.0, 0.25)):
            def snap(t: float, g: float = grid_s) -> float:
                return math.floor(t / g) * g if g > 0 else t
            assert (bounded_neighbourhoods(c, victims, max_len, lookback_s, snap)
                    == reference(c, victims, max_len, lookback_s, snap))

