"""The step-cost fit kept on disk, so a restarted agent (a new pod, an upgrade, a crash) prices its engine as the
last one had learnt to instead of from the prior, which machines miss by 3x.

One file per engine in `state_dir`, written atomically (a temporary file, fsync, rename: a crash leaves the old
file or the new one, never half of one) every `state_save_interval_s` while the fit changes, and at exit. At
start the file is read and offered to the pipeline, which adopts it once the engine is known and the same
(attribution/fit_snapshot.py). A missing file is a cold start; a corrupt, truncated, foreign or mismatched one is
a warning, a count (`attrib_source_skipped_total{source="fit_state"}`) and a cold start, never fatal. Numbers
and the engine's labels only: no request, prompt or completion. With the fit, the traffic last seen (a rate and
median sizes): the forecast's expected arrivals until the restarted agent has seen two of its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

from attrib_agent.attribution.fit_snapshot import MAX_BYTES, decode, encode
from attrib_agent.attribution.forecast_state import last_gap, last_load, last_prompts
from attrib_agent.health import SourceHealth
from attrib_agent.pipeline import AttributionPipeline

if TYPE_CHECKING:
    from attrib_agent.agent.core import AgentCore
    from attrib_agent.config.load import AgentConfig

logger = logging.getLogger("attrib_agent")

NAME: Final = "fit_state"
FILE: Final = "step-cost-engine-{engine}.json"


def state_file(directory: Path, engine: int) -> Path:
    return directory / FILE.format(engine=engine)


def read_state(path: Path, max_bytes: int) -> bytes | OSError | None:
    """A state file's first `max_bytes` + 1 bytes (more is not ours); None when there is none; else the error."""
    try:
        with open(path, "rb") as f:
            return f.read(max_bytes + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        return e


class StateWriter:
    """One state file written atomically (a temporary file beside it, fsync, rename: a crash leaves the old file or
    the new one); a failed write is counted each time and logged once until a write succeeds (a full disk would
    log every minute)."""

    def __init__(self, path: Path, health: SourceHealth, what: str) -> None:
        self.path, self.health, self.what = path, health, what
        self._failing = False

    def write(self, data: bytes) -> bool:
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            self.health.skip("write_error")
            if not self._failing:
                logger.warning("%s: cannot write %s: %s", self.what, self.path, e.strerror or type(e).__name__)
            self._failing = True
            return False
        self._failing = False
        return True


class FitStore:
    """A sink in shape (flush every half second, shutdown at exit) that saves the fit rather than results."""

    name = NAME

    def __init__(self, directory: Path, pipeline: AttributionPipeline, health: SourceHealth | None = None, *,
                 save_interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = state_file(directory, pipeline.config.engine)
        self.pipeline = pipeline
        self.health = health if health is not None else SourceHealth(NAME)
        self.save_interval_s = save_interval_s
        self._clock = clock
        self._last_save = clock()
        self._saved: object = None  # what the fit was when last written (unchanged: not written again)
        self._writer = StateWriter(self.path, self.health, "step-cost fit")
        self.verdict: str | None = None  # the loaded file's fate: loaded, mismatch, invalid (None: none yet)
        self.load()

    def load(self) -> None:
        """Read the file and offer it to the pipeline (adopted once the engine is known and the same)."""
        data = read_state(self.path, MAX_BYTES)
        if data is None:
            logger.info("step-cost fit: no %s yet; the fit starts from the prior", self.path)
            return
        if isinstance(data, OSError):
            self._refused("read_error", f"cannot read {self.path}: {data.strerror or type(data).__name__}")
            return
        try:
            snapshot = decode(data)
        except ValueError as e:
            self._refused("invalid", f"{self.path}: {e}")
            return
        watch = self.pipeline.engine_watch
        watch.offer(snapshot, self._decided)
        watch.decide(self.pipeline.attributor.cost)  # at once when the engine is already known

    def _decided(self, verdict: str, detail: str) -> None:
        self.verdict = verdict
        if verdict == "loaded":
            logger.info("step-cost fit: restored from %s (%s)", self.path, detail)
            self.health.success(time.time())
        else:
            self._refused(verdict, f"{self.path} " + (f"describes another engine ({detail})"
                                                      if verdict == "mismatch" else f"is not usable: {detail}"))

    def _refused(self, kind: str, why: str) -> None:
        self.verdict = kind
        logger.warning("step-cost fit: %s; starting from the prior", why)
        self.health.skip(kind)

    # ---- the sink's calls ------------------------------------------------------------------------------------
    def on_results(self, results: object) -> None:
        return None

    def flush(self) -> None:
        if self._clock() - self._last_save >= self.save_interval_s:
            self.save()

    def shutdown(self) -> None:
        self.save()

    def save(self) -> bool:
        """Write the fit now if the engine is known and the fit changed since the last write; False if not written."""
        self._last_save = self._clock()
        engine = self.pipeline.engine_watch.fingerprint()
        cost = self.pipeline.attributor.cost
        load, gap, prompts = last_load(self.pipeline), last_gap(self.pipeline), last_prompts(self.pipeline)
        now = (engine, cost.steps_seen, cost.window_steps, cost.coefficients, load, gap, prompts)
        if engine is None or engine.device is None or cost.window_steps == 0 or now == self._saved:
            return False  # nothing learnt, or the engine not fully known (a saved fit always names its device)
        if not self._writer.write(encode(engine, cost, load, gap, prompts)):
            return False
        self._saved = now
        return True


def attach(cfg: AgentConfig, core: AgentCore) -> FitStore | None:
    """The store `state_dir` asks for, added to the core's sinks (None when off)."""
    if cfg.state_dir is None:
        return None
    store = FitStore(cfg.state_dir, core.pipeline, core.state.source(NAME), save_interval_s=cfg.state_save_interval_s)
    core.add_sink(store)
    return store
