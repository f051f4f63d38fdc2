"""Tokens per member of one engine step, and what computing them does to each request.

Known chunks (a decode's one token, what is left of a known prompt) take the token budget in scheduling
order; what the line's counts leave over goes to the members whose size is not known yet. Then each member
advances: a prefill that reaches its prompt's end samples the first token, a recompute after preemption
that completes samples the next one, a decode adds one token to its KV.
"""

from __future__ import annotations

from collections.abc import Callable

from attrib_agent.timeline.lifecycle import LifecycleBook
from attrib_agent.timeline.model import RequestLifecycle
from attrib_agent.timeline.sched_state import Geometry, SchedState, StepInput, Track, blocks_for, fact_ms
from attrib_agent.timeline.step_counts import Slot, split_context, split_unknown
from attrib_agent.timeline.step_outcome import ResumeSighting, StepWork


def assign_tokens(st: SchedState, si: StepInput, geo: Geometry, work: StepWork) -> None:
    """Known chunks take the budget in scheduling order; the counts' remainder goes to the unknown ones.

    Generation members are settled first (a decode is one token; recomputes share the rest of the line's
    generation tokens) so that a known prompt's chunk sees the budget they left.
    """
    live = [s for s in work.slots if not s.dropped]
    gen = [s for s in live if s.phase != "prefill"]
    gen_unknown = [s for s in gen if s.tokens is None]
    for s, n in zip(gen_unknown, _split_recompute(si.generation_tokens - sum(s.tokens or 0 for s in gen),
                                                  gen_unknown, geo), strict=True):
        s.tokens = n
    left = st.budget
    wanted: list[tuple[Slot, int]] = []
    for s in live:
        if s.tokens is None:  # an unknown chunk still takes its turn: a resumed prompt roughly its uncached tail
            left -= _resume_estimate(s.track, geo)
            continue
        if s.phase == "prefill":
            wanted.append((s, s.tokens))
            s.tokens = max(min(s.tokens, left), 0)
        left -= s.tokens
    ctx = [s for s in live if s.phase == "prefill"]
    unknown = [s for s in ctx if s.tokens is None]
    if not unknown:
        uncut = _cut_before_last(wanted, live)
        if uncut:  # the budget did not bind where the known sizes said: they ran whole, less their prefix hits
            for s, n in wanted:
                s.tokens = n
        _prefix_hits(ctx, si, st.budget, block_size=geo.block_size, uncut=uncut)
        return
    rest = si.context_tokens - sum(s.tokens or 0 for s in ctx)
    shares = split_context(rest, unknown, _kv_misfit(st, si, geo, work, unknown), geo.block_size)
    for s, n in zip(unknown, shares, strict=True):
        s.tokens = n


def _cut_before_last(wanted: list[tuple[Slot, int]], live: list[Slot]) -> bool:
    """Whether the budget cap cut a member that is not the step's last, or cut the last to nothing: vLLM never
    does (it stops scheduling when its budget runs out, so only the last member can be partial, and a member it
    counts computed something). The line counting those members means the budget did not bind there (the budget
    is only the largest step seen so far); the known sizes were too large, and prefix-cache hits (invisible on
    the line, found at admission) explain the difference. Left capped, a member would get 0 tokens and fall
    out of a step the line says it ran in, and the next step would take it for preempted (an n>1 request's
    children: three 256-token prompts admitted together, 256 + 128 + 128 computed, the last capped to 0)."""
    return bool(live) and any(s.tokens is not None and s.tokens < n and (s is not live[-1] or s.tokens <= 0)
                              for s, n in wanted)


def _prefix_hits(ctx: list[Slot], si: StepInput, budget: int, *, block_size: int | None = None,
                 uncut: bool = False) -> None:
    """Known prompts that the line shows computing fewer tokens than they had left found the rest in vLLM's
    prefix cache (the line counts computed tokens only; the cache stops one token short of the prompt).

    Only requests whose hit is not settled yet can have one (vLLM looks the cache up at admission; a first
    chunk cut by the budget hides it until the next). When the step did not fill the budget every such
    prefill ended in it, so the hits are what their prompts had left beyond the line's count; when it did,
    the chunks were capped first and the shortfall is what the hits must explain (`uncut`: the counts showed
    that cap wrong, so every prefill ended here). Placed as vLLM places them when they add up to whole blocks
    (`_whole_block_hits`); else shared evenly.
    """
    open_ = [s for s in ctx if s.track.cached is None and s.track.prompt is not None and not s.track.resuming]
    if not open_:
        return
    ended = uncut or si.scheduled_tokens < budget
    rest = {id(s): s.track.prompt - s.track.computed if ended else s.tokens or 0  # type: ignore[operator]
            for s in open_}
    shortfall = sum(rest.values()) + sum(s.tokens or 0 for s in ctx if all(s is not o for o in open_)) \
        - si.context_tokens
    room = [max(rest[id(s)] - 1, 0) for s in open_]
    if shortfall <= 0 or sum(room) <= 0:
        return
    hits = _whole_block_hits(min(shortfall, sum(room)), room, block_size)
    if hits is None:
        hits = [min(h, r) for h, r in zip(split_unknown(min(shortfall, sum(room)), len(open_)), room, strict=True)]
        for i, r in enumerate(room):  # what a capped one could not take goes to those with room left
            extra = min(shortfall - sum(hits), r - hits[i])
            hits[i] += max(extra, 0)
    for s, h in zip(open_, hits, strict=True):
        s.hit = h
        s.tokens = rest[id(s)] - h


def _whole_block_hits(total: int, room: list[int], block_size: int | None) -> list[int] | None:
    """Hits as vLLM makes them: whole blocks of a shared prefix, the same length for its sharers, and found by the
    latest admitted (blocks are cached at allocation, so a request admitted later in a step hits what an earlier
    one is computing in it, never the reverse: the first of a new prefix computes it). So `total` goes to the
    fewest latest admitted that can hold it, as level as whole blocks allow (a spare block to the earliest of
    them); None when it is not whole blocks or does not fit (the caller shares it evenly)."""
    if not block_size or total % block_size:
        return None
    blocks, caps = total // block_size, [r // block_size for r in room]
    k = next((k for k in range(1, len(caps) + 1) if sum(caps[-k:]) >= blocks), None)
    if k is None:
        return None
    tail, give = caps[-k:], [0] * k
    while (left := blocks - sum(give)) > 0:
        open_ = [i for i in range(k) if give[i] < tail[i]]
        share, spare = divmod(left, len(open_))
        for j, i in enumerate(open_):
            give[i] += min(share + (j < spare), tail[i] - give[i])
    return [0] * (len(caps) - k) + [g * block_size for g in give]


def _kv_misfit(st: SchedState, si: StepInput, geo: Geometry, work: StepWork,
               unknown: list[Slot]) -> Callable[[list[int]], float] | None:
    """How far a split of the unknown chunks leaves the predicted blocks from the line's KV usage."""
    usable, bs = geo.usable_blocks, geo.block_size
    if usable is None or bs is None or len(unknown) < 2:
        return None
    size = bs
    scheduled = {id(s.track): s for s in work.slots if not s.dropped}
    base = 0
    for t in st.running:
        s = scheduled.get(id(t))
        if s is None or all(s is not u for u in unknown):
            after = t.num_tokens if s is not None and s.phase == "recompute" and t.num_tokens else t.computed
            base += blocks_for(after + (s.tokens or 0) if s is not None and s.phase != "recompute" else after, size)
    target = si.kv_usage * usable

    def misfit(shares: list[int]) -> float:
        return abs(base + sum(blocks_for(u.track.computed + n, size) for u, n in zip(unknown, shares, strict=True))
                   - target)

    return misfit


def apply_tokens(st: SchedState, si: StepInput, book: LifecycleBook, geo: Geometry, work: StepWork) -> None:
    """Advance every member by its tokens; the last member of a step that filled the budget may be mid-chunk."""
    live = [s for s in work.slots if not s.dropped and (s.tokens or 0) > 0]
    budget_limited = si.scheduled_tokens >= st.budget
    last = live[-1] if live else None
    for s in live:
        t, n = s.track, s.tokens or 0
        lc = book.get(t.rid)
        cut = budget_limited and s is last  # the budget ran out on it: it may not have finished its chunk work
        if s.phase == "decode":
            t.computed += 1
            t.outputs += 1
        elif s.phase == "prefill":
            if t.computed == 0 and t.resuming:
                t.computed = _cached_prefix(t, n, geo)
            if s.hit:
                t.cached = (t.cached or 0) + s.hit
            t.computed += n + s.hit
            t.prefilled += n
            if _prefill_done(t, lc, si, cut):
                t.prompt = t.computed if t.prompt is None else t.prompt
                t.computed = max(t.computed, t.prompt)
                t.outputs, t.first_token_seq, t.resuming = 1, si.seq, False
                t.cached = t.cached or 0
        else:  # recompute after preemption, counted as generation
            total = t.num_tokens or (t.held_before_preempt + 1)
            if t.computed == 0:
                t.computed = _cached_prefix(t, n, geo)
            t.computed = min(t.computed + n, total)
            if not cut or t.computed >= total:
                t.computed, t.resuming = total, False
                t.outputs += 1
                t.resume_seqs = (*t.resume_seqs, si.seq)
                work.resumes.append(ResumeSighting(t.rid, si.seq, si.iteration, si.end_ts, n))


def _split_recompute(total: int, members: list[Slot], geo: Geometry) -> list[int]:
    """Share the generation tokens left over among resumed requests: each its uncached tail when those add
    up to at most the total (the excess going to the first, whose cache was likely reused), else evenly."""
    estimates = [_resume_estimate(s.track, geo) for s in members]
    if not members or not all(estimates) or sum(estimates) > total:
        return split_unknown(total, len(members))
    estimates[0] += total - sum(estimates)
    return estimates


def _resume_estimate(t: Track, geo: Geometry) -> int:
    """What a resumed prompt should recompute if its own blocks are still cached (0 when nothing is known)."""
    if not t.resuming or t.num_tokens is None:
        return 0
    return t.num_tokens - (t.computed or _cached_prefix(t, 1, geo))


def _cached_prefix(t: Track, recompute: int, geo: Geometry) -> int:
    """Tokens a resumed request finds in the prefix cache: its own full blocks from before the preemption, as
    far as the recompute the line shows leaves room for (blocks reused by others meanwhile are recomputed)."""
    if not t.held_before_preempt:
        return 0
    total = t.num_tokens if t.num_tokens is not None else t.held_before_preempt
    bs = geo.block_size
    cached = t.held_before_preempt // bs * bs if bs else t.held_before_preempt
    return max(min(cached, total - recompute), 0)


def _prefill_done(t: Track, lc: RequestLifecycle | None, si: StepInput, cut: bool) -> bool:
    """Whether this chunk ended the prompt: the span's first-token time when it is unambiguous, else the count
    (a known prompt with no prefix-cache guess in it), else whether the budget cut the step short."""
    if lc is not None and lc.complete and lc.first_token_ts is not None and t.first_token_seq is None:
        first_ms = fact_ms(lc.first_token_ts)
        if first_ms != si.end_ms:
            return first_ms < si.end_ms
    if t.prompt is not None and (t.computed >= t.prompt or not t.resuming):
        return t.computed >= t.prompt
    return not cut
