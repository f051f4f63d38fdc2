"""The `attrib-agent` command line: the parser over every subcommand, and `main` (the console script)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from attrib_agent import __version__
from attrib_agent.agent.build_kind import build_kind
from attrib_agent.cli.agent import add_agent_commands, parse_listen
from attrib_agent.cli.lab import (
    add_lab_options,
    cmd_demo,
    cmd_record,
    cmd_scenarios,
    cmd_score,
    cmd_serve,
    cmd_truth,
    forecast_report,
    lab_config,
)
from attrib_agent.lab.bench_cli import add_bench_command
from attrib_agent.lab.server import LabError
from attrib_agent.lab.workload import SCENARIOS


class _Version(argparse.Action):
    """`--version`: the version and which build runs, read from the modules themselves."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(f"attrib-agent {__version__} ({build_kind()})")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attrib-agent", description=__doc__)
    p.add_argument("--version", action=_Version, help="show the version and the build (compiled by mypyc or pure "
                   "Python) and exit")
    sub = p.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="real vLLM + the agent beside it: a whale scenario, and who slowed the shorts")
    demo.add_argument("--scenario", default="preempt", choices=sorted(SCENARIOS))
    demo.add_argument("--out", type=Path, help="where to keep the two recordings (default .lab/demo/<time>)")
    demo.add_argument("--listen", type=parse_listen, default=("127.0.0.1", 9400), metavar="HOST:PORT",
                      help="the agent's API, /metrics and page (default %(default)s; port 0 picks a free one)")
    demo.add_argument("--duration", type=float, default=0,
                      help="keep the agent up this many seconds after the run (default: until Ctrl-C)")
    demo.add_argument("--explain", type=int, default=3, help="how many of the slowest shorts to explain")
    add_lab_options(demo)
    demo.set_defaults(func=cmd_demo)

    add_agent_commands(sub)

    lab = sub.add_parser("lab", help="real-vLLM lab: scenarios, recordings, counterfactual truth")
    lsub = lab.add_subparsers(dest="lab_command", required=True)
    sc = lsub.add_parser("scenarios", help="list the built-in scenarios")
    sc.set_defaults(func=cmd_scenarios)
    serve = lsub.add_parser("serve", help="start vLLM + capture and keep them up (for --attach)")
    serve.add_argument("--state-file", type=Path, help="write the endpoints here for other commands to --attach")
    serve.add_argument("--otlp-forward", metavar="URL", help="also send vLLM's spans to this OTLP/HTTP URL, "
                       "e.g. your agent's http://127.0.0.1:4318/v1/traces (--otlp-http-port 4318)")
    serve.add_argument("--duration", type=float, default=0, help="stop after this many seconds (0: until Ctrl-C)")
    add_lab_options(serve)
    serve.set_defaults(func=cmd_serve)
    rec = lsub.add_parser("record", help="run a scenario and write a recording directory")
    rec.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    rec.add_argument("--out", type=Path, required=True)
    add_lab_options(rec)
    rec.set_defaults(func=cmd_record)
    tr = lsub.add_parser("truth", help="counterfactual runs under every subset of whales -> truth.json")
    tr.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    tr.add_argument("--reps", type=int, default=3)
    tr.add_argument("--out", type=Path, required=True)
    tr.add_argument("--keep-recordings", action="store_true", help="keep every run's recording under OUT/runs/")
    add_lab_options(tr)
    tr.set_defaults(func=cmd_truth)
    sc2 = lsub.add_parser("score", help="score attribution against counterfactual truth (needs --keep-recordings)"
                          " and the timeline against vLLM's per-step truth (recordings made with --truth-plugin)")
    sc2.add_argument("truth_dirs", type=Path, nargs="+", metavar="TRUTH_DIR|RECORDING")
    sc2.add_argument("--json", action="store_true")
    sc2.set_defaults(func=cmd_score)
    add_bench_command(lsub, add_lab_options, lab_config)
    from attrib_agent.lab.oracle import suite as oracle  # no vLLM import until it runs

    orc = lsub.add_parser("oracle", help="vLLM's own scheduler vs the re-simulation: step agreement report")
    oracle.add_arguments(orc)
    orc.set_defaults(func=oracle.run)
    from attrib_agent.lab.routing import study as routing  # no vLLM import until it runs

    rs = lsub.add_parser("routing-study", help="shorts' TTFT under round-robin, least-loaded and forecast routing "
                         "of two vLLM scheduler instances (the lab's cost model, not a GPU)")
    routing.add_arguments(rs)
    rs.set_defaults(func=routing.run)
    from attrib_agent.lab import marginal

    mg = lsub.add_parser("marginal", help="what k more decoders or one prefill chunk add to the same decodes' step"
                         " time (recordings of `lab record --scenario marginal`)")
    marginal.add_arguments(mg)
    mg.set_defaults(func=marginal.run)
    fs = lsub.add_parser("forecast-score", help="score the admission forecast against counterfactual truth")
    fs.add_argument("truth_dirs", type=Path, nargs="+", metavar="TRUTH_DIR")
    fs.add_argument("--warm", action="store_true", help="cost model fitted on the truth's null run first")
    fs.add_argument("--persisted", action="store_true", help="also each recording from the step-cost fit the "
                    "agent that replayed the truth's previous recording saved (state_dir), side by side with cold")
    fs.add_argument("--json", action="store_true")
    fs.set_defaults(func=lambda a: print(forecast_report(a.truth_dirs, warm=a.warm, as_json=a.json,
                                                         persisted=a.persisted)) or 0)
    return p


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds context managers, so vLLM's process group is stopped


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)
    try:
        return int(args.func(args))
    except LabError as e:
        print(f"attrib-agent: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("attrib-agent: interrupted", file=sys.stderr)
        return 130

