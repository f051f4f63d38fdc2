"""The forecast's starting point built once per pipeline settle and reused by every request until the next.

A forecast costs a state read off the timeline and two simulated futures (docs/forecast.md, "Latency"); the
state, the cost model and the future without any candidate depend only on the pipeline's state, so they are
built at the first request after a settle (the pipeline's `settles` counter, every `settle_interval_s` of event
time) and kept; each candidate's answer is kept too (a router asks about the same few sizes, the gauge about
the reference whale), so a scrape or a repeated request costs a dictionary look-up. A forecast is therefore as
old as the last settle at most (0.25 s of event time by default). Requests with their own load or prompt
lengths get a state of their own (not kept). Pure: the key is given by the caller.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from attrib_agent.attribution.forecast import (
    ArrivalLoad,
    Baseline,
    Candidate,
    EngineState,
    Forecast,
    ForecastConfig,
    baseline,
    forecast,
)
from attrib_agent.attribution.forecast_state import PipelineParts, engine_state, forecast_cost
from attrib_agent.attribution.sim_types import StepCost

MAX_ANSWERS = 64
"""Candidates' answers kept per snapshot (distinct sizes asked between two settles); the oldest leave first."""


@dataclass
class _Snapshot:
    key: tuple[int, ForecastConfig]
    state: EngineState | None
    cost: StepCost
    base: Baseline | None = None
    answers: OrderedDict[Candidate, Forecast] = field(default_factory=OrderedDict)


class ForecastCache:
    """Forecasts from a state snapshot per settle: `forecast(...)` answers like `forecast.forecast` on the state
    of the pipeline at the first call since the settle numbered `key`."""

    def __init__(self, max_answers: int = MAX_ANSWERS) -> None:
        self.max_answers = max_answers
        self._snap: _Snapshot | None = None
        self.built = 0  # snapshots built (a test and the benchmark read it)

    def forecast(self, pipeline: PipelineParts, key: int, candidates: Sequence[Candidate], config: ForecastConfig,
                 load: ArrivalLoad | None = None, prompts: Mapping[str, int] | None = None
                 ) -> tuple[EngineState, list[Forecast]] | None:
        if load is not None or prompts:  # the caller's own view of the engine: a state of its own
            state = engine_state(pipeline, load=load, prompts=prompts)
            return None if state is None else (state, forecast(state, candidates, forecast_cost(pipeline), config))
        snap = self._snapshot(pipeline, (key, config))
        if snap.state is None:
            return None
        missing = list(dict.fromkeys(c for c in candidates if c not in snap.answers))
        if missing:
            if snap.base is None:
                snap.base = baseline(snap.state, snap.cost, config)
            for c, f in zip(missing, forecast(snap.state, missing, snap.cost, config, snap.base), strict=True):
                snap.answers[c] = f
        out = [snap.answers[c] for c in candidates]
        for c in candidates:
            snap.answers.move_to_end(c)
        while len(snap.answers) > self.max_answers:
            snap.answers.popitem(last=False)
        return snap.state, out

    def _snapshot(self, pipeline: PipelineParts, key: tuple[int, ForecastConfig]) -> _Snapshot:
        if self._snap is None or self._snap.key != key or (self._snap.state is None
                                                            and pipeline.last_event_ts is not None):
            self._snap = _Snapshot(key, engine_state(pipeline), forecast_cost(pipeline))
            self.built += 1
        return self._snap
