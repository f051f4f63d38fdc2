"""vLLM's logging config for running it by hand beside the agent (shipped as deploy/vllm-logging.json).

The lab's config (lab/server.py `vllm_logging_config`: vLLM's prefix with millisecond stamps and the year,
to stdout) plus the file the agent tails, as the Helm chart writes it (helm/attrib-agent/templates/_pod.tpl
`attrib-agent.vllmLoggingConfig` with its default values): a rotating `vllm.log` fed only by the loggers
whose lines the agent reads, all written by vLLM's API-server process (a file shared by vLLM's processes
would break rotation; docs/deployment.md). A unit test keeps the shipped file equal to this, an
integration test keeps it equal to the chart's rendering.

    python -m attrib_agent.lab.logging_config [LOG_DIR] > deploy/vllm-logging.json
"""

from __future__ import annotations

import json
import sys
from typing import Any, Final

from attrib_agent.lab.server import vllm_logging_config

DEFAULT_LOG_DIR: Final = "/var/log/vllm"
MAX_BYTES: Final = 10 * 1024 * 1024
BACKUP_COUNT: Final = 2
# vllm.config.scheduler: the start-up line with the step budget (`max_num_batched_tokens=N`), API server only
FILE_LOGGERS: Final = ("vllm.entrypoints", "vllm.v1.engine.async_llm", "vllm.v1.metrics.loggers",
                       "vllm.config.scheduler")


def by_hand_logging_config(log_dir: str = DEFAULT_LOG_DIR, level: str = "INFO") -> dict[str, Any]:
    """The `VLLM_LOGGING_CONFIG_PATH` dictConfig: the lab's stdout config plus `<log_dir>/vllm.log`."""
    cfg = vllm_logging_config(level)
    (fmt_name,) = cfg["formatters"]
    stdout = cfg["handlers"].pop("vllm")
    cfg["handlers"] = {
        "stdout": stdout,
        "attrib_file": {"class": "logging.handlers.RotatingFileHandler", "formatter": fmt_name, "level": level,
                        "filename": f"{log_dir.rstrip('/')}/vllm.log", "maxBytes": MAX_BYTES,
                        "backupCount": BACKUP_COUNT, "encoding": "utf-8"},
    }
    cfg["loggers"] = {"vllm": {**cfg["loggers"]["vllm"], "handlers": ["stdout"]},
                      **{name: {"handlers": ["attrib_file"], "propagate": True} for name in FILE_LOGGERS}}
    return cfg


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(json.dumps(by_hand_logging_config(*args[:1]), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
