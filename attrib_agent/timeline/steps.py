"""Which requests took part in each engine step, replaying vLLM's scheduling rules against the logged counts.

Each `Iteration` line says how many context and generation requests and tokens the step ran; it does not say
which. vLLM v1 serves its running list first, in admission order (a decode is one token, a prefill chunk is
what is left of the prompt under the token budget), then admits from the waiting queue in FCFS order, with
preempted requests at the front, and admits nobody in a step that preempted. The inference keeps that state
and lets the counts decide *how many* (finishes nobody has reported yet, preemptions, admissions) and the
rules decide *who*; a landed span's times and token counts override guesses. Context tokens on the line
include recomputation after a preemption; a resumed request with output already is counted as generation.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from attrib_agent.timeline.lifecycle import LifecycleBook
from attrib_agent.timeline.model import RequestLifecycle, StepMember, StepRecord
from attrib_agent.timeline.sched_state import MS_PER_S, Geometry, SchedState, StepInput, Track, blocks_for, fact_ms
from attrib_agent.timeline.step_counts import Slot, kv_victims, pick_unreported_finishes, pool_tight
from attrib_agent.timeline.step_outcome import Departure, PreemptionSighting, StepOutcome, StepWork
from attrib_agent.timeline.step_tokens import apply_tokens, assign_tokens

LOG_KV_PRECISION = 0.001  # `KV cache usage: 16.8%`: one decimal of a percent
STAMP_RESOLUTION_S = 0.001  # log stamps are millisecond-truncated


def infer_step(st: SchedState, si: StepInput, book: LifecycleBook, geo: Geometry) -> StepOutcome:
    """Advance `st` over one step and return its members; `st` is mutated (the caller checkpoints copies)."""
    work = StepWork()
    get = book.lookup()
    if st.last_iteration is not None and si.iteration < st.last_iteration:
        for t in (*st.running, *st.waiting):  # vLLM restarted: whatever it held is gone
            _span_prompt(t, get(t.rid))
            work.departures.append(_departure(t, si, "restart", st, before=True))
        st.running.clear()
        st.waiting.clear()
        st.observed_used = None
    st.budget = max(st.budget, si.scheduled_tokens)
    _enqueue(st, book, si)
    _leave_before(st, get, si, work)
    bs = geo.block_size
    if _decodes_only(st, si):  # each running request takes one token, in `_finish`'s pass over them
        n = len(st.running)
        return _finish(st, si, get, geo, work, [], (0, 0, n, n), decode=True)
    work.slots = [_slot(t) for t in st.running]
    preempted = _explain_running(st, si, book, geo, work)
    if not preempted:
        _admit(st, si, work)
    assign_tokens(st, si, geo, work)
    apply_tokens(st, si, book, geo, work)
    members = []
    cr = ct = gr = gt = 0
    for s in work.slots:
        n = s.tokens or 0
        if s.dropped or n <= 0:
            continue
        t = s.track
        c = t.computed
        members.append(StepMember(t.rid, s.phase, n, c, blocks_for(c, bs) if bs else 0))
        if s.phase == "prefill":
            cr, ct = cr + 1, ct + n
        else:
            gr, gt = gr + 1, gt + n
    return _finish(st, si, get, geo, work, members, (cr, ct, gr, gt))


def _decodes_only(st: SchedState, si: StepInput) -> bool:
    """The line counts exactly the running requests as generating one token each, and they all decode: nobody
    left, was preempted or admitted, no chunk to size (most steps under load). The general path then gives each
    a decode of one token and nothing else; this one does that without the counts' bookkeeping."""
    running = st.running
    n = len(running)
    if si.context_requests or si.generation_requests != n or si.generation_tokens != n:
        return False
    for t in running:
        if not t.outputs or t.resuming:
            return False
    return True


def _slot(t: Track) -> Slot:
    """A running request's candidate part: its phase (as `Track.phase`) and the tokens it is known to take."""
    if t.outputs:
        return Slot(t, "recompute", None) if t.resuming else Slot(t, "decode", 1)
    if t.prompt is not None and (not t.resuming or t.computed):
        # once a resumed prompt is back in, its cached prefix is counted
        return Slot(t, "prefill", max(t.prompt - t.computed, 1))
    return Slot(t, "prefill", None)  # unknown prompt, or a recompute whose prefix-cache hit is unknown: counts decide


def _enqueue(st: SchedState, book: LifecycleBook, si: StepInput) -> None:
    """Requests that reached vLLM before this step was scheduled join the waiting queue, in arrival order.

    Both stamps are truncated to the millisecond, so a request logged up to one millisecond after the step's
    estimated start may still have been in time; the counts decide whether it was taken.
    """
    for entry in book.queued_between(st.cursor, si.start_ts + STAMP_RESOLUTION_S):
        st.cursor = (entry.queue_ts, entry.order)
        lc = entry.lifecycle
        if lc.aborted_ts is not None and lc.aborted_ts < si.start_ts:
            continue
        if lc.complete and lc.finish_ts is not None and st.last_end_ms is not None \
                and fact_ms(lc.finish_ts) <= st.last_end_ms:
            continue  # its whole life is before this step (learnt from a late span)
        st.waiting.append(Track(lc.request_id, entry.queue_ts, entry.order))


def _leave_before(st: SchedState, get: Callable[[str], RequestLifecycle | None], si: StepInput,
                  work: StepWork) -> None:
    """Requests known to have finished by the previous step, or aborted before this one, leave; every one first
    brings its known prompt in from its span.

    A checkpoint taken before a span landed may hold a prompt that was taken as cut by the budget although it
    had ended; with the prompt known, it has produced its first token. (Each request's lifecycle is read once:
    leaving and the prompt touch only the request itself, so doing both in one pass changes nothing.)
    """
    start, last_ms = si.start_ts, st.last_end_ms
    for running, queue in ((True, st.running), (False, st.waiting)):
        if not queue:
            continue
        kept: list[Track] = []
        for t in queue:
            lc = get(t.rid)
            if lc is None:  # the book let it go (bounded): a waiting one goes too, a running one when counts say
                if running:
                    kept.append(t)
                continue
            known = _span_prompt(t, lc)
            if lc.aborted_ts is not None and lc.aborted_ts < start:
                work.departures.append(_departure(t, si, "aborted", st, before=True))
                continue
            if _finished_by(lc, t, last_ms):
                work.departures.append(_departure(t, si, "finished", st, before=True))
                continue
            kept.append(t)
            if known and running and t.outputs == 0 and not t.resuming and t.computed >= (t.prompt or 0):
                t.outputs, t.first_token_seq = 1, si.seq - 1
        if len(kept) != len(queue):
            queue[:] = kept


def _span_prompt(t: Track, lc: RequestLifecycle | None) -> bool:
    """A landed span's prompt replaces whatever the track held, before anything reads it (a departure, the
    counts): so a state whose held prompts are stale equals the fresh one from the step's start, which lets a
    re-inference keep stored states (reinference.py). True when the span gave one."""
    if lc is not None and lc.complete and lc.prompt_tokens is not None:
        t.prompt = lc.prompt_tokens
        return True
    return False


def _finished_by(lc: RequestLifecycle, t: Track, until_ms: int | None) -> bool:
    """Whether the request has produced its last token by the step ending at `until_ms`.

    The token count decides when it is known; the span's finish time decides when it is certainly earlier
    (two steps can be logged within one millisecond, so an equal stamp is not proof).
    """
    if not lc.complete:
        return lc.max_tokens is not None and t.outputs >= lc.max_tokens
    if lc.completion_tokens is not None and t.outputs >= lc.completion_tokens > 0:
        return True
    finish_ts = lc.finish_ts
    if until_ms is None or finish_ts is None:
        return False
    done_ms = math.floor(finish_ts * MS_PER_S)  # fact_ms, inlined: asked for every request of every step
    return done_ms < until_ms or (done_ms == until_ms and lc.completion_tokens is None)


def _explain_running(st: SchedState, si: StepInput, book: LifecycleBook, geo: Geometry, work: StepWork) -> bool:
    """Make the running requests' part agree with the line's counts; True when the step preempted."""
    slots = work.slots
    prefills = _prefills(slots)
    gen_excess = len(slots) - prefills - si.generation_requests
    ctx_excess = prefills - si.context_requests
    resumable = len([t for t in st.waiting if t.outputs > 0]) if gen_excess < 0 else 0  # read only then
    for s in slots:  # an unknown prompt taken as cut by the budget may have ended: the counts show it decoding
        if gen_excess < 0 and (ctx_excess > 0 or -gen_excess > resumable) and s.phase == "prefill" \
                and s.track.prompt is None and s.track.prefilled:
            s.track.prompt, s.track.outputs, s.track.first_token_seq = s.track.prefilled, 1, si.seq - 1
            s.phase, s.tokens = "decode", 1
            gen_excess, ctx_excess = gen_excess + 1, ctx_excess - 1
    if gen_excess <= 0 and ctx_excess <= 0:
        return False
    victims: list[tuple[Slot, bool]] = []
    pressure = pool_tight(slots, st.observed_used, geo, st.budget)
    ranked = kv_victims(slots, st.observed_used, geo, st.budget) if pressure else []
    ranked += [s for s in reversed(slots) if pressure and all(s is not r for r in ranked)]
    for s in ranked:  # vLLM's victim order: what the block replay names first, then the most recent admission
        if s.phase == "prefill" and ctx_excess > 0:
            ctx_excess -= 1
        elif s.phase != "prefill" and gen_excess > 0:
            gen_excess -= 1
        else:
            continue
        victims.append((s, True))
    if gen_excess > 0:
        chosen = pick_unreported_finishes(
            [s for s in slots if s.phase == "decode" and all(s is not v for v, _ in victims)],
            gen_excess, book, geo, si.kv_usage,
        )
        for s in chosen:
            s.dropped = True
            work.departures.append(_departure(s.track, si, "finished", st, before=True))
            st.running.remove(s.track)
            gen_excess -= 1
    for s in reversed(slots):  # still unexplained: the most recently admitted left (FCFS victim order)
        if gen_excess <= 0 and ctx_excess <= 0:
            break
        if s.dropped or any(s is v for v, _ in victims):
            continue
        if s.phase == "prefill" and ctx_excess > 0:
            ctx_excess -= 1
            victims.append((s, False))
        elif s.phase != "prefill" and gen_excess > 0:
            gen_excess -= 1
            victims.append((s, False))
    for s, pressure in victims:
        _preempt(st, s, si, pressure, geo, work)
    return bool(victims)


def _prefills(slots: list[Slot]) -> int:
    """How many of `slots` the line counts as context (the rest are generation): a list, not a generator sum."""
    return len([s for s in slots if s.phase == "prefill"])


def _preempt(st: SchedState, s: Slot, si: StepInput, pressure: bool, geo: Geometry, work: StepWork) -> None:
    t = s.track
    s.dropped = True
    bs = geo.block_size
    work.preemptions.append(PreemptionSighting(t.rid, si.seq, si.iteration, si.start_ts, pressure, t.computed,
                                               blocks_for(t.computed, bs) if bs else 0))
    t.held_before_preempt, t.computed = t.computed, 0
    t.resuming = True
    if t.outputs == 0:
        t.prefilled = 0
    t.preempt_seqs = (*t.preempt_seqs, si.seq)
    st.running.remove(t)
    st.waiting.insert(0, t)  # vLLM prepends each victim: the earliest admitted ends up first


def _admit(st: SchedState, si: StepInput, work: StepWork) -> None:
    """Take from the waiting queue in order as many of each phase as the counts have left over."""
    live = [s for s in work.slots if not s.dropped]
    prefills = _prefills(live)
    gen_slots = si.generation_requests - (len(live) - prefills)
    ctx_slots = si.context_requests - prefills
    for t in list(st.waiting):
        if gen_slots <= 0 and ctx_slots <= 0:
            break
        phase = "prefill" if t.outputs == 0 else "recompute"
        if phase == "prefill" and ctx_slots > 0:
            ctx_slots -= 1
        elif phase == "recompute" and gen_slots > 0:
            gen_slots -= 1
        else:
            continue
        st.waiting.remove(t)
        st.running.append(t)
        if t.admitted_seq is None:
            t.admitted_seq = si.seq
        known = t.prompt if phase == "prefill" and t.prompt is not None and not t.resuming else None
        work.slots.append(Slot(t, phase, known, admitted=True))


def _finish(st: SchedState, si: StepInput, get: Callable[[str], RequestLifecycle | None], geo: Geometry,
            work: StepWork, members: list[StepMember], counts: tuple[int, int, int, int],
            decode: bool = False) -> StepOutcome:
    """The step's record from its `members` and their (context requests, tokens, generation requests, tokens);
    who finished in it leaves, and what the rest hold after it. `decode` (`_decodes_only`): each running request
    first takes one decode token and its member here, in the same pass (each reads only the request itself)."""
    bs = geo.block_size
    running = st.running
    until_ms = si.end_ms
    kept: list[Track] = []
    held: list[tuple[str, int]] = []  # (request, blocks) of each one kept
    blocks = 0
    cached = False  # prefix hits are rare: without one, no copies and no shares
    for t in running:  # finished in this step: vLLM frees its blocks before it reports KV usage
        if decode:
            c = t.computed = t.computed + 1
            t.outputs += 1
            b = -(-c // bs) if bs else 0  # blocks_for(c, bs): c > 0
            members.append(StepMember(t.rid, "decode", 1, c, b))
        elif bs:
            b = blocks_for(t.computed, bs)
        lc = get(t.rid)
        if lc is not None and t.outputs > 0 and _finished_by(lc, t, until_ms):
            work.departures.append(_departure(t, si, "finished", st))
            continue
        kept.append(t)
        if bs:
            held.append((t.rid, b))
            blocks += b
            if t.cached:
                cached = True
    if len(kept) != len(running):
        running[:] = kept
    cr, ct, gr, gt = counts
    holdings = tuple(held)
    error = (abs(cr - si.context_requests) + abs(ct - si.context_tokens)
             + abs(gr - si.generation_requests) + abs(gt - si.generation_tokens))
    record = StepRecord(si.engine, si.iteration, si.end_ts, si.elapsed_s, si.context_requests, si.context_tokens,
                        si.generation_requests, si.generation_tokens, si.kv_usage, tuple(members), error)
    usable = geo.usable_blocks
    observed = None if usable is None else si.kv_usage * usable
    predicted = blocks - (_shared_copies(running, bs, observed) if cached else 0) if bs else None
    if observed is not None and usable is not None and LOG_KV_PRECISION * usable < 1.0:
        st.observed_used = float(round(observed))
    else:
        st.observed_used = float(predicted) if predicted is not None else None
    st.last_end_ms, st.last_iteration = until_ms, si.iteration
    shares = tuple([(t.rid, t.prefix_root, t.cached // bs) for t in running if t.cached and t.prefix_root]) \
        if cached and bs else ()
    return StepOutcome(record, tuple(work.departures), tuple(work.preemptions), tuple(work.resumes), holdings,
                       predicted, observed, shares)


def _shared_copies(running: list[Track], bs: int, observed: float | None) -> int:
    """Blocks counted twice in the holdings: a prefix-cache hit's blocks are one copy, shared with the request
    that computed them if it still runs, else among the hitters. Which running request a new hit shares with
    (several prefixes may be live) is decided once, at the step that saw the hit: by the blocks that step
    added (a copy shared with a running request adds none), among the earlier running requests holding that
    many tokens, or none (the hit came from free cached blocks)."""
    for i, t in enumerate(running):
        if t.cached and t.prefix_root is None:
            hit = t.cached // bs * bs
            options = list(dict.fromkeys(r.prefix_root or r.rid for r in running[:i] if r.computed >= hit))
            options.append(t.rid)
            t.prefix_root = options[0] if observed is None else min(
                options, key=functools.partial(_misfit, running, bs, observed, t))
    return _dupes(running, bs)


def _misfit(running: list[Track], bs: int, observed: float, track: Track, root: str) -> float:
    track.prefix_root = root
    return abs(sum(blocks_for(r.computed, bs) for r in running) - _dupes(running, bs) - observed)


def _dupes(running: list[Track], bs: int) -> int:
    hits: dict[str, list[int]] = {}
    for t in running:
        if t.cached and t.prefix_root is not None:
            hits.setdefault(t.prefix_root, []).append(t.cached // bs)
    if not hits:
        return 0
    ids = {t.rid for t in running if not t.cached}
    return sum(sum(h) - (0 if root in ids else max(h)) for root, h in hits.items())


def _departure(t: Track, si: StepInput, reason: str, st: SchedState, before: bool = False) -> Departure:
    """`before`: it left between the previous step and this one (its last step is the previous one)."""
    if before:
        seq = si.seq - 1
        end_ts = si.start_ts if st.last_end_ms is None else st.last_end_ms / MS_PER_S
    else:
        seq, end_ts = si.seq, si.end_ts
    return Departure(t.rid, seq, end_ts, reason, t.prompt, t.outputs, t.admitted_seq, t.first_token_seq,
                     t.preempt_seqs, t.cached)
