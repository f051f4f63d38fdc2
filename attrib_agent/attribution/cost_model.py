"""The uncontended baseline: what one engine step costs, fitted online from the steps themselves.

step_s = a + b*prefill_tokens + c*decode_requests + d*decode_context_sum + e*prefill_pairs + f*prefill_requests
+ gap, where the gap
is vLLM's work between steps (scheduling, output handling) plus the mean of the fit's residuals: step times are
skewed, and the re-simulation adds up hundreds of them, so the per-step mean matters, not just the typical step.
The d term is the memory-bandwidth cost of decoding long contexts; the e term is prefill attention (a chunk
attends to everything before it, so a whale's third chunk costs about twice its first); the f term is what a
prefilling request costs beyond its tokens (vLLM computes logits and samples for every scheduled request, a
partial prefill's too, and sets up its input rows and block table): with one per-token figure, long chunks set
the price and 32- or 64-token prefills were priced at half their time (preempt's shorts: 3.4 ms, priced 1.6 ms).
The fit is robust (Huber IRLS) with non-negative coefficients over a bounded window of recent steps plus the
latest prefill steps of each chunk size, kept past the window: a whale's few long chunks are what identify the
prefill terms, and ~1,000 decode steps later the window alone has forgotten them (decoy's whale: its 2,048-token
chunks, 1.0-1.8 s, then priced by the prior at 0.19-0.38 s; kept, at 1.04-1.80 s). A coefficient whose feature
the steps read have not exercised keeps its prior. Until `min_steps` steps are seen the
configured prior is used as is.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from itertools import combinations
from math import isfinite, isqrt
from typing import Any, Final

import numpy as np

from attrib_agent.attribution.step_shape import StepShape, prefill_pairs, step_shape
from attrib_agent.timeline.model import StepRecord

MIN_STEP_S = 1e-12  # a step's least compute time: the formula's floor, for the model and its frozen copies
_Row = tuple[float, ...]  # 1, prefill tokens, decode requests, decode context sum, prefill pairs, prefill requests
TERMS: Final = 6
HUBER_K: Final = 1.345  # Huber's tuning constant: 95 % efficiency on Gaussian residuals
_INF: Final = float("inf")


@dataclass(frozen=True, slots=True)
class StepCoefficients:
    """Seconds per unit of each step feature, plus the fixed per-step gap (see the module docstring)."""

    intercept_s: float
    per_prefill_token_s: float
    per_decode_request_s: float
    per_decode_context_token_s: float
    per_prefill_pair_s: float
    step_gap_s: float
    per_prefill_request_s: float = 0.0  # last: settings written as six numbers before it existed still parse

    def as_tuple(self) -> tuple[float, float, float, float, float, float]:
        return (self.intercept_s, self.per_prefill_token_s, self.per_decode_request_s,
                self.per_decode_context_token_s, self.per_prefill_pair_s, self.per_prefill_request_s)


FIT_WINDOW: Final = 1024  # recent steps the fit reads; min_steps (the prior's reign) cannot exceed it
SIZE_CLASSES: Final = 7  # prefill steps kept past the window by chunk size: 1-3, 4-15, ..., 1,024-4,095, more
KEPT_PER_SIZE: Final = 32  # ... the latest this many of each size


@dataclass(frozen=True, slots=True)
class StepCostPrior(StepCoefficients):
    """Used until enough steps are seen. The defaults approximate the lab's CPU model (tiny Qwen2, 2 cores:
    a 2048-token first chunk ~0.17 s, a decode step of a few short requests ~6 ms); configure your own for
    other hardware. Every field is overridable: StepCostPrior(per_prefill_token_s=2e-6, ...)."""

    intercept_s: float = 4.5e-3
    per_prefill_token_s: float = 6e-5
    per_decode_request_s: float = 6e-4
    per_decode_context_token_s: float = 3.5e-7
    per_prefill_pair_s: float = 2.5e-8
    step_gap_s: float = 1.5e-3
    per_prefill_request_s: float = 6e-4  # as a decode request: both are one row of logits and sampling

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isfinite(value) or value < 0:
                raise ValueError(f"prior {f.name} must be a finite non-negative number, got {value}")

    def __str__(self) -> str:
        """The seven numbers in field order, as `parse` reads them back (how settings show the prior)."""
        return ",".join(repr(getattr(self, f.name)) for f in fields(self))

    @classmethod
    def parse(cls, value: object) -> StepCostPrior:
        """Seven seconds figures in field order, from "a,b,c,d,e,gap,f" or a list (a TOML array), or the first
        six (written before the per-prefill-request term existed: a prefilling request then costs what a decoding
        one does, a row of logits and sampling each); ValueError else."""
        names = [f.name for f in fields(cls)]
        parts = value.split(",") if isinstance(value, str) else value
        if not isinstance(parts, list | tuple) or len(parts) not in (len(names) - 1, len(names)):
            raise ValueError(f"expected {len(names)} numbers (or the first {len(names) - 1}), comma-separated: "
                             f"{','.join(names)}")
        names = names[:len(parts)]
        numbers = []
        for name, part in zip(names, parts, strict=True):
            try:
                numbers.append(float(part.strip() if isinstance(part, str) else part))
            except (TypeError, ValueError):
                raise ValueError(f"{name}: expected a number, got {part!r}") from None
        if len(numbers) < len(fields(cls)):
            numbers.append(numbers[2])  # per_decode_request_s
        return cls(*numbers)


@dataclass(frozen=True, slots=True)
class StepFeatures:
    """What one step computed, in the cost model's terms."""

    prefill_tokens: int  # tokens of requests not simply decoding (prefill chunks, recompute)
    decode_requests: int
    decode_context_sum: int  # KV tokens the decoding requests attend to
    prefill_pairs: int = 0
    prefill_requests: int = 0  # requests in the step that are not simply decoding

    @classmethod
    def from_record(cls, record: StepRecord) -> StepFeatures:
        """From the timeline's members; from the logged counts when it inferred none."""
        return cls(*_record_terms(record))

    def row(self) -> _Row:
        return (1.0, float(self.prefill_tokens), float(self.decode_requests), float(self.decode_context_sum),
                float(self.prefill_pairs), float(self.prefill_requests))


def _record_terms(record: StepRecord) -> StepShape:
    """A step's terms in `StepFeatures`' field order: from the timeline's members, else the logged counts."""
    if not record.members:
        extra = max(record.generation_tokens - record.generation_requests, 0)
        return StepShape(record.context_tokens + extra, record.generation_requests, 0, 0, record.context_requests)
    return step_shape((m.tokens, m.context_tokens - m.tokens, m.phase == "decode" and m.tokens == 1)
                      for m in record.members)


def record_row(record: StepRecord) -> _Row:
    """`StepFeatures.from_record(record).row()` without the object between: every step fed to both fits."""
    tokens, requests, context, pairs, prefilling = _record_terms(record)
    return (1.0, float(tokens), float(requests), float(context), float(pairs), float(prefilling))


def row_ok(row: _Row) -> bool:
    """Every feature a finite number >= 0: a NaN or an infinity makes the sum fail (so would finite features
    summing past 1.8e308, none a step has)."""
    return min(row) >= 0.0 and sum(row) < _INF


_Kept = Sequence[tuple[int, _Row, float]]  # (step seq, row, elapsed) in the order observed


@dataclass(frozen=True, slots=True)
class PriceRange:
    """The prefill a fit's prices rest on: the most prefill tokens and causal query-key pairs (`prefill_pairs`:
    the attention work, which grows with the context a chunk attends over) of any step it was fitted on, and the
    decodes `beside` the largest chunk. A chunk beyond it is priced by the prior or by extrapolation, not by
    evidence (`forecast.price_check`). The decodes beside a chunk take their token of the budget: a whale's chunk
    beside two decodes is 2,046 tokens, the same chunk alone 2,048, and the one is evidence for the other. So a
    chunk is covered up to `prefill_tokens + beside` tokens, its pairs up to `prefill_pairs` times the square of
    that ratio (a chunk and the context before it both that much longer)."""

    prefill_tokens: int = 0
    prefill_pairs: int = 0
    beside: int = 0

    def covers(self, tokens: int, pairs: int) -> bool:
        most = self.prefill_tokens + self.beside
        grow = most / self.prefill_tokens if self.prefill_tokens else 1.0
        return tokens <= most and pairs <= self.prefill_pairs * grow * grow


def kept_class(tokens: int, pairs: int) -> int:
    """The class a prefill step is kept in past the window: by the size of a fresh chunk doing its attention work
    (`prefill_pairs`: n tokens from the prompt's start make n (n + 1) / 2 pairs), or of its tokens if more. A
    chunk deep in a long prompt is evidence of what a whale's last chunks cost; by tokens alone it shared its
    class with a stream's prompts of the budget's size, which evicted it: continuous-b1024's kept fit had read
    w1's 828-token last chunk over 3,072 tokens of context and forgotten it by the next run, so every forecast
    of w1 was priced beyond the fit's evidence."""
    fresh = isqrt(2 * pairs) if pairs > 0 else 0
    return min(max(tokens, fresh).bit_length() // 2, SIZE_CLASSES - 1)


def seen_range(window: Iterable[tuple[_Row, float]]) -> PriceRange:
    """The `PriceRange` of the steps a fit reads (their rows hold the ints' exact floats)."""
    tokens = pairs = beside = 0.0
    for row, _ in window:
        if row[1] > 0:
            if (row[1], row[2]) > (tokens, beside):
                tokens, beside = row[1], row[2]
            if row[4] > pairs:
                pairs = row[4]
    return PriceRange(int(tokens), int(pairs), int(beside))


def _window(rows: _Kept, kept: Sequence[_Kept]) -> list[tuple[_Row, float]]:
    """What a fit reads: the prefill steps kept past the window (older than its first step), then the window.
    Built once a fit runs: a batch of deferred refits copies the deques at each due refit (cheap) instead."""
    oldest = rows[0][0]
    window = [(r, y) for k in kept for seq, r, y in k if seq < oldest]
    window += [(r, y) for _, r, y in rows]
    return window


class StepCostModel:
    """Online robust fit of step cost; implements StepCost and PrefillAwareStepCost."""

    def __init__(self, prior: StepCostPrior | None = None, *, min_steps: int = 64, refit_every: int = 128,
                 max_window: int = FIT_WINDOW, min_support: int = 3, max_step_gap_s: float = 0.05) -> None:
        if min_steps < 1 or refit_every < 1 or max_window < min_steps or min_support < 1:
            raise ValueError("need min_steps >= 1, refit_every >= 1, max_window >= min_steps, min_support >= 1")
        self.prior = prior if prior is not None else StepCostPrior()
        self.min_steps = min_steps
        self.refit_every = refit_every
        self.min_support = min_support
        self.max_window = max_window
        self.max_step_gap_s = max_step_gap_s
        self._rows: deque[tuple[int, _Row, float]] = deque(maxlen=max_window)
        # Prefill evidence kept past the window, per chunk size (a whale's chunks are rare among decode steps)
        self._kept: list[deque[tuple[int, _Row, float]]] = [deque(maxlen=KEPT_PER_SIZE) for _ in range(SIZE_CLASSES)]
        self._gaps: deque[float] = deque(maxlen=max_window)
        self._coef: _Row = self.prior.as_tuple()
        self._gap_s = self.prior.step_gap_s
        self._seen = PriceRange()  # what the coefficients were fitted on: nothing while the prior prices
        self._pace: float | None = 1.0  # the fit's price of the steps it read over the prior's (`prior_pace`)
        self._paced_rows: list[_Row] = []  # ... the rows it is worked out from, when first asked after a fit
        self._scale: float | None = None
        self._since_fit = 0
        # While `deferred()`: the latest due refit's inputs (window, kept, gaps), fitted once when it ends
        self._deferring = False
        self._pending: tuple[_Kept, list[_Kept], list[float]] | None = None  # copies: the window built at the fit
        self.steps_seen = 0
        self.skipped = 0  # observations refused (negative or non-finite)
        self.fits = 0  # fits run: what a test counts without spying on `_fit` (a compiled class has no such seam)

    def observe(self, context_tokens: int, decode_requests: int, decode_context_sum: int, elapsed_s: float, *,
                prefill_pairs: int = 0, prefill_requests: int = 0, gap_s: float | None = None) -> None:
        """One engine step: what it computed and its `iteration elapsed time`; `gap_s` is the idle time before
        it when it followed the previous step back to back (None when unknown)."""
        self.observe_features(StepFeatures(context_tokens, decode_requests, decode_context_sum, prefill_pairs,
                                           prefill_requests), elapsed_s, gap_s=gap_s)

    def observe_features(self, features: StepFeatures, elapsed_s: float, *, gap_s: float | None = None) -> None:
        self.observe_row(features.row(), elapsed_s, gap_s=gap_s)

    def observe_row(self, row: _Row, elapsed_s: float, *, gap_s: float | None = None,
                    checked: bool | None = None) -> bool:
        """One step as its `StepFeatures.row()`; False (counted in `skipped`) when refused: a feature or the time
        negative or not finite. `checked`: `row_ok(row)` as the caller already knows it (a step fed to both fits
        is checked once)."""
        if not (0.0 <= elapsed_s < _INF) or not (row_ok(row) if checked is None else checked):
            self.skipped += 1
            return False
        seq = self.steps_seen
        self._rows.append((seq, row, elapsed_s))
        if row[1] > 0:  # prefill tokens: the chunk's class (the row holds the ints' exact floats)
            self._kept[kept_class(int(row[1]), int(row[4]))].append((seq, row, elapsed_s))
        if gap_s is not None and isfinite(gap_s) and abs(gap_s) <= self.max_step_gap_s:  # log stamps jitter
            self._gaps.append(gap_s)
        self.steps_seen += 1
        self._since_fit += 1
        first = self._scale is None and self._pending is None
        if len(self._rows) >= self.min_steps and (first or self._since_fit >= self.refit_every):
            if self._deferring:
                self._since_fit = 0
                self._pending = (list(self._rows), [list(k) for k in self._kept], list(self._gaps))
            else:
                self.refit()
        return True

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """Observe a batch of steps and fit once at its end, on the window the last refit due in it would have
        read: the same coefficients as refitting on the way, except that refits superseded within the batch do
        not warm-start the last one (IRLS from another start: equal to its tolerance, 1e-7 of a coefficient).
        An attribution pass learns every step since the one before (~1,000 at 100 steps/s and passes 10 s
        apart): eight refits of which only the last is read."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
            pending, self._pending = self._pending, None
            if pending is not None:
                rows, kept, gaps = pending
                self._fit(_window(rows, kept), gaps)

    def refit(self) -> None:
        """Fit now on the window (normally automatic every `refit_every` steps)."""
        self._since_fit = 0
        if len(self._rows) < self.min_steps:
            return
        self._fit(_window(self._rows, self._kept), list(self._gaps))

    def _fit(self, window: list[tuple[_Row, float]], gaps: list[float]) -> None:
        rows = [r for r, _ in window]
        ys = [y for _, y in window]
        coef, scale, bias = huber_nonnegative_fit(rows, ys, prior=self.prior.as_tuple(),
                                                  free=self._free(rows), start=self._coef)
        self._coef = coef
        self._scale = scale
        self._seen = seen_range(window)
        gap = statistics.fmean(gaps) if len(gaps) >= self.min_steps else self.prior.step_gap_s
        self._gap_s = max(gap + bias, 0.0)
        self._pace, self._paced_rows = None, rows  # worked out when a forecast asks (the attribution never does)
        self.fits += 1

    def _paced(self, rows: list[_Row]) -> float:
        """The fit's price of `rows` (whole steps, as the forecast adds them up) over the prior's: by how much the
        prior must be scaled to price the steps the fit has seen as the fit does. 1 with nothing to compare."""
        if not rows:
            return 1.0
        x = np.asarray(rows, dtype=np.float64).reshape(len(rows), TERMS)
        fit = float(np.maximum(x @ np.asarray(self._coef), MIN_STEP_S).sum()) + len(rows) * self._gap_s
        prior = float(np.maximum(x @ np.asarray(self.prior.as_tuple()), MIN_STEP_S).sum()) + len(rows) * (
            self.prior.step_gap_s)
        return fit / prior if fit > 0 and prior > 0 else 1.0

    def _free(self, rows: list[_Row]) -> list[bool]:
        """The terms the fit may move: the intercept, and each feature at least `min_support` rows have."""
        return [j == 0 or sum(1 for r in rows if r[j] > 0) >= self.min_support for j in range(TERMS)]

    def posterior(self) -> dict[int, tuple[float, float]]:
        """Per term the fit may move, the mean and spread of its price given the current window, the bound >= 0
        dropped (`huber_posterior` at the fitted coefficients); empty before a fit."""
        if not self._rows or not self.fitted:
            return {}
        window = _window(self._rows, self._kept)
        rows = [r for r, _ in window]
        return huber_posterior(rows, [y for _, y in window], prior=self.prior.as_tuple(), free=self._free(rows),
                               coef=self._coef)

    def prefill_steps(self) -> list[tuple[_Row, float]]:
        """The prefill steps the fit reads (its window's and those kept past it), each as its row and seconds: a
        reader's own check of how the fit prices them (the forecast's, `forecast_state.prefill_factor`)."""
        return [(r, y) for r, y in _window(self._rows, self._kept) if r[1] > 0] if self._rows else []

    @property
    def price_range(self) -> PriceRange:
        """The prefill the current coefficients were fitted on (empty before the first fit: the prior's)."""
        return self._seen

    @property
    def prior_pace(self) -> float:
        """The fit's price of the steps it was fitted on over the prior's (1 before the first fit): the machine's
        pace against the prior's, read where the fit has evidence. With the prior's shape it prices what the fit
        has no evidence for (`forecast_state.prior_shape`: a fit that never read a full chunk)."""
        if self._pace is None:
            self._pace, self._paced_rows = self._paced(self._paced_rows), []
        return self._pace

    @property
    def window_steps(self) -> int:
        """Steps currently in the fitting window (at most `max_window`)."""
        return len(self._rows)

    @property
    def fitted(self) -> bool:
        """Enough steps seen: the coefficients come from the data, not the prior."""
        return self._scale is not None

    @property
    def residual_scale(self) -> float | None:
        """Robust (MAD) spread of the fit's residuals, seconds; None until fitted."""
        return self._scale

    @property
    def coefficients(self) -> StepCoefficients:
        a, b, c, d, e, f = self._coef
        return StepCoefficients(a, b, c, d, e, self._gap_s, f)

    def step_seconds(self, context_tokens: int, decode_requests: int, decode_context_sum: int) -> float:
        return self.step_seconds_with_prefill(context_tokens, decode_requests, decode_context_sum, 0)

    def step_seconds_with_prefill(self, context_tokens: int, decode_requests: int, decode_context_sum: int,
                                  prefill_pairs: int, prefill_requests: int = 0) -> float:
        """`prefill_requests`: how many requests the step prefills (0: a caller that does not count them)."""
        a, b, c, d, e, f = self._coef
        compute = (a + b * context_tokens + c * decode_requests + d * decode_context_sum + e * prefill_pairs
                   + f * prefill_requests)
        return max(compute, MIN_STEP_S) + self._gap_s

    def solo_ttft_s(self, prompt_tokens: int, token_budget: int, cached_tokens: int = 0) -> float:
        """The prompt's prefill alone, in budget-sized chunks; the first token comes with the last chunk. Its
        first `cached_tokens` come from vLLM's prefix cache: not computed, but attended to."""
        if token_budget < 1:
            raise ValueError("token_budget must be >= 1")
        done = min(max(cached_tokens, 0), max(prompt_tokens - 1, 0))
        total = 0.0
        remaining = max(prompt_tokens - done, 1)
        while remaining > 0:
            chunk = min(token_budget, remaining)
            total += self.step_seconds_with_prefill(chunk, 0, 0, prefill_pairs(done, chunk), 1)
            done += chunk
            remaining -= chunk
        return total

    def solo_itl_s(self, context_tokens: int) -> float:
        """One decode step with only this request, at its context length."""
        return self.step_seconds_with_prefill(0, 1, max(context_tokens, 0), 0)

    # ---- kept across restarts (the agent's state file; agent/fit_store.py does the I/O) ----------------------
    def snapshot(self) -> dict[str, Any]:
        """What the fit has learnt, numbers only (no request id, no text): the rows it reads, each as
        [seq, its five features, seconds], the prefill rows kept past the window, the gaps, and the fit they gave.
        Bounded as the model is: at most max_window + 7 x 32 rows. `restore` takes it back."""
        # Steps restored from an earlier snapshot are numbered below 0: all move up so none is negative
        shift = -min((e[0] for e in (*self._rows, *(e for k in self._kept for e in k))), default=0)
        shift = max(shift, 0)
        return {"steps_seen": self.steps_seen + shift, "rows": [_encoded(e, shift) for e in self._rows],
                "kept": [[_encoded(e, shift) for e in k] for k in self._kept], "gaps": list(self._gaps),
                "coefficients": list(self._coef), "step_gap_s": self._gap_s, "scale": self._scale}

    def restore(self, data: Mapping[str, Any]) -> None:
        """Take back a `snapshot` (an earlier agent's, on the same engine) as the oldest evidence: the steps seen
        since start stay the newest, and the bounded window keeps the newest of both. With no step seen yet the
        saved fit is adopted as it was (the first forecast prices as the last agent did); else the merged window
        is refitted. ValueError, and nothing changed, when `data` is not a valid snapshot."""
        if not isinstance(data, Mapping):
            raise ValueError(f"expected a table, got {type(data).__name__}")
        old = _whole(data.get("steps_seen"), "steps_seen")
        rows = [_decoded(e, old) for e in _listed(data, "rows")]
        kept = _listed(data, "kept")
        if len(kept) != SIZE_CLASSES:
            raise ValueError(f"kept: expected {SIZE_CLASSES} size classes, got {len(kept)}")
        kept_rows = [[_decoded(e, old) for e in _listed({"k": k}, "k")] for k in kept]
        gaps = [_number(g, "gaps", negative=True) for g in _listed(data, "gaps")]
        coef = tuple(_number(c, "coefficients") for c in _listed(data, "coefficients"))
        if len(coef) != TERMS:
            raise ValueError(f"coefficients: expected {TERMS}, got {len(coef)}")
        gap_s = _number(data.get("step_gap_s"), "step_gap_s")
        scale = None if data.get("scale") is None else _number(data.get("scale"), "scale")
        own = len(self._rows)
        self._rows = deque([*rows, *self._rows], maxlen=self._rows.maxlen)
        self._kept = [deque([*k, *mine], maxlen=KEPT_PER_SIZE) for k, mine in zip(kept_rows, self._kept, strict=True)]
        self._gaps = deque([*gaps, *self._gaps], maxlen=self._gaps.maxlen)
        if own == 0 and scale is not None:  # adopted as fitted: on the saved window (its rows and kept ones)
            self._coef, self._gap_s, self._scale = coef, gap_s, scale
            window = _window(self._rows, self._kept) if self._rows else []
            self._seen = seen_range(window) if window else PriceRange()
            self._pace, self._paced_rows = None, [r for r, _ in window]
        elif len(self._rows) >= self.min_steps:
            if self._scale is None:
                self._coef = coef  # the refit's warm start
            self.refit()

    def forget_restored(self) -> None:
        """Drop what `restore` brought (it turned out to be another engine's): back to this run's own steps."""
        self._rows = deque((e for e in self._rows if e[0] >= 0), maxlen=self._rows.maxlen)
        self._kept = [deque((e for e in k if e[0] >= 0), maxlen=KEPT_PER_SIZE) for k in self._kept]
        self._coef, self._gap_s, self._scale = self.prior.as_tuple(), self.prior.step_gap_s, None
        self._seen = PriceRange()
        self._pace, self._paced_rows = 1.0, []
        if len(self._rows) >= self.min_steps:
            self.refit()


def _encoded(entry: tuple[int, _Row, float], shift: int) -> list[float]:
    seq, row, y = entry
    return [seq + shift, *row[1:], y]


def _decoded(entry: object, old_steps: int) -> tuple[int, _Row, float]:
    """A saved row, its sequence number moved before every step of this run (the saved ones are older)."""
    if not isinstance(entry, list) or len(entry) != TERMS + 1:
        raise ValueError(f"a row: expected {TERMS + 1} numbers, got {str(entry)[:40]}")
    seq = _whole(entry[0], "a row's sequence number")
    if seq >= old_steps:
        raise ValueError(f"a row's sequence number {seq} is not below steps_seen {old_steps}")
    nums = [_number(v, "a row") for v in entry[1:]]
    return seq - old_steps, (1.0, *nums[:-1]), nums[-1]


def _listed(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list):
        raise ValueError(f"{key}: expected a list, got {type(value).__name__}")
    return value


def _whole(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what}: expected a whole number >= 0, got {str(value)[:40]}")
    return value


def _number(value: object, what: str, *, negative: bool = False) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not isfinite(value) or (
            value < 0 and not negative):
        raise ValueError(f"{what}: expected a finite{'' if negative else ' non-negative'} number, "
                         f"got {str(value)[:40]}")
    return float(value)


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting (the systems are at most 6x6); None when singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-12:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for k in range(col, n + 1):
                m[r][k] -= f * m[col][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x


def _nonnegative_solve(a: list[list[float]], b: list[float]) -> list[float]:
    """argmin x'Ax - 2b'x subject to x >= 0 (A positive definite: the fit adds its prior's penalty to the
    diagonal). The optimum is the one support whose own solution is non-negative and that no term left out would
    improve (the gradient (Ax - b)_j >= 0 off it); searched from the largest supports down, since a fit's free
    terms are mostly all in use, so most solves take 1-7 small systems instead of all 63. What it returns is the
    vector `_best_support` would pick among all supports (the same solve of the same subsystem); if rounding
    leaves no support passing the test, that search decides."""
    n = len(b)
    for k in range(n, 0, -1):
        for support in combinations(range(n), k):
            sub = _solve([[a[i][j] for j in support] for i in support], [b[i] for i in support])
            if sub is None or any(v < 0 for v in sub):
                continue
            out = [0.0] * n
            for v, i in zip(sub, support, strict=True):
                out[i] = v
            if all(sum(a[j][i] * out[i] for i in support) >= b[j] for j in range(n) if j not in support):
                # no drop in the objective: the search keeps its start, all zeros (not a solve's -0.0)
                return out if sum(v * b[i] for v, i in zip(sub, support, strict=True)) > 0.0 else [0.0] * n
    return _best_support(a, b)


def _best_support(a: list[list[float]], b: list[float]) -> list[float]:
    """argmin x'Ax - 2b'x subject to x >= 0, by trying every support set (2^6 at most)."""
    n = len(b)
    best, best_gain = [0.0] * n, 0.0
    for k in range(1, n + 1):
        for support in combinations(range(n), k):
            sub = _solve([[a[i][j] for j in support] for i in support], [b[i] for i in support])
            if sub is None or any(v < 0 for v in sub):
                continue
            gain = sum(v * b[i] for v, i in zip(sub, support, strict=True))  # objective drop at the support's optimum
            if gain > best_gain:
                best_gain = gain
                best = [0.0] * n
                for v, i in zip(sub, support, strict=True):
                    best[i] = v
    return best


def _huber_inputs(rows: list[_Row], ys: list[float], prior: _Row, free: list[bool]
                  ) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """What the fit works on: the free terms, their RMS scales, the rows scaled by them, the target less the fixed
    terms' prior share, the prior in scaled units (each feature's RMS contribution, seconds), the penalty floor."""
    idx = [j for j in range(len(prior)) if free[j]]
    fixed = [j for j in range(len(prior)) if not free[j]]
    x_all = np.asarray(rows, dtype=np.float64).reshape(len(rows), len(prior))
    target = np.asarray(ys, dtype=np.float64) - x_all[:, fixed] @ np.asarray([prior[j] for j in fixed])
    raw = x_all[:, idx]
    rms = np.sqrt((raw * raw).sum(axis=0) / len(rows))
    scales = np.where(rms > 0, rms, 1.0)
    pri = np.asarray([prior[j] for j in idx]) * scales
    floor = 1e-4 * max(float(np.median(np.abs(target))), 1e-6)
    return idx, scales, raw / scales, target, pri, floor


def _huber_system(xs: np.ndarray, target: np.ndarray, theta: Sequence[float], pri: np.ndarray, floor: float,
                  huber_k: float, prior_spread: float) -> tuple[np.ndarray, np.ndarray, float]:
    """The weighted normal equations (A, b) of one IRLS step at `theta` (scaled units), with the prior's
    penalty, and the residuals' MAD scale they were weighted by: the fit iterates them, its posterior reads them."""
    absr = np.abs(target - xs @ np.asarray(theta))
    scale = max(1.4826 * float(np.median(absr)), 1e-6)
    cut = huber_k * scale
    w = np.where(absr <= cut, 1.0, cut / np.maximum(absr, 1e-300))
    penalty = (scale / (prior_spread * np.abs(pri) + floor)) ** 2
    wx = xs * w[:, None]
    return wx.T @ xs + np.diag(penalty), wx.T @ target + penalty * pri, scale


def huber_nonnegative_fit(rows: list[_Row], ys: list[float], *, prior: _Row, free: list[bool], start: _Row,
                          iterations: int = 12, huber_k: float = HUBER_K, prior_spread: float = 1.0
                          ) -> tuple[_Row, float, float]:
    """Huber IRLS with coefficients >= 0 and a Gaussian prior on each: mean the prior, spread `prior_spread`
    times its contribution. Where the data cannot tell two features apart (only 32-token prefills: tokens and
    attention pairs move together) the prior decides, and it gives the correction to the feature that already
    explains most, so a short-only window never predicts a whale's chunk from a tiny pair count. A zero prior
    coefficient thus stays near zero. Coefficients not `free` stay at the prior. Returns (coefficients, MAD
    scale, mean residual with residuals clipped at 5 scales). Vectorised: a refit runs every 128 steps over up
    to 1,024 of them, and the per-row arithmetic in Python was the pipeline's largest single cost."""
    idx, scales, xs, target, pri, floor = _huber_inputs(rows, ys, prior, free)
    theta = [float(v) for v in np.asarray([start[j] for j in idx]) * scales]
    for _ in range(iterations):
        ata, atb, _scale = _huber_system(xs, target, theta, pri, floor, huber_k, prior_spread)
        new = _nonnegative_solve(ata.tolist(), atb.tolist())
        done = max(abs(a - b) for a, b in zip(new, theta, strict=True)) <= 1e-7 * (1 + max(map(abs, theta)))
        theta = new
        if done:
            break
    resid = target - xs @ np.asarray(theta)
    scale = 1.4826 * float(np.median(np.abs(resid)))
    clip = 5 * scale
    bias = float(np.mean(np.clip(resid, -clip, clip)))
    coef = list(prior)
    for j, sc, v in zip(idx, scales.tolist(), theta, strict=True):
        coef[j] = v / sc
    return tuple(coef), scale, bias


def huber_posterior(rows: list[_Row], ys: list[float], *, prior: _Row, free: list[bool], coef: _Row,
                    huber_k: float = HUBER_K, prior_spread: float = 1.0) -> dict[int, tuple[float, float]]:
    """Per free term, the mean and spread of the Gaussian the fit's last step stands on at `coef` (its Huber
    weights, MAD scale and prior penalty, the bound >= 0 dropped), in the term's own units: how well the window
    pins each price, for a reader that must not take a price the bound set to 0 for "nothing". Empty when
    the system is singular."""
    idx, scales, xs, target, pri, floor = _huber_inputs(rows, ys, prior, free)
    ata, atb, scale = _huber_system(xs, target, [coef[j] * sc for j, sc in zip(idx, scales.tolist(), strict=True)],
                                    pri, floor, huber_k, prior_spread)
    try:
        inv = np.linalg.inv(ata)
    except np.linalg.LinAlgError:
        return {}
    mu = inv @ atb
    return {j: (float(mu[i]) / sc, scale * float(np.sqrt(max(float(inv[i, i]), 0.0))) / sc)
            for i, (j, sc) in enumerate(zip(idx, scales.tolist(), strict=True))}


__all__ = ["PriceRange", "StepCoefficients", "StepCostModel", "StepCostPrior", "StepFeatures", "huber_nonnegative_fit",
           "huber_posterior",
           "prefill_pairs", "record_row", "row_ok", "seen_range"]
