"""The packed cause and evidence maps every stored result holds (attribution/compact.py): they read like the
dicts they replace, and a result's JSON is byte for byte what it was with dicts."""

from __future__ import annotations

import copy
import json
import pickle
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attrib_agent.attribution.compact import (
    CAUSE_NAMES,
    EVIDENCE_NAMES,
    NO_CAUSES,
    CauseMap,
    EvidenceMap,
    compact_causes,
    compact_evidence,
    culprit_causes,
    culprit_numbers,
    culprit_size,
    pack_culprit,
)
from attrib_agent.attribution.result import AttributionResult, Cause, Culprit, Evidence
from attrib_agent.attribution.result_codec import culprit_to_dict, from_dict, to_dict
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sources.replay import ReplaySource

RECORDINGS = Path(__file__).parents[2] / "fixtures" / "recordings"
_floats = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([0.0, -0.0, 5e-324, 1e308, 0.1 + 0.2])
_causes = st.dictionaries(st.sampled_from([c.value for c in Cause]), _floats)


def test_the_tables_name_every_cause_and_evidence() -> None:
    assert set(CAUSE_NAMES) == {c.value for c in Cause} and set(EVIDENCE_NAMES) == {e.value for e in Evidence}


@given(_causes)
def test_a_packed_cause_map_reads_and_serialises_as_its_dict(d: dict[str, float]) -> None:
    m = compact_causes(d)
    if not d:
        assert m is NO_CAUSES
        return
    assert isinstance(m, CauseMap)
    assert list(m) == list(d) and list(m.items()) == list(d.items()) and len(m) == len(d)
    assert all(struct.pack("<d", m[k]) == struct.pack("<d", v) for k, v in d.items())  # to the bit (-0.0)
    assert m == d and d == m and dict(m) == d
    assert json.dumps(dict(m)) == json.dumps(d)
    assert pickle.loads(pickle.dumps(m)) == m and copy.deepcopy(m) == m
    with pytest.raises(KeyError):
        m["not_a_cause"]
    missing = next((c for c in CAUSE_NAMES if c not in d), None)
    if missing is not None:
        assert missing not in m and m.get(missing) is None


def test_maps_that_cannot_be_packed_exactly_stay_as_they_were() -> None:
    newer = {"kv_pressure": 0.5, "a_cause_from_a_newer_agent": 0.5}
    ints = {"kv_pressure": 1}
    assert compact_causes(newer) is newer and compact_causes(ints) is ints  # type: ignore[arg-type]
    odd = {"kv_pressure": "a_newer_evidence"}
    assert compact_evidence(odd) is odd
    ev = compact_evidence({"kv_pressure": "observed_steps", "preemption": "observed_preemption"})
    assert isinstance(ev, EvidenceMap) and dict(ev) == {"kv_pressure": "observed_steps",
                                                         "preemption": "observed_preemption"}
    assert pickle.loads(pickle.dumps(ev)) == ev
    with pytest.raises(KeyError):
        ev["head_of_line"]


@given(_causes, _causes)
def test_a_culprit_packs_its_maps_and_its_json_is_unchanged(causes: dict[str, float], itl: dict[str, float]) -> None:
    c = Culprit(request_id="cmpl-a-0", ttft_s=0.1, itl_s=0.01, share=1.0, causes=causes, itl_causes=itl)
    plain = {"request_id": "cmpl-a-0", "ttft_s": 0.1, "itl_s": 0.01, "share": 1.0, "causes": causes,
             "kv_block_seconds": 0.0, "is_whale": False, "itl_causes": itl}
    assert json.dumps(culprit_to_dict(c)) == json.dumps(plain)
    assert c.blame_by_cause(3) == Culprit(request_id="x", ttft_s=0.1, itl_s=0.01, share=1.0,
                                          causes=dict(causes), itl_causes=dict(itl)).blame_by_cause(3)


@given(st.lists(st.tuples(st.tuples(_floats, _floats, _floats, _floats), _causes, _causes), max_size=4),
       st.binary(max_size=3))
def test_packed_culprits_laid_end_to_end_are_walked_and_read_back_by_the_layout(
        culprits: list[tuple[tuple[float, float, float, float], dict[str, float], dict[str, float]]],
        lead: bytes) -> None:
    """As a packed result holds them (result_pack.py): `culprit_size` finds where each ends, and each reads back
    its numbers and both maps to the bit, whatever its maps' sizes."""
    blobs = [pack_culprit(*c) for c in culprits]
    assert all(b is not None for b in blobs)
    joined = lead + b"".join(b for b in blobs if b is not None)
    at = len(lead)
    for blob, (numbers, causes, itl) in zip(blobs, culprits, strict=True):
        assert blob is not None and culprit_size(joined, at) == len(blob)
        one = joined[at:at + culprit_size(joined, at)]
        assert struct.pack("<4d", *culprit_numbers(one)) == struct.pack("<4d", *numbers)
        for got, want in ((culprit_causes(one, itl=False), causes), (culprit_causes(one, itl=True), itl)):
            assert list(got.items()) == list(want.items())
            assert [struct.pack("<d", v) for v in got.values()] == [struct.pack("<d", v) for v in want.values()]
        at += len(blob)
    assert at == len(joined)


def test_real_results_serialise_as_before_packing() -> None:
    """Every result of two recordings: its JSON equals the JSON built from plain-dict copies of its maps (what
    the API and journal wrote before), and it decodes back to an equal, packed result."""
    for name in ("preempt", "whale2"):
        p = AttributionPipeline()
        for ev in ReplaySource(RECORDINGS / name).events():
            p.feed(ev)
        p.settle()
        assert len(p.store) > 0
        packed = 0
        for r in p.store:
            d = to_dict(r)
            plain = {**d, "evidence": {k: r.evidence[k] for k in r.evidence},
                     "culprits": [{**cd, "causes": {k: c.causes[k] for k in c.causes},
                                   "itl_causes": {k: c.itl_causes[k] for k in c.itl_causes}}
                                  for cd, c in zip(d["culprits"], r.culprits, strict=True)]}
            assert json.dumps(d) == json.dumps(plain)
            back = from_dict(json.loads(json.dumps(d)))
            assert back == r and json.dumps(to_dict(back)) == json.dumps(d)
            packed += sum(isinstance(c.itl_causes, CauseMap) for c in back.culprits)
            assert isinstance(back, AttributionResult) and back.mode is r.mode
        assert packed > 0


def test_decoded_results_share_one_string_per_request_id() -> None:
    """A journal restored: the same id decoded in many results (as victim, as culprit) is one string."""
    p = AttributionPipeline()
    for ev in ReplaySource(RECORDINGS / "whale2").events():
        p.feed(ev)
    p.settle()
    texts = [json.dumps(to_dict(r)) for r in p.store]
    first, second = [from_dict(json.loads(t)) for t in texts], [from_dict(json.loads(t)) for t in texts]
    by_id = {r.request_id: r.request_id for r in first}
    assert all(r.request_id is by_id[r.request_id] for r in second)
    named = [c.request_id for r in second for c in r.culprits if c.request_id in by_id]
    assert named and all(rid is by_id[rid] for rid in named)
