"""parse_metrics finds the series it reads by name and remembers parsed lines: same snapshots as parsing every
line afresh, and the memo stays bounded whatever the bodies (real vLLM 0.32 bodies)."""

from __future__ import annotations

from pathlib import Path

from attrib_agent.recording import METRICS, Recording
from attrib_agent.sources.metrics import parser as metrics_parser
from attrib_agent.sources.metrics.parser import parse_metrics

RECORDINGS = Path(__file__).parents[2] / "fixtures" / "recordings"


def _bodies() -> list[str]:
    return [r["text"] for name in ("preempt", "whale2") for r in Recording(RECORDINGS / name).records(METRICS)]


def test_remembered_lines_give_the_snapshots_a_fresh_parse_gives() -> None:
    bodies = _bodies()
    metrics_parser._memo_sample.cache_clear()
    fresh = [parse_metrics(b, 1.0) for b in bodies]
    assert metrics_parser._memo_sample.cache_info().hits > len(bodies)  # cache_config_info, idle gauges ...
    assert [parse_metrics(b, 1.0) for b in bodies] == fresh


def test_the_memo_is_bounded_and_skips_long_lines() -> None:
    body = _bodies()[-1]
    metrics_parser._memo_sample.cache_clear()
    for i in range(3 * metrics_parser._memo_sample.cache_info().maxsize):  # every scrape a new counter value
        parse_metrics(body.replace("vllm:num_requests_running{", f'vllm:num_requests_running{{x="{i}",'), 1.0)
    info = metrics_parser._memo_sample.cache_info()
    assert info.currsize <= info.maxsize == 256
    (line,) = [ln for ln in body.split("\n") if ln.startswith("vllm:cache_config_info")]
    padded = line.replace("{", "{" + ",".join(f'pad{i}="{"x" * 40}"' for i in range(200)) + ",", 1)
    assert len(padded) > metrics_parser._MAX_MEMO_LINE
    metrics_parser._memo_sample.cache_clear()
    (snap,) = parse_metrics(body.replace(line, padded), 1.0)
    assert (snap.block_size, snap.num_gpu_blocks) == (128, 96)
    assert metrics_parser._memo_sample.cache_info().currsize < 12  # the long line was parsed, not kept
