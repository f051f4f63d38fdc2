"""Why one traced request waited, step by step, inside a scheduler re-simulation.

Each simulated step the victim either did not progress (the whole step is a wait) or progressed more slowly
than alone (the step's excess over its own solo cost is a wait). Causes, and whom they blame:
- kv_pressure: admission refused because the free blocks were too few; split by blocks held.
- head_of_line: queued behind a waiting request that did not fit; blamed on that request.
- prefill_contention / decode_batching / kv_bandwidth: the step's time (or its excess) split by each other
  member's marginal cost: prefill chunks; decodes' per-request cost; decodes' per-context-token cost.
- preemption: the step the victim was preempted in, and the recompute of what it had already computed;
  blamed on the request whose growth forced it (or on the block holders when it preempted itself).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from attrib_agent.attribution.sim_cache import FrozenCost
from attrib_agent.attribution.sim_types import StepCost, WaitCause

# prefill tokens, decode requests, decode context sum, prefill pairs, prefilling requests
Features = tuple[int, int, int, int, int]
DecodeFeatures = tuple[int, int, int, int]  # the first four: a step with nothing prefilling
Blame = tuple[tuple[str, float], ...]  # request id -> weight (summing to 1)


@dataclass(slots=True, unsafe_hash=True)
class Member:
    """One request's part in one simulated step. Treated as immutable (hashed by value), but not frozen: a frozen
    dataclass's constructor costs three times as much, and the simulator makes one per member per step."""

    request_id: str
    tokens: int
    prior: int  # tokens in its KV before this step
    decode: bool  # one token on a fully computed context
    redo_until: int = 0  # tokens below this were computed before a preemption: redoing them is waste

    def features(self) -> Features:
        if self.decode:
            return (0, 1, self.prior + 1, 0, 0)
        return (self.tokens, 0, 0, self.tokens * self.prior + self.tokens * (self.tokens + 1) // 2, 1)


class Pricer:
    """Prices a step's members with the cost model (prefill attention too when the model offers it)."""

    def __init__(self, cost: StepCost) -> None:
        self._cost = cost
        # what `isinstance(cost, PrefillAwareStepCost)` checks (the method's presence), without the runtime
        # protocol check's ~40 us: a forecast builds a Pricer per simulated run
        aware: Callable[..., float] | None = getattr(cost, "step_seconds_with_prefill", None)
        # the five features in, seconds out: bound once, called per member per traced step
        price = aware if aware is not None else self._blind
        self.price5: Callable[[int, int, int, int, int], float] = price
        self.price4: Callable[[int, int, int, int], float] = price  # nothing prefilling: decode stretches
        # a frozen fit's prices (the re-simulation's): a decode-only step's marginals are then worked out in one
        # loop, the formula's operations in its order (the same floats), not two calls per member
        self.frozen: FrozenCost | None = cost if type(cost) is FrozenCost else None

    def _blind(self, t: int, r: int, c: int, p: int, n: int = 0) -> float:
        return self._cost.step_seconds(t, r, c)

    @staticmethod
    def features(members: list[Member]) -> Features:
        t = r = c = p = q = 0  # integer sums: the same in any order
        for m in members:
            if m.decode:
                r += 1
                c += m.prior + 1
            else:
                n = m.tokens
                t += n
                p += n * m.prior + n * (n + 1) // 2
                q += 1
        return (t, r, c, p, q)

    def price(self, f: Features | DecodeFeatures) -> float:
        """A step's seconds; four features are a step with nothing prefilling."""
        return self.price5(f[0], f[1], f[2], f[3], f[4] if len(f) > 4 else 0)

    def seconds(self, members: list[Member]) -> float:
        return self.price(self.features(members))

    def solo(self, member: Member) -> float:
        """`seconds([member])`: the member's own features are the step's (the same integers, the same price)."""
        return self.price5(*member.features())


class StepPrices:
    """One step's prices, shared by every tracer shown the step: the step's total and, per member, what
    leaving it out would save (all traced victims of a run see the same members)."""

    __slots__ = ("_pricer", "members", "total", "full", "_marginals", "_all")

    def __init__(self, pricer: Pricer, members: list[Member], priced: tuple[Features, float] | None = None) -> None:
        """`priced`: the members' features and their price, when the caller has them already."""
        self._pricer = pricer
        self.members = members
        if priced is None:
            self.total = pricer.features(members)
            self.full = pricer.price(self.total)
        else:
            self.total, self.full = priced
        self._marginals: dict[int, tuple[float, float]] = {}
        self._all: list[tuple[float, float]] | None = None

    def marginal(self, m: Member) -> tuple[float, float]:
        """(marginal cost, of which context bandwidth) of member `m` (bandwidth 0 for a prefill)."""
        got = self._marginals.get(id(m))
        if got is None:
            got = self._marginals[id(m)] = _marginal(m, self._pricer.price5, self.total, self.full)
        return got

    def marginals(self) -> list[tuple[float, float]]:
        """`marginal` of every member, in member order (computed once, for every tracer of the step)."""
        if self._all is None:
            price, total, full = self._pricer.price5, self.total, self.full
            frozen = self._pricer.frozen
            if frozen is not None and total[4] == 0:  # nothing prefilling: every member decodes
                self._all = _decode_marginals(frozen, self.members, total, full)
            else:
                self._all = [_marginal(m, price, total, full) for m in self.members]
        return self._all


def _decode_marginals(cost: FrozenCost, members: list[Member], total: Features,
                      full: float) -> list[tuple[float, float]]:
    """`_marginal` of each member of a decode-only step priced by `cost`: `FrozenCost.step_seconds_with_prefill`
    written out, its sum's leading terms (the same for every member) added once, in the formula's order."""
    t, r, c, p, q = total
    a, floor, gap = cost.a, cost.floor_s, cost.gap_s
    head_t = a + cost.b * t
    without = head_t + cost.c * (r - 1)  # ... the member left out
    kept = head_t + cost.c * r  # ... its requests counted, its context not
    d, ep, fq = cost.d, cost.e * p, cost.f * q
    out = []
    for m in members:
        rest = c - (m.prior + 1)
        x = without + d * rest + ep + fq
        marginal = full - ((floor if floor > x else x) + gap)
        if marginal < 0.0:
            marginal = 0.0
        y = kept + d * rest + ep + fq
        bandwidth = full - ((floor if floor > y else y) + gap)
        out.append((marginal, 0.0 if bandwidth < 0.0 else marginal if bandwidth > marginal else bandwidth))
    return out


def _marginal(m: Member, price: Callable[[int, int, int, int, int], float], total: Features,
              full: float) -> tuple[float, float]:
    """What leaving `m` out of a step costing `full` for features `total` would save, and of that the context
    bandwidth part (0 for a prefill): max(saving, 0), bandwidth clamped to [0, saving]."""
    t, r, c, p, q = total
    if m.decode:
        context = m.prior + 1
        marginal = full - price(t, r - 1, c - context, p, q)
        if marginal < 0.0:
            marginal = 0.0
        bandwidth = full - price(t, r, c - context, p, q)
        return marginal, 0.0 if bandwidth < 0.0 else marginal if bandwidth > marginal else bandwidth
    f = m.features()
    return max(full - price(t - f[0], r, c, p - f[3], q - 1), 0.0), 0.0


@dataclass(slots=True, unsafe_hash=True)
class VictimView:
    """The traced request as the scheduler saw it at this step (built per traced step: not frozen, as `Member`)."""

    arrival_ts: float
    in_flight: bool  # queued or running (not yet arrived, refused or finished: False)
    running: bool
    preempted_now: bool
    first_token_seen: bool
    forced_by: Blame


class VictimTracer:
    """Sums the traced request's waits per (cause, phase) and blaming request, step by step, into one map each: its
    readers (the light split, `simulated_causes`) only ever sum them so. Bounded by causes x phases entries, each
    by the requests of the run."""

    def __init__(self, request_id: str, pricer: Pricer) -> None:
        self.request_id = request_id
        self._pricer = pricer
        self._sums: dict[tuple[str, bool], dict[str, float]] = {}  # (cause, itl phase) -> request -> seconds
        self._ts: dict[tuple[str, bool], float] = {}  # ... the start of the first step that added to it

    def waits(self) -> tuple[WaitCause, ...]:
        """One entry per (cause, phase), stamped with its first step's start: a TTFT entry's precedes the first
        token, an ITL entry's follows it (the phase a step is traced in is its start's side of the first token)."""
        return tuple(WaitCause(cause, sum(by.values()), tuple(sorted(by.items())), self._ts[(cause, itl)])
                     for (cause, itl), by in self._sums.items() if by)

    def step(self, start: float, end: float, members: list[Member], stop: str, blocked: str | None,
             holders: Blame, running_ids: list[str], victim: VictimView, prices: StepPrices | None = None) -> None:
        """`prices` (of these `members`) may be shared with other tracers of the same run."""
        if not victim.in_flight or victim.arrival_ts > end:
            return
        if prices is None or prices.members is not members:
            prices = StepPrices(self._pricer, members)
        itl = victim.first_token_seen
        if victim.arrival_ts > start:  # arrived while this step ran: waits for it to end
            self._contention(members, None, prices, end - victim.arrival_ts, victim.arrival_ts, itl)
            return
        duration = end - start
        mine = None
        for m in members:
            if m.request_id == self.request_id:
                mine = m
                break
        if mine is not None:
            solo = self._pricer.solo(mine)
            redo = max(min(mine.prior + mine.tokens, mine.redo_until) - mine.prior, 0)
            if redo:
                self.add("preemption", solo * redo / mine.tokens, victim.forced_by, start, itl)
            self._contention(members, mine, prices, duration - solo, start, itl)
        elif victim.preempted_now:
            self.add("preemption", duration, victim.forced_by, start, itl)
        elif victim.running or stop == "budget":
            self._contention(members, None, prices, duration, start, itl)
        elif stop in ("kv", "preemption") and (blocked is None or blocked == self.request_id):
            self.add("kv_pressure", duration, holders, start, itl)
        elif stop == "kv" and blocked is not None:
            self.add("head_of_line", duration, ((blocked, 1.0),), start, itl)
        elif stop == "seats" and running_ids:
            self.add("decode_batching", duration, tuple((r, 1 / len(running_ids)) for r in running_ids), start,
                      itl)

    def _sum(self, cause: str, itl: bool, ts: float) -> dict[str, float]:
        key = (cause, itl)
        got = self._sums.get(key)
        if got is None:
            got = self._sums[key] = {}
            self._ts[key] = ts
        return got

    def _contention(self, members: list[Member], skip: Member | None, prices: StepPrices, seconds: float, ts: float,
                    itl: bool) -> None:
        """The wait split by the marginal cost of the step's members other than `skip` (the victim's own): each
        member's part is `seconds` x its marginal over the others' summed marginals, added straight to its sums."""
        if seconds <= 0 or len(members) <= (skip is not None):
            return
        marginals = prices.marginals()
        prefill = batching = bandwidth = 0.0  # the per-cause totals, each from 0 in member order
        for m, (marginal, bw) in zip(members, marginals, strict=True):
            if m is skip:
                continue
            if m.decode:
                batching += marginal - bw
                bandwidth += bw
            else:
                prefill += marginal
        spent = prefill + batching + bandwidth
        if spent <= 0:  # a cost model blind to these members: split evenly by what they computed
            others = [m for m in members if m is not skip]
            total = float(sum(m.tokens for m in others))
            self.add("prefill_contention", seconds, tuple((m.request_id, m.tokens / total) for m in others
                                                           if not m.decode), ts, itl)
            self.add("decode_batching", seconds, tuple((m.request_id, m.tokens / total) for m in others
                                                        if m.decode), ts, itl)
            return
        k = seconds / spent
        pre = bat = ban = None
        for m, (marginal, bw) in zip(members, marginals, strict=True):
            if m is skip:
                continue
            rid = m.request_id
            if m.decode:
                if marginal > bw:
                    bat = bat if bat is not None else self._sum("decode_batching", itl, ts)
                    bat[rid] = bat.get(rid, 0.0) + k * (marginal - bw)
                if bw > 0.0:
                    ban = ban if ban is not None else self._sum("kv_bandwidth", itl, ts)
                    ban[rid] = ban.get(rid, 0.0) + k * bw
            elif marginal > 0.0:
                pre = pre if pre is not None else self._sum("prefill_contention", itl, ts)
                pre[rid] = pre.get(rid, 0.0) + k * marginal

    def decode_stretch(self, contexts: list[tuple[str, int]], skip: str | None, k0: float, k1: float, c: float,
                       d: float, ts: float, itl: bool) -> None:
        """A stretch of alike decode steps' contention at once (`StretchTracer`): priced by a frozen fit above its
        floor, member o's marginal in step j is c + d x (its context then: `contexts` at step 0, plus j), of which
        d x context is bandwidth; the victim's wait in step j over the others' marginals summed is k_j, and
        `k0`, `k1` are sum(k_j) and sum(k_j x j). Adds sum_j k_j x (c, d x context) to each member but `skip`."""
        if k0 <= 0:
            return
        batching = self._sum("decode_batching", itl, ts) if c > 0 else None
        bandwidth = self._sum("kv_bandwidth", itl, ts) if d > 0 else None
        per = c * k0
        for rid, context in contexts:
            if rid == skip:
                continue
            if batching is not None:
                batching[rid] = batching.get(rid, 0.0) + per
            if bandwidth is not None:
                bandwidth[rid] = bandwidth.get(rid, 0.0) + d * (context * k0 + k1)

    def add(self, cause: str, seconds: float, blame: Blame, ts: float, itl: bool) -> None:
        """`blame` weights are fractions of `seconds` (they sum to 1 except for one cause of a split step)."""
        if seconds <= 0 or not any(w > 0 for _, w in blame):
            return
        by = self._sum(cause, itl, ts)
        for rid, w in blame:
            if w > 0:
                by[rid] = by.get(rid, 0.0) + seconds * w
