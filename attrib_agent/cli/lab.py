"""The lab's subcommands (`demo`, `lab serve/record/truth/score`): a real vLLM beside the agent."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from attrib_agent.lab.server import LabConfig, LabError, VllmLab, running_lab
from attrib_agent.lab.workload import SCENARIOS, get_scenario


def _command() -> str:
    return shlex.join(["attrib-agent", *sys.argv[1:]])


def lab_config(args: argparse.Namespace) -> LabConfig:
    return LabConfig(kv_cache_bytes=args.kv_cache_bytes, metrics_interval_s=args.metrics_interval,
                     log_level=args.log_level, extra_args=list(args.vllm_arg or []),
                     truth_plugin=args.truth_plugin)


def add_lab_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--attach", type=Path, metavar="STATE",
                   help="use a lab started by `attrib-agent lab serve --state-file STATE` instead of starting one")
    p.add_argument("--kv-cache-bytes", type=int, default=LabConfig.kv_cache_bytes,
                   help="vLLM --kv-cache-memory-bytes (small, so KV is tight; default %(default)s)")
    p.add_argument("--metrics-interval", type=float, default=LabConfig.metrics_interval_s,
                   help="seconds between /metrics scrapes while recording (default %(default)s)")
    p.add_argument("--max-lateness-ms", type=float, default=20.0,
                   help="reject a run whose load client was later than this (default %(default)s)")
    p.add_argument("--attempts", type=int, default=3, help="tries per run before giving up (default %(default)s)")
    p.add_argument("--log-level", default="INFO", choices=["INFO", "DEBUG"],
                   help="vLLM's log level; DEBUG logs prompt text (privacy canary recordings only)")
    p.add_argument("--truth-plugin", action="store_true",
                   help="load the step plugin (plugins/vllm) in vLLM and record its per-step truth as vllm_steps")
    p.add_argument("--vllm-arg", action="append", metavar="ARG",
                   help="extra argument for vllm serve, e.g. --vllm-arg=--enable-log-outputs (repeatable)")


def cmd_scenarios(args: argparse.Namespace) -> int:
    for s in SCENARIOS.values():
        whales = ", ".join(f"{w.spec_id}={w.klass.prompt_tokens}/{w.klass.output_tokens}" for w in s.whales) or "-"
        print(f"{s.name:<10} {len(s.shorts):>3} shorts  whales: {whales:<40} {s.description}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from attrib_agent.lab.sidecar import forward_spans

    lab = VllmLab(lab_config(args))
    with lab as ep:
        if args.state_file:
            ep.save(args.state_file)
        if args.otlp_forward:  # vLLM's spans also to your agent: see docs/by-hand.md
            forward_spans(ep.capture_url, args.otlp_forward)
        print(f"vLLM {ep.vllm_url}  capture {ep.capture_url}  log {ep.server_log}", flush=True)
        deadline = time.monotonic() + args.duration if args.duration else None
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.5)
    return 0


def cmd_record(args: argparse.Namespace) -> int:
    from attrib_agent.lab.record import record_run
    from attrib_agent.lab.summary import format_table, group_latency, shorts

    scenario = get_scenario(args.scenario)
    with running_lab(lab_config(args), args.attach) as ep:
        res = record_run(ep, scenario, args.out, command=_command(), max_lateness_s=args.max_lateness_ms / 1000,
                         attempts=args.attempts)
    print(format_table([(scenario.name, group_latency(shorts(res.results)))]))
    m = res.meta
    print(f"recorded {args.out}: {m['stream_counts']}, preemptions {m['preemptions']:.0f}, "
          f"client lateness {m['client_lateness']['lateness_s'] * 1000:.1f} ms")
    return 0


def cmd_truth(args: argparse.Namespace) -> int:
    from attrib_agent.lab.truth import run_truth, truth_table

    scenario = get_scenario(args.scenario)
    with running_lab(lab_config(args), args.attach) as ep:
        truth = run_truth(ep, scenario, args.reps, args.out, keep_recordings=args.keep_recordings,
                          max_lateness_s=args.max_lateness_ms / 1000, attempts=args.attempts, command=_command(),
                          progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(truth_table(truth))
    print(f"wrote {args.out / 'truth.json'}")
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    import json

    from attrib_agent.lab import cause_truth
    from attrib_agent.lab.score import format_scores, score_command
    from attrib_agent.lab.step_truth import format_step_scores, recordings_of, score_dir

    scores = []
    for d in args.truth_dirs:
        if not (d / "truth.json").is_file() and (d / "meta.json").is_file():
            continue  # a single recording: only the step truth below applies
        for s in score_command(d):
            s.name = f"{s.name} [{d.name}]"
            scores.append(s)
    steps = [(d.name, st) for d in args.truth_dirs if (st := score_dir(d)) is not None]
    causes = {d.name: c for d in args.truth_dirs if (c := cause_truth.score_dir(recordings_of(d))) is not None}
    if args.json:
        print(json.dumps({"counterfactual": [s.as_dict() for s in scores],
                          "step_truth": {name: s.as_dict() for name, s in steps},
                          "causes": {name: c.as_dict() for name, c in causes.items()}}, indent=1))
        return 0
    if scores:
        print(format_scores(scores))
    if steps:
        print(("\n" if scores else "") + format_step_scores(steps, causes))
    if not scores and not steps:
        print("nothing to score: no truth.json and no recording with the vllm_steps stream", file=sys.stderr)
        return 1
    return 0


def forecast_report(truth_dirs: list[Path], *, warm: bool, as_json: bool, persisted: bool = False) -> str:
    from attrib_agent.lab.forecast_score import report_command

    return report_command(truth_dirs, warm=warm, as_json=as_json, persisted=persisted)


def cmd_demo(args: argparse.Namespace) -> int:
    import httpx

    from attrib_agent.cli.report import explain_table
    from attrib_agent.lab.record import record_run
    from attrib_agent.lab.sidecar import agent_beside
    from attrib_agent.lab.summary import format_table, group_latency, shorts, ttft_s

    scenario = get_scenario(args.scenario)
    baseline = scenario.with_whales(())
    out = args.out or Path(".lab") / "demo" / time.strftime("%Y%m%d-%H%M%S")
    print("starting vLLM (CPU build, tiny random-weight model); this takes about a minute ...", flush=True)
    with running_lab(lab_config(args), args.attach) as ep, \
            agent_beside(ep, out / "agent", api_port=args.listen[1] or None, journal_dir=out / "journal") as agent:
        print(f"attrib-agent is running beside vLLM: {agent.api_url}/ (log {agent.log_path})", flush=True)
        rows = []
        for s, sub in ((baseline, "alone"), (scenario, "with-whales")):
            print(f"running {s.name} ...", flush=True)
            res = record_run(ep, s, out / sub, command=_command(), max_lateness_s=args.max_lateness_ms / 1000,
                             attempts=args.attempts)
            rows.append((f"{sub} ({len(s.whales)} whales)", group_latency(shorts(res.results)), res))
        print()
        print(format_table([(label, g) for label, g, _ in rows]))
        crowded = rows[1][2]
        slowest = sorted(shorts(crowded.results), key=lambda r: ttft_s(r) or 0.0, reverse=True)[: args.explain]
        print(f"\nwho slowed the {len(slowest)} slowest short requests (asked of the agent's API):\n")
        with httpx.Client(trust_env=False, timeout=10.0) as c:
            for r in slowest:
                url = f"{agent.api_url}/v1/requests/{r['vllm_request_id']}/culprits"
                body = _wait_final(c, url)
                print(explain_table(body) if body else f"request {r['vllm_request_id']}: not attributed yet")
                print()
        print(f"the picture: {agent.api_url}/   series: {agent.api_url}/metrics")
        print(f"ask about any request: attrib-agent explain <request id> --api {agent.api_url}")
        if args.duration == 0:
            print("Ctrl-C to stop", flush=True)
        deadline = time.monotonic() + args.duration if args.duration > 0 else None
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.5)
            if agent.proc is not None and agent.proc.poll() is not None:
                raise LabError(f"the agent exited ({agent.proc.returncode}); see {agent.log_path}")
    return 0


def _wait_final(client: object, url: str, timeout_s: float = 30.0) -> dict[str, object] | None:
    """The API's answer once final (200), else the last partial one (202) after `timeout_s`."""
    import httpx

    assert isinstance(client, httpx.Client)
    deadline = time.monotonic() + timeout_s
    body = None
    while time.monotonic() < deadline:
        resp = client.get(url)
        if resp.status_code in (200, 202):
            body = resp.json()
            if resp.status_code == 200:
                return dict(body)
        time.sleep(0.5)
    return dict(body) if body and body.get("culprits") is not None else None
