"""The step-cost fit as a restarted agent finds it: which engine it describes, its encoding, and when to adopt it.

A fit prices one engine: one model on one machine, with one KV pool. The agent learns what identifies it from
what it reads anyway: the model from `/metrics` labels, the block size and pool from `vllm:cache_config_info` (or
the settings that override it; the pool's size is what the engine's memory, model and dtype left for KV), the
token budget when configured (an inferred one moves as steps are seen, so it is not compared) and the device from
the step lines. A saved fit is adopted at the first scrape when those agree: a whale may arrive before the first
step (six of the lab's twelve do), and a fit adopted at the first step would come too late for it. The device is
compared when the first step shows it: a different one drops the adopted evidence again. Pure: the agent layer
(agent/fit_store.py) reads and writes the file; this decides.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Final

from attrib_agent.attribution.cost_model import StepCostModel
from attrib_agent.attribution.forecast_types import ArrivalLoad
from attrib_agent.events import EngineStep, Event, MetricsSnapshot
from attrib_agent.timeline.sched_state import Geometry

FORMAT: Final = "attrib-agent step-cost fit"
VERSION: Final = 1
MAX_BYTES: Final = 4 * 2**20  # a full snapshot is ~45 KB (1,024 + up to 224 rows); a larger file is not ours
MAX_GAP_S: Final = 1.0  # a saved gap between steps beyond this is not one (the model counts those within 50 ms)
MAX_TEXT: Final = 200  # a model name longer than this is cut (it is a label, not content)


@dataclass(frozen=True, slots=True)
class EngineFingerprint:
    """What must match for a saved fit to price this engine."""

    engine: int
    model: str
    device: str | None  # None until a step was read (a saved fingerprint always has it)
    block_size: int | None
    num_blocks: int | None
    token_budget: int | None  # configured; None when inferred

    def differences(self, other: EngineFingerprint) -> list[str]:
        """`name: saved -> now` for every part that differs (the device only when both know it)."""
        return [f"{f.name}: {getattr(other, f.name)!r} -> {getattr(self, f.name)!r}" for f in fields(self)
                if getattr(self, f.name) != getattr(other, f.name)
                and not (f.name == "device" and None in (self.device, other.device))]

    @classmethod
    def parse(cls, data: object) -> EngineFingerprint:
        if not isinstance(data, Mapping) or set(data) != {f.name for f in fields(cls)}:
            raise ValueError("engine: expected the fields " + ", ".join(f.name for f in fields(cls)))
        ints = [data[n] for n in ("engine", "block_size", "num_blocks", "token_budget")]
        if not isinstance(data["model"], str) or not isinstance(data["device"], str | None) or any(
                v is not None and (not isinstance(v, int) or isinstance(v, bool)) for v in ints):
            raise ValueError("engine: model and device are text, the others whole numbers")
        return cls(**{f.name: data[f.name] for f in fields(cls)})


@dataclass(frozen=True, slots=True)
class FitSnapshot:
    engine: EngineFingerprint
    fit: Mapping[str, Any]  # StepCostModel.snapshot(), checked when restored
    load: ArrivalLoad | None = None  # the last traffic the saving agent saw (rate and sizes), if any
    step_gap_s: float | None = None  # the gap between steps it measured (forecast_state.step_gap), if any
    prompts: tuple[tuple[int, int], ...] = ()  # (max_tokens, median prompt) it saw (forecast_state.prompt_classes)


LOAD_FIELDS: Final = ("rate_per_s", "prompt_tokens", "max_tokens", "cached_prefix_tokens")
MAX_PROMPT_CLASSES: Final = 64  # (max_tokens, prompt) pairs a file may hold; the agent saves at most 16


def encode(engine: EngineFingerprint, model: StepCostModel, load: ArrivalLoad | None = None,
           step_gap_s: float | None = None, prompts: Mapping[int, int] | None = None) -> bytes:
    """The state file's bytes: numbers and the engine's labels only (the load: a rate and median sizes)."""
    doc: dict[str, Any] = {"format": FORMAT, "version": VERSION, "engine": asdict(engine), "fit": model.snapshot()}
    if load is not None:
        doc["load"] = {k: getattr(load, k) for k in LOAD_FIELDS}
    if step_gap_s is not None:
        doc["step_gap_s"] = step_gap_s
    if prompts:
        doc["prompts"] = [[int(k), int(v)] for k, v in prompts.items()]
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()


def _load(data: object) -> ArrivalLoad | None:
    """The saved load (absent in files written before it was kept: None); ValueError when malformed."""
    if data is None:
        return None
    if not isinstance(data, Mapping) or set(data) != set(LOAD_FIELDS) or any(
            not isinstance(data[k], int | float) or isinstance(data[k], bool) or not math.isfinite(data[k])
            for k in LOAD_FIELDS):
        raise ValueError("load: expected the finite numbers " + ", ".join(LOAD_FIELDS))
    try:
        return ArrivalLoad(float(data["rate_per_s"]), int(data["prompt_tokens"]), int(data["max_tokens"]),
                           cached_prefix_tokens=int(data["cached_prefix_tokens"]))
    except (ValueError, OverflowError) as e:
        raise ValueError(f"load: {e}") from None


def _gap(data: object) -> float | None:
    """The saved gap between steps (absent in files written before it was kept: None); ValueError when it is
    not a finite number of seconds within MAX_GAP_S either way (log stamps jitter: a gap can read negative)."""
    if data is None:
        return None
    if not isinstance(data, int | float) or isinstance(data, bool) or not abs(data) <= MAX_GAP_S:
        raise ValueError(f"step_gap_s: expected a number of seconds within +/-{MAX_GAP_S}")
    return float(data)


def _prompts(data: object) -> tuple[tuple[int, int], ...]:
    """The saved prompt classes (absent in files written before they were kept: none); ValueError when malformed."""
    if data is None:
        return ()
    if not isinstance(data, list) or len(data) > MAX_PROMPT_CLASSES or any(
            not isinstance(pair, list) or len(pair) != 2
            or any(not isinstance(x, int) or isinstance(x, bool) or x < 1 for x in pair) for pair in data):
        raise ValueError(f"prompts: expected at most {MAX_PROMPT_CLASSES} [max_tokens, prompt_tokens] pairs >= 1")
    return tuple((a, b) for a, b in data)


def state_document(data: bytes, fmt: str, version: int, max_bytes: int) -> dict[str, Any]:
    """A state file's JSON object, checked for size, format and version (what every state file of the agent's
    starts with); ValueError saying what is wrong: too large, not JSON (a truncated write), another format or
    version."""
    if len(data) > max_bytes:
        raise ValueError(f"{len(data)} bytes, more than the {max_bytes} a {fmt} file takes")
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"not JSON ({type(e).__name__}): truncated or not a state file") from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        raise ValueError(f"not a {fmt} file")
    if doc.get("version") != version:
        raise ValueError(f"version {str(doc.get('version'))[:20]}, this agent reads version {version}")
    return doc


def decode(data: bytes) -> FitSnapshot:
    """ValueError saying what is wrong (`state_document`'s checks, then the fit's)."""
    doc = state_document(data, FORMAT, VERSION, MAX_BYTES)
    if not isinstance(doc.get("fit"), dict):
        raise ValueError("fit: missing")
    return FitSnapshot(EngineFingerprint.parse(doc.get("engine")), doc["fit"], _load(doc.get("load")),
                       _gap(doc.get("step_gap_s")), _prompts(doc.get("prompts")))


# (verdict, detail): "loaded", "mismatch" (detail: what differs) or "invalid" (detail: the ValueError)
Decision = Callable[[str, str], None]


class EngineWatch:
    """The pipeline's: the engine's facts as events show them, and a saved fit waiting for them to be known."""

    def __init__(self, engine: int, geometry: Callable[[], Geometry], token_budget: int | None = None) -> None:
        """`geometry`: the pool as the timeline resolved it (settings over `vllm:cache_config_info`), read at each
        scrape of this engine: one rule for the pool, the timeline's, and kept across a timeline replaced."""
        self.engine, self._label = engine, str(engine)
        self._geometry = geometry
        self.token_budget = token_budget
        self.model: str | None = None  # None until a scrape of this engine was read
        self.device: str | None = None  # None until one of its steps was read
        self._raw_model: str | None = None  # the name as the last scrape gave it (cut once, when it changes)
        self._pool = geometry()
        self._offer: tuple[FitSnapshot, Decision] | None = None
        self._unchecked: tuple[str, Decision] | None = None  # adopted before a step showed the device: (saved, tell)
        self.arrivals: ArrivalLoad | None = None  # the load the adopted file's agent last saw (the forecast's prior)
        self.step_gap_s: float | None = None  # the gap between steps it measured (likewise, until one is measured)
        self.prompts: dict[int, int] = {}  # its median prompt by max_tokens (likewise, for the max_tokens not seen)

    def offer(self, snapshot: FitSnapshot, decided: Decision) -> None:
        """Adopt `snapshot` into the cost model once the engine is known (at once if it is), then `decided`."""
        self._offer = (snapshot, decided)

    @property
    def pending(self) -> bool:
        return self._offer is not None

    def see(self, event: Event, cost: StepCostModel) -> None:
        """One event: learn from it, and decide on a waiting fit once the engine is known."""
        if isinstance(event, EngineStep):
            if event.engine == self.engine and not event.dummy and event.device != self.device:
                self.device = event.device
                self._check_device(cost)
        elif isinstance(event, MetricsSnapshot) and event.engine == self._label:
            if event.model_name != self._raw_model:
                self._raw_model, self.model = event.model_name, event.model_name[:MAX_TEXT]
            now = self._geometry()
            if now.known or not self._pool.known:  # a fresh timeline (a stepped clock) has not seen it yet
                self._pool = now
        else:
            return
        if self._offer is not None:
            self.decide(cost)

    def _check_device(self, cost: StepCostModel) -> None:
        if self._unchecked is None:
            return
        (saved, decided), self._unchecked = self._unchecked, None
        if saved != self.device:
            cost.forget_restored()
            decided("mismatch", f"device: {saved!r} -> {self.device!r} (the adopted fit dropped)")

    def fingerprint(self) -> EngineFingerprint | None:
        """The engine as known now; None until a scrape of it was read."""
        if self.model is None:
            return None
        pool = self._pool
        return EngineFingerprint(self.engine, self.model, self.device, pool.block_size, pool.num_blocks,
                                 self.token_budget)

    def decide(self, cost: StepCostModel) -> None:
        now = self.fingerprint()
        if self._offer is None or now is None:
            return
        (snapshot, decided), self._offer = self._offer, None
        differ = now.differences(snapshot.engine)
        if differ:
            decided("mismatch", "; ".join(differ))
            return
        try:
            cost.restore(snapshot.fit)
        except ValueError as e:
            decided("invalid", str(e))
            return
        self.arrivals, self.step_gap_s, self.prompts = snapshot.load, snapshot.step_gap_s, dict(snapshot.prompts)
        if now.device is None and snapshot.engine.device is not None:
            self._unchecked = (snapshot.engine.device, decided)
        decided("loaded", f"{len(snapshot.fit.get('rows', ()))} steps")


__all__ = ["FORMAT", "MAX_BYTES", "VERSION", "EngineFingerprint", "EngineWatch", "FitSnapshot", "decode", "encode"]
