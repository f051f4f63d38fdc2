"""Re-inference is exact: fed a recording in batches and read after each (as live), the timeline's outcomes,
departures and scheduler state equal those of inferring every step held from scratch with all the facts known
by then (steps.infer_step from a fresh state), on every fixture recording, truth runs and the GPU-rate input.
The skips (fact_reads.py) must also do their job: fewer re-inferences than re-inferring from each change on."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from attrib_agent.events import Event
from attrib_agent.sources.replay import ReplaySource
from attrib_agent.timeline import EngineTimeline
from attrib_agent.timeline.fact_reads import StoredPass
from attrib_agent.timeline.reinference import TimelineInference
from attrib_agent.timeline.sched_state import SchedState
from attrib_agent.timeline.step_outcome import StepOutcome
from attrib_agent.timeline.steps import infer_step
from benchmarks._gpu_rate import GPU_RATE_SOURCES, build_gpu_rate, load_source
from benchmarks._recordings import FIXTURES

RECORDINGS = Path(__file__).parents[2] / "fixtures" / "recordings"
TRUTH = Path(__file__).parents[2] / "fixtures" / "truth"
TRUTH_RUNS = ["continuous/runs/w1+w2-r0", "decoy/runs/d1+w1-r0", "preempt/runs/w1+w2+w3-r0",
              "preempt-midstream/runs/w1+w2-r1", "prefix/runs/" + "none-r0", "whale2/runs/w1-r0"]


@cache
def events(path: Path) -> tuple[Event, ...]:
    return tuple(ReplaySource(path).events())


@cache
def gpu_rate(tmp: Path) -> tuple[Event, ...]:
    info = build_gpu_rate(tmp, duration_s=3.0, sources=[load_source(FIXTURES / n) for n in GPU_RATE_SOURCES])
    return events(info.path)


def from_scratch(tl: EngineTimeline) -> tuple[list[StepOutcome], SchedState]:
    """Every step held inferred again, in order, from the initial state with the facts known now."""
    inference, window = tl._inference, tl._window
    assert window.first_seq == 0, "the oracle needs every step since the first"
    st = SchedState(budget=tl._configured_budget or 0)
    return [infer_step(st, si, inference.book, inference.geometry) for si, _ in window.outcomes()], st


def fed_in_batches(evs: tuple[Event, ...], batch: int, check_every: int = 1) -> EngineTimeline:
    """Fed `batch` events at a time and read after each (a refresh); every `check_every`-th read, and the last,
    compared with the from-scratch inference."""
    tl = EngineTimeline(keep_s=1e12, max_steps=10**7, max_requests=10**6)  # nothing leaves: the oracle sees all
    for n, i in enumerate(range(0, len(evs), batch)):
        tl.feed_all(evs[i:i + batch])
        got = [out for _, out in tl.outcomes()]
        if n % check_every and i + batch < len(evs):
            continue
        want, state = from_scratch(tl)
        first = next((k for k, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)
        assert first is None, f"after event {i + batch}: step {first} differs from a from-scratch inference"
        assert state.same_as(tl._inference.state)
        departed = {d.request_id: d for out in want for d in out.departures}
        assert all(tl._inference.departure(rid) == d for rid, d in departed.items())
        assert tl._inference.departures() == len(departed)
        seqs = [seq for seq, _ in tl._inference._departed.values()]  # in step order: a re-inference cuts a suffix
        assert seqs == sorted(seqs)
    return tl


@pytest.mark.parametrize("name", ["whale2", "preempt", "preempt-steps", "bench-prefix-steps", "canary"])
def test_recordings_read_after_every_batch_equal_a_from_scratch_inference(name: str) -> None:
    tl = fed_in_batches(events(RECORDINGS / name), batch=40, check_every=2)
    fed, inferred, again = tl.inference_work()
    assert again > 0 and inferred == fed + again  # late spans did re-infer, and every step was inferred


@pytest.mark.parametrize("run", TRUTH_RUNS)
def test_truth_runs_read_after_every_batch_equal_a_from_scratch_inference(run: str) -> None:
    fed_in_batches(events(TRUTH / run), batch=60, check_every=3)


def test_gpu_rate_input_read_after_every_batch_equals_a_from_scratch_inference(tmp_path_factory:
                                                                               pytest.TempPathFactory) -> None:
    """Never idle, KV near full, whales and shared prefixes: admissions wait, prompts hit the prefix cache."""
    evs = gpu_rate(tmp_path_factory.mktemp("gpu"))[:2500]
    fed_in_batches(evs, batch=100, check_every=4)


def test_the_skips_save_re_inference_and_change_nothing(tmp_path_factory: pytest.TempPathFactory,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Read after every event, the GPU-rate input re-infers at least a fifth fewer steps than with the skips off
    (every span re-inferred from its request's queueing, convergence only once no changed request is held),
    with the same outcomes."""
    evs = gpu_rate(tmp_path_factory.mktemp("gpu"))[:2500]

    def live() -> EngineTimeline:
        tl = EngineTimeline()
        for ev in evs:
            tl.feed(ev)
            tl.outcomes()
        return tl

    skipping = live()
    monkeypatch.setattr(TimelineInference, "_admission", lambda self, rid, queued: queued)
    monkeypatch.setattr(StoredPass, "_admission", lambda self, rid, lc, otherwise: otherwise)
    monkeypatch.setattr(StoredPass, "_finish_read", lambda self, lc, outputs, seq: seq)
    plain = live()
    assert skipping.outcomes() == plain.outcomes()
    fed, inferred, again = skipping.inference_work()
    assert fed == plain.inference_work()[0] and inferred == fed + again
    print(f"\n{fed} steps: {again} re-inferences with the skips, {plain.inference_work()[2]} without")
    assert again <= 0.8 * plain.inference_work()[2]


def test_an_eviction_infers_only_up_to_its_horizon_and_changes_nothing(tmp_path_factory: pytest.TempPathFactory,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Fed without reads, a timeline that evicts infers the steps its eviction needs, not the newest ones (those
    wait for a reader, by when more spans have landed); read at the end, it holds the same steps with the same
    outcomes, departures and state as one whose evictions inferred every step, for fewer inferences."""
    evs = gpu_rate(tmp_path_factory.mktemp("gpu"))

    def fed(batch: int) -> EngineTimeline:
        tl = EngineTimeline(keep_s=0.5)
        for i in range(0, len(evs), batch):
            tl.feed_all(evs[i:i + batch])
            if i + batch < len(evs):  # a reader now and then, as the attribution passes
                tl.outcomes()
        return tl

    bounded = fed(3000)
    w = bounded._window
    assert 0 < w.first_seq < w.computed_to < w.next_seq  # evicted, and the newest steps not inferred
    monkeypatch.setattr(EngineTimeline, "_infer_through", lambda self, ts: self._inference.refresh())
    full = fed(3000)
    assert bounded.outcomes() == full.outcomes() and bounded._window.first_seq == full._window.first_seq
    assert bounded._inference.state.same_as(full._inference.state)
    assert bounded._inference._departed == full._inference._departed
    assert bounded.inference_work()[1] < full.inference_work()[1]


def test_the_oldest_checkpoint_clock_reads_the_checkpoints_as_a_walk_of_every_step(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """`StepWindow.oldest_clock` reads only the checkpoints kept: fed with evictions and reads between (checkpoints
    re-taken, windows cut at checkpoints and wholly), it equals the minimum over every step held holding one."""
    evs = gpu_rate(tmp_path_factory.mktemp("gpu"))
    for every, keep in ((32, 0.5), (7, 0.2), (5, 1e12)):
        tl = EngineTimeline(keep_s=keep, checkpoint_every=every)
        w = tl._window
        for i in range(0, len(evs), 97):
            tl.feed_all(evs[i:i + 97])
            if i % 3 == 0:
                tl.outcomes()
            walked = [c[1] for q in range(w.first_seq, w.next_seq) if (c := w.checkpoint(q)) is not None]
            assert w.oldest_clock() == (min(walked) if walked else None)
        assert w.first_seq > 0 or keep > 1
