"""A small engine that follows vLLM v1's scheduling rules and emits the events the sources would.

It is the ground truth for property tests: FCFS with the running list served first in admission order,
chunked prefill under a token budget, admission only when the whole sequence fits in free KV blocks and no
preemption happened in the step, preemption of the most recently admitted running request when a block
allocation fails (its own blocks stay in the prefix cache, so a resumption recomputes only its last partial
block), the preemption counter rising when the victim next produces a token, spans a while after finishing.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from attrib_agent.events import EngineStep, Event, MetricsSnapshot, RequestAdded, RequestReceived, RequestSpan

T0 = 1_800_000_000.0


@dataclass(frozen=True)
class FakeRequest:
    rid: str
    arrival: float  # seconds after T0
    prompt: int
    output: int


@dataclass(frozen=True)
class FakeConfig:
    budget: int = 256
    block_size: int = 16
    num_blocks: int = 40
    span_delay_s: float = 2.0
    scrape_every_s: float = 0.25
    step_s: float = 0.005  # a step's fixed cost (plus 10 us a token)


@dataclass
class _Req:
    spec: FakeRequest
    computed: int = 0
    outputs: int = 0
    admitted: float | None = None
    first_token: float | None = None
    finish: float | None = None
    undelivered_preemptions: int = 0
    cached: int = 0  # tokens of its full blocks left in the prefix cache when it was preempted
    resuming: bool = False  # preempted: its next scheduling recomputes its KV

    @property
    def num_tokens(self) -> int:
        return self.spec.prompt + self.outputs


@dataclass(frozen=True)
class TruthStep:
    iteration: int
    members: tuple[tuple[str, str, int], ...]  # (request, phase, tokens) in scheduling order
    holdings: tuple[tuple[str, int], ...]  # blocks per running request after the step
    used: int


@dataclass
class FakeRun:
    config: FakeConfig
    events: list[Event] = field(default_factory=list)
    steps: list[TruthStep] = field(default_factory=list)
    preemptions: list[tuple[str, int]] = field(default_factory=list)  # (request, iteration)
    finished: dict[str, _Req] = field(default_factory=dict)


def _blocks(tokens: int, bs: int) -> int:
    return -(-tokens // bs)


def _ms(t: float) -> float:
    return math.floor(t * 1000.0) / 1000.0


def run(cfg: FakeConfig, requests: list[FakeRequest]) -> FakeRun:
    bs, usable = cfg.block_size, cfg.num_blocks - 1
    out = FakeRun(cfg)
    pending = deque(sorted(requests, key=lambda r: (r.arrival, r.rid)))
    for spec in pending:
        at = T0 + spec.arrival
        out.events.append(RequestReceived(at + 0.0001, _ms(at), spec.rid, spec.output))
        out.events.append(RequestAdded(at + 0.0002, _ms(at + 0.0001), spec.rid, spec.rid + "-0a1b2c3d"))
    waiting: deque[_Req] = deque()
    running: list[_Req] = []
    held: dict[str, int] = {}
    now, iteration, delivered = T0, 0, 0
    counter: list[tuple[float, int, int, int]] = []  # (step end, used, preemptions delivered, running)
    while pending or waiting or running:
        if not waiting and not running:
            now = max(now, T0 + pending[0].arrival + 0.0005)
        start = now
        while pending and T0 + pending[0].arrival < start:
            waiting.append(_Req(pending.popleft()))
        left, preempted = cfg.budget, False
        sched: list[tuple[_Req, int]] = []
        free = usable - sum(held.values())
        for r in list(running):
            if left <= 0 or r not in running:
                break
            n = 1 if r.computed == r.num_tokens - 1 and r.outputs else min(r.num_tokens - r.computed, left)
            need = _blocks(r.computed + n, bs) - held.get(r.spec.rid, 0)
            while need > free:
                victim = running.pop()
                free += held.pop(victim.spec.rid, 0)
                victim.cached = victim.computed // bs * bs
                victim.computed, victim.undelivered_preemptions = 0, victim.undelivered_preemptions + 1
                victim.resuming = True
                waiting.appendleft(victim)
                out.preemptions.append((victim.spec.rid, iteration))
                preempted = True
                if victim is r:
                    break
            if r not in running:
                break
            free -= need
            held[r.spec.rid] = held.get(r.spec.rid, 0) + need
            sched.append((r, n))
            left -= n
        while not preempted and left > 0 and waiting:
            r = waiting[0]
            if _blocks(r.num_tokens, bs) > free:
                break
            hit = min(r.cached, (r.num_tokens - 1) // bs * bs) if r.resuming else 0
            n = min(r.num_tokens - hit, left)
            waiting.popleft()
            running.append(r)
            r.computed = hit
            r.admitted = start if r.admitted is None else r.admitted
            need = _blocks(hit + n, bs)
            free -= need
            held[r.spec.rid] = need
            sched.append((r, n))
            left -= n
        if not sched:
            now += 0.001
            continue
        tokens = sum(n for _, n in sched)
        elapsed = cfg.step_s + 1e-5 * tokens
        end = start + elapsed
        members: list[tuple[str, str, int]] = []
        ctx_r = ctx_t = gen_r = gen_t = 0
        for r, n in sched:
            phase = "prefill" if r.outputs == 0 else ("recompute" if r.resuming else "decode")
            members.append((r.spec.rid, phase, n))
            if r.outputs == 0:
                ctx_r, ctx_t = ctx_r + 1, ctx_t + n
            else:
                gen_r, gen_t = gen_r + 1, gen_t + n
            r.computed += n
            if r.computed == r.num_tokens:
                r.outputs += 1
                r.resuming = False
                delivered += r.undelivered_preemptions
                r.undelivered_preemptions = 0
                if r.outputs == 1:
                    r.first_token = end
        for r, _ in sched:
            if r.outputs == r.spec.output and r in running:
                running.remove(r)
                held.pop(r.spec.rid, None)
                r.finish = end
                out.finished[r.spec.rid] = r
                out.events.append(_span(r, cfg))
        used = sum(held.values())
        kv = round(used / usable * 100.0, 1) / 100.0
        out.events.append(EngineStep(end + 0.0004, _ms(end + 0.0002), 0, iteration, ctx_r, ctx_t, gen_r, gen_t,
                                     round(elapsed * 1000.0, 2), kv, "CPU"))
        out.steps.append(TruthStep(iteration, tuple(members), tuple((r.spec.rid, held[r.spec.rid]) for r in running),
                                   used))
        counter.append((end + 0.0002, used, delivered, len(running)))
        iteration += 1
        now = end + 0.0003
    _scrapes(out, counter, cfg)
    out.events.sort(key=lambda e: e.ts)
    return out


def _span(r: _Req, cfg: FakeConfig) -> RequestSpan:
    arrival = T0 + r.spec.arrival
    assert r.first_token is not None and r.finish is not None and r.admitted is not None
    return RequestSpan(r.finish + cfg.span_delay_s, r.spec.rid, "0" * 32, "0" * 16, arrival, r.finish,
                       r.admitted - arrival, r.first_token - arrival, r.finish - arrival, r.first_token - r.admitted,
                       r.finish - r.first_token, r.finish - r.admitted, r.spec.prompt, r.outputs, r.spec.output)


def _scrapes(out: FakeRun, counter: list[tuple[float, int, int, int]], cfg: FakeConfig) -> None:
    if not counter:
        return
    usable = cfg.num_blocks - 1
    t, i = T0 + cfg.scrape_every_s / 2, 0
    state = (0, 0, 0)
    while t < counter[-1][0] + cfg.scrape_every_s:
        while i < len(counter) and counter[i][0] <= t:
            state = counter[i][1:]
            i += 1
        used, pre, running = state
        out.events.append(MetricsSnapshot(t, "0", "m", float(running), 0.0, used / usable, float(pre), None, None,
                                          None, None, None, None, cfg.block_size, cfg.num_blocks))
        t += cfg.scrape_every_s
