"""Per-step truth: the capture records the plugin's datagrams, and the timeline is scored against them."""

import json
import socket
import threading
import time

from attrib_agent.lab.capture import Capture, bind_steps_socket, receive_steps
from attrib_agent.lab.step_truth import StepTruthScore, format_step_scores, score_steps, truth_steps
from attrib_agent.recording import VLLM_STEPS, Recording
from attrib_agent.timeline.model import StepMember, StepRecord
from attrib_agent.timeline.preemption import InferredPreemption
from attrib_agent.timeline.sched_state import StepInput
from attrib_agent.timeline.step_outcome import StepOutcome


def test_capture_records_plugin_datagrams_only_while_recording(tmp_path):
    cap = Capture(tmp_path / "server.log")
    path = str(tmp_path / "s.sock")
    sock = bind_steps_socket(path)
    threading.Thread(target=receive_steps, args=(cap, sock), daemon=True).start()
    tx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    def until(key):
        deadline = time.monotonic() + 5
        while cap.counters[key] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)

    tx.sendto(b'{"v":1,"kind":"step","iter":0}\n', path)  # no recording open: counted, not written
    until("step_messages")
    cap.start(str(tmp_path / "rec"), {})
    tx.sendto(b'{"v":1,"kind":"step","iter":1,"t":5.0}\n', path)
    tx.sendto(b"not json", path)
    until("step_rejected")
    assert cap.stop() == {VLLM_STEPS: 1}
    assert cap.counters["step_messages"] == 2 and cap.counters["step_rejected"] == 1
    (rec,) = Recording(tmp_path / "rec").records(VLLM_STEPS)
    assert rec["iter"] == 1 and rec["t"] == 5.0 and rec["ts"] > 1e9
    sock.close()
    bind_steps_socket(path).close()  # a restarted capture replaces the stale socket file


def msg(i, members, blocks, preempted=(), kind="step", v=1):
    return {"v": v, "kind": kind, "iter": i, "scheduled": [{"id": f"{m}-0123abcd", "new": 1} for m in members],
            "blocks": {f"{k}-0123abcd": n for k, n in blocks.items()},
            "preempted": [f"{p}-0123abcd" for p in preempted]}


def outcome(i, members, holdings):
    si = StepInput(i, 0, i, 10.0 + i, 0.01, 0, 0, len(members), len(members), 0.5)
    rec = StepRecord(0, i, 10.0 + i, 0.01, 0, 0, len(members), len(members), 0.5,
                     tuple(StepMember(m, "decode", 1, 100, holdings.get(m, 0)) for m in members))
    return si, StepOutcome(rec, holdings=tuple(holdings.items()))


def test_truth_steps_map_internal_ids_and_skip_what_is_not_a_v1_step():
    truth = truth_steps([{"v": 1, "kind": "hello"}, msg(0, ["a"], {"a": 2}), msg(1, ["a"], {}, v=2),
                         {**msg(2, [], {}), "iter": None}, json.loads(json.dumps(msg(3, ["b"], {"b": 1}, ["a"])))])
    assert [(t.iteration, sorted(t.members), dict(t.blocks), t.preempted) for t in truth] == [
        (0, ["a"], {"a": 2}, ()), (3, ["b"], {"b": 1}, ("a",))]


def test_score_counts_membership_blocks_and_preemption_naming():
    truth = truth_steps([msg(0, ["a", "b"], {"a": 2, "b": 3}), msg(1, ["a"], {"a": 2}, preempted=["b"]),
                         msg(2, ["a", "b"], {"a": 3, "b": 4}), msg(9, ["a"], {"a": 3})])
    outcomes = [outcome(0, ["a", "b"], {"a": 2, "b": 3}), outcome(1, ["a", "b"], {"a": 2, "b": 3}),
                outcome(2, ["a", "b"], {"a": 3, "b": 2})]
    named = [InferredPreemption("b", 2, 12.0, None, None, 0.8, ("count_gap",)),
             InferredPreemption("a", 2, 12.0, None, None, 0.5, ("count_gap",))]
    s = score_steps(truth, outcomes, named)
    assert (s.steps, s.steps_in_timeline, s.membership_exact) == (4, 3, 2)
    # pairs: step 0 two exact, step 1 a exact + b 3 vs 0, step 2 a exact + b 2 vs 4
    assert (s.block_pairs, s.block_exact, s.block_abs_error) == (6, 4, 5)
    assert (s.preempted_true, s.preempted_named, s.preempted_hits) == (1, 2, 1)
    assert s.preemption_precision == 0.5 and s.preemption_recall == 1.0
    total = StepTruthScore()
    total.add(s)
    total.add(s)
    assert total.steps == 8 and total.preemption_precision == 0.5
    table = format_step_scores([("rec", s)])
    assert "3/4" in table and "67 %" in table and "50 %" in table
