"""parse_metrics finds the series it reads by name and remembers parsed lines: same snapshots as parsing every
line afresh, and the memo stays bounded whatever the bodies (real vLLM 0.32 bodies)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from attrib_agent.recording import METRICS, Recording
from attrib_agent.sources.metrics import parser as metrics_parser
from attrib_agent.sources.metrics.parser import parse_metrics

RECORDINGS = Path(__file__).parents[2] / "fixtures" / "recordings"


def _bodies() -> list[str]:
    return [r["text"] for name in ("preempt", "whale2") for r in Recording(RECORDINGS / name).records(METRICS)]


def test_remembered_lines_give_the_snapshots_a_fresh_parse_gives() -> None:
    bodies = _bodies()
    metrics_parser._memo_sample.cache_clear()
    metrics_parser._memo_head.cache_clear()
    fresh = [parse_metrics(b, 1.0) for b in bodies]
    hits = metrics_parser._memo_sample.cache_info().hits + metrics_parser._memo_head.cache_info().hits
    assert hits > len(bodies)  # cache_config_info, idle gauges, counters by their head ...
    assert [parse_metrics(b, 1.0) for b in bodies] == fresh


def test_the_memo_is_bounded_and_skips_long_lines() -> None:
    body = _bodies()[-1]
    metrics_parser._memo_sample.cache_clear()
    for i in range(3 * metrics_parser._memo_sample.cache_info().maxsize):  # every scrape a new counter value
        parse_metrics(body.replace("vllm:num_requests_running{", f'vllm:num_requests_running{{x="{i}",'), 1.0)
    for memo in (metrics_parser._memo_sample, metrics_parser._memo_head):
        info = memo.cache_info()
        assert info.currsize <= info.maxsize == 256
    (line,) = [ln for ln in body.split("\n") if ln.startswith("vllm:cache_config_info")]
    padded = line.replace("{", "{" + ",".join(f'pad{i}="{"x" * 40}"' for i in range(200)) + ",", 1)
    assert len(padded) > metrics_parser._MAX_MEMO_LINE
    metrics_parser._memo_sample.cache_clear()
    (snap,) = parse_metrics(body.replace(line, padded), 1.0)
    assert (snap.block_size, snap.num_gpu_blocks) == (128, 96)
    assert metrics_parser._memo_sample.cache_info().currsize < 12  # the long line was parsed, not kept


def _reference_known_lines(text: str) -> list[str]:
    """What `_known_lines` must give: every line (split at "\n" only, as prometheus_client reads) that is a sample
    of a series we read, stripped."""
    return [line.strip() for line in text.split("\n") if metrics_parser._is_known(line.strip())]


def test_known_lines_are_every_line_of_a_read_series_on_real_and_mangled_bodies() -> None:
    rng = random.Random(14)
    pieces = ["\n", " ", "\t", "\r", "{", "}", '"', "vllm:", "vllm:num_requests_running", "# HELP ", "_count",
              "\u00a0", "\x0b", "x", "1.0", "vllm:iteration_tokens_total_count", "vllm:cache_config_info",
              "vllm:kv_cache_usage_perc_bucket"]
    bodies = _bodies()
    for body in bodies:
        assert metrics_parser._known_lines(body) == _reference_known_lines(body)
    for _ in range(3000):
        body = rng.choice(bodies)
        i = rng.randrange(len(body))
        text = body[max(0, i - 2000):i] + "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 30))) \
            + body[i + rng.randrange(500):][:2000]
        assert metrics_parser._known_lines(text) == _reference_known_lines(text)


@pytest.mark.parametrize("line", [
    'vllm:num_requests_running{engine="0",model_name="m"} 3.0', 'vllm:x{a="1"} 12', 'vllm:x{a="1"} 01',
    'vllm:x{a="}"} 2', 'vllm:x{a="b",} 3.50', 'vllm:x{} 3', 'vllm:x{a="1"} 1e3', 'vllm:x{a=1} 2',
    'vllm:x{a="1"}  2', 'vllm:x{a="1"} 2 1700000000', 'vllm:x{a="\\"} 1.5', 'vllm:x{a="1"} 1_0',
    'vllm:x_total{a="1"} 5 # {trace_id="abc"} 1', 'vllm:x{a="{"} 2', 'vllm:x{a="x} 2', 'vllm:x{a="} 1"} 2',
])
def test_a_line_parsed_by_its_remembered_head_reads_as_prometheus_client_reads_it(line: str) -> None:
    def outcome(parse: Callable[[str], object]) -> object:
        try:
            return parse(line)
        except Exception as e:
            return type(e)

    metrics_parser._memo_head.cache_clear()
    expected = outcome(metrics_parser._sample)
    for _ in range(2):  # first parse, then remembered
        got = outcome(metrics_parser._parse_line)
        assert got == expected
        if isinstance(got, tuple):
            assert type(got[2]) is type(expected[2])  # type: ignore[index]
