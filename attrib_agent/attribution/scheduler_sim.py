"""A discrete-time re-run of vLLM 0.32's v1 scheduler, to ask "what if these requests had not been there?".

The scheduling rules are in `sim_step` (token budget, KV blocks, FCFS admission with whole-sequence reservation,
recompute preemption, prefix-cache reuse); this module drives them through time. Requests join the queue at the
first step boundary at or after their arrival (vLLM's engine picks up new requests between steps); each step
lasts what the cost model says; the first token comes at the end of the step that completes the prompt; time
jumps to the next arrival when the engine is idle. With async scheduling two steps are in flight: step k+1
is scheduled (seeing arrivals up to step k's start) before step k's tokens and frees are back. The pool has
`num_blocks - 1` usable blocks: vLLM keeps one null block. Replaying the reconstructed requests with nobody
removed should reproduce the observed waits; the tests check that on real recordings, and `lab.oracle` checks
every step against vLLM's own scheduler.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace

from attrib_agent.attribution.block_pool import FreeBlockQueue
from attrib_agent.attribution.shapley import shapley_values
from attrib_agent.attribution.sim_step import (
    LiveRequest,
    StepPlan,
    blocks_for,
    finish,
    holders,
    schedule_step,
)
from attrib_agent.attribution.sim_stretch import decode_stretch
from attrib_agent.attribution.sim_trace import Blame, Features, Member, Pricer, StepPrices, VictimTracer, VictimView
from attrib_agent.attribution.sim_types import (
    SchedulerConfig,
    SimOutcome,
    SimRequest,
    SimResult,
    SimStart,
    StepCost,
)

StepObserver = Callable[[StepPlan, list[LiveRequest], float, float], None]  # plan, running, start, end


def simulate(requests: Sequence[SimRequest], config: SchedulerConfig, cost: StepCost, *,
             trace: str | Collection[str] | None = None, max_steps: int = 1_000_000,
             until_done: Collection[str] | None = None, on_step: StepObserver | None = None,
             start: SimStart | None = None) -> SimResult:
    """Re-run the scheduler over `requests`; with `trace`, explain that request's (or those requests') waits
    step by step.

    Ties in arrival keep the input order. A request whose whole sequence cannot fit in the pool even alone is
    never scheduled (vLLM refuses it). The run stops after `max_steps` steps; requests unfinished by then have
    no finish time. With `until_done` it also stops once those requests have finished (or were refused): a
    step never changes what came before it, so their outcomes are exact, while the others' and the run's
    totals (steps, peaks) cover only the steps run. Tracing several requests in one run gives each the waits
    it would get traced alone: tracing only observes. `on_step` sees each model step once it is scheduled
    (before its tokens are counted), with the running requests: the lab's oracle compares them with vLLM's.
    """
    if config.block_size < 1 or config.num_blocks < 2 or config.token_budget < 1 or config.max_num_seqs < 1:
        raise ValueError(f"invalid scheduler config {config}")
    lives = [LiveRequest(r if r.prompt_tokens >= 1 else replace(r, prompt_tokens=1), i, max(r.output_tokens, 1))
             for i, r in enumerate(requests)]
    by_id = {lv.req.request_id: lv for lv in lives}
    if len(by_id) != len(lives):
        raise ValueError("request ids must be unique")
    traced = [] if trace is None else [trace] if isinstance(trace, str) else sorted(set(trace))
    for rid in (*traced, *(until_done or ())):
        if rid not in by_id:
            raise ValueError(f"traced or awaited request {rid!r} is not among the requests")
    bs, usable = config.block_size, config.num_blocks - 1
    for lv in lives:
        lv.refused = blocks_for(lv.req.prompt_tokens + lv.target - 1, bs) > usable
    awaited = {by_id[rid] for rid in until_done or () if not by_id[rid].refused}
    pool = FreeBlockQueue(usable, config.prefix_caching)
    if config.prefix_caching:
        for group, tokens in config.warm_prefixes:
            pool.warm(group, min(tokens // bs, usable))
    waiting: deque[LiveRequest] = deque()
    running: list[LiveRequest] = []
    placed = _place(start, by_id, running, waiting, pool, bs) if start is not None else set()
    pending = deque(sorted((lv for lv in lives if lv.req.request_id not in placed),
                           key=lambda lv: (lv.req.arrival_ts, lv.index)))
    pricer = Pricer(cost)
    tracers = [(by_id[rid], VictimTracer(rid, pricer)) for rid in traced]
    now = model_free = start.ts if start is not None else pending[0].req.arrival_ts if pending else 0.0
    depth = 2 if config.async_scheduling else 1  # steps in flight: vLLM's batch queue
    in_flight: deque[tuple[list[tuple[LiveRequest, bool]], float]] = deque()  # (request, samples), end
    steps = preemptions = peak_blocks = peak_tokens = empty_rounds = 0
    stretches = depth == 1 and on_step is None  # alike decode steps in one go (sim_stretch)
    while steps < max_steps and (until_done is None or awaited):
        while pending and pending[0].req.arrival_ts <= now:
            lv = pending.popleft()
            lv.queued_ts = now
            if not lv.refused:
                waiting.append(lv)
        if stretches and running:
            width = len(running)  # the stretch's step size in tokens (its last step may finish some)
            seen = StretchTracer(tracers, pricer, running, waiting, config, now) if tracers else None
            run = decode_stretch(running, waiting, pool, config, pricer, now, model_free,
                                 pending[0].req.arrival_ts if pending else None, max_steps - steps, seen)
            if seen is not None:
                seen.flush()
            if run is not None:
                awaited.difference_update(run.finished)
                steps += len(run.ends)
                now, model_free, empty_rounds = run.now, run.model_free, 0
                peak_blocks = max(peak_blocks, usable - run.least_free)
                peak_tokens = max(peak_tokens, width)
                continue
        plan = None
        if running or waiting:
            plan = schedule_step(running, waiting, pool, config, now)
            preemptions += len(plan.preempted)
            peak_blocks = max(peak_blocks, usable - pool.free)
        if plan is not None and plan.members:
            begin = max(now, model_free)
            features = pricer.features(plan.members)
            seconds = pricer.price(features)
            end = model_free = begin + seconds
            peak_tokens = max(peak_tokens, sum(m.tokens for m in plan.members))
            if on_step is not None:
                on_step(plan, running, begin, end)
            if tracers:
                _trace_step(tracers, pricer, plan, begin, end, running, (features, seconds))
            in_flight.append((_compute_all(plan.members, by_id), end))
            steps += 1
        if in_flight and (len(in_flight) >= depth or plan is None or not plan.members):
            done, end = in_flight.popleft()
            for lv in _deliver_all(done, end, running, waiting, pool, bs):
                awaited.discard(lv)
            now = max(now, end)
            empty_rounds = 0
        elif plan is not None and not plan.members:
            empty_rounds += 1  # everyone running was preempted; vLLM runs no model step, the next round admits
            if empty_rounds > len(lives) + 1:
                break
        elif plan is None:
            if not pending:
                break
            now = max(now, pending[0].req.arrival_ts)
    waits = {victim.req.request_id: tracer.waits() for victim, tracer in tracers}
    outcomes = {lv.req.request_id: SimOutcome(
        lv.req.request_id, lv.scheduled_ts, lv.first_token_ts, lv.finish_ts, tuple(lv.token_ts), lv.preemptions,
        waits.get(lv.req.request_id, ()), lv.queued_ts) for lv in lives}
    return SimResult(outcomes, steps, preemptions, peak_blocks, peak_tokens)


def _place(start: SimStart, by_id: Mapping[str, LiveRequest], running: list[LiveRequest],
           waiting: deque[LiveRequest], pool: FreeBlockQueue, block_size: int) -> set[str]:
    """Put the requests on the engine at the start as observed: running ones holding their KV (as much of it
    as the pool has room for), queued ones in order. Returns their ids (they do not arrive again)."""
    placed: set[str] = set()
    for ip in start.state:
        lv = by_id.get(ip.request_id)
        if lv is None:
            raise ValueError(f"request {ip.request_id!r} in the start state is not among the requests")
        placed.add(ip.request_id)
        lv.queued_ts = lv.req.arrival_ts
        lv.scheduled_ts = ip.scheduled_ts
        if lv.refused:
            continue
        prompt = lv.req.prompt_tokens
        outputs = 1 if ip.running and ip.outputs == 0 and ip.computed >= prompt else ip.outputs
        lv.outputs = min(max(outputs, 0), lv.target - 1)
        if lv.outputs:
            lv.first_token_ts = ip.first_token_ts if ip.first_token_ts is not None else start.ts
        if not ip.running:
            waiting.append(lv)
            continue
        lv.computed = min(max(ip.computed, 0), prompt + lv.outputs - 1 if lv.outputs else prompt - 1)
        lv.blocks = min(ip.blocks or blocks_for(lv.computed, block_size), pool.free)
        pool.allocate(lv.blocks)
        if lv.scheduled_ts is None:
            lv.scheduled_ts = start.ts
        running.append(lv)
    return placed


class StretchTracer:
    """What the tracers see of a decode stretch (`sim_stretch`), step j: every running request decoding its
    `computed + j`-th token, admission stopped where `schedule_step` would stop it, the blocks held as allocated
    by then. A tracer whose victim runs, or waits behind a full budget, only splits each step's time by the others'
    marginal costs: priced by a frozen fit above its floor those are c + d x context, so its steps are summed as two
    numbers and spread over the members once, at `flush`. One that waits for KV or a seat blames the same requests
    all stretch long (the holders by blocks between block boundaries, the queue's head, the running alike), so its
    steps' seconds are summed and shared out at `flush` (both: the same parts up to float rounding). The others
    (a victim with recompute left, a fit at its floor) are shown each step's members (`_trace_step`)."""

    def __init__(self, tracers: list[tuple[LiveRequest, VictimTracer]], pricer: Pricer, running: list[LiveRequest],
                 waiting: deque[LiveRequest], config: SchedulerConfig, now: float) -> None:
        """`now`: the engine clock at the stretch's start (its first step begins no earlier). Nothing is worked
        out until a first step is seen: most calls of `decode_stretch` find no stretch."""
        self._args = (tracers, waiting, config, now)
        self._pricer, self._running = pricer, running
        self._ready = False

    def _setup(self) -> None:
        tracers, waiting, config, now = self._args
        pricer, running = self._pricer, self._running
        n, bs = len(running), config.block_size
        self._n, self._bs = n, bs
        self._blocked = blocked = waiting[0] if waiting and n < config.token_budget and n < config.max_num_seqs \
            else None
        self._stop = stop = "empty" if not waiting else "budget" if n >= config.token_budget else \
            "seats" if blocked is None else "kv"
        self._base = [(r.req.request_id, r.computed, r.redo_until, r.blocks) for r in running]
        self._context = sum(computed + 1 for _, computed, _, _ in self._base)
        self._hold: Blame | None = None
        self._changes = 0  # the step from which the blocks held change again (each request's next block boundary)
        # (tracer, its victim's context at step 0 or None when it waits, its first token seen, [k0, k1, first ts])
        self._fast: list[tuple[VictimTracer, int | None, bool, list[float]]] = []
        self._slow: list[tuple[LiveRequest, VictimTracer]] = []
        self._queued: list[tuple[VictimTracer, bool]] = []  # waiting for KV or a seat, first token seen
        self._waited = [0.0, 0.0]  # the queued tracers' steps: seconds summed, first begin
        self._segments: list[tuple[Blame, list[float]]] = []  # (holders, [seconds summed, first begin]) by boundary
        frozen = pricer.frozen
        self._c = self._d = 0.0
        if frozen is not None and frozen.c >= 0 and frozen.d >= 0 and (frozen.c > 0 or frozen.d > 0):
            self._c, self._d = frozen.c, frozen.d
            # the least a step costs without one member (the longest context left out) at step 0: above the
            # floor, every marginal is c + d x context, and it only grows with j
            top = max((computed + 1 for _, computed, _, _ in self._base), default=0)
            least = frozen.a + frozen.b * 0 + frozen.c * (n - 1) + frozen.d * (self._context - top)
            above = least > frozen.floor_s * (1 + 1e-9) + 1e-12
        else:
            above = False
        self._head_traced = False  # the queue's head, waiting for KV, is traced: it blames the holders
        on = set(map(id, running))
        queued = set(map(id, waiting))
        for victim, tracer in tracers:
            if victim.finish_ts is not None or victim.refused:
                continue
            if victim.req.arrival_ts > now:  # not yet arrived (or placed early by a start): steps to see it come
                self._slow.append((victim, tracer))
            elif above and id(victim) in on and victim.redo_until <= victim.computed and n > 1:
                self._fast.append((tracer, victim.computed + 1, True, [0.0, 0.0, 0.0]))
            elif id(victim) not in queued:
                self._slow.append((victim, tracer))
            elif above and stop == "budget":
                self._fast.append((tracer, None, victim.first_token_ts is not None, [0.0, 0.0, 0.0]))
            elif stop in ("kv", "seats"):
                self._queued.append((tracer, victim.first_token_ts is not None))
                self._head_traced = self._head_traced or victim is blocked
            else:
                self._slow.append((victim, tracer))

    def __call__(self, j: int, begin: float, end: float, seconds: float) -> None:
        if not self._ready:
            self._setup()
            self._ready = True
        if self._queued:
            if not self._waited[0]:
                self._waited[1] = begin
            self._waited[0] += end - begin
            if self._head_traced:  # the holders by blocks, per block boundary
                self._held(j)
                hold = self._hold if self._hold is not None else ()
                if not self._segments or self._segments[-1][0] is not hold:
                    self._segments.append((hold, [0.0, begin]))
                self._segments[-1][1][0] += end - begin
        n, c, d = self._n, self._c, self._d
        context = self._context + j * n
        duration = end - begin
        for _, own, _, acc in self._fast:
            if own is None:  # waiting behind the full budget: the whole step
                wait, spent = duration, n * c + d * context
            else:
                mine = own + j
                wait = duration - self._pricer.price5(0, 1, mine, 0, 0)
                spent = (n - 1) * c + d * (context - mine)
            if wait > 0 and spent > 0:
                k = wait / spent
                if not acc[0]:
                    acc[2] = begin
                acc[0] += k
                acc[1] += k * j
        if self._slow:
            shown = [t for t in self._slow if t[0].req.arrival_ts <= end]  # not yet arrived: nothing to see
            if shown:
                self._step(shown, j, begin, end, seconds)

    def flush(self) -> None:
        """Spread the fast tracers' sums over the members (once the stretch has run)."""
        if not self._ready:
            return
        contexts = [(rid, computed + 1) for rid, computed, _, _ in self._base]
        for tracer, own, itl, (k0, k1, ts) in self._fast:
            tracer.decode_stretch(contexts, tracer.request_id if own is not None else None, k0, k1, self._c,
                                  self._d, ts, itl)
        if not self._queued or not self._waited[0]:
            return
        blocked = self._blocked.req.request_id if self._blocked is not None else None
        waited, first = self._waited
        for tracer, itl in self._queued:
            if self._stop == "seats":
                tracer.add("decode_batching", waited, tuple((r, 1 / self._n) for r, _, _, _ in self._base), first,
                           itl)
            elif blocked == tracer.request_id:  # the queue's head: the holders, segment by segment
                for hold, (secs, ts) in self._segments:
                    tracer.add("kv_pressure", secs, hold, ts, itl)
            elif blocked is not None:
                tracer.add("head_of_line", waited, ((blocked, 1.0),), first, itl)

    def _held(self, j: int) -> None:
        """The block holders' blame at step j (recomputed at each block boundary)."""
        if self._hold is None or j >= self._changes:
            bs = self._bs
            held = [(rid, max(blocks, -(-(computed + j + 1) // bs)), computed)
                    for rid, computed, _, blocks in self._base]
            total = sum(b for _, b, _ in held)
            self._hold = tuple((rid, b / total) for rid, b, _ in held if b > 0) if total > 0 else ()
            self._changes = min(b * bs - computed for _, b, computed in held)

    def _step(self, tracers: list[tuple[LiveRequest, VictimTracer]], j: int, begin: float, end: float,
              seconds: float) -> None:
        n, stop = self._n, self._stop
        if stop == "kv":
            self._held(j)
        members = [Member(rid, 1, computed + j, True, redo) for rid, computed, redo, _ in self._base]
        _trace_step(tracers, self._pricer, StepPlan(members, [], stop, self._blocked), begin, end, self._running,
                    ((0, n, self._context + j * n, 0, 0), seconds), self._hold if stop == "kv" else None)


def _trace_step(tracers: list[tuple[LiveRequest, VictimTracer]], pricer: Pricer, plan: StepPlan, now: float,
                end: float, running: list[LiveRequest], priced: tuple[Features, float],
                hold: Blame | None = None) -> None:
    """Show one step to every tracer whose request is in flight (the others would ignore it). `priced`: the
    step's features and price; `hold`: the block holders' blame when the caller knows it better than the
    running requests' blocks say."""
    blocked = plan.blocked.req.request_id if plan.blocked is not None else None
    if hold is None:  # only these stops blame the block holders ...
        hold = holders(running) if plan.stop in ("kv", "preemption") else ()
    ids = [r.req.request_id for r in running] if plan.stop == "seats" else []  # ... and only this one the running
    prices: StepPrices | None = None
    for victim, tracer in tracers:
        if victim.finish_ts is not None or victim.refused or victim.req.arrival_ts > end:
            continue
        if prices is None:
            prices = StepPrices(pricer, plan.members, priced)
        view = VictimView(victim.req.arrival_ts, True, victim in running, victim in plan.preempted,
                          victim.first_token_ts is not None, victim.forced_by)
        tracer.step(now, end, plan.members, plan.stop, blocked, hold, ids, view, prices)


def _compute(lv: LiveRequest, tokens: int) -> bool:
    """When the step is scheduled (vLLM's `_update_after_schedule`): its tokens count as computed; a request
    whose KV catches up will sample a token at the step's end. Returns whether it samples."""
    lv.computed += tokens
    lv.in_flight += 1
    if lv.computed < lv.num_tokens:
        return False
    lv.pending += 1
    return True


def _compute_all(members: list[Member], by_id: Mapping[str, LiveRequest]) -> list[tuple[LiveRequest, bool]]:
    """`_compute` for every member of a step: (request, whether it samples), in member order."""
    out = []
    for m in members:
        lv = by_id[m.request_id]
        computed = lv.computed = lv.computed + m.tokens
        lv.in_flight += 1
        samples = computed >= lv.req.prompt_tokens + lv.outputs + lv.pending  # num_tokens, inlined
        if samples:
            lv.pending += 1
        out.append((lv, samples))
    return out


def _deliver(lv: LiveRequest, samples: bool, end: float, running: list[LiveRequest],
             waiting: deque[LiveRequest], pool: FreeBlockQueue, block_size: int) -> None:
    """The step's output is back: a sampled token counts (even for a request preempted meanwhile, as vLLM
    delivers it); done requests free their blocks (the full ones hashed, at the back of the free queue)."""
    _deliver_all([(lv, samples)], end, running, waiting, pool, block_size)


def _deliver_all(done: list[tuple[LiveRequest, bool]], end: float, running: list[LiveRequest],
                 waiting: deque[LiveRequest], pool: FreeBlockQueue, block_size: int) -> list[LiveRequest]:
    """`_deliver` for a whole step, in member order; returns the requests it finished."""
    finished = []
    for lv, samples in done:
        lv.in_flight -= 1
        if not samples:
            continue
        lv.pending -= 1
        outputs = lv.outputs = lv.outputs + 1
        lv.token_ts.append(end)
        if lv.first_token_ts is None:
            lv.first_token_ts = end
        if outputs >= lv.target:
            finish(lv, end, running, waiting, pool, block_size)
            finished.append(lv)
    return finished


def shapley(players: Sequence[str], value: Callable[[frozenset[str]], float], *, exact_up_to: int = 6,
            permutations: int = 64, seed: int = 0) -> dict[str, float]:
    """Shapley values: exact for up to `exact_up_to` players, else permutation sampling (seeded, antithetic
    pairs, deterministic). Values are cached per coalition; the shares always sum to v(all) - v(none)."""
    if len(set(players)) != len(players):
        raise ValueError("players must be distinct")
    if len(players) <= exact_up_to:
        return shapley_values(players, value)
    cache: dict[frozenset[str], float] = {}

    def v(s: frozenset[str]) -> float:
        if s not in cache:
            cache[s] = value(s)
        return cache[s]

    rng = random.Random(seed)
    totals = dict.fromkeys(players, 0.0)
    order = list(players)
    rounds = max(2, permutations + permutations % 2)
    for k in range(rounds):
        if k % 2 == 0:
            rng.shuffle(order)
        coalition: frozenset[str] = frozenset()
        before = v(coalition)
        for p in order if k % 2 == 0 else reversed(order):
            coalition = coalition | {p}
            after = v(coalition)
            totals[p] += after - before
            before = after
    return {p: totals[p] / rounds for p in players}


def _metric(outcome: SimOutcome, arrival_ts: float, metric: str) -> float:
    if metric == "ttft":
        value = outcome.ttft_s(arrival_ts)
    else:
        value = outcome.mean_itl_s
    return value if value is not None else 0.0


def slowdown_shares(requests: Sequence[SimRequest], config: SchedulerConfig, cost: StepCost, victim: str,
                    players: Mapping[str, Collection[str]], *, metric: str = "ttft", exact_up_to: int = 6,
                    permutations: int = 64, seed: int = 0) -> tuple[dict[str, float], dict[frozenset[str], float]]:
    """Each player's Shapley share of the victim's simulated slowdown: `metric` ("ttft" or "itl", seconds)
    with every player present minus with none. A player is a label for a set of request ids (one heavy culprit,
    or the light ones pooled); requests in no player always stay. Returns (shares, slowdown per coalition
    simulated)."""
    if metric not in ("ttft", "itl"):
        raise ValueError("metric must be 'ttft' or 'itl'")
    target = next((r for r in requests if r.request_id == victim), None)
    if target is None:
        raise ValueError(f"victim {victim!r} is not among the requests")
    owner = {rid: label for label, ids in players.items() for rid in ids if rid != victim}
    runs: dict[frozenset[str], float] = {}

    def run(present: frozenset[str]) -> float:
        if present not in runs:
            kept = [r for r in requests if r.request_id not in owner or owner[r.request_id] in present]
            result = simulate(kept, config, cost)
            runs[present] = _metric(result.outcomes[victim], target.arrival_ts, metric)
        return runs[present]

    baseline = run(frozenset())
    shares = shapley(list(players), lambda s: run(s) - baseline, exact_up_to=exact_up_to,
                     permutations=permutations, seed=seed)
    return shares, {s: v - baseline for s, v in runs.items()}
