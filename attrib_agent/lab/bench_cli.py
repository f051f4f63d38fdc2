"""`attrib-agent lab bench`: record `vllm bench serve` against the lab's vLLM (lab/bench.py).

    attrib-agent lab bench --dataset mixed --count 130 --out rec/mixed -- --request-rate 2 --ignore-eos

With `--dataset mixed|rag` the lab writes a custom dataset (lab/bench_data.py) and passes it with
`--dataset-name custom --disable-shuffle --skip-chat-template --custom-output-len -1 --num-prompts <all>`;
without, the arguments after `--` are vLLM's alone (e.g. `--dataset-name prefix_repetition ...`).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from attrib_agent.lab.model import ensure_model_dir
from attrib_agent.lab.server import LabConfig, lab_home, running_lab


def dataset_args(kind: str, path: Path, count: int, seed: int) -> tuple[list[str], dict[str, Any]]:
    """Write the lab dataset `kind` to `path`; the `vllm bench serve` arguments that send all of it (`count`
    requests plus the whales placed in the file) in file order."""
    from attrib_agent.lab.bench_data import make_dataset

    summary = make_dataset(kind, path, ensure_model_dir(lab_home() / "models") / "tokenizer.json", count, seed)
    return ["--dataset-name", "custom", "--dataset-path", str(path), "--disable-shuffle", "--skip-chat-template",
            "--custom-output-len", "-1", "--num-prompts", str(summary["requests"])], summary


def cmd_bench(args: argparse.Namespace, config: LabConfig) -> int:
    from attrib_agent.lab.bench import record_bench, whale_companion

    bench_args = [a for a in args.bench_args if a != "--"]
    dataset = None
    command = " ".join(shlex.quote(a) for a in ["attrib-agent", *sys.argv[1:]])
    # The dataset is remade from its seed (its summary goes to meta.json), so it lives only for the run.
    with tempfile.TemporaryDirectory() as tmp, running_lab(config, args.attach) as ep:
        if args.dataset:
            extra, dataset = dataset_args(args.dataset, Path(tmp) / "dataset.jsonl", args.count, args.seed)
            bench_args = [*extra, *bench_args]
        res = record_bench(ep, args.out, bench_args, command=command, dataset=dataset,
                           max_lateness_s=args.max_lateness_ms / 1000.0, attempts=args.attempts,
                           companions=[whale_companion(args.whales_after_s, args.whales, args.seed)]
                           if args.whales else [])
    t, late = res.meta["traffic"], res.meta["client_lateness"]
    print(f"{res.path}: {t['requests']} requests over {t['duration_s']:.1f} s, prefix cache hits "
          f"{t['prefix_hit_share']:.0%} of prompt tokens, received without a span: "
          f"{', '.join(t['received_without_span']) or '-'}; probe lateness {late['lateness_s'] * 1000:.1f} ms")
    return 0


def add_bench_command(lsub: Any, add_lab_options: Any, lab_config: Any) -> None:
    """Register `lab bench` on the `lab` subparsers (cli.py passes its shared lab options and config)."""
    b = lsub.add_parser("bench", help="record `vllm bench serve` (a third-party client) against the lab's vLLM")
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--dataset", choices=["mixed", "rag"],
                   help="a lab-made custom dataset: mixed = seed 002's four shapes + mid-stream whales, "
                        "rag = shared system prompt + reused documents")
    b.add_argument("--count", type=int, default=100, help="requests in the --dataset (default %(default)s)")
    b.add_argument("--seed", type=int, default=2, help="dataset seed (default %(default)s)")
    b.add_argument("--whales", type=int, default=0,
                   help="also start a second `vllm bench serve` sending this many ~3,900/300-token whales "
                        "(random dataset, its own /tokenize call) --whales-after-s after the first")
    b.add_argument("--whales-after-s", type=float, default=15.0)
    b.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- then arguments for `vllm bench serve`")
    add_lab_options(b)
    b.set_defaults(func=lambda a: cmd_bench(a, lab_config(a)))
