"""LogLineParser on real vLLM 0.32 recordings, re-rendered through vLLM's own formatters.

No vLLM line here is hand-written: lines come from the recordings, or from vLLM's real formatter classes
(vllm/logging_utils/formatter.py, loaded by path) fed vLLM's own format strings, read from its source with
`ast`. Importing vllm itself would take ~8 s of CPU, so the tests only read its files.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import logging
import math
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attrib_agent.events import (
    EngineStep,
    RequestAborted,
    RequestAdded,
    RequestFailed,
    RequestReceived,
    StatsLine,
)
from attrib_agent.health import SourceHealth
from attrib_agent.lab.server import LOG_DATEFMT, LOG_FORMAT
from attrib_agent.recording import CLIENT, LOG, Recording
from attrib_agent.sources.log import parser as log_parser
from attrib_agent.sources.log.parser import LogEvent, LogLineParser

RECORDINGS = Path(__file__).parents[2] / "fixtures" / "recordings"
NAMES = ["shorts", "whale1", "whale2", "preempt"]
CANARY = RECORDINGS / "canary"
LAB_LINE = re.compile(
    r"\((?P<proc>\S+) pid=(?P<pid>\d+)\) (?P<level>[A-Z]+) (?P<date>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.(?P<ms>\d{3}) "
    r"\[(?P<file>[^:\]]+):(?P<lineno>\d+)\] (?P<msg>.*)"
)


# --- vLLM's own formats, read from its installed source --------------------------------------------------

def _vllm_root() -> Path:
    spec = importlib.util.find_spec("vllm")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vllm is not installed in this venv: its formats cannot be read")
    return Path(next(iter(spec.submodule_search_locations)))


@functools.cache
def _source(relpath: str) -> str:
    return (_vllm_root() / relpath).read_text()


@functools.cache
def _logged_formats(relpath: str) -> dict[str, int]:
    """Every constant format string a logger call in vllm/<relpath> passes, with the call's line."""
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(_source(relpath))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args
                and node.func.attr in {"debug", "info", "warning", "error", "exception"}
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out[node.args[0].value] = node.lineno
    return out


def vllm_format(relpath: str, fmt: str) -> tuple[str, int]:
    formats = _logged_formats(relpath)
    assert fmt in formats, f"vllm/{relpath} no longer logs {fmt!r}: vLLM changed, update log_patterns"
    return fmt, formats[fmt]


def vllm_constant(relpath: str, text: str) -> str:
    assert text in _source(relpath), f"vllm/{relpath} no longer holds {text!r}"
    return text


@functools.cache
def _formatter_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_vllm_log_formatter", _vllm_root() / "logging_utils/formatter.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # imports only logging and pathlib
    return mod


@functools.cache
def _default_format() -> tuple[str, str]:
    """vllm/logger.py `_FORMAT` (with the default empty VLLM_LOGGING_PREFIX) and `_DATE_FORMAT`."""
    values: dict[str, str] = {}
    for node in ast.parse(_source("logger.py")).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            v = node.value
            if isinstance(v, ast.JoinedStr):
                values[node.targets[0].id] = "".join(str(c.value) for c in v.values if isinstance(c, ast.Constant))
            elif isinstance(v, ast.Constant) and isinstance(v.value, str):
                values[node.targets[0].id] = v.value
    return values["_FORMAT"], values["_DATE_FORMAT"]


def formatter(kind: str) -> logging.Formatter:
    """vLLM's formatter for `kind` (lab, default, color, json), printing UTC as vLLM does with TZ=UTC."""
    mod = _formatter_module()
    fmt: logging.Formatter
    if kind == "lab":
        fmt = mod.NewLineFormatter(LOG_FORMAT, LOG_DATEFMT)
    elif kind == "default":
        fmt = mod.NewLineFormatter(*_default_format())
    elif kind == "color":
        fmt = mod.ColoredFormatter(*_default_format())
    else:
        from pythonjsonlogger.json import JsonFormatter

        # "json-datefmt": a dictConfig pairing the JSON formatter with vLLM's own datefmt (no year, 1 s)
        fmt = JsonFormatter(mod.JSON_FORMAT, datefmt=_default_format()[1] if kind == "json-datefmt" else None)
    fmt.converter = time.gmtime
    return fmt


def make_record(template: str, msg: str, args: tuple[Any, ...] = (), *, level: str | None = None,
                relpath: str | None = None, lineno: int | None = None, shift_s: float = 0.0) -> logging.LogRecord:
    """A LogRecord as vLLM made it for a recorded lab line (`template`), optionally with another message."""
    m = LAB_LINE.fullmatch(template)
    assert m, "not a lab-format line"
    created = datetime.strptime(m["date"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp() + shift_s
    rec = logging.LogRecord(
        "vllm." + (relpath or m["file"]).removesuffix(".py").replace("/", "."),
        logging.getLevelNamesMapping()[level or m["level"]], relpath or m["file"], lineno or int(m["lineno"]), msg,
        args or None, None,
    )
    rec.created, rec.msecs = created + int(m["ms"]) / 1000, float(m["ms"])
    rec.process, rec.processName, rec.vllm_process_name = int(m["pid"]), "MainProcess", m["proc"]
    return rec


def render(kind: str, record: logging.LogRecord) -> list[str]:
    """The lines vLLM writes for one record, as a tailer hands them over (newline gone, "\\r" kept)."""
    return formatter(kind).format(record).split("\n")


# --- recordings -----------------------------------------------------------------------------------------

@functools.cache
def log_lines(name: str) -> tuple[tuple[float, str], ...]:
    return tuple((r["ts"], r["line"]) for r in Recording(RECORDINGS / name).records(LOG))


def parse_lines(lines: Any, parser: LogLineParser | None = None) -> tuple[list[LogEvent], SourceHealth]:
    parser = parser or LogLineParser(SourceHealth("log"))
    events: list[LogEvent] = []
    for ts, line in lines:
        events += parser.parse_all(line, ts)
    return events, parser.health


def rerendered(name: str, kind: str) -> list[tuple[float, str]]:
    """A recording's lines as vLLM would have printed them with formatter `kind`."""
    out: list[tuple[float, str]] = []
    for ts, line in log_lines(name):
        m = LAB_LINE.fullmatch(line)
        assert m, "not a lab-format line"
        out += [(ts, x) for x in render(kind, make_record(line, m["msg"]))]
    return out


def first_line(name: str, needle: str) -> str:
    return next(line for _, line in log_lines(name) if needle in line)


# --- whole recordings -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["preempt", "whale2"])
def test_golden_events(name: str, golden: Callable[[str, str], None]) -> None:
    events, health = parse_lines(log_lines(name))
    text = "".join(f"{e!r}\n" for e in events)
    text += f"# ok_total={health.ok_total} skipped={sorted(health.skipped.items())} errors={dict(health.errors)}\n"
    golden(f"logs/{name}.events.txt", text)


@pytest.mark.parametrize("name", NAMES + ["canary"])
def test_every_iteration_line_is_one_engine_step(name: str) -> None:
    if not (RECORDINGS / name).is_dir():
        pytest.skip(f"recording {name} not present")
    parser = LogLineParser(SourceHealth("log"))
    n = 0
    for ts, line in log_lines(name):
        events = parser.parse_all(line, ts)
        if "Iteration(" in line:
            n += 1
            assert len(events) == 1 and isinstance(events[0], EngineStep)
            assert f"Iteration({events[0].iteration})" in line and events[0].device == "CPU"
        else:
            assert not any(isinstance(e, EngineStep) for e in events)
    assert n > 100


@pytest.mark.parametrize("name", NAMES + ["canary"])
def test_every_client_request_is_received_and_added(name: str) -> None:
    if not (RECORDINGS / name).is_dir():
        pytest.skip(f"recording {name} not present")
    events, health = parse_lines(log_lines(name))
    clients = list(Recording(RECORDINGS / name).records(CLIENT))
    received = {e.request_id: e for e in events if isinstance(e, RequestReceived)}
    added = {e.request_id: e for e in events if isinstance(e, RequestAdded)}
    for c in clients:
        rid = c["vllm_request_id"]
        assert received[rid].max_tokens == c["max_tokens"]
        assert added[rid].internal_id.startswith(rid + "-") and len(added[rid].internal_id) == len(rid) + 9
        assert (r := received[rid].log_ts) is not None and (a := added[rid].log_ts) is not None and r <= a
    assert health.errors == {} and "parser_error" not in health.skipped


def test_real_lines_have_no_unknowns_and_receipt_follows_log_time() -> None:
    for name in NAMES:
        events, health = parse_lines(log_lines(name))
        assert health.skipped == {} and health.ok_total == len(events) == len(log_lines(name))
        assert all(e.log_ts is not None and 0 <= e.ts - e.log_ts < 0.5 for e in events)


def test_stats_line_optional_parts_from_real_line() -> None:
    events, _ = parse_lines(log_lines("preempt"))
    stats = [e for e in events if isinstance(e, StatsLine)]
    assert len(stats) == 1
    assert dataclasses.astuple(stats[0])[2:] == (0, 1217.8, 163.8, 2, 0, 0.347, 0.0, None)


# --- the same lines in vLLM's other formats ---------------------------------------------------------------

def test_rerendering_reproduces_the_recorded_lines_exactly() -> None:
    """The renderer is faithful: the lab format through vLLM's formatter gives back each recorded line."""
    for name in NAMES:
        assert rerendered(name, "lab") == list(log_lines(name))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind", ["default", "color", "json-datefmt"])
def test_default_format_gives_the_same_events_to_the_second(name: str, kind: str) -> None:
    lines = rerendered(name, kind)
    assert lines[0][1].startswith(("(APIServer pid=", "\x1b[0;36m(APIServer pid=", '{"asctime": "11-22 00:'))
    lab, _ = parse_lines(log_lines(name))
    default, health = parse_lines(lines)
    assert health.skipped == {}
    assert default == [dataclasses.replace(e, log_ts=math.floor(e.log_ts or 0)) for e in lab]


@pytest.mark.parametrize("name", NAMES)
def test_json_format_gives_the_same_events(name: str) -> None:
    lines = rerendered(name, "json")
    assert lines[0][1].startswith('{"asctime": "2026-')
    lab, _ = parse_lines(log_lines(name))
    assert parse_lines(lines)[0] == lab


def test_default_format_year_is_the_one_nearest_receipt() -> None:
    """A line stamped 12-31 23:59:59 received just after new year belongs to the old year."""
    line = first_line("whale2", "Added request")
    m = LAB_LINE.fullmatch(line)
    assert m
    stamped = datetime.strptime(m["date"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    shift = datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp() - stamped.timestamp()
    (out,) = render("default", make_record(line, m["msg"], shift_s=shift))
    assert " 12-31 23:59:59 " in out
    new_year = datetime(2027, 1, 1, 0, 0, 2, tzinfo=UTC).timestamp()
    event = LogLineParser(SourceHealth("log")).parse(out, new_year)
    assert event is not None and event.log_ts == new_year - 3


# --- message variants, rendered from vLLM's own format strings --------------------------------------------

def _parse_rendered(parser: LogLineParser, template: str, relpath: str, fmt: str, *args: Any,
                    level: str = "INFO") -> list[LogEvent]:
    fmt, lineno = vllm_format(relpath, fmt)
    record = make_record(template, fmt, args, level=level, relpath=relpath.rsplit("/", 1)[-1], lineno=lineno)
    return [e for line in render("lab", record) for e in parser.parse_all(line, 1.0)]


def test_iteration_variants_dummy_gpu_and_encoder() -> None:
    template = first_line("whale2", "Iteration(")
    real = LogLineParser(SourceHealth("log")).parse(template, 1.0)
    assert isinstance(real, EngineStep)
    loggers = "v1/metrics/loggers.py"
    fmt = ("%sIteration(%d): %d context requests, %d context tokens, %d generation requests, %d generation tokens, "
           "iteration elapsed time: %.2f ms%s, %s KV cache usage: %.1f%%%s")
    encoder = (vllm_constant(loggers, ", encoder inputs: ") + "2" + ", "
               + vllm_constant(loggers, "encoder output embeddings: ") + "576")
    prefix = vllm_constant(loggers, "Engine {:03d}: ").format(3)
    parser = LogLineParser(SourceHealth("log"))
    (step,) = _parse_rendered(parser, template, loggers, fmt, prefix, real.iteration, real.context_requests,
                              real.context_tokens, real.generation_requests, real.generation_tokens,
                              real.elapsed_ms, vllm_constant(loggers, " (dummy)"), "GPU", real.kv_usage * 100, encoder)
    assert step == dataclasses.replace(real, ts=1.0, engine=3, device="GPU", dummy=True)


def test_stats_line_variants_from_vllm_parts() -> None:
    loggers = "v1/metrics/loggers.py"
    parts = [vllm_constant(loggers, p) for p in (
        "Avg prompt throughput: %.1f tokens/s", "Avg generation throughput: %.1f tokens/s", "Running: %d reqs",
        "Waiting: %d reqs", "Deferred: %d reqs", "KV fetch: %d waiting to start, %d in progress, %d completed waiting",
        "Preemptions: %d", "%s KV cache usage: %.1f%%", "Prefix cache hit rate: %.1f%%",
        "External prefix cache hit rate: %.1f%%", "MM cache hit rate: %.1f%%")]
    args = (12.5, 3.0, 4, 7, 2, 1, 0, 1, 3, "GPU", 91.2, 40.0, 10.0, 0.0)
    template = first_line("whale2", "Avg prompt throughput")
    m = LAB_LINE.fullmatch(template)
    assert m
    for prefix, engine in ((vllm_constant(loggers, "Engine {:03d}: ").format(1), 1),
                           (vllm_constant(loggers, "{} Engines Aggregated: ").format(2), -1)):
        record = make_record(template, prefix + ", ".join(parts), args)
        (line,) = render("lab", record)
        event = LogLineParser(SourceHealth("log")).parse(line, 1.0)
        assert event == StatsLine(ts=1.0, log_ts=event.log_ts if event else None, engine=engine,
                                  prompt_throughput=12.5, generation_throughput=3.0, running=4, waiting=7,
                                  kv_usage=0.912, prefix_cache_hit_rate=0.4, preemptions=3)


def test_added_aborted_failed_variants() -> None:
    engine, serving = "v1/engine/async_llm.py", "entrypoints/generate/base/serving.py"
    parser = LogLineParser(SourceHealth("log"))
    events, _ = parse_lines(log_lines("whale2"), parser)
    added = {e.request_id: e.internal_id for e in events if isinstance(e, RequestAdded)}
    (w1, i1), (w2, i2), (s0, _) = list(added.items())[:3]
    template = first_line("whale2", "Added request")
    secret = "SECRET-user-text 'x' Request cmpl-evil-0 aborted."

    assert _parse_rendered(parser, template, engine, "Aborted request(s) %s.", ",".join([i1, i2])) == [
        RequestAborted(1.0, _log_ts(template), w1), RequestAborted(1.0, _log_ts(template), w2)]
    assert _parse_rendered(parser, template, engine, "Request %s aborted.", s0) == [
        RequestAborted(1.0, _log_ts(template), s0)]
    for fmt, args, reason in (
        ("Request %s failed (engine dead).", (), "engine_dead"),
        ("Request %s failed (bad request): %s.", (secret,), "bad_request"),
        ("Request %s failed (input error): %s.", (secret,), "input_error"),
        ("Request %s failed due to %s.", (f"{ValueError.__name__}: {ValueError(secret)}",), "ValueError"),
        ("Request %s failed (bad request).", (), "bad_request"),
        ("Request %s failed.", (), "failed"),
    ):
        assert _parse_rendered(parser, template, engine, fmt, s0, *args) == [
            RequestFailed(1.0, _log_ts(template), s0, reason)]
    (failed,) = _parse_rendered(parser, template, serving, "Request %s failed with an internal error during generation",
                                w1, level="ERROR")
    assert failed == RequestFailed(1.0, _log_ts(template), w1, "internal_error")
    # n>1 children `<i>_<internal>` (each its own engine request: `<i>_<external>`) and
    # VLLM_DISABLE_REQUEST_ID_RANDOMIZATION (internal == external)
    assert _parse_rendered(parser, template, engine, "Added request %s.", f"1_{i1}") == [
        RequestAdded(1.0, _log_ts(template), f"1_{w1}", f"1_{i1}")]
    assert _parse_rendered(parser, template, engine, "Added request %s.", w2) == [
        RequestAdded(1.0, _log_ts(template), w2, w2)]
    assert "SECRET" not in repr(parser.health)


def _log_ts(template: str) -> float | None:
    event = LogLineParser(SourceHealth("log")).parse(template, 1.0)
    return event.log_ts if event else None


def test_multiline_failure_text_is_dropped_even_without_carriage_returns() -> None:
    """A validation error may quote the request over several lines: those lines are content, never rows."""
    template = first_line("whale2", "Added request")
    fmt, lineno = vllm_format("v1/engine/async_llm.py", "Request %s failed (bad request): %s.")
    text = "1 validation error\n  Input should be 'SECRET'\nAdded request cmpl-evil-0-0123abcd"
    record = make_record(template, fmt, ("cmpl-x-0", text), relpath="async_llm.py", lineno=lineno)
    lines = render("lab", record)
    assert len(lines) == 3 and lines[0].endswith("\r")
    for strip in (False, True):  # live (the tailer keeps "\r") and as the lab recorder stores it
        health = SourceHealth("log")
        events, _ = parse_lines([(1.0, x.rstrip("\r") if strip else x) for x in lines], LogLineParser(health))
        assert events == [RequestFailed(1.0, _log_ts(template), "cmpl-x-0", "bad_request")]
        assert health.skipped == {"content_dropped": 2}


def test_multiline_debug_output_cannot_inject_a_row() -> None:
    """Tool parsers log model output with %s at DEBUG: its later lines carry vLLM's prefix but are not rows."""
    template = first_line("whale2", "Added request")
    relpath = "tool_parsers/poolside_v1_tool_parser.py"
    fmt, lineno = vllm_format(relpath, "model_output: %s")
    output = "SECRET\nAdded request cmpl-evil-0-0123abcd.\nEngine 000: Avg prompt throughput: 1.0 tokens/s, " \
             "Avg generation throughput: 1.0 tokens/s"
    for kind in ("lab", "default", "json"):
        record = make_record(template, fmt, (output,), level="DEBUG", relpath="poolside_v1_tool_parser.py",
                             lineno=lineno)
        health = SourceHealth("log")
        events, _ = parse_lines([(1.0, x) for x in render(kind, record)], LogLineParser(health))
        assert events == [] and "SECRET" not in repr(health)
        assert sum(health.skipped.values()) == len(render(kind, record))


def test_received_keeps_only_id_and_max_tokens_whatever_the_stop_words() -> None:
    """SamplingParams' repr quotes user stop words; one that looks like a field is not read as one."""
    line = first_line("whale2", "Received request")
    assert "stop=[], " in line and "max_tokens=600, " in line
    stops = ["max_tokens=7, ", "SECRET\\'s (", '") max_tokens=9']
    mutated = line.replace("stop=[], ", f"stop={stops!r}, ", 1)
    for variant, expected in ((mutated, 600), (mutated.replace("max_tokens=600, ", "max_tokens=None, "), None)):
        event = LogLineParser(SourceHealth("log")).parse(variant, 1.0)
        assert isinstance(event, RequestReceived) and event.max_tokens == expected
        assert event.request_id == "cmpl-659b22-w1-0" and "SECRET" not in repr(event)


def test_unknown_real_lines_are_counted() -> None:
    if not CANARY.is_dir():
        pytest.skip("canary recording not present")
    lines = [(ts, x) for ts, x in log_lines("canary") if "Running batch with cudagraph_mode" in x]
    _, health = parse_lines(lines)
    assert health.skipped == {"unknown_line": len(lines)} and len(lines) > 10


def test_id_memory_is_bounded() -> None:
    received, added = first_line("whale2", "Received request"), first_line("whale2", "Added request cmpl-659b22-w1-0")
    parser = LogLineParser(SourceHealth("log"), max_tracked_ids=8)
    for i in range(100):
        parser.parse_all(received.replace("w1-0", f"w1-{i}"), 1.0)
        parser.parse_all(added.replace("w1-0", f"w1-{i}"), 1.0)
    # none ends (no span, no abort): the in-flight memory holds the last 8, each received id left when added
    assert parser.ids.sizes() == {"received": 0, "in_flight": 8, "ended": 0} and parser.health.ok_total == 200


def test_a_parser_bug_is_counted_without_the_line(monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    def broken(m: re.Match[str], ts: float, log_ts: float | None, ids: log_parser.RequestIds) -> list[LogEvent]:
        raise ValueError(f"bad {m.string}")

    monkeypatch.setattr(log_parser, "ROWS", tuple(r._replace(build=broken) for r in log_parser.ROWS))
    health = SourceHealth("log")
    assert LogLineParser(health).parse_all(first_line("whale2", "Received request"), 1.0) == []
    assert health.skipped == {"parser_error": 1} and health.last_error == "parser_error: ValueError"
    assert "cmpl-" not in caplog.text and "ValueError" in caplog.text


# --- privacy: a real DEBUG recording whose prompts carry a canary -----------------------------------------

@pytest.mark.parametrize("kind", ["lab", "default", "json"])
def test_canary_never_leaves_the_parser(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    if not CANARY.is_dir():
        pytest.skip("tests/fixtures/recordings/canary (real vLLM, DEBUG, canary prompts) is not present")
    rec = Recording(CANARY)
    canary = rec.meta["canary"]
    caplog.set_level(logging.DEBUG)
    lines = list(log_lines("canary")) if kind == "lab" else rerendered("canary", kind)
    health = SourceHealth("log")
    parser = LogLineParser(health)
    events: list[LogEvent] = []
    content_lines = 0
    for ts, line in lines:
        before = health.skipped["content_dropped"]
        got = parser.parse_all(line, ts)
        events += got
        if canary in line or "Generated response" in line:
            content_lines += 1
            assert got == [] and health.skipped["content_dropped"] == before + 1
    assert content_lines >= 8 and health.skipped["content_dropped"] == content_lines
    assert canary not in repr(events) and canary.split("-")[1] not in repr(events)
    assert canary not in repr(dataclasses.asdict(health))
    assert all(canary not in r.getMessage() and canary not in str(r.args) for r in caplog.records)
    ids = {c["vllm_request_id"] for c in rec.records(CLIENT)}
    assert ids == {e.request_id for e in events if isinstance(e, RequestReceived)}


# --- robustness -----------------------------------------------------------------------------------------

@functools.cache
def _real_pool() -> tuple[str, ...]:
    names = NAMES + (["canary"] if CANARY.is_dir() else [])
    pool = {line for name in names for _, line in log_lines(name)[:60]}
    pool |= {line for _, line in rerendered("whale2", "default")[:30] + rerendered("whale2", "json")[:30]}
    return tuple(sorted(pool))


@st.composite
def mutated_lines(draw: st.DrawFn) -> str:
    line = draw(st.sampled_from(_real_pool()))
    for _ in range(draw(st.integers(1, 2))):
        i = draw(st.integers(0, len(line)))
        op = draw(st.sampled_from(["cut", "flip", "insert", "delete", "splice", "cr"]))
        if op == "cut":
            line = line[:i]
        elif op == "flip":
            line = line[:i] + draw(st.characters()) + line[i + 1:]
        elif op == "insert":
            line = line[:i] + draw(st.text(max_size=8)) + line[i:]
        elif op == "delete":
            line = line[:i] + line[i + draw(st.integers(1, 20)):]
        elif op == "splice":
            other = draw(st.sampled_from(_real_pool()))
            line = line[:i] + other[draw(st.integers(0, len(other))):]
        else:
            line += "\r"
    return line


def _every_line_is_counted(lines: list[str]) -> None:
    health = SourceHealth("log")
    parser = LogLineParser(health)
    for line in lines:
        before = health.ok_total + sum(health.skipped.values())
        parser.parse_all(line, 1_795_307_359.0)
        assert health.ok_total + sum(health.skipped.values()) > before
    assert "parser_error" not in health.skipped and not health.errors


# Volume (>= 10,000 cases a parser, counted where the parsing happens) is the seeded mutation fuzzer's job
# (tests/unit/fuzz/test_fuzz_log_line.py, ~1 s); these properties draw structured inputs beside it. Each except
# clause of the parser narrowed in turn (an injected bug): arbitrary text caught a non-JSON '{' line escaping as
# ValueError at example 56-489 (7 seeds), hence 3,000. Mutated real lines also caught a log stamp out of
# range escaping datetime() as ValueError only at example 1,201 and 2,764 (seeds 0, 1): they keep 10,000.
PROPERTY_EXAMPLES = 3_000
MUTATED_LINE_EXAMPLES = 10_000


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(), min_size=1, max_size=4))
def test_arbitrary_text_never_raises_and_is_counted(lines: list[str]) -> None:
    _every_line_is_counted(lines)


@settings(max_examples=MUTATED_LINE_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutated_lines(), min_size=1, max_size=3))
def test_mutated_real_lines_never_raise_and_are_counted(lines: list[str]) -> None:
    _every_line_is_counted(lines)
