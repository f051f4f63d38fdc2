"""deploy/vllm-logging.json (the by-hand recipe's logging config) is what the generator makes; that it equals
the chart's (whose lines the integration tests run through vLLM's formatter) is tests/integration's."""

from __future__ import annotations

import json
from pathlib import Path

from attrib_agent.lab.logging_config import main

REPO = Path(__file__).resolve().parents[2]


def test_the_shipped_file_is_the_generated_one(capsys):
    main([])
    assert json.loads((REPO / "deploy" / "vllm-logging.json").read_text()) == json.loads(capsys.readouterr().out)
