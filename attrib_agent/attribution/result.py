"""What the attribution engine says about one finished request: values only (the store is `store.py`).

The parts add up: for TTFT, sum(culprit.ttft_s) + unexplained_ttft_s == ttft_slowdown_s (likewise ITL),
and no part is negative. Ids only, no request content.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import FrozenInstanceError, dataclass, field
from enum import StrEnum
from typing import Final

from attrib_agent.attribution.compact import (
    DOUBLE,
    CauseMap,
    compact_causes,
    compact_evidence,
    culprit_causes,
    culprit_numbers,
    pack_culprit,
)
from attrib_agent.attribution.compact import NO_CAUSES as NO_CAUSES  # re-exported: the maps' shared empties
from attrib_agent.attribution.compact import NO_EVIDENCE as NO_EVIDENCE


class Cause(StrEnum):
    """Why a culprit slowed a victim. str-valued: JSON, span attributes and metric labels carry the value."""

    KV_PRESSURE = "kv_pressure"
    HEAD_OF_LINE = "head_of_line"
    PREFILL_CONTENTION = "prefill_contention"
    DECODE_BATCHING = "decode_batching"
    KV_BANDWIDTH = "kv_bandwidth"
    PREEMPTION = "preemption"
    OTHER = "other"  # blame the simulation traced to no mechanism


CAUSES: Final = tuple(c.value for c in Cause if c is not Cause.OTHER)  # what the simulation traces


class Evidence(StrEnum):
    """What a cause rests on (docs/attribution.md, "Causes"): the weakest link of its derivation."""

    SIMULATED = "simulated"  # the re-simulation's trace (no engine steps observed for the victim)
    OBSERVED_STEPS = "observed_steps"  # the logged steps, their inferred members and the KV ledger
    OBSERVED_PREEMPTION = "observed_preemption"  # the timeline saw the victim preempted (timeline/preemption.py)
    COST_MODEL = "cost_model"  # observed steps, split by the fitted step-cost model's marginal costs
    NVML_BANDWIDTH = "nvml_bandwidth"  # observed steps, the bandwidth part from the GPU's measured DRAM use
    # the amount, not only its label, from the observed steps: no re-simulated world showed a whale to matter, so
    # what the simulation missed went to the whales in the victim's steps by what they cost there (causes.py)
    OBSERVED_COMEMBERSHIP = "observed_comembership"


class Culprit:
    """One request blamed for a victim's slowdown. Read like a frozen dataclass of these fields:
      request_id; ttft_s: seconds of the victim's TTFT blamed on it; itl_s: seconds per token of the victim's
      mean ITL; share: of the victim's total blamed TTFT + ITL seconds (0..1); causes: TTFT seconds by cause;
      kv_block_seconds: KV block-seconds it held while the victim was in flight; is_whale; itl_causes: ITL
      s/token by cause (none: decode batching, as results from before ITL had causes).
    The numbers and both maps are packed in one bytes (compact.py): ~150 bytes a culprit where the fields took
    ~330, two culprits a result, 100,000 results over (docs/performance.md section 5)."""

    __slots__ = ("request_id", "is_whale", "_blob", "_raw")
    __match_args__ = ("request_id", "ttft_s", "itl_s", "share", "causes", "kv_block_seconds", "is_whale",
                      "itl_causes")
    request_id: str
    is_whale: bool
    _blob: bytes | None
    _raw: tuple[float, float, float, float, Mapping[str, float], Mapping[str, float]] | None

    def __init__(self, request_id: str, ttft_s: float, itl_s: float, share: float,
                 causes: Mapping[str, float] = NO_CAUSES, kv_block_seconds: float = 0.0, is_whale: bool = False,
                 itl_causes: Mapping[str, float] = NO_CAUSES) -> None:
        blob = pack_culprit((ttft_s, itl_s, share, kv_block_seconds), causes, itl_causes)
        raw = None if blob is not None else (ttft_s, itl_s, share, kv_block_seconds, compact_causes(causes),
                                             compact_causes(itl_causes))
        self._fill(request_id, is_whale, blob, raw)

    def _fill(self, request_id: str, is_whale: bool, blob: bytes | None,
              raw: tuple[float, float, float, float, Mapping[str, float], Mapping[str, float]] | None) -> None:
        fill = object.__setattr__  # (frozen: past its own __setattr__; four calls, a stored result decodes many)
        fill(self, "request_id", request_id)
        fill(self, "is_whale", is_whale)
        fill(self, "_blob", blob)
        fill(self, "_raw", raw)

    @classmethod
    def packed(cls, request_id: str, is_whale: bool, blob: bytes) -> Culprit:
        """The culprit whose numbers and maps `pack_culprit` packed in `blob`: a stored result decoded
        (result_pack.py) takes its culprits' bytes as they are, without packing them again."""
        c = object.__new__(cls)
        c._fill(request_id, is_whale, blob, None)
        return c

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def numbers(self) -> tuple[float, float, float, float]:
        """(ttft_s, itl_s, share, kv_block_seconds) in one read: what loops over many culprits take."""
        if self._blob is not None:
            return culprit_numbers(self._blob)
        assert self._raw is not None
        return self._raw[:4]

    def _number(self, i: int) -> float:
        b = self._blob
        value: float = DOUBLE.unpack_from(b, 8 * i)[0] if b is not None else self._raw[i]  # type: ignore[index,assignment]
        return value

    ttft_s = property(lambda self: self._number(0), doc="seconds of the victim's TTFT blamed on it")
    itl_s = property(lambda self: self._number(1), doc="seconds per token of the victim's mean ITL blamed on it")
    share = property(lambda self: self._number(2), doc="of the victim's total blamed TTFT + ITL seconds")
    kv_block_seconds = property(lambda self: self._number(3), doc="KV block-seconds it held in the victim's life")

    @property
    def causes(self) -> Mapping[str, float]:
        return culprit_causes(self._blob, itl=False) if self._blob is not None else self._raw[4]  # type: ignore[index]

    @property
    def itl_causes(self) -> Mapping[str, float]:
        return culprit_causes(self._blob, itl=True) if self._blob is not None else self._raw[5]  # type: ignore[index]

    def _fields(self) -> tuple[object, ...]:
        return (self.request_id, self.ttft_s, self.itl_s, self.share, dict(self.causes), self.kv_block_seconds,
                self.is_whale, dict(self.itl_causes))

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not Culprit:
            return NotImplemented
        assert isinstance(other, Culprit)
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # (its maps are not hashable, as a dataclass's were not)

    def __repr__(self) -> str:
        names = ("request_id", *self.__match_args__[1:])
        return f"Culprit({', '.join(f'{n}={v!r}' for n, v in zip(names, self._fields(), strict=True))})"

    def __reduce__(self) -> tuple[type[Culprit], tuple[object, ...]]:
        return Culprit, (self.request_id, self.ttft_s, self.itl_s, self.share, self.causes, self.kv_block_seconds,
                         self.is_whale, self.itl_causes)

    def seconds(self, itl_gaps: int) -> float:
        """Victim seconds this culprit cost: its TTFT blame plus its per-token ITL blame times the gaps."""
        ttft, itl = self.numbers()[:2]
        return ttft + itl * itl_gaps

    def ttft_by_cause(self) -> dict[str, float]:
        """Its TTFT blame split by the traced causes' weights (all `other` when none was traced)."""
        return split_by_cause(self.ttft_s, self.causes)

    def itl_by_cause(self, itl_gaps: int) -> dict[str, float]:
        """Its ITL blame in seconds by cause (decode batching for a result written before ITL had causes)."""
        itl = self.itl_s * itl_gaps
        return split_by_cause(itl, self.itl_causes or {Cause.DECODE_BATCHING.value: 1.0})

    def blame_by_cause(self, itl_gaps: int) -> dict[str, float]:
        """Victim seconds by cause, summing to `seconds(itl_gaps)`: the split every sink reports."""
        ttft, itl = self.numbers()[:2]
        itl *= itl_gaps
        out = split_by_cause(ttft, self.causes) if ttft > 0 else {}  # (a map unpacked only when it is used)
        if itl > 0:
            for cause, secs in split_by_cause(itl, self.itl_causes or {Cause.DECODE_BATCHING.value: 1.0}).items():
                out[cause] = out.get(cause, 0.0) + secs
        return out


def split_by_cause(seconds: float, causes: Mapping[str, float]) -> dict[str, float]:
    """`seconds` shared out by the positive cause weights; all `other` when there are none."""
    if seconds <= 0:
        return {}
    pairs = causes.pairs() if isinstance(causes, CauseMap) else causes.items()  # (one unpack when packed)
    weights = {k: float(v) for k, v in pairs if v > 0}
    total = sum(weights.values())
    if total <= 0:
        weights, total = {Cause.OTHER.value: 1.0}, 1.0
    return {cause: seconds * w / total for cause, w in weights.items()}


def itl_gaps(completion_tokens: int | None, sequences: int = 1) -> int:
    """Gaps between output tokens (none for a single token): a per-token ITL figure times this is seconds. Each of
    an n>1 client request's `sequences` children starts its own output, so its tokens have `sequences` fewer gaps
    (sum over the children of tokens - 1, as vLLM's ITL histogram pools them)."""
    return max((completion_tokens or sequences) - sequences, 0)


@dataclass(frozen=True, slots=True)
class AttributionResult:
    request_id: str
    finished_ts: float
    ttft_s: float | None
    ttft_baseline_s: float | None
    ttft_slowdown_s: float
    itl_s: float | None  # observed mean inter-token latency
    itl_baseline_s: float | None
    itl_slowdown_s: float
    culprits: tuple[Culprit, ...]
    unexplained_ttft_s: float
    unexplained_itl_s: float
    no_interference: bool  # slowdowns below the noise floor
    quality: float  # 0..1: how well the reconstruction explained what vLLM reported
    is_whale: bool = False
    engine: int = 0
    arrival_ts: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    trace_id: str | None = None  # vLLM's `llm_request` span (32 hex), set by the pipeline when the span landed
    span_id: str | None = None  # (16 hex)
    final: bool = True  # False while requests that overlapped this one are still running (may be refined)
    preempted_s: float = 0.0  # seconds it stalled and recomputed after vLLM preempted it (observed)
    # what each cause named in its culprits rests on (cause -> an Evidence value): one victim's causes come from
    # one derivation, so it is said once per result rather than per culprit
    evidence: Mapping[str, str] = field(default_factory=lambda: NO_EVIDENCE)
    mode: str = "inferred"  # "exact": the step plugin reported every step of its life (docs/exact-mode.md)
    # output sequences its completion tokens are summed over: an n>1 client request's children (`client_result`),
    # else 1 (left out of repr: 1 on every other result, whose repr, and the replay digests of it, stay as they were)
    sequences: int = field(default=1, repr=False)
    # why it was attributed while the live agent shed load: "share" (in the hash sample the counters read: every
    # result outside shedding) or "slowed" (outside it, attributed because it finished visibly slowed: the
    # pipeline's `visible_slowdown`); left out of repr as `sequences` is
    chosen_by: str = field(default="share", repr=False)

    def __post_init__(self) -> None:  # one string per mode, the evidence packed (compact.py)
        object.__setattr__(self, "evidence", compact_evidence(self.evidence))
        object.__setattr__(self, "mode", sys.intern(self.mode))
        object.__setattr__(self, "chosen_by", sys.intern(self.chosen_by))

    @property
    def itl_gaps(self) -> int:
        """Gaps between output tokens: a per-token ITL figure times this is seconds of decode time."""
        return itl_gaps(self.completion_tokens, self.sequences)

    def victim_seconds(self) -> float:
        """The victim's slowdown in seconds of its own time: TTFT plus per-token ITL times its token gaps."""
        return self.ttft_slowdown_s + self.itl_slowdown_s * self.itl_gaps

    def culprit(self, request_id: str) -> Culprit | None:
        return next((c for c in self.culprits if c.request_id == request_id), None)

    def top_culprit(self) -> Culprit | None:
        return max(self.culprits, key=lambda c: (c.ttft_s + c.itl_s, c.request_id), default=None)


def client_result(client_id: str, parts: Sequence[AttributionResult], *, final: bool) -> AttributionResult:
    """One result for a client request vLLM ran as n engine requests (n > 1, parallel sampling), from its children's
    `parts` (child order); the one place these rules are written (docs/sources.md, "Requests with n > 1"):
    - TTFT (observed, baseline, slowdown, unexplained, each culprit's TTFT blame and causes): the child whose first
      token came first, what a streaming client sees first;
    - ITL: per output-token gap over all children (each child's figure weighted by its gaps), as vLLM's
      `vllm:inter_token_latency_seconds` pools every child's gaps (vllm/v1/metrics/stats.py:549-552); vLLM
      reports no per-parent ITL, only per child (stats.py:607-611);
    - completion tokens summed over the children (`sequences`: those with a token), each child's tokens - 1 gaps
      (`itl_gaps`); finished when the last child did; preempted seconds summed;
    - a culprit's blame added over the children (TTFT from the first only), its share of the combined blame,
      KV block-seconds the most any child saw; blame of a child on its siblings is not in the parts (unexplained).
    `final` when every child's part is."""
    first = min(parts, key=lambda r: (r.ttft_s is None, r.ttft_s or 0.0))
    gaps = [r.itl_gaps for r in parts]
    total_gaps = sum(gaps)

    def per_gap(values: Sequence[float | None]) -> float | None:
        known = [(v, g) for v, g in zip(values, gaps, strict=True) if v is not None]
        weight = sum(g for _, g in known)
        if not known:
            return None
        return sum(v * g for v, g in known) / weight if weight > 0 else known[0][0]

    def per_gap_f(values: Sequence[float]) -> float:
        return sum(v * g for v, g in zip(values, gaps, strict=True)) / total_gaps if total_gaps > 0 else 0.0

    tokens = [r.completion_tokens for r in parts if r.completion_tokens is not None]
    completion = sum(tokens) if tokens else None
    sequences = max(sum(1 for t in tokens if t > 0), 1)  # (a child with no token adds no gap, and no sequence)
    ids = sorted({c.request_id for r in parts for c in r.culprits})
    blamed: list[tuple[str, float, float, Mapping[str, float], Mapping[str, float], float, bool]] = []
    for cid in ids:
        mine = [r.culprit(cid) for r in parts]
        at_first = first.culprit(cid)
        itl = per_gap_f([c.itl_s if c is not None else 0.0 for c in mine])
        itl_causes: dict[str, float] = {}
        for c, g in zip(mine, gaps, strict=True):
            for cause, v in (c.itl_causes.items() if c is not None and total_gaps > 0 else ()):
                itl_causes[cause] = itl_causes.get(cause, 0.0) + v * g / total_gaps
        blamed.append((cid, at_first.ttft_s if at_first is not None else 0.0, itl,
                       at_first.causes if at_first is not None else NO_CAUSES, itl_causes,
                       max(c.kv_block_seconds for c in mine if c is not None), any(c.is_whale for c in mine if c)))
    total = sum(t + total_gaps * i for _, t, i, *_ in blamed)
    culprits = sorted((Culprit(cid, t, i, (t + total_gaps * i) / total if total > 0 else 0.0, causes, kv, whale,
                               itl_causes)
                       for cid, t, i, causes, itl_causes, kv, whale in blamed),
                      key=lambda c: (-(c.ttft_s + total_gaps * c.itl_s), c.request_id))
    itl_slow = per_gap_f([r.itl_slowdown_s for r in parts])
    evidence: dict[str, str] = {}
    for r in reversed(parts):
        evidence.update(r.evidence)
    return AttributionResult(
        request_id=client_id, finished_ts=max(r.finished_ts for r in parts), ttft_s=first.ttft_s,
        ttft_baseline_s=first.ttft_baseline_s, ttft_slowdown_s=first.ttft_slowdown_s,
        itl_s=per_gap([r.itl_s for r in parts]), itl_baseline_s=per_gap([r.itl_baseline_s for r in parts]),
        itl_slowdown_s=itl_slow, culprits=tuple(culprits), unexplained_ttft_s=first.unexplained_ttft_s,
        unexplained_itl_s=per_gap_f([r.unexplained_itl_s for r in parts]),
        no_interference=first.ttft_slowdown_s == 0.0 and itl_slow == 0.0, quality=min(r.quality for r in parts),
        is_whale=any(r.is_whale for r in parts), engine=first.engine, arrival_ts=first.arrival_ts,
        prompt_tokens=first.prompt_tokens, completion_tokens=completion, trace_id=first.trace_id,
        span_id=first.span_id, final=final, preempted_s=sum(r.preempted_s for r in parts), evidence=evidence,
        mode="exact" if all(r.mode == "exact" for r in parts) else "inferred", sequences=sequences)
