"""vLLM's step budget kept in `state_dir`, for an agent restarted when vLLM's start-up line is no longer in its log.

vLLM announces its budget once, as it starts (`max_num_batched_tokens=N`). A sidecar restarted beside a running
vLLM reads the log back from its end for that line (sources/log/tailer.py `startup_budget_line`), but a busy
server rotates it out (the shipped config at 10 MiB). So the agent that read it writes it here with the engine it
describes (model, KV block size and pool: what the saved fit is matched on), and a restarted agent takes it when
- its log look-back found neither the budget line nor a later start-up of vLLM (found either, the log decides:
  a start-up without the line is a vLLM restarted on its default budget),
- the engine is the same (the first scrape's model and pool), and
- neither the `token_budget` setting nor a line read since gives one.
The timeline then says `saved` (/readyz, `attrib_token_budget_origin`). A missing file is nothing; a corrupt or
mismatched one is a warning and a count (`attrib_source_skipped_total{source="budget_state"}`), never fatal.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from attrib_agent.agent.fit_store import StateWriter, read_state
from attrib_agent.attribution.fit_snapshot import state_document
from attrib_agent.health import SourceHealth
from attrib_agent.pipeline import AttributionPipeline

logger = logging.getLogger("attrib_agent")

NAME: Final = "budget_state"
FILE: Final = "token-budget-engine-{engine}.json"
FORMAT: Final = "attrib-agent token budget"
MAX_BYTES: Final = 4096  # a saved budget is ~200 bytes; a larger file is not ours
MAX_TEXT: Final = 200  # the model name is cut as the fit's is (fit_snapshot.MAX_TEXT)

Engine = tuple[str, int | None, int | None]  # model, block size, pool blocks


def encode(engine: Engine, token_budget: int) -> bytes:
    model, block_size, num_blocks = engine
    return json.dumps({"format": FORMAT, "version": 1, "model": model, "block_size": block_size,
                       "num_blocks": num_blocks, "token_budget": token_budget}, separators=(",", ":")).encode()


def decode(data: bytes) -> tuple[Engine, int]:
    """(engine, budget); ValueError saying what is wrong."""
    doc = state_document(data, FORMAT, 1, MAX_BYTES)
    model, block, pool, budget = (doc.get(k) for k in ("model", "block_size", "num_blocks", "token_budget"))
    if not isinstance(model, str) or not all(v is None or type(v) is int for v in (block, pool)) or not (
            type(budget) is int and 1 <= budget < 2**31):
        raise ValueError("model is text, block_size and num_blocks whole numbers, token_budget 1..2^31")
    return (model[:MAX_TEXT], block, pool), budget


class BudgetStore:
    """A sink in shape (flush every half second on the pipeline's thread, shutdown at exit)."""

    name = NAME

    def __init__(self, directory: Path, pipeline: AttributionPipeline, looked_back: Callable[[], str | None],
                 health: SourceHealth | None = None) -> None:
        """`looked_back`: what the log follower's look-back found ("budget", "restart", "none"; None until done)."""
        self.path = directory / FILE.format(engine=pipeline.config.engine)
        self.pipeline = pipeline
        self.looked_back = looked_back
        self.health = health if health is not None else SourceHealth(NAME)
        self.verdict: str | None = None  # restored, log_decides, mismatch, budget_known, invalid (None: none yet)
        self._pending: tuple[Engine, int] | None = None
        self._saved: bytes | None = None
        self._writer = StateWriter(self.path, self.health, "token budget")
        self._load()

    def _load(self) -> None:
        data = read_state(self.path, MAX_BYTES)
        if isinstance(data, OSError):
            self._refused("read_error", f"cannot read {self.path}: {data.strerror or type(data).__name__}")
        if not isinstance(data, bytes):
            return
        try:
            self._pending = decode(data)
        except ValueError as e:
            self._refused("invalid", f"{self.path}: {e}")

    def _refused(self, kind: str, why: str) -> None:
        self.verdict = kind
        logger.warning("token budget: %s; not used", why)
        self.health.skip(kind)

    def _engine(self) -> Engine | None:
        fp = self.pipeline.engine_watch.fingerprint()
        return None if fp is None else (fp.model, fp.block_size, fp.num_blocks)

    # ---- the sink's calls ------------------------------------------------------------------------------------
    def on_results(self, results: object) -> None:
        return None

    def flush(self) -> None:
        if self._pending is not None:
            self._restore()
        self.save()

    def shutdown(self) -> None:
        self.save()

    def _restore(self) -> None:
        assert self._pending is not None
        seen = self.looked_back()
        engine = self._engine()
        if seen is None or engine is None:
            return  # the log not opened yet, or no scrape read: wait
        (saved, budget), self._pending = self._pending, None
        if seen != "none":
            self.verdict = "log_decides"  # the running vLLM's start-up is in the log: it says (or not) the budget
        elif saved != engine:
            self._refused("mismatch", f"{self.path} describes another engine ({saved} -> {engine})")
        elif self.pipeline.timeline.restore_budget(budget):
            self.verdict = "restored"
            logger.info("token budget: %d restored from %s (vLLM's start-up line is no longer in the log)",
                        budget, self.path)
            self.health.success(time.time())
        else:
            self.verdict = "budget_known"

    def save(self) -> bool:
        """Write the budget vLLM announced (read from its line, not restored) with its engine, when it changed."""
        engine = self._engine()
        if engine is None or self.pipeline.token_budget_source() != "announced":
            return False
        data = encode(engine, self.pipeline.token_budget())
        if data == self._saved:
            return False
        if not self._writer.write(data):
            return False
        self._saved = data
        return True
