"""The agent's commands: `run` (live sidecar), `replay` (a recording through the same pipeline), `explain`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import logging
import os
import signal
import sys
import time
from pathlib import Path

import httpx

from attrib_agent import __version__
from attrib_agent.agent.build_kind import build_kind
from attrib_agent.agent.core import AgentCore, ServeOptions
from attrib_agent.agent.live import LiveAgent, up_or_ended
from attrib_agent.agent.replay import replay_into
from attrib_agent.cli.report import explain_table, json_lines, summary_row, write_parquet
from attrib_agent.config.load import AgentConfig, ConfigError, add_run_arguments, load_config
from attrib_agent.sinks.journal import JournalError

logger = logging.getLogger("attrib_agent")


def parse_listen(value: str) -> tuple[str, int]:
    """`host:port`, `[v6]:port` or `:port` (loopback)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"--listen wants host:port, got {value!r}")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port)


async def _wait_or_duration(stop: asyncio.Event, duration: float | None) -> None:
    if duration:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), duration)
        stop.set()
    else:
        await stop.wait()


def _config(args: argparse.Namespace, live: bool) -> AgentConfig | None:
    """The merged configuration (file < env < flags), or None after printing the one-line error."""
    try:
        cfg = load_config(args, os.environ, live=live)
    except ConfigError as e:
        print(f"attrib-agent: config error: {e}", file=sys.stderr)
        return None
    configure_logging(cfg.log_level)
    for w in cfg.warnings:
        logger.warning("%s", w)
    return cfg


def cmd_run(args: argparse.Namespace) -> int:
    cfg = _config(args, live=True)
    if cfg is None:
        return 2
    logger.info("attrib-agent %s (%s) starting: %s", __version__, build_kind(),
                ", ".join(f"{k}={v} [{src}]" for k, v, src in cfg.describe()))
    try:
        agent = LiveAgent(cfg)
    except JournalError as e:
        print(f"attrib-agent: error: {e}", file=sys.stderr)
        return 2

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await agent.run(stop, lambda a: logger.info("ready: API http://%s:%s/", cfg.listen_host, a.api_port))

    try:
        asyncio.run(main())
    except OSError as e:
        print(f"attrib-agent: error: {e}", file=sys.stderr)
        return 1
    logger.info("attrib-agent stopped")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    if not (args.recording / "meta.json").exists():
        print(f"attrib-agent: error: {args.recording} is not a recording (no meta.json)", file=sys.stderr)
        return 2
    cfg = _config(args, live=False)
    if cfg is None:
        return 2
    try:
        core = AgentCore.from_config(cfg, live=False)
    except JournalError as e:
        print(f"attrib-agent: error: {e}", file=sys.stderr)
        return 2
    token = cfg.reveal_api_token()  # ATTRIB_API_TOKEN or --api-token-file, as for `run`
    show_progress = sys.stderr.isatty() and not (args.json or args.digest)

    def progress(n: int) -> None:
        if show_progress:
            print(f"\rreplayed {n:,} events", end="", file=sys.stderr, flush=True)

    async def main() -> int:
        stop = asyncio.Event()
        server = None
        if args.serve:
            host, port = cfg.listen_host, cfg.listen_port
            listening = asyncio.Event()

            def started(p: int) -> None:
                print(f"serving http://{host}:{p}/ (API, /metrics, page)", file=sys.stderr, flush=True)
                listening.set()

            server = asyncio.create_task(core.serve(ServeOptions(host, port, token), stop, started))
            if not await up_or_ended(listening, server):
                await server  # raises why it could not listen
        consume = asyncio.create_task(core.consume(stop))  # idle settles and journal flushes, as live
        n = await replay_into(core, args.recording, speed=args.speed, progress=progress, exact=args.exact)
        if show_progress:
            print(file=sys.stderr)
        results = sorted(core.pipeline.store, key=lambda r: (r.finished_ts, r.request_id))
        if args.digest:  # the --json lines hashed: an optimisation that changes nothing keeps the digest
            h = hashlib.sha256()
            for line in json_lines(results):
                h.update(line.encode() + b"\n")
            print(h.hexdigest())
        elif args.json:
            for line in json_lines(results):
                print(line)
        else:
            for r in results:
                print(summary_row(r))
            print(f"{len(results)} requests attributed from {n:,} events", file=sys.stderr)
        if args.out:
            write_parquet(results, args.out)
            print(f"wrote {args.out}", file=sys.stderr)
        sys.stdout.flush()
        if server is not None:
            await _wait_or_duration(stop, args.duration)
            await server
        stop.set()
        await consume
        core.shutdown()  # the sinks' exit: spans sent, the journal closed, the step-cost fit saved (state_dir)
        return 0

    try:
        return asyncio.run(main())
    except OSError as e:  # the API cannot listen (a port taken), as `run` says it
        print(f"attrib-agent: error: {e}", file=sys.stderr)
        return 1


def cmd_explain(args: argparse.Namespace) -> int:
    token = os.environ.get("ATTRIB_API_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = f"{args.api.rstrip('/')}/v1/requests/{args.request_id}/culprits"
    try:
        resp = httpx.get(url, headers=headers, timeout=10.0, trust_env=False)
    except httpx.HTTPError as e:
        print(f"attrib-agent: error: cannot reach the agent at {args.api}: {e}", file=sys.stderr)
        return 1
    if resp.status_code == 404:
        print(f"attrib-agent: no request {args.request_id!r} known to the agent at {args.api}", file=sys.stderr)
        return 1
    if resp.status_code not in (200, 202):
        print(f"attrib-agent: error: the agent answered {resp.status_code}: {resp.text[:200]}", file=sys.stderr)
        return 1
    body = resp.json()
    if args.json:
        import json
        print(json.dumps(body, indent=1))
    elif body.get("status") == "running":
        print(f"request {args.request_id} is still running; ask again when it has finished")
    elif body.get("status") == "aborted":
        print(f"request {args.request_id} ended without finishing (aborted, failed, or lost when vLLM restarted): "
              "nothing to attribute")
    else:
        print(explain_table(body))
    return 0


def add_agent_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="the live sidecar beside one vLLM server (see docs/configuration.md)")
    add_run_arguments(run)
    run.set_defaults(func=cmd_run)
    rp = sub.add_parser("replay", help="a recording through the same pipeline as live: one attribution per request")
    rp.add_argument("recording", type=Path, metavar="DIR")
    rp.add_argument("--json", action="store_true", help="JSON lines (request_id, ttft_s, culprits, ...)")
    rp.add_argument("--digest", action="store_true",
                    help="print only the sha256 of the --json output (checks that a change kept every result)")
    rp.add_argument("--speed", type=float, default=None,
                    help="pace at this multiple of recorded speed (default: as fast as possible)")
    rp.add_argument("--serve", action="store_true",
                    help="serve the API, /metrics and the page (on --listen) during and after the replay")
    rp.add_argument("--duration", type=float, default=0, help="with --serve: stop after this many seconds")
    rp.add_argument("--out", type=Path, help="write the results as a Parquet table")
    rp.add_argument("--exact", action="store_true",
                    help="exact mode: also read the step plugin's vllm_steps stream (recordings made with "
                         "--truth-plugin); without it they replay as the sidecar alone would see them")
    add_run_arguments(rp, live=False)
    rp.set_defaults(func=cmd_replay)
    ex = sub.add_parser("explain", help="who slowed this request, by how much, through what (asks the agent's API)")
    ex.add_argument("request_id")
    ex.add_argument("--api", default="http://127.0.0.1:9400", help="the agent's API (default %(default)s)")
    ex.add_argument("--json", action="store_true")
    ex.set_defaults(func=cmd_explain)


def configure_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.Formatter.converter = time.gmtime
    # httpx logs every request at INFO with the full URL, password included (--vllm-url http://u:pw@...):
    # the agent scrapes several times a second and says itself when a source fails, so keep those quiet.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
