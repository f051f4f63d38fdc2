"""Exact mode end to end: the lab's real vLLM loads the step plugin and sends to a live `attrib-agent run
--plugin-socket`; during a preempting run (`kvpair`) the agent reports `mode: exact`, and its step membership
and preemptions (read through its API) equal what the plugin reported (also written to a file for the test)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import httpx
import pytest

from attrib_agent.lab.record import record_run
from attrib_agent.lab.server import PLUGIN_STEPS_FILE, LabConfig, VllmLab
from attrib_agent.lab.sidecar import agent_beside, poll_until
from attrib_agent.lab.step_truth import truth_steps
from attrib_agent.lab.workload import get_scenario
from attrib_agent.recording import CLIENT, Recording


@pytest.fixture(scope="module")
def exact_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("exact")
    sock = str(Path(tempfile.mkdtemp(prefix="attrib-exact-")) / "agent.sock")  # unix paths: <= 107 bytes
    with VllmLab(LabConfig(plugin_socket=sock), workdir=root / "lab") as ep, \
            agent_beside(ep, root / "agent", extra_args=["--plugin-socket", sock]) as agent:
        record_run(ep, get_scenario("kvpair"), root / "rec", attempts=3)
        ids = [c["vllm_request_id"] for c in Recording(root / "rec").records(CLIENT)]
        with httpx.Client(trust_env=False, timeout=10) as c:
            def all_final():
                got = {rid: c.get(f"{agent.api_url}/v1/requests/{rid}/culprits") for rid in ids}
                return got if all(r.status_code == 200 and r.json().get("status") == "final"
                                  for r in got.values()) else None  # not `skipped` (load shed)
            answers = poll_until(all_final, 60)
            ready = c.get(f"{agent.api_url}/readyz").json()
            timeline = c.get(f"{agent.api_url}/v1/timeline", params={"since": "0", "max_steps": "10000"}).json()
            metrics = c.get(f"{agent.api_url}/metrics").text
        log = (root / "agent" / "agent.log").read_text()
    lines = (root / "lab" / PLUGIN_STEPS_FILE).read_text().splitlines()
    messages = [json.loads(x) for x in lines if x.strip()]
    facts = truth_steps(messages)
    drops = max((m.get("drops") or 0 for m in messages), default=0)  # datagrams the agent never got
    return {"drops": drops, "answers": answers, "ready": ready, "timeline": timeline, "metrics": metrics,
            "facts": facts, "log": log}


def test_the_agent_says_it_is_exact(exact_run):
    assert exact_run["answers"], exact_run["log"][-3000:]
    modes = [r.json()["mode"] for r in exact_run["answers"].values()]
    print(f"\nresults: {modes.count('exact')} exact, {modes.count('inferred')} inferred; "
          f"plugin datagrams dropped: {exact_run['drops']}")
    # A result is exact only when the agent got every step of its life: a dropped datagram (the plugin drops
    # rather than wait on a receiver stuck > 2 s) leaves the requests of that step inferred, and says so.
    assert set(modes) == {"exact"} or (exact_run["drops"] > 0 and "exact" in modes), modes
    assert exact_run["ready"]["mode"] == "exact"
    assert 'attrib_mode_info{mode="exact"} 1.0' in exact_run["metrics"]


def test_membership_equals_the_plugins(exact_run):
    facts = {f.iteration: f for f in exact_run["facts"]}
    steps = exact_run["timeline"]["steps"]
    assert not exact_run["timeline"]["truncated"] and len(steps) > 50
    compared = 0
    for s in steps:
        members = frozenset(r for ids in s["members"].values() for r in ids)
        assert members == facts[s["iteration"]].members, s["iteration"]
        compared += 1
    print(f"\n{compared} steps: membership equal to the plugin's in all")


def test_preemptions_equal_the_plugins(exact_run):
    steps = exact_run["timeline"]["steps"]
    first, last = steps[0]["iteration"], steps[-1]["iteration"]
    starts = {round(s["ts"] - s["elapsed_s"], 6): s["iteration"] for s in steps}
    true = sorted((rid, f.iteration) for f in exact_run["facts"] if first <= f.iteration <= last for rid in f.preempted)
    assert true, "the KV-exhausting pair did not preempt"
    named = sorted((lane["request_id"], starts[round(p["ts"], 6)])
                   for lane in exact_run["timeline"]["requests"] for p in lane["preemptions"])
    assert named == true
    assert all(p["confidence"] == 1.0 for lane in exact_run["timeline"]["requests"] for p in lane["preemptions"])
