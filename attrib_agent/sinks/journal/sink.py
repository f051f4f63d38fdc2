"""The journal as a sink: every result (partial and final) buffered on `on_results`, written on `flush`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from attrib_agent.attribution.result import AttributionResult
from attrib_agent.config import values as v
from attrib_agent.config.setting import Setting
from attrib_agent.sinks.journal.result_journal import DEFAULT_MAX_BYTES, MIB, ResultJournal
from attrib_agent.sinks.sink import SinkSpec

if TYPE_CHECKING:
    from attrib_agent.config.load import AgentConfig
    from attrib_agent.read_model import AgentState

NAME = "journal"
ROWS: Final[tuple[Setting[Any], ...]] = (
    Setting("journal_dir", "journal", v.path, None, "keep every final result as JSON lines here", "DIR",
            default_text="off"),
    Setting("journal_max_bytes", "journal", v.size_bytes(MIB, 2**40), DEFAULT_MAX_BYTES,
            "most disk space the journal may use", "BYTES", default_text="256MiB"),
)


class JournalSink:
    name = NAME

    def __init__(self, journal: ResultJournal, state: AgentState | None = None) -> None:
        self.journal = journal
        self._state = state

    def on_results(self, results: Sequence[AttributionResult]) -> None:
        self.journal.append(results)

    def flush(self) -> None:
        if self._state is not None:  # requests that ended without a result: a restarted agent still answers them
            self.journal.append_ended(self._state.pipeline.take_ended())
        self.journal.flush()
        if self._state is not None:  # what /metrics reports of the journal
            self._state.journal_written = self.journal.written_total
            self._state.journal_errors = self.journal.errors

    def shutdown(self) -> None:
        self.journal.close()


def journal_for(cfg: AgentConfig) -> ResultJournal | None:
    if cfg.journal_dir is None:
        return None
    return ResultJournal(cfg.journal_dir, max_bytes=cfg.journal_max_bytes)


def build(cfg: AgentConfig, state: AgentState) -> JournalSink | None:
    journal = journal_for(cfg)
    return None if journal is None else JournalSink(journal, state)


SPEC = SinkSpec(NAME, ROWS, build)
