"""Re-simulation runs shared across victims and across settle passes, and the step-cost version they are priced by.

Under continuous load each settle pass re-attributes new victims and refines partial ones whose windows start
where earlier ones did; without sharing, every pass re-ran every coalition of every window. A run is a pure
function of (its start, the requests it keeps, the scheduler limits, the step prices), and a step never changes
what came before it, so a cached run answers a new question exactly when every request read from it finished in
it and the requests arriving up to the last of those finishes are the same: later arrivals cannot reach back.

The prices: the step-cost model refits every `refit_every` steps (about every second at GPU rates), and a run
priced by another fit is another run. `CostVersions` keeps a frozen copy of the coefficients and moves to a new
version only when the live fit predicts some probe step (decode batches and prefill chunks of the sizes vLLM runs)
more than `tolerance` (relative) away from the frozen copy: a refit that barely moved reuses every run.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from attrib_agent.attribution.cost_model import MIN_STEP_S, StepCostModel, prefill_pairs
from attrib_agent.attribution.sim_types import SchedulerConfig, SimRequest, SimResult, SimStart

# (context tokens, decode requests, decode context sum, prefill pairs, prefill requests) of the steps a version
# is checked on: decode batches of 1 to 256 at short and long contexts, prefill chunks of 32, 256 and 2,048 tokens
# alone and after 4,096 cached ones: the shapes whose prices move a re-simulated TTFT or ITL.
PROBES: tuple[tuple[int, int, int, int, int], ...] = (
    *((n, n, n * ctx, 0, 0) for n in (1, 16, 64, 256) for ctx in (512, 4096)),
    *((c, 0, 0, prefill_pairs(done, c), 1) for c in (32, 256, 2048) for done in (0, 4096)),
)


@dataclass(frozen=True, slots=True)
class FrozenCost:
    """A fit's coefficients, frozen: what the runs of one cost version are priced by (same formula as the
    model's `step_seconds_with_prefill`, read from its coefficients)."""

    a: float
    b: float
    c: float
    d: float
    e: float
    gap_s: float
    f: float = 0.0

    floor_s: float = MIN_STEP_S

    @classmethod
    def of(cls, model: StepCostModel, factor: float = 1.0) -> FrozenCost:
        """The model's coefficients now, each times `factor` (the forecast's pace; 1: the fit as it is)."""
        k = model.coefficients
        a, b, c, d, e, f = (factor * x for x in k.as_tuple())
        return cls(a, b, c, d, e, factor * k.step_gap_s, f, factor * MIN_STEP_S)

    def step_seconds(self, context_tokens: int, decode_requests: int, decode_context_sum: int) -> float:
        return self.step_seconds_with_prefill(context_tokens, decode_requests, decode_context_sum, 0)

    def step_seconds_with_prefill(self, context_tokens: int, decode_requests: int, decode_context_sum: int,
                                  prefill_pairs: int, prefill_requests: int = 0) -> float:
        compute = (self.a + self.b * context_tokens + self.c * decode_requests + self.d * decode_context_sum
                   + self.e * prefill_pairs + self.f * prefill_requests)
        return max(compute, self.floor_s) + self.gap_s


class CostVersions:
    """The frozen prices runs use, and their version: bumped only when the live fit has moved past `tolerance`."""

    def __init__(self, tolerance: float) -> None:
        if tolerance < 0:
            raise ValueError("tolerance must be >= 0")
        self.tolerance = tolerance
        self.version = 0
        self.cost: FrozenCost | None = None

    def current(self, model: StepCostModel) -> FrozenCost:
        """The prices to run with now (a new version if the model's have moved past the tolerance)."""
        live = FrozenCost.of(model)
        if self.cost is None or _moved(self.cost, live, self.tolerance):
            self.cost = live
            self.version += 1
        return self.cost


def _moved(old: FrozenCost, new: FrozenCost, tolerance: float) -> bool:
    for p in PROBES:
        a, b = old.step_seconds_with_prefill(*p), new.step_seconds_with_prefill(*p)
        if abs(b - a) > tolerance * max(abs(a), 1e-9):
            return True
    return False


RunKey = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class _Entry:
    kept: tuple[SimRequest, ...]  # in arrival order
    result: SimResult
    traced: frozenset[str]


class RunCache:
    """At most `max_runs` runs, least recently used dropped first. Keyed by what a run starts from (the start and
    the state left once its removed requests leave it, scheduler limits, cost version): the requests removed that
    were not on the engine at the start only change which requests arrive, and those are compared up to the
    readers' horizon, so a world without a whale that arrives after its readers finished is answered by the run
    with it. A traced run also answers untraced questions (tracing only observes)."""

    def __init__(self, max_runs: int) -> None:
        if max_runs < 0:
            raise ValueError("max_runs must be >= 0")
        self.max_runs = max_runs
        self._runs: OrderedDict[int, tuple[RunKey, _Entry]] = OrderedDict()  # by serial, least recent first
        self._by_key: dict[RunKey, list[int]] = {}
        self._serial = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._runs)

    @staticmethod
    def key(start: SimStart | None, sched: SchedulerConfig, version: int, removed: frozenset[str],
            first_arrival: float) -> RunKey:
        """A run's identity but for the requests arriving in it (an idle start is the first arrival)."""
        if start is None:
            return (("idle", first_arrival), sched, version)
        gone = frozenset(ip.request_id for ip in start.state if ip.request_id in removed) if removed else removed
        return ((start.ts, start.state), gone, sched, version)

    def get(self, key: RunKey, kept: Sequence[SimRequest], readers: Collection[str],
            traced: bool = False) -> SimResult | None:
        """A kept run that gives the readers' outcomes exactly (and their waits, if `traced`), else None."""
        for serial in reversed(self._by_key.get(key, ())):
            entry = self._runs[serial][1]
            if (not traced or entry.traced.issuperset(readers)) and _answers(entry, kept, readers):
                self._runs.move_to_end(serial)
                self.hits += 1
                return entry.result
        self.misses += 1
        return None

    def put(self, key: RunKey, kept: Sequence[SimRequest], result: SimResult, traced: Collection[str]) -> None:
        if self.max_runs == 0:
            return
        serial, self._serial = self._serial, self._serial + 1
        self._runs[serial] = (key, _Entry(tuple(kept), result, frozenset(traced)))
        self._by_key.setdefault(key, []).append(serial)
        while len(self._runs) > self.max_runs:
            old, (k, _) = self._runs.popitem(last=False)
            serials = self._by_key[k]
            serials.remove(old)
            if not serials:
                del self._by_key[k]


def _answers(entry: _Entry, kept: Sequence[SimRequest], readers: Collection[str]) -> bool:
    """Whether the cached run gives the readers' outcomes exactly: each finished in it, and the requests arriving
    up to the last of their finishes are the same."""
    horizon = float("-inf")
    for rid in readers:
        o = entry.result.outcomes.get(rid)
        if o is None or o.finish_ts is None:
            return False
        horizon = max(horizon, o.finish_ts)
    return _upto(entry.kept, horizon) == _upto(kept, horizon)


def _upto(kept: Sequence[SimRequest], horizon: float) -> tuple[SimRequest, ...]:
    return tuple(r for r in kept if r.arrival_ts <= horizon)
