"""The step plugin inside the lab's real vLLM: every step reported, with vLLM's ids, and the preemption named.
A pair of whales that fit the KV pool when admitted and outgrow it while decoding forces vLLM to preempt
(token counts, not timing, decide that; which running request goes is its FCFS policy's tail). The same
scenario is also recorded on the session's lab without the plugin: what the agent reads must not change in
kind, and the plugin's own cost per step is reported.
"""

import re
import statistics
from collections import Counter

import pytest

from attrib_agent.lab.record import record_run
from attrib_agent.lab.server import LabConfig, VllmLab
from attrib_agent.lab.step_truth import external_id, score_recording
from attrib_agent.lab.summary import shorts, ttft_s
from attrib_agent.lab.workload import get_scenario
from attrib_agent.recording import CLIENT, LOG, VLLM_STEPS, Recording
from attrib_agent.sources.replay import ReplaySource

ITERATION = re.compile(r"Engine 000: Iteration\((\d+)\): (\d+) context requests, (\d+) context tokens, "
                       r"(\d+) generation requests, (\d+) generation tokens")
ADDED = re.compile(r"Added request (\S+)\.")
STEP_KEYS = {"v", "kind", "t", "ts", "step", "iter", "tokens", "scheduled", "admitted", "resumed", "preempted",
             "finished", "running", "waiting", "blocks", "free_blocks", "total_blocks", "head", "drops", "cost_us"}

PAIR = get_scenario("kvpair")


@pytest.fixture(scope="module")
def with_plugin(tmp_path_factory) -> Recording:
    root = tmp_path_factory.mktemp("plugin")
    with VllmLab(LabConfig(truth_plugin=True), workdir=root / "lab") as ep:
        res = record_run(ep, PAIR, root / "rec", attempts=5)
    return Recording(res.path)


@pytest.fixture(scope="module")
def without_plugin(lab, tmp_path_factory) -> Recording:
    res = record_run(lab, PAIR, tmp_path_factory.mktemp("plain") / "rec", attempts=5)
    return Recording(res.path)


def steps_of(rec: Recording) -> list[dict]:
    return [m for m in rec.records(VLLM_STEPS) if m.get("kind") == "step"]


def test_every_engine_step_is_reported_with_the_logged_counts(with_plugin):
    assert with_plugin.meta["truth_plugin"] is True
    by_iter = {m["iter"]: m for m in steps_of(with_plugin) if m["iter"] is not None}
    logged = [ITERATION.search(r["line"]) for r in with_plugin.records(LOG)]
    logged = [m for m in logged if m]
    assert len(logged) > 50
    for m in logged:
        step = by_iter[int(m.group(1))]
        assert set(step) <= STEP_KEYS and step["v"] == 1
        assert step["tokens"] == int(m.group(3)) + int(m.group(5))
        assert len(step["scheduled"]) == int(m.group(2)) + int(m.group(4))
    assert all(m["drops"] == 0 for m in steps_of(with_plugin))


def test_ids_are_vllms_internal_ids_and_map_to_the_frontends(with_plugin):
    added = {m.group(1) for r in with_plugin.records(LOG) if (m := ADDED.search(r["line"]))}
    seen = {s["id"] for m in steps_of(with_plugin) for s in m["scheduled"]}
    assert seen == added
    frontend = {c["vllm_request_id"] for c in with_plugin.records(CLIENT)}
    assert {external_id(i) for i in seen} == frontend
    admitted = [i for m in steps_of(with_plugin) for i in m["admitted"]]
    assert sorted(admitted) == sorted(added)  # each admitted once; re-admission after preemption is "resumed"


def test_the_preemption_is_named_and_counted(with_plugin):
    steps = steps_of(with_plugin)
    preempted = [(m["iter"], i) for m in steps for i in m["preempted"]]
    assert preempted, "the KV-exhausting pair did not preempt"
    assert len(preempted) == with_plugin.meta["preemptions"]  # vLLM's own counter agrees
    ours = {c["vllm_request_id"] for c in with_plugin.records(CLIENT)}
    assert {external_id(i) for _, i in preempted} <= ours
    # Which request goes is vLLM's FCFS policy, not the whales: the tail of its running list (`running.pop()`),
    # i.e. the request (re)admitted last among those running. That is a whale when nothing came after it; on a
    # loaded host a short admitted after the whales is running when the KV runs out, and it goes (a CI run).
    admitted_at: dict[str, int] = {}  # running request -> the step it was last admitted or resumed in
    for k, m in enumerate(steps):
        for i in m["finished"]:  # finished since the last schedule: off the running list before this one
            admitted_at.pop(i, None)
        gone = set(m["preempted"])
        staying = [at for i, at in admitted_at.items() if i not in gone]
        for i in gone:
            assert i in admitted_at, (k, i)  # it was running
            assert admitted_at[i] >= max(staying, default=-1), (k, i, admitted_at)  # the tail goes first
            del admitted_at[i]
        for i in [*m["admitted"], *m["resumed"]]:
            admitted_at[i] = k
    resumed = {i for m in steps for i in m["resumed"]}
    assert {i for _, i in preempted} <= resumed
    for m in steps:
        assert sum(m["blocks"].values()) <= m["total_blocks"] and m["free_blocks"] >= 0
    assert max(sum(m["blocks"].values()) for m in steps) >= 0.9 * steps[0]["total_blocks"]


def test_agent_inputs_are_unchanged_in_kind_and_the_plugin_is_cheap(with_plugin, without_plugin):
    def kinds(rec: Recording) -> Counter:
        return Counter(type(ev).__name__ for ev in ReplaySource(rec.path).events())

    a, b = kinds(with_plugin), kinds(without_plugin)
    # vLLM logs its stats line on a 10 s timer while busy: a run of a few seconds holds one or none, by the timer's
    # phase, plugin or not (a CI run had one only without the plugin). Every other kind must match.
    on_a_timer = {"StatsLine"}
    assert set(a) - on_a_timer == set(b) - on_a_timer, (a, b)
    for kind in ("RequestReceived", "RequestAdded", "RequestSpan"):
        assert a[kind] == b[kind], (kind, a, b)
    costs = [m["cost_us"] for m in steps_of(with_plugin)[1:]]
    elapsed = [float(m.group(1)) for r in with_plugin.records(LOG)
               if (m := re.search(r"iteration elapsed time: ([\d.]+) ms", r["line"]))]
    share = sum(costs) / 1000 / sum(elapsed)
    ttft = {name: statistics.median(t for r in shorts(rec.records(CLIENT)) if (t := ttft_s(r)) is not None)
            for name, rec in (("with", with_plugin), ("without", without_plugin))}
    print(f"\nplugin cost per step: median {statistics.median(costs)} us, max {max(costs)} us over {len(costs)} "
          f"steps; {100 * share:.3f} % of step time; shorts' median TTFT with {ttft['with'] * 1000:.1f} ms, "
          f"without {ttft['without'] * 1000:.1f} ms")
    assert statistics.median(costs) < 1000  # engine-thread microseconds; the benchmark measures the step rate


def test_lab_score_reads_the_stream(with_plugin):
    score = score_recording(with_plugin.path)
    assert score is not None and score.steps == len([m for m in steps_of(with_plugin) if m["iter"] is not None])
    assert score.steps_in_timeline == score.steps and score.preempted_true >= 1
    print("\nstep truth:", score.as_dict())
