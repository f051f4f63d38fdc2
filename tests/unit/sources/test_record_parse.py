"""checked_record_parse, the one shape of every replayed source's record parser: rejections counted, never raised."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from attrib_agent.events import Event, GpuSample
from attrib_agent.health import SourceHealth
from attrib_agent.sources.nvml.source import record_parser as nvml_record_parser
from attrib_agent.sources.source import ReplayContext, checked_record_parse


class Rejected(ValueError):
    reason = "too_new"


def _parse(rec: Mapping[str, Any], ts: float) -> Sequence[Event]:
    if rec.get("kind") == "new":
        raise Rejected("a newer version")
    return (_sample(ts, int(rec["gpu"])),)  # KeyError without a gpu; ValueError when not a number


def _sample(ts: float, gpu: int) -> GpuSample:
    return GpuSample(ts=ts, gpu=gpu, uuid=None, memory_used_bytes=None, memory_total_bytes=None,
                     memory_util_pct=None, dram_bw_util_pct=None)


@pytest.mark.parametrize("count_success", [True, False])
def test_rejections_are_counted_by_reason_and_good_records_by_success(count_success: bool) -> None:
    health = SourceHealth("s")
    parse = checked_record_parse(_parse, health, bad_input=(Rejected,), reason=lambda e: getattr(e, "reason", "?"),
                                 bad_record=(KeyError, ValueError), count_success=count_success)
    assert parse({"kind": "new"}, 1.0) == ()  # Rejected is a ValueError too: its reason wins, as listed first
    assert parse({}, 2.0) == () and parse({"gpu": "x"}, 3.0) == ()
    (sample,) = parse({"gpu": 3}, 4.0)
    assert isinstance(sample, GpuSample) and sample.gpu == 3
    assert health.skipped == {"too_new": 1, "malformed_record": 2}
    assert health.ok_total == (1 if count_success else 0)


def test_a_source_other_errors_still_raise() -> None:
    def broken(rec: Mapping[str, Any], ts: float) -> Sequence[Event]:
        raise RuntimeError("a bug, not bad input")

    with pytest.raises(RuntimeError):
        checked_record_parse(broken, SourceHealth("s"), bad_record=(KeyError,))({}, 1.0)


def test_the_nvml_record_parser_through_the_wrapper() -> None:
    health = SourceHealth("nvml")
    parse = nvml_record_parser(ReplayContext(health))
    good = {"ts": 1.0, "gpu": 0, "uuid": None, "memory_used_bytes": 1, "memory_total_bytes": 2,
            "memory_util_pct": None, "dram_bw_util_pct": None, "extra": "ignored"}
    assert parse(good, 1.0) == (_sample(1.0, 0).__class__(**{k: v for k, v in good.items() if k != "extra"}),)
    assert parse({"ts": 1.0}, 2.0) == ()  # fields missing: GpuSample() raises TypeError
    assert health.skipped == {"malformed_record": 1} and health.ok_total == 1
