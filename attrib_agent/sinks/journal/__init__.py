"""The result journal: every result as a JSON line on disk, bounded by bytes; reloaded after a restart."""

from attrib_agent.sinks.journal.result_journal import JournalError, ResultJournal
from attrib_agent.sinks.journal.sink import JournalSink

__all__ = ["JournalError", "JournalSink", "ResultJournal"]
