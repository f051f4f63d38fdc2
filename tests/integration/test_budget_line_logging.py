"""vLLM's start-up line with the step budget must reach the file the agent tails (deploy/vllm-logging.json, the
chart's config rendered with its defaults: test_by_hand_logging.py keeps them equal).

vLLM 0.32 logs `Chunked prefill is enabled with max_num_batched_tokens=N.` from `vllm/config/scheduler.py`
(logger `vllm.config.scheduler`, in the API server process only). nu16's by-hand run found the shipped config
sent it to stdout only: an agent tailing vllm.log never read the budget, even started before vLLM.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attrib_agent.events import TokenBudgetLine
from attrib_agent.health import SourceHealth
from attrib_agent.sources.log.parser import LogLineParser
from tests.integration.test_helm_pod_patch import APPLY_CONFIG, PREFIX_END

REPO = Path(__file__).resolve().parents[2]
STARTUP = REPO / "tests" / "fixtures" / "vllm-startup" / "budget-4096.log"  # a real vLLM 0.32 start-up


def test_the_budget_line_reaches_the_agents_file(tmp_path: Path) -> None:
    vllm_spec = importlib.util.find_spec("vllm")
    formatter_py = Path(vllm_spec.origin or "").parent / "logging_utils" / "formatter.py" if vllm_spec else None
    if formatter_py is None or not formatter_py.exists():
        pytest.skip("vllm is not installed (pip install 'attrib-agent[lab]')")
    config = json.loads((REPO / "deploy" / "vllm-logging.json").read_text())
    config["handlers"]["attrib_file"]["filename"] = str(tmp_path / "vllm.log")
    lines = [line for line in STARTUP.read_text().splitlines() if "[scheduler.py:" in line]
    assert len(lines) == 1, "the recorded start-up has one line from vllm/config/scheduler.py"
    messages = [("vllm.config.scheduler", lines[0][PREFIX_END.search(lines[0]).end():])]  # type: ignore[union-attr]
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "messages.json").write_text(json.dumps(messages))
    proc = subprocess.run([sys.executable, "-c", APPLY_CONFIG, str(formatter_py), str(tmp_path / "config.json"),
                           str(tmp_path / "messages.json")], capture_output=True, text=True, timeout=60,
                          env={"TZ": "UTC", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    written = (tmp_path / "vllm.log").read_text().splitlines() if (tmp_path / "vllm.log").exists() else []
    parser = LogLineParser(SourceHealth("vllm_log"))
    got = [e for line in written for e in parser.parse_all(line, time.time())]
    assert [e.token_budget for e in got if isinstance(e, TokenBudgetLine)] == [4096]
