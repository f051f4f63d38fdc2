"""Pure parsing of a vLLM /metrics body into one `MetricsSnapshot` per engine, and counter-reset tracking.

Parsing is prometheus_client's; this module only picks the series of `vllm_names` (old names
resolved to new ones) and groups them by their `engine` / `model_name` labels. No clock, no I/O: the
poller and replay call the same code with the body and its receipt time.

prometheus_client's text parser costs ~23 ms of CPU for a 0.32 body (600 lines, half of them histogram
buckets we never read): half a core at the 50 ms minimum interval. So only the lines of series we read
go through it; the whole body is parsed only when none are found, to tell "no vLLM series" (e.g.
`--disable-log-stats`) from a body that is not Prometheus text at all. A broken line in a series we do
not read is therefore ignored, not an error.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

from attrib_agent.events import MetricsSnapshot
from attrib_agent.sources.metrics.vllm_names import METRICS, resolve_sample, sample_names

MAX_ENGINES: Final = 256
"""Most (engine, model_name) pairs one body may yield; a real server has one per data-parallel rank."""

# (canonical name, sample suffix) -> MetricsSnapshot field.
_FIELDS: Final[Mapping[tuple[str, str], str]] = {
    ("vllm:num_requests_running", ""): "running",
    ("vllm:num_requests_waiting", ""): "waiting",
    ("vllm:kv_cache_usage_perc", ""): "kv_usage",
    ("vllm:num_preemptions_total", ""): "preemptions_total",
    ("vllm:prompt_tokens_total", ""): "prompt_tokens_total",
    ("vllm:generation_tokens_total", ""): "generation_tokens_total",
    ("vllm:iteration_tokens_total", "_count"): "iteration_tokens_count",
    ("vllm:iteration_tokens_total", "_sum"): "iteration_tokens_sum",
    ("vllm:prefix_cache_queries_total", ""): "prefix_cache_queries_total",
    ("vllm:prefix_cache_hits_total", ""): "prefix_cache_hits_total",
}
_CACHE_CONFIG: Final = "vllm:cache_config_info"

COUNTER_FIELDS: Final = (
    "preemptions_total",
    "prompt_tokens_total",
    "generation_tokens_total",
    "iteration_tokens_count",
    "iteration_tokens_sum",
    "prefix_cache_queries_total",
    "prefix_cache_hits_total",
)
"""The snapshot fields that only grow while vLLM runs: one going backwards means a restart."""

# vLLM before V1 (<= 0.8) labelled series with model_name only, and ran one engine.
_DEFAULT_ENGINE: Final = "0"
_ALL_ENGINES: Final = None


class MetricsParseError(ValueError):
    """A body prometheus_client cannot parse (or not one vLLM would serve); never quotes the body."""


def _value(v: float) -> float | None:
    # Every value we read is a non-negative count, ratio or size; anything else is no reading at all.
    f = float(v)
    return f if math.isfinite(f) and f >= 0 else None


def _label_int(labels: Mapping[str, str], name: str) -> int | None:
    raw = labels.get(name, "")  # vLLM prints "None" for a field it has not set
    return int(raw) if raw.isascii() and raw.isdecimal() and len(raw) < 20 else None


def _is_known(line: str) -> bool:
    """Whether a stripped line is a sample of a series we read, named the way prometheus_client reads it."""
    if not line.startswith("vllm:"):
        return False
    end = len(line)
    for stop in ("{", " ", "\t"):
        i = line.find(stop, 0, end)
        if i >= 0:
            end = i
    name = line[:end]
    return name == _CACHE_CONFIG or resolve_sample(name) is not None


def _known_names() -> frozenset[str]:
    names = {_CACHE_CONFIG} | {sample for m in METRICS.values() for name in (m.name, *(a.name for a in m.aliases))
                               for sample in sample_names(m, name)}
    if not all(n.startswith("vllm:") and (n == _CACHE_CONFIG or resolve_sample(n)) for n in names):
        raise ValueError("every series read is named vllm:... and resolves")
    return frozenset(names)


def _trie(words: list[str]) -> str:
    """A regex matching exactly `words` (longest first), shared beginnings factored out: re tries alternatives one
    by one, so at each of a body's ~800 "vllm:" a flat list of ~30 names costs ~30 tries, this a few."""
    if len(words) == 1:
        return re.escape(words[0])
    groups: dict[str, list[str]] = {}
    for w in words:
        groups.setdefault(w[:1], []).append(w[1:])
    alternatives = []
    for first in sorted((k for k in groups if k), key=lambda k: -max(map(len, groups[k]))):
        common = os.path.commonprefix(groups[first])
        tails = sorted((r[len(common):] for r in groups[first]), key=len, reverse=True)
        body = _trie(tails)
        alternatives.append(re.escape(first + common) + (body if len(tails) == 1 else f"(?:{body})"))
    if "" in groups:
        alternatives.append("")  # a word ending here: tried after every longer one
    return "|".join(alternatives)


_NAMES: Final = _known_names()
_KNOWN_NAME: Final = re.compile("vllm:(?:" + _trie(sorted((n[5:] for n in _NAMES), key=len, reverse=True)) + ")")
"""Every name a kept line can start with. A kept line contains its own name, so only lines holding one of them
need the per-line test: the search skips the ~600 others (mostly histogram buckets) at C speed."""


_STOPS: Final = ("{", " ", "\t")  # what ends a sample's name (`_is_known`)
_COMMENTS: Final = ("# HELP ", "# TYPE ")


def _known_lines(text: str) -> list[str]:
    """The sample lines of series we read, found by name the way prometheus_client would read it."""
    kept = []
    pos = 0
    search = _KNOWN_NAME.search
    while (m := search(text, pos)) is not None:
        # as prometheus_client's StringIO reads it: "\n" only ends a line
        start = m.start()
        before = text[start - 1] if start else "\n"
        end = text.find("\n", m.end())
        end = len(text) if end < 0 else end
        after = text[m.end():m.end() + 1]
        if before == "\n" and after in _STOPS:
            kept.append(text[start:end].strip())  # the usual sample line: its name, then labels or value
        elif before == "\n" and after and not after.isspace():
            pass  # its name runs on past the longest name we read (`..._waiting_by_reason`): not one of ours
        elif before == " " and start >= 7 and text.startswith(_COMMENTS, start - 7) and (
                start == 7 or text[start - 8] == "\n"):
            pass  # the `# HELP` and `# TYPE` lines of a family we read: a comment, never a sample
        elif before == "\n" or before.isspace():
            line = text[text.rfind("\n", 0, start) + 1:end].strip()
            if _is_known(line):
                kept.append(line)
        # else (e.g. a `# HELP` line or a label value): the leftmost known name in a kept line starts it
        pos = end + 1
    return kept


_MAX_MEMO_LINE: Final = 8192


@functools.lru_cache(maxsize=256)
def _memo_sample(line: str) -> tuple[str, Mapping[str, str], float]:
    return _sample(line)


def _sample(line: str) -> tuple[str, Mapping[str, str], float]:
    """(name, labels, value) of one sample line. Alone, a sample line is parsed exactly as among others (with
    no `# TYPE` before it, each is its own untyped family), so lines can be parsed, and remembered, one by
    one: vLLM repeats most of them between scrapes (cache_config_info's ~60 labels cost ~0.3 ms a parse)."""
    (family,) = text_string_to_metric_families(line)
    (sample,) = family.samples
    return sample.name, MappingProxyType(sample.labels), sample.value


_PLAIN_VALUE: Final = re.compile(r"[0-9]{1,30}(?:\.[0-9]{1,30})?")


@functools.lru_cache(maxsize=256)
def _memo_head(head: str) -> tuple[str, Mapping[str, str]] | None:
    """Name and labels of a `name{labels}` head. prometheus_client reads them before, and apart from, the value,
    so they are the same under any value: parsed once with a stand-in one (None: let the whole line say why)."""
    try:
        name, labels, _ = _sample(head + " 0")
    except Exception:
        return None
    return name, labels


def _parse_line(line: str) -> tuple[str, Mapping[str, str], float]:
    if len(line) > _MAX_MEMO_LINE:
        return _sample(line)
    # A counter's line changes every scrape, but only in its value: the usual `name{labels} 12.0` is parsed by
    # its head, remembered, and the value as prometheus_client reads a plain one (int, else float).
    # One brace pair, closing the head: nothing (an exemplar's `# {...}`) sits between the labels and the value.
    head, _, value = line.rpartition(" ")
    if head.endswith("}") and head.count("}") == 1 and head.count("{") == 1 and _PLAIN_VALUE.fullmatch(value):
        labelled = _memo_head(head)
        if labelled is not None:
            return labelled[0], labelled[1], float(value) if "." in value else int(value)
    return _memo_sample(line)


def parse_metrics(text: str, ts: float, *, max_engines: int = MAX_ENGINES) -> list[MetricsSnapshot]:
    """One snapshot per (engine, model_name) with any series we read, sorted; [] when vLLM exposes none.

    `vllm:cache_config_info` gives block_size/num_gpu_blocks to its `engine` (to every engine when the
    label is absent, as before V1). Raises MetricsParseError for an unparseable body.
    """
    values: dict[tuple[str, str], dict[str, tuple[float | None, bool]]] = {}
    cache: dict[str | None, tuple[int | None, int | None]] = {}
    known = _known_lines(text)
    try:
        if not known:
            for _ in text_string_to_metric_families(text):
                pass
            return []
        for sample_name, labels, sample_value in map(_parse_line, known):
            if sample_name == _CACHE_CONFIG:
                cache[labels.get("engine", _ALL_ENGINES)] = (
                    _label_int(labels, "block_size"), _label_int(labels, "num_gpu_blocks"))
                continue
            resolved = resolve_sample(sample_name)
            if resolved is None:
                continue
            metric, suffix, is_alias = resolved
            field = _FIELDS.get((metric.name, suffix))
            if field is None:
                continue
            key = (labels.get("engine", _DEFAULT_ENGINE), labels.get("model_name", ""))
            fields = values.get(key)
            if fields is None:
                if len(values) >= max_engines:
                    raise MetricsParseError(f"more than {max_engines} engine/model_name label pairs")
                fields = values[key] = {}
            if is_alias and field in fields and not fields[field][1]:
                continue  # vLLM exposed both names (deprecation window): the current one wins
            fields[field] = (_value(sample_value), is_alias)
    except MetricsParseError:
        raise
    except Exception as e:  # the one boundary with prometheus_client: anything it throws means a bad body
        # `from None`: its messages quote the offending line, which must not travel with our error.
        raise MetricsParseError(f"unparseable /metrics body ({type(e).__name__}, {len(text)} chars)") from None

    snapshots = []
    for (engine, model_name), fields in sorted(values.items()):
        block_size, num_gpu_blocks = cache.get(engine, cache.get(_ALL_ENGINES, (None, None)))
        got = {name: v for name, (v, _) in fields.items()}
        snapshots.append(MetricsSnapshot(
            ts=ts, engine=engine, model_name=model_name,
            running=got.get("running"), waiting=got.get("waiting"), kv_usage=got.get("kv_usage"),
            preemptions_total=got.get("preemptions_total"),
            prompt_tokens_total=got.get("prompt_tokens_total"),
            generation_tokens_total=got.get("generation_tokens_total"),
            iteration_tokens_count=got.get("iteration_tokens_count"),
            iteration_tokens_sum=got.get("iteration_tokens_sum"),
            prefix_cache_queries_total=got.get("prefix_cache_queries_total"),
            prefix_cache_hits_total=got.get("prefix_cache_hits_total"),
            block_size=block_size, num_gpu_blocks=num_gpu_blocks,
        ))
    return snapshots


def delta(prev_total: float | None, cur_total: float | None, reset: bool) -> float | None:
    """Growth of a counter between two scrapes, never negative: after a reset it is the new total."""
    if cur_total is None:
        return None
    if reset or (prev_total is not None and cur_total < prev_total):
        return max(cur_total, 0.0)
    if prev_total is None:
        return None
    return cur_total - prev_total


class CounterTracker:
    """Flags snapshots whose counters went backwards since the last one of the same engine (a vLLM restart).

    Remembers the last known value of each counter per (engine, model_name), for at most `max_keys`
    keys (least recently seen dropped first), so a stream of ever-new label values cannot grow it.
    """

    def __init__(self, max_keys: int = MAX_ENGINES) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be >= 1")
        self.max_keys = max_keys
        self._last: OrderedDict[tuple[str, str], tuple[float | None, ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._last)

    def observe(self, snapshots: Iterable[MetricsSnapshot]) -> list[MetricsSnapshot]:
        """The snapshots, in order, each with `counter_reset=True` when any counter went backwards."""
        out = []
        for snap in snapshots:
            key = (snap.engine, snap.model_name)
            current = tuple(getattr(snap, f) for f in COUNTER_FIELDS)
            last = self._last.pop(key, None)
            if last is None:
                last = (None,) * len(COUNTER_FIELDS)
            elif any(c is not None and p is not None and c < p for p, c in zip(last, current, strict=True)):
                snap = replace(snap, counter_reset=True)
                last = (None,) * len(COUNTER_FIELDS)  # totals from before the restart mean nothing now
            # Keep the last known value of a counter missing from this scrape, to compare the next one with.
            self._last[key] = tuple(p if c is None else c for p, c in zip(last, current, strict=True))
            while len(self._last) > self.max_keys:
                self._last.popitem(last=False)
            out.append(snap)
        return out
