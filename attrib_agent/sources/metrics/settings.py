"""The /metrics source's settings rows and their defaults, apart from the poller so reading them needs no httpx."""

from __future__ import annotations

from typing import Any, Final

from attrib_agent.config import values as v
from attrib_agent.config.setting import Setting

MIN_INTERVAL_S: Final = 0.05
DEFAULT_INTERVAL_S: Final = 0.25
DEFAULT_TIMEOUT_S: Final = 1.0

URL: Final[Setting[str | None]] = Setting(
    "vllm_url", "vllm", v.http_url, None, "vLLM's base URL; /metrics is scraped from it", "URL", live=True,
    default_text="required for run")
ROWS: Final[tuple[Setting[Any], ...]] = (
    URL,
    Setting("metrics_interval_s", "vllm", v.seconds(MIN_INTERVAL_S), DEFAULT_INTERVAL_S,
            "seconds between /metrics scrapes", "SECONDS", live=True),
    Setting("metrics_timeout_s", "vllm", v.seconds(0, inclusive=False), DEFAULT_TIMEOUT_S,
            "time-out of one /metrics scrape", "SECONDS", live=True),
)
