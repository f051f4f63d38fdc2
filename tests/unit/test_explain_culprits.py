"""explain on real recordings: every listed culprit has blamed time that reads as such, a share and a cause."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attrib_agent.attribution.attributor import MIN_CULPRIT_S
from attrib_agent.attribution.result_codec import to_dict
from attrib_agent.cli.report import explain_table
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sources.replay import ReplaySource

RECORDINGS = Path(__file__).parents[1] / "fixtures" / "recordings"
ROW = re.compile(r"^  \S+(?: \[whale\])?\s+(?P<ttft>[\d.]+ m?s)\s+(?P<itl>[\d.]+ m?s)"
                 r"\s+(?P<share>\d+)%  (?P<causes>.*)$")


@pytest.mark.parametrize("name", ["whale1", "whale2"])
def test_no_listed_culprit_reads_zero_or_has_no_cause(name: str) -> None:
    p = AttributionPipeline()
    for ev in ReplaySource(RECORDINGS / name).events():
        p.feed(ev)
    p.settle()
    rows = 0
    for r in p.store:
        for c in r.culprits:
            assert c.ttft_s + max(r.itl_gaps, 1) * c.itl_s >= MIN_CULPRIT_S and c.share > 0
        table = explain_table({**to_dict(r), "status": "final"})
        for line in table.splitlines():
            m = ROW.match(line)
            if m is None:
                continue
            rows += 1
            assert (m["ttft"], m["itl"]) != ("0 ms", "0 ms") and m["causes"] != "-", line
    assert rows > 20  # ITL-only culprits included (most of these recordings' culprits)
