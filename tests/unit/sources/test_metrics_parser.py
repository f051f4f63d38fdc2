"""parse_metrics and CounterTracker on real vLLM 0.32 /metrics bodies from the recorded fixtures.

Nothing here is hand-written vLLM output: multi-engine, alias and broken bodies are real bodies with
lines renamed, copied, cut or corrupted.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from attrib_agent.events import MetricsSnapshot
from attrib_agent.recording import METRICS, Recording
from attrib_agent.sources.metrics.parser import (
    COUNTER_FIELDS,
    CounterTracker,
    MetricsParseError,
    delta,
    parse_metrics,
)
from attrib_agent.sources.metrics.vllm_names import METRICS as NAMES
from attrib_agent.sources.metrics.vllm_names import resolve_sample, sample_names

RECORDINGS = Path(__file__).parents[2] / "fixtures" / "recordings"
SCENARIOS = ("shorts", "whale1", "whale2", "preempt")


@cache
def bodies(scenario: str) -> tuple[tuple[float, str], ...]:
    return tuple((r["ts"], r["text"]) for r in Recording(RECORDINGS / scenario).records(METRICS))


def last_body() -> str:
    return bodies("preempt")[-1][1]


def lines_of(text: str, name: str) -> list[str]:
    """The sample lines of one exposed name (not its `_created` twin or a longer name sharing the prefix)."""
    return [ln for ln in text.splitlines() if re.match(re.escape(name) + r"[{ ]", ln)]


def render(snapshots: list[MetricsSnapshot]) -> str:
    return "".join(json.dumps(dataclasses.asdict(s), sort_keys=True) + "\n" for s in snapshots)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_golden_whole_recording(scenario: str, golden: Callable[[str, str], None]) -> None:
    tracker = CounterTracker()
    out = [s for ts, text in bodies(scenario) for s in tracker.observe(parse_metrics(text, ts))]
    assert len(out) == len(bodies(scenario))  # one engine, one snapshot per scrape
    assert not any(s.counter_reset for s in out)
    golden(f"metrics/{scenario}.jsonl", render(out))


def test_preempt_recording_agrees_with_its_meta() -> None:
    meta = Recording(RECORDINGS / "preempt").meta
    snaps = [parse_metrics(text, ts)[0] for ts, text in bodies("preempt")]
    first, last = snaps[0], snaps[-1]
    assert first.preemptions_total is not None and last.preemptions_total is not None
    assert last.preemptions_total - first.preemptions_total == meta["preemptions"] > 0
    assert {(s.block_size, s.num_gpu_blocks) for s in snaps} == {(meta["block_size"], meta["num_gpu_blocks"])}
    assert max(s.kv_usage or 0.0 for s in snaps) > 0.5  # the scenario fills the KV pool
    assert {(s.engine, s.model_name) for s in snaps} == {("0", "tiny")}


def test_every_field_is_read_from_a_real_032_body() -> None:
    (snap,) = parse_metrics(last_body(), 1.0)
    assert all(getattr(snap, f.name) is not None for f in dataclasses.fields(snap)), snap


def test_catalog_matches_real_body_both_ways() -> None:
    families = {f.name: f for f in text_string_to_metric_families(last_body())}
    for m in NAMES.values():  # every table entry is served by 0.32 with vLLM's own TYPE and HELP
        family = families[m.name.removesuffix("_total") if m.kind == "counter" else m.name]
        assert (family.type, family.documentation) == (m.kind, m.help), m.name
        assert {s.name for s in family.samples} >= set(sample_names(m))
        for alias in m.aliases:  # aliases are older names: removed by 0.32
            assert not lines_of(last_body(), alias.name) and "renamed" in alias.why
    served = {s.name for f in families.values() for s in f.samples if s.name.startswith("vllm:")}
    known = {name for name in served if resolve_sample(name) is not None}
    assert known  # what the parser claims to know of a real body is exactly the table's samples
    assert known == {n for m in NAMES.values() for n in sample_names(m)}


ALIASES = [(m.name, a.name) for m in NAMES.values() for a in m.aliases]


@pytest.mark.parametrize(("canonical", "alias"), ALIASES)
def test_alias_gives_the_same_snapshot(canonical: str, alias: str) -> None:
    body = last_body()
    renamed = body.replace(canonical + "{", alias + "{").replace(canonical + " ", alias + " ")
    assert renamed != body and not lines_of(renamed, canonical)
    assert parse_metrics(renamed, 1.0) == parse_metrics(body, 1.0)


def test_current_name_wins_over_alias_in_a_deprecation_window() -> None:
    earlier = next(text for _, text in bodies("preempt") if parse_metrics(text, 0)[0].kv_usage)
    (line,) = lines_of(earlier, "vllm:kv_cache_usage_perc")
    old = line.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    body = last_body()
    (expected,) = parse_metrics(body, 1.0)
    assert parse_metrics(old + "\n" + body, 1.0) == parse_metrics(body + "\n" + old + "\n", 1.0) == [expected]
    assert expected.kv_usage == 0.0


def other_engine(text: str) -> str:
    """A real body's engine-0 series copied as engine 1: what a 2-rank data-parallel server serves."""
    return "\n".join(ln.replace('engine="0"', 'engine="1"') for ln in text.splitlines()
                     if ln.startswith("vllm:") and 'engine="0"' in ln and not ln.startswith("vllm:cache_config_info"))


def test_cache_config_info_applies_to_its_engine_or_to_all() -> None:
    body = last_body() + "\n" + other_engine(bodies("preempt")[30][1]) + "\n"
    e0, e1 = parse_metrics(body, 1.0)
    assert (e0.engine, e1.engine) == ("0", "1") and e0.prompt_tokens_total != e1.prompt_tokens_total
    assert (e0.block_size, e1.block_size) == (128, None)  # cache_config_info{engine="0"} is engine 0's
    (info,) = lines_of(body, "vllm:cache_config_info")
    no_engine = body.replace(info, info.replace('engine="0",', ""))  # as vLLM before V1 served it
    assert [(s.block_size, s.num_gpu_blocks) for s in parse_metrics(no_engine, 1.0)] == [(128, 96)] * 2


def test_engine_count_is_bounded() -> None:
    body = last_body() + "\n" + other_engine(last_body()) + "\n"
    assert len(parse_metrics(body, 1.0, max_engines=2)) == 2
    with pytest.raises(MetricsParseError, match="more than 1 engine"):
        parse_metrics(body, 1.0, max_engines=1)


def test_body_without_vllm_series_is_empty_not_an_error() -> None:
    # What a server started with --disable-log-stats serves: the process and HTTP series only.
    body = "\n".join(ln for ln in last_body().splitlines() if "vllm:" not in ln) + "\n"
    assert parse_metrics(body, 1.0) == []
    assert parse_metrics("", 1.0) == []


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-1.0"])
def test_impossible_values_read_as_unknown(bad: str) -> None:
    (line,) = lines_of(last_body(), "vllm:num_preemptions_total")
    (snap,) = parse_metrics(last_body().replace(line, line.rsplit(" ", 1)[0] + " " + bad), 1.0)
    assert snap.preemptions_total is None and snap.prompt_tokens_total == 37020.0


def test_parse_error_is_typed_and_quotes_nothing() -> None:
    (line,) = lines_of(last_body(), "vllm:prompt_tokens_total")
    secret = "prompt-text-must-not-leak"
    with pytest.raises(MetricsParseError) as info:
        parse_metrics(last_body().replace(line, line + secret), 1.0)
    assert secret not in str(info.value) and "tiny" not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    with pytest.raises(MetricsParseError):
        parse_metrics("<html><body>Not Found</body></html>", 1.0)


def test_restart_is_a_reset_with_non_negative_deltas() -> None:
    (_, later), (_, earlier) = bodies("preempt")[-1], bodies("preempt")[0]
    tracker = CounterTracker()
    (before,) = tracker.observe(parse_metrics(later, 1.0))
    (after,) = tracker.observe(parse_metrics(earlier, 2.0))  # counters lower: what a vLLM restart looks like
    assert not before.counter_reset and after.counter_reset
    for f in COUNTER_FIELDS:
        prev, cur = getattr(before, f), getattr(after, f)
        assert delta(prev, cur, after.counter_reset) == cur >= 0
    (again,) = tracker.observe(parse_metrics(later, 3.0))  # counting on from the restart: no new reset
    assert not again.counter_reset


def test_real_restart_between_recordings_is_detected() -> None:
    # Each recording had its own vLLM process: scraping preempt's server, then shorts' one, is a restart.
    start = [re.findall(r"^process_start_time_seconds (\S+)$", bodies(s)[0][1], re.M) for s in ("preempt", "shorts")]
    assert start[0] != start[1]
    tracker = CounterTracker()
    tracker.observe(parse_metrics(bodies("preempt")[-1][1], 1.0))
    (first_of_next,) = tracker.observe(parse_metrics(bodies("shorts")[0][1], 2.0))
    assert first_of_next.counter_reset


def test_reset_is_seen_across_a_scrape_missing_the_counter() -> None:
    tracker = CounterTracker()
    (line,) = lines_of(last_body(), "vllm:num_preemptions_total")
    tracker.observe(parse_metrics(last_body(), 1.0))
    (gap,) = tracker.observe(parse_metrics(last_body().replace(line, ""), 2.0))
    assert gap.preemptions_total is None and not gap.counter_reset
    lower = last_body().replace(line, line.replace(" 5.0", " 0.0"))
    assert tracker.observe(parse_metrics(lower, 3.0))[0].counter_reset


def test_delta() -> None:
    assert delta(4.0, 5.0, False) == 1.0
    assert delta(5.0, 2.0, True) == 2.0
    assert delta(5.0, 2.0, False) == 2.0  # backwards is a reset even if the caller did not say so
    assert delta(None, 2.0, False) is None and delta(1.0, None, True) is None
    assert delta(None, 2.0, True) == 2.0


def test_tracker_keys_are_bounded() -> None:
    tracker = CounterTracker(max_keys=3)
    base = parse_metrics(last_body(), 1.0)[0]
    for i in range(10):
        tracker.observe([dataclasses.replace(base, engine=str(i))])
    assert len(tracker) == 3
    with pytest.raises(ValueError):
        CounterTracker(max_keys=0)


# --- robustness: arbitrary text and mutated real bodies raise MetricsParseError or nothing -------------

SAMPLE_BODIES = tuple(text for s in SCENARIOS for i, (_, text) in enumerate(bodies(s)) if i % 15 == 0)
KNOWN_NAMES = sorted({n for m in NAMES.values() for name in (m.name, *(a.name for a in m.aliases))
                      for n in sample_names(m, name)} | {"vllm:cache_config_info"})


OPS = st.lists(st.tuples(st.sampled_from(["cut", "flip", "flip_known", "drop", "dup", "splice", "insert"]),
                         st.integers(0, 1 << 20), st.integers(0, 300), st.integers(1, 255),
                         st.sampled_from(KNOWN_NAMES), st.sampled_from(SAMPLE_BODIES)), min_size=1, max_size=4)
WINDOW = st.one_of(st.none(), st.tuples(st.integers(0, 1 << 20), st.integers(0, 60)))


@st.composite
def mutated_bodies(draw: st.DrawFn) -> str:
    """A real body (or a window of its lines) cut, bit-flipped (often inside a series we read) and spliced."""
    text = draw(st.sampled_from(SAMPLE_BODIES))
    window = draw(WINDOW)
    if window is not None:  # fewer lines, so corruption lands among the ones we read more often
        lines = text.split("\n")
        a = window[0] % (len(lines) + 1)
        text = "\n".join(lines[a:a + window[1]])
    for op, pos, span, bits, name, other in draw(OPS):
        n = len(text)
        i = pos % (n + 1)
        j = min(n, i + span)
        if op == "flip_known" and n:
            at = text.find(name)
            i = min(n - 1, (at if at >= 0 else i) + pos % 1500)
        if op in ("flip", "flip_known") and i < n:
            text = text[:i] + chr(ord(text[i]) ^ bits) + text[i + 1:]
        elif op == "cut":
            text = text[:i]
        elif op == "drop":
            text = text[:i] + text[j:]
        elif op == "dup":
            text = text[:j] + text[i:j] + text[j:]
        elif op == "splice":
            k = pos % (len(other) + 1)
            text = text[:i] + other[k:k + j - i] + text[j:]
        elif op == "insert":
            text = text[:i] + draw(st.text(max_size=30)) + text[i:]
    return text


PROM_ALPHABET = st.sampled_from(list('{}=",# \n\t\\:_.eE+-0123456789abcxyzNaIf') + ["\r", "\x00", "\u2028", "é"])
PROM_TOKENS = st.sampled_from([*KNOWN_NAMES, "# TYPE ", "# HELP ", " counter", " histogram", 'engine="0"',
                               'model_name="tiny"', 'block_size="128"', "le=", "NaN", "+Inf", "1.0", "\n", ","])
ARBITRARY = st.one_of(st.text(), st.text(PROM_ALPHABET), st.lists(PROM_TOKENS, max_size=40).map("".join))


def _parse_or_typed_error(text: str) -> None:
    try:
        snaps = parse_metrics(text, 1.0)
    except MetricsParseError as e:
        assert "\n" not in str(e) and e.__cause__ is None
        return
    assert len({(s.engine, s.model_name) for s in snaps}) == len(snaps)
    CounterTracker().observe(snaps)


# Volume (>= 10,000 cases a parser, counted where the parsing happens) is the seeded mutation fuzzer's job
# (tests/unit/fuzz/test_fuzz_metrics.py, ~1 s); these properties draw structured inputs beside it. Each except
# clause of the parser narrowed in turn (an injected bug): those they catch, they catch in the first
# ~20 examples.
PROPERTY_EXAMPLES = 1_000


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(ARBITRARY)
def test_arbitrary_text_raises_only_parse_error(text: str) -> None:
    _parse_or_typed_error(text)


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutated_bodies())
def test_mutated_real_bodies_raise_only_parse_error(text: str) -> None:
    _parse_or_typed_error(text)
