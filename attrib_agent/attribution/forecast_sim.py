"""The forecast's re-simulation: vLLM's scheduler run on from a state mid-flight, not from arrivals.

The scheduling rules are the attribution's own (`sim_step.schedule_step`, `scheduler_sim`'s token advance),
priced by the same step-cost model. What is added: starting from requests that already hold KV and tokens,
and jumping over stretches of identical decode steps (nobody admitted, nobody finishing, no block to
allocate, no arrival due) in one go, which is most of a whale's life and most of a forecast's cost.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from attrib_agent.attribution.block_pool import FreeBlockQueue
from attrib_agent.attribution.forecast_types import EngineState
from attrib_agent.attribution.sim_step import LiveRequest, blocks_for, finish, plan_sync
from attrib_agent.attribution.sim_stretch import advance, fitting_steps
from attrib_agent.attribution.sim_trace import Pricer
from attrib_agent.attribution.sim_types import SimRequest, StepCost

SMALL_STRETCH = 64  # stretches shorter than this get their step ends in plain Python (numpy costs more there)

Piece = tuple[float, float, float, int] | list[float]
"""A run of a stretch's step ends: (now, first step's price, slope, steps) in closed form, or the ends listed."""
Window = list[float]
"""A request's token times within the window, summed up as the simulator delivers them: [count, first, last,
gaps longer than the ITL limit] (what `forecast._harm` compares, with no pass over the token times)."""


@dataclass(slots=True)
class Run:
    """One simulated future: per request its first token, its new token times, its preemptions."""

    first_token: dict[str, float | None]
    tokens: dict[str, list[float]]
    preemptions: int
    first_stop: str  # why admission stopped in the first step
    first_members: frozenset[str]
    first_blocked: str | None  # the waiting request that did not fit in the first step
    window: dict[str, Window] = field(default_factory=dict)  # per request, its tokens up to `until`, summed up


def simulate_from(state: EngineState, cost: StepCost, extra: Sequence[tuple[SimRequest, int]],
                  watch: set[str], max_steps: int, first_token_only: frozenset[str] = frozenset(),
                  until: float | None = None, itl_limit: float = math.inf, keep_tokens: bool = True) -> Run:
    """Run the scheduler on from `state` with `extra` requests (and their cached prefix tokens) joining at their
    arrival, until every watched request has finished, or for those in `first_token_only` has its first token
    (or `max_steps`). With `until`, a run also stops once it is past `until` and every watched request has its
    first token: what comes later changes no TTFT, and the caller reads token times up to `until` only. Each
    request's tokens up to `until` are also summed up as they come (`Run.window`, gaps over `itl_limit` counted);
    without `keep_tokens` their times are not kept (`Run.tokens` empty): the sums are what the forecast reads."""
    cfg = state.sched
    bs, usable, max_seqs = cfg.block_size, cfg.num_blocks - 1, cfg.max_num_seqs
    pool = FreeBlockQueue(usable, cfg.prefix_caching)
    running: list[LiveRequest] = []
    waiting: deque[LiveRequest] = deque()
    lives: list[LiveRequest] = []
    for i, r in enumerate(state.requests):
        lv = LiveRequest(SimRequest(r.request_id, r.arrival_ts, r.prompt_tokens, r.outputs + r.remaining), i,
                         max(r.outputs + r.remaining, 1), computed=r.computed if r.running else 0,
                         outputs=r.outputs, first_token_ts=r.first_token_ts, queued_ts=r.arrival_ts)
        lv.refused = blocks_for(r.prompt_tokens + lv.target - 1, bs) > usable
        if r.running:
            lv.blocks = min(blocks_for(r.computed, bs), pool.free)
            pool.allocate(lv.blocks)
            lv.scheduled_ts = r.arrival_ts
            running.append(lv)
        elif not lv.refused:
            waiting.append(lv)
        lives.append(lv)
    pending: deque[LiveRequest] = deque()
    j = len(state.requests)
    for req, cached in sorted(extra, key=_arrival):  # (per expected arrival: a few dozen a run)
        target = req.output_tokens if req.output_tokens > 1 else 1
        lv = LiveRequest(req, j, target)
        j += 1
        lv.refused = refused = -(-(req.prompt_tokens + target - 1) // bs) > usable  # blocks_for, inlined
        hit = cached // bs
        if hit and not refused:  # its prefix sits in the free queue, reusable until allocation evicts it
            hit = min(hit, pool.free)
            if hit:
                pool.allocate(hit)
                pool.release(lv.index, hit, hit)
        pending.append(lv)
        lives.append(lv)
    by_id = {lv.req.request_id: lv for lv in lives}
    awaited = {rid for rid in watch if rid in by_id and not by_id[rid].refused
               and not (rid in first_token_only and by_id[rid].first_token_ts is not None)}
    unserved = {rid for rid in awaited if by_id[rid].first_token_ts is None}  # no first token yet
    pricer = Pricer(cost)
    price5 = pricer.price5
    win: list[Window] = [[0.0, 0.0, 0.0, 0.0] for _ in lives]  # by LiveRequest.index
    upto = math.inf if until is None else until
    sums = (win, itl_limit, keep_tokens)
    now, steps, preemptions, empty = busy_since(state, running, waiting, price5), 0, 0, 0
    short = False  # the last stretch stopped where the blocks ran short: the next step is scheduled (it preempts)
    first_stop, first_members, first_blocked = "", frozenset[str](), None
    while steps < max_steps and awaited and (until is None or unserved or now < until):
        while pending and pending[0].req.arrival_ts <= now:
            lv = pending.popleft()
            if not lv.refused:
                waiting.append(lv)
        if not running and not waiting:
            if not pending:
                break
            now = pending[0].req.arrival_ts
            continue
        jumped = 0
        # the first step is always scheduled: it says whether the candidate is admitted now; nor is there a stretch
        # when the queue's head fits (blocks_for its num_tokens, inlined): admission takes it in the next step
        if first_stop and not short and not (waiting and len(running) < max_seqs and -(
                -(waiting[0].req.prompt_tokens + waiting[0].outputs + waiting[0].pending) // bs) <= pool.free):
            jumped, now, finished, short = _decode_stretch(running, waiting, pool, max_seqs, bs, pricer, now,
                                                    pending, max_steps - steps, until, unserved,
                                                    sums)
            for lv in finished:  # as a scheduled step's delivery: they had their first token already
                awaited.discard(lv.req.request_id)
        if jumped:
            steps += jumped
            continue
        short = False
        members: list[tuple[LiveRequest, int]] = []
        preempted, stop, blocked, f1, f2, f3, f4, f5 = plan_sync(running, waiting, pool, cfg, now, members)
        if until is None or now < until:  # counted within the window both runs cover
            preemptions += preempted
        if not first_stop and now >= state.now:  # the first step to start from now: whom it admits
            first_stop, first_members = stop, frozenset(lv.req.request_id for lv, _ in members)
            first_blocked = blocked.req.request_id if blocked is not None else None
        if not members:
            empty += 1
            if empty > len(lives) + 1:
                break
            continue
        empty = 0
        end = now + price5(f1, f2, f3, f4, f5)
        for lv, n in members:  # vLLM's sync scheduling: computed, then delivered at the end of the step (one
            computed = lv.computed = lv.computed + n  # member's delivery touches no other member: in one pass)
            if computed < lv.req.prompt_tokens + lv.outputs:
                continue  # a prefill chunk short of the prompt's end: no token
            outputs = lv.outputs = lv.outputs + 1
            if keep_tokens:
                lv.token_ts.append(end)
            if lv.first_token_ts is None:  # its first token: awaited no more for it
                lv.first_token_ts = end
                rid = lv.req.request_id
                unserved.discard(rid)
                if rid in first_token_only:
                    awaited.discard(rid)
            if outputs >= lv.target:
                finish(lv, end, running, waiting, pool, bs)
                awaited.discard(lv.req.request_id)
            if end <= upto:  # `_took(win[lv.index], end, end, 1, 0, itl_limit)`, inlined: per member per step
                w = win[lv.index]
                if w[0]:
                    w[3] += end - w[2] > itl_limit
                else:
                    w[1] = end
                w[0] += 1
                w[2] = end
        now = end
        steps += 1
    return Run({lv.req.request_id: lv.first_token_ts for lv in lives},
                {lv.req.request_id: lv.token_ts for lv in lives} if keep_tokens else {}, preemptions, first_stop,
                first_members, first_blocked, {lv.req.request_id: win[lv.index] for lv in lives})


def busy_since(state: EngineState, running: Sequence[LiveRequest], waiting: Sequence[LiveRequest],
               price: Callable[[int, int, int, int, int], float]) -> float:
    """When the run's first step starts: `state.now`, unless the engine was idle with a request waiting since
    before it whose first step would still be under way. vLLM's engine starts a step as soon as a request
    reaches an idle engine, so at `now` that step has run for a while (no step line has ended it yet) and
    whoever comes now waits for the rest of it, not for all of it from now: preempt/w2 came 49 ms into w1's
    first 2,048-token chunk (56-69 ms). A request waiting longer than its first chunk takes (priced alone:
    `price`, the five features in) is not in such a step: the state is behind the engine (no step line read
    yet), and the run starts from now as before."""
    if running or not waiting:
        return state.now
    first = min(waiting, key=lambda lv: lv.req.arrival_ts)
    began = first.req.arrival_ts
    if began >= state.now:
        return state.now
    n = min(state.sched.token_budget, max(first.req.prompt_tokens, 1))
    return began if began + price(n, 0, 0, n * (n + 1) // 2, 1) > state.now else state.now


def _arrival(extra: tuple[SimRequest, int]) -> float:
    return extra[0].arrival_ts


def _decode_stretch(running: list[LiveRequest], waiting: deque[LiveRequest], pool: FreeBlockQueue, max_seqs: int,
                    bs: int, pricer: Pricer, now: float, pending: deque[LiveRequest], max_steps: int,
                    until: float | None, unserved: set[str],
                    window: tuple[list[Window], float, bool] | None = None
                    ) -> tuple[int, float, list[LiveRequest], bool]:
    """Run the coming steps at once while they are all alike: every running request decodes one token, their
    new blocks fit in the free ones and the queue's head cannot be admitted (no blocks or no seat: the caller
    checks that one first, and calls only when it holds; `max_seqs` is the seats it checked against). The stretch
    ends with the first step that finishes a request (delivered as a scheduled step delivers it), or at the next
    arrival; but when someone waits, arrivals only join the queue behind a head that fits even less later, and
    the stretch goes on past them (up to the run's own stop at `until` once no first token is awaited in
    `unserved`). The same steps as `schedule_step` one by one, and the same times, to the bit, as stretches
    broken at every arrival and finish: each piece is summed in closed form from the step an arrival fell in,
    and a finishing step is added to the end of the one before it. Past `until` the token times are not kept
    (only first tokens are read there); those up to `until` are summed up in `window` (by request index, with
    the ITL limit). Returns (steps run, new time, the requests its last step finished, whether it stopped where
    the free blocks ran out: the next step cannot be one of a stretch)."""
    if not running:
        return 0, now, [], False
    last = running[-1]  # the last admitted, most often the one still prefilling: looked at first
    if last.computed + 1 != last.req.prompt_tokens + last.outputs + last.pending or last.outputs < 1:
        return 0, now, [], False
    context, finish_in = 0, max_steps + 1  # one pass: the pattern check, the context and the steps up to a finish
    for r in running:
        computed, outputs = r.computed, r.outputs
        if computed + 1 != r.req.prompt_tokens + outputs + r.pending or outputs < 1:
            return 0, now, [], False
        context += computed + 1
        left = r.target - outputs  # steps up to the one that finishes it
        if left < finish_in:
            finish_in = left
    n = len(running)
    most = finish_in if finish_in < max_steps else max_steps
    k = fitting_steps(running, pool.free, bs, most)
    if k <= 0:
        return 0, now, [], False
    price = pricer.price4
    alike = k - 1 if k == finish_in else k  # the steps before the one that finishes a request, if within k
    cross = bool(waiting)
    pieces: list[Piece] = []  # the step ends, kept as closed forms: lists only where a reader needs them
    t, done, a, crossed = now, 0, 0, False  # a: the next arrival in `pending` (those before `now` are queued)
    top = 0.0  # the longest step's price
    while done < alike:
        nxt = pending[a].req.arrival_ts if a < len(pending) else None
        s, t, longest = _alike(price, n, context + done * n, t, alike - done, nxt,
                               pieces if until is None or t < until else None)
        if longest > top:
            top = longest
        done += s
        crossed = False
        if nxt is None or t < nxt or not cross or (until is not None and not unserved and t >= until):
            break  # (the run stops at `until` once no first token is awaited: so does the stretch)
        while a < len(pending) and pending[a].req.arrival_ts <= t:  # due: they join behind the blocked head
            a += 1
        crossed = True
    nxt = pending[a].req.arrival_ts if a < len(pending) else None
    if done == alike < k and (nxt is None or t < nxt) and not (crossed and until is not None and not unserved
                                                                and t >= until):
        closing = price(0, n, context + done * n, 0)  # the finishing step, priced as a scheduled step is (once)
        if until is None or t < until:
            pieces.append([t + closing])
        t += closing
        if closing > top:
            top = closing
        done += 1
    keep = True
    ends: list[float] = []
    if window is not None and pieces:
        win, limit, keep = window
        upto = math.inf if until is None else until
        first_end, last_end = _first_last(pieces)
        if not keep and last_end <= upto and top < limit - 64 * math.ulp(last_end):  # no gap over the limit
            count = 0
            for x in pieces:
                count += len(x) if isinstance(x, list) else x[3]
            for r in running:  # all within the window: its sums only, as `_took_stretch` makes them (`_took`
                w = win[r.index]  # with no gap over the limit, inlined: per running request per stretch)
                if w[0]:
                    w[3] += first_end - w[2] > limit
                else:
                    w[1] = first_end
                w[0] += count
                w[2] = last_end
        else:
            ends = _ends(pieces)
            _took_stretch(running, ends, upto, top, win, limit)
    elif pieces:
        ends = _ends(pieces)
    finished = advance(running, ends if keep else [], bs, pool, done)
    for r in finished:  # in member order, after every allocation, as the step loop delivers them
        finish(r, t, running, waiting, pool, bs)
    return done, t, finished, done == k < most


def _alike(price: Callable[[int, int, int, int], float], n: int, context: int, now: float, m: int,
           next_arrival: float | None, ends: list[Piece] | None) -> tuple[int, float, float]:
    """Up to `m` alike decode steps of `n` requests from `now` (the first attends to `context` tokens), ending
    with the one in which `next_arrival` falls; their ends appended to `ends` (unless None) as one piece: the
    closed form's (now, first, slope, steps), or the list of them when priced step by step. Returns (steps run,
    the last one's end, the longest one's price)."""
    first = price(0, n, context, 0)
    slope = price(0, n, context + n, 0) - first  # each step attends to n more tokens
    if abs(price(0, n, context + (m - 1) * n, 0) - (first + (m - 1) * slope)) > 1e-9 * (1 + first):
        t, j, top = now, 0, 0.0  # a cost model not linear in the context: price step by step
        listed: list[float] = []
        while j < m and (next_arrival is None or t < next_arrival):
            seconds = price(0, n, context + j * n, 0)
            t += seconds
            top = max(top, seconds)
            j += 1
            listed.append(t)
        if ends is not None and listed:
            ends.append(listed)
        return j, t, top

    def end(j: int) -> float:  # step j (0-based) costs first + j * slope: its end in closed form
        return now + (j + 1) * first + slope * j * (j + 1) / 2

    if next_arrival is not None and end(m - 1) >= next_arrival:
        # the step in which the arrival falls is the last one: the queue is looked at after it. The first j with
        # end(j) >= next_arrival (ends rise with j), found from the quadratic's root and a step or two either side
        j = _root(first, slope, next_arrival - now, m - 1)
        if end(j) >= next_arrival:
            while j and end(j - 1) >= next_arrival:
                j -= 1
        else:
            j += 1
            while end(j) < next_arrival:
                j += 1
        m = j + 1
    if ends is not None:
        ends.append((now, first, slope, m))
    last = first + (m - 1) * slope
    return m, end(m - 1), last if last > first else first  # end: the same expression as `_ends`' last


def _root(first: float, slope: float, span: float, most: int) -> int:
    """About the step j (0 to `most`) whose end, (j + 1) * first + slope * j * (j + 1) / 2 after the start,
    reaches `span`: where `_alike` starts its search for the exact one."""
    b = first + slope / 2  # slope / 2 * j^2 + b * j + first - span = 0
    if slope > 1e-12 * first:
        x = (math.sqrt(b * b + 2 * slope * (span - first)) - b) / slope if b * b + 2 * slope * (span - first) > 0 else 0
    else:
        x = (span - first) / b if b > 0 else 0.0
    return 0 if not x > 0 else most if x >= most else int(x)


def _ends(pieces: list[Piece]) -> list[float]:
    """A stretch's step ends, one float per step, from its pieces."""
    ends: list[float] = []
    for x in pieces:
        if isinstance(x, list):
            ends.extend(x)
            continue
        now, first, slope, m = x
        if m < SMALL_STRETCH:  # the same float operations in the same order as numpy's: the same values
            ends.extend([now + (j + 1) * first + slope * j * (j + 1) / 2 for j in range(m)])
        else:
            jj = np.arange(m, dtype=np.float64)
            ends.extend((now + (jj + 1) * first + slope * jj * (jj + 1) / 2).tolist())
    return ends


def _first_last(pieces: list[Piece]) -> tuple[float, float]:
    """A stretch's first and last step ends, as `_ends` gives them, without the list."""
    x, y = pieces[0], pieces[-1]
    if isinstance(x, list):
        first = x[0]
    else:
        now, price, slope, _ = x
        first = now + (0 + 1) * price + slope * 0 * (0 + 1) / 2
    if isinstance(y, list):
        return first, y[-1]
    now, price, slope, m = y
    j = m - 1
    return first, now + (j + 1) * price + slope * j * (j + 1) / 2


def _took(w: Window, first: float, last: float, count: int, over: int, limit: float) -> None:
    """`count` tokens from `first` to `last`, `over` of their gaps longer than `limit`, join a request's window."""
    if w[0]:
        over += first - w[2] > limit
    else:
        w[1] = first
    w[0] += count
    w[2] = last
    w[3] += over


def _took_stretch(running: list[LiveRequest], ends: list[float], until: float, top: float, win: list[Window],
                  limit: float) -> None:
    """A stretch's step ends up to `until` join every running request's window: its inner gaps are counted once,
    for all (the same subtractions as of each request's token times), and not at all when its longest step
    (`top`) is shorter than `limit` by more than the rounding of a difference of two ends (a few units in the
    last place of the clock)."""
    cut = len(ends) if ends[-1] <= until else bisect.bisect_right(ends, until)
    if not cut:
        return
    over = 0
    if top >= limit - 64 * math.ulp(ends[cut - 1]):
        for a, b in zip(ends, ends[1:cut], strict=False):
            if b - a > limit:
                over += 1
    first, last = ends[0], ends[cut - 1]
    for r in running:
        _took(win[r.index], first, last, cut, over, limit)
