"""What each API request costs the server's event loop in CPU, measured in the server (api_load's `--serve`).

On a shared machine the client's wall latencies are mostly the scheduler's; the loop thread's CPU per request
is what the agent itself decides. `CpuTimer` wraps the agent's ASGI app: from the call to its return, the
loop thread's CPU (`time.thread_time`) and the collector's pauses inside it, by endpoint. It does not see
uvicorn's own work around the app (parsing, writing to the socket): `--profile` (cProfile of the loop thread)
does, and `loop_cpu_s` (the thread's CPU while serving) bounds it.
"""

from __future__ import annotations

import gc
import time
from collections import defaultdict
from collections.abc import Coroutine, Generator
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send


def endpoint(path: str, status: int) -> str:
    """api_load's name for a request (MIX's keys)."""
    if path.startswith("/v1/requests/"):
        return "culprits" if status != 404 else "culprits_unknown"
    return {"/v1/culprits/top": "top_5m", "/metrics": "metrics", "/v1/timeline": "timeline"}.get(path, "other")


class CpuTimer:
    """The agent's app, each call timed in loop-thread CPU seconds (and the collections that fell inside it)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.state = getattr(app, "state", None)  # AgentCore.serve reads app.state.renderers
        self.cpu: dict[str, list[float]] = defaultdict(list)
        self.gc_in: dict[str, list[float]] = defaultdict(list)
        self._gc_s = 0.0
        self._gc_began = 0.0
        gc.callbacks.append(self._on_gc)

    def close(self) -> None:
        """Stop watching the collector."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_began = time.thread_time()
        else:
            self._gc_s += time.thread_time() - self._gc_began

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0

        async def sending(msg: Message) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        steps = _Steps(self.app(scope, receive, sending), self)
        try:
            await steps
        finally:
            name = endpoint(scope["path"], status)
            self.cpu[name].append(steps.cpu_s)
            self.gc_in[name].append(steps.gc_s)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, xs in self.cpu.items():
            s = sorted(xs)
            out[name] = {"n": len(s), "p50_ms": 1000 * _pct(s, 0.5), "p99_ms": 1000 * _pct(s, 0.99),
                         "max_ms": 1000 * s[-1], "sum_s": sum(s), "gc_s": sum(self.gc_in[name])}
        return out


class _Steps:
    """Awaits a coroutine and adds up the thread CPU of its own steps only: while it waits (e.g. for a read on
    the pipeline thread) the loop runs other requests, which are not its cost."""

    def __init__(self, coro: Coroutine[Any, Any, None], timer: CpuTimer) -> None:
        self.coro, self.timer = coro, timer
        self.cpu_s = self.gc_s = 0.0

    def __await__(self) -> Generator[Any, Any, None]:
        it = self.coro.__await__()
        value: Any = None
        error: BaseException | None = None
        while True:
            gc0, t0 = self.timer._gc_s, time.thread_time()
            try:
                step = it.throw(error) if error is not None else it.send(value)
            except StopIteration:
                return
            finally:
                self.cpu_s += time.thread_time() - t0
                self.gc_s += self.timer._gc_s - gc0
            try:
                value, error = (yield step), None
            except BaseException as e:  # noqa: BLE001 - handed on to the coroutine, as `await` does
                value, error = None, e


def report_server(inside: dict[str, Any], n: int, order: list[str]) -> None:
    """The server's own figures: its loop's CPU per request by endpoint, its collections, its loop's lateness."""
    if not inside:
        print("server: no figures (it did not stop cleanly)")
        return
    rows = inside["cpu_per_request"]
    in_app = sum(r["sum_s"] for r in rows.values())
    print("\nserver loop CPU per request (thread CPU in the app; collections inside it in 'gc s'):\n"
          f"{'endpoint':<17} {'n':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>8} {'sum s':>7} {'gc s':>6}")
    for name in [*order, *sorted(set(rows) - set(order))]:
        if name in rows:
            r = rows[name]
            print(f"{name:<17} {r['n']:>6} {r['p50_ms']:>7.3f} {r['p99_ms']:>7.3f} {r['max_ms']:>8.2f} "
                  f"{r['sum_s']:>7.2f} {r['gc_s']:>6.3f}")
    loop = inside["loop_cpu_s"]
    print(f"loop thread CPU {loop:.2f} s: {1000 * loop / max(1, n):.3f} ms a request "
          f"({1000 * in_app / max(1, n):.3f} in the app, the rest uvicorn, the refresher, timers)")
    g, late = inside["gc"], inside["server_loop_late_ms"]
    print(f"server collections {g['collections']} (full {g['full']}, longest {g['full_max_ms']:.1f} ms; "
          f"young longest {g['young_max_ms']:.1f} ms); its loop late p50 {late['p50']:.1f}, p99 {late['p99']:.1f}, "
          f"max {late['max']:.1f} ms")


def _pct(s: list[float], q: float) -> float:
    return s[min(len(s) - 1, max(0, int(q * len(s) + 0.999999) - 1))] if s else float("nan")
