"""The journal across real processes: a writer killed with SIGKILL, and a directory the agent may not write."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from attrib_agent.attribution.result import AttributionResult
from attrib_agent.attribution.result_codec import to_dict
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sinks.journal import JournalError, ResultJournal
from attrib_agent.sources.replay import ReplaySource

RECORDINGS = Path(__file__).parents[2] / "fixtures" / "recordings"

# The agent's loop in miniature: results keep coming, a flush every 16 batches (~400 KB, several segments),
# "flushed <k>" printed only once flush() has returned. It never stops by itself (it idles at the cap), so
# the kill is always a kill.
WRITER = """
import json, sys, time
from dataclasses import replace
from attrib_agent.attribution.result_codec import from_dict
from attrib_agent.sinks.journal import ResultJournal
directory, source = sys.argv[1], sys.argv[2]
base = [from_dict(json.loads(line)) for line in open(source)]
journal = ResultJournal(directory, segment_bytes=64 * 1024, max_bytes=1 << 30)
for k in range(1600):
    journal.append([replace(r, request_id=f"{r.request_id}#{k}") for r in base])
    if k % 16 == 15:
        journal.flush()
        print("flushed", k, flush=True)
time.sleep(120)
"""


@pytest.fixture(scope="module")
def finals() -> list[AttributionResult]:
    p = AttributionPipeline()
    for ev in ReplaySource(RECORDINGS / "preempt").events():
        p.feed(ev)
    p.settle()
    return list(p.store)


def test_sigkill_mid_write_loses_nothing_that_was_flushed(tmp_path: Path, finals: list[AttributionResult]) -> None:
    source = tmp_path / "results.ndjson"
    source.write_text("".join(json.dumps(to_dict(r)) + "\n" for r in finals))
    journal_dir = tmp_path / "journal"
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(journal_dir), str(source)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        reports: list[int] = []
        while len(reports) < 10:
            line = child.stdout.readline()
            assert line, f"writer died: {child.stderr.read() if child.stderr else ''}"
            reports.append(int(line.split()[1]))
        kill_when_writing(child, journal_dir)
        assert child.wait(10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    last_flushed = reports[-1]
    journal = ResultJournal(journal_dir)  # the restarted agent
    loaded = {r.request_id: r for r in journal.load()}
    want = {f"{r.request_id}#{k}": r for k in range(last_flushed + 1) for r in finals}
    assert want.keys() <= loaded.keys()
    assert all(to_dict(loaded[rid]) == to_dict(r) | {"request_id": rid} for rid, r in want.items())
    assert journal.errors["malformed"] == 0 and journal.errors["truncated"] <= 1
    # it writes on in a fresh segment, and a later load still has everything
    journal.append(finals)
    journal.flush()
    again = ResultJournal(journal_dir)
    assert want.keys() | {r.request_id for r in finals} <= {r.request_id for r in again.load()}


def disk_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


def kill_when_writing(child: subprocess.Popen[str], directory: Path) -> None:
    """SIGKILL the writer once its next flush has begun to reach the disk, so the kill lands inside a flush."""
    flushed = disk_bytes(directory)
    for _ in range(1_000_000):
        if disk_bytes(directory) > flushed or child.poll() is not None:
            break
    os.kill(child.pid, signal.SIGKILL)


def _open_as_unprivileged(directory: Path) -> str:
    """Open the journal without the power to ignore file modes; the JournalError message, or '' if none."""
    code = ("import sys\nfrom attrib_agent.sinks.journal import ResultJournal, JournalError\n"
            "try:\n    ResultJournal(sys.argv[1])\nexcept JournalError as e:\n    print(e)\n")
    if os.geteuid() != 0:
        try:
            ResultJournal(directory)
        except JournalError as e:
            return str(e)
        return ""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: file modes cannot be enforced")
    out = subprocess.run([setpriv, "--inh-caps=-all", "--bounding-set=-all", sys.executable, "-c", code,
                          str(directory)], capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


def test_a_read_only_directory_is_a_clear_error_at_start(tmp_path: Path) -> None:
    directory = tmp_path / "journal"
    directory.mkdir()
    directory.chmod(0o555)
    try:
        message = _open_as_unprivileged(directory)
    finally:
        directory.chmod(0o755)
    assert message == f"journal directory {directory} is not writable: Permission denied"
    assert not list(directory.iterdir())
