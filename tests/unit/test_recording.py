import json

import pytest

from attrib_agent.recording import (
    CLIENT,
    LOG,
    OTLP,
    Recording,
    RecordingError,
    RecordingVersionError,
    RecordingWriter,
    compress_streams,
    log_record,
    otlp_body,
    otlp_record,
)


def test_roundtrip_plain_and_compressed(tmp_path):
    with RecordingWriter(tmp_path, {"scenario": {"name": "x"}}) as w:
        w.append(LOG, log_record(1.5, "a line"))
        w.append(LOG, log_record(2.5, "another"))
        w.append(OTLP, otlp_record(3.0, "application/x-protobuf", b"\x00\x01raw"))
    r = Recording(tmp_path)
    assert r.meta["format"] == "attrib-recording" and r.meta["version"] == 1
    assert [x["line"] for x in r.records(LOG)] == ["a line", "another"]
    compress_streams(tmp_path)
    assert not (tmp_path / "log.jsonl").exists() and (tmp_path / "log.jsonl.xz").exists()
    r = Recording(tmp_path)
    assert [x["ts"] for x in r.records(LOG)] == [1.5, 2.5]
    assert otlp_body(next(r.records(OTLP))) == b"\x00\x01raw"
    assert list(r.records(CLIENT)) == [] and not r.has(CLIENT)


def test_unknown_keys_and_files_are_accepted(tmp_path):
    with RecordingWriter(tmp_path, {"future_field": 1}) as w:
        w.append(LOG, log_record(1.0, "x", future_key="y"))
    (tmp_path / "something-new.bin").write_bytes(b"\x00")
    rec = next(Recording(tmp_path).records(LOG))
    assert rec["future_key"] == "y"


def test_newer_version_is_refused_clearly(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps({"format": "attrib-recording", "version": 2}))
    with pytest.raises(RecordingVersionError, match="newer"):
        Recording(tmp_path)


@pytest.mark.parametrize("meta", [None, "{not json", json.dumps({"format": "other", "version": 1}),
                                  json.dumps({"format": "attrib-recording"})])
def test_not_a_recording(tmp_path, meta):
    if meta is not None:
        (tmp_path / "meta.json").write_text(meta)
    with pytest.raises(RecordingError):
        Recording(tmp_path)


def test_malformed_lines_are_counted_not_raised(tmp_path):
    with RecordingWriter(tmp_path) as w:
        w.append(LOG, log_record(1.0, "ok"))
    with open(tmp_path / "log.jsonl", "a") as f:
        f.write('{"ts": "not a number", "line": "x"}\n[1,2]\n{"ts": 2.0, "line": "trunc')
    r = Recording(tmp_path)
    assert [x["line"] for x in r.records(LOG)] == ["ok"]
    assert r.stats[LOG].records == 1 and r.stats[LOG].skipped == 3


def test_merge_existing_meta(tmp_path):
    RecordingWriter(tmp_path, {"a": 1}).close()
    with RecordingWriter(tmp_path, merge_existing=True) as w:
        w.update_meta({"b": 2})
    assert Recording(tmp_path).meta["a"] == 1 and Recording(tmp_path).meta["b"] == 2


def test_unknown_stream_rejected(tmp_path):
    with RecordingWriter(tmp_path) as w, pytest.raises(ValueError):
        w.append("bogus", {"ts": 1})
