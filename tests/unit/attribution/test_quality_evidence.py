"""Quality is honest about missing evidence: without vLLM's iteration log no result may read as good."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

RECORDINGS = Path(__file__).parents[2] / "fixtures" / "recordings"


def replay(path: Path) -> list[dict[str, object]]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])}
    out = subprocess.run([sys.executable, "-m", "attrib_agent", "replay", "--json", str(path)], env=env,
                         capture_output=True, text=True, check=True, timeout=300).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_replay_without_the_engine_step_stream_reports_zero_quality(tmp_path: Path) -> None:
    whole = replay(RECORDINGS / "shorts")
    assert whole and max(float(str(r["quality"])) for r in whole) > 0.5  # the same recording, with its steps
    copy = tmp_path / "shorts"
    shutil.copytree(RECORDINGS / "shorts", copy)
    (copy / "log.jsonl.xz").unlink()  # vLLM's log: the only source of engine steps
    blind = replay(copy)
    assert len(blind) == len(whole)
    assert all(r["quality"] == 0.0 for r in blind), [r["quality"] for r in blind]
