#!/usr/bin/env python3
"""Cause agreement with the step plugin's per-step truth, TTFT queue waits only (rough; docs/attribution.md).

Per victim, each culprit's truth label over the steps the victim waited: vLLM's head reason `no_free_blocks` ->
kv_pressure for every block holder (head_of_line for another head), else prefill_contention for chunks and
decode_batching for decodes, weighted by step time; agreement = TTFT blamed seconds whose dominant cause matches.
Usage: PYTHONPATH=. .venv/bin/python scripts/cause_agreement.py [RECORDING_WITH_STEP_TRUTH]
"""
import re
import sys
from collections import defaultdict
from pathlib import Path

from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.recording import VLLM_STEPS, Recording
from attrib_agent.sources.replay import ReplaySource

path = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/recordings/preempt-steps")


def ext(internal: str) -> str:
    return re.sub(r"-[0-9a-f]{8}$", "", internal)



steps = [m for m in Recording(path).records(VLLM_STEPS) if m.get("kind") == "step"]
p = AttributionPipeline()
p.feed_all(tuple(ReplaySource(path).events()))
p.settle()
lcs = {lc.request_id: lc for lc in p.lifecycles()}
agree = total = 0.0
reasons = defaultdict(int)
for r in p.store:
    lc = lcs[r.request_id]
    if not r.culprits or r.ttft_slowdown_s <= 0:
        continue
    # truth weights per culprit over the steps the victim waited (not scheduled yet)
    w = defaultdict(lambda: defaultdict(float))
    prev_t = None
    for m in steps:
        t = m["t"]
        dt = t - prev_t if prev_t else 0.0
        prev_t = t
        if not (lc.arrival_ts < t <= lc.scheduled_ts):
            continue
        head = m.get("head") or {}
        reasons[head.get("reason")] += 1
        if head.get("reason") == "no_free_blocks":
            for k in m["blocks"]:
                w[ext(k)]["kv_pressure"] += dt
            if head.get("id") and ext(head["id"]) != r.request_id:
                w[ext(head["id"])]["head_of_line"] += dt
        else:
            for s in m["scheduled"]:
                w[ext(s["id"])]["prefill_contention" if s["new"] > 1 else "decode_batching"] += dt
    for c in r.culprits:
        if c.ttft_s <= 0 or not c.causes or c.request_id not in w:
            continue
        mine = max(c.causes, key=c.causes.get)
        truth = max(w[c.request_id], key=w[c.request_id].get)
        total += c.ttft_s
        agree += c.ttft_s if mine == truth else 0.0
        if mine != truth:
            print("disagree", r.request_id[-8:], c.request_id[-6:], mine, truth, round(c.ttft_s, 3))
print(dict(reasons))
print(f"TTFT blamed seconds in queue waits whose dominant cause agrees with vLLM's head reason: "
      f"{agree:.2f}/{total:.2f} = {agree / max(total, 1e-9):.0%}")
