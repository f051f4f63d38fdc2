"""vLLM SIGKILLed and restarted under a live `attrib-agent run`: the agent stays up and marks the gap, counts the
restart without a counter going backwards, still serves what it attributed before, and attributes after.

The session's one vLLM (the `lab` fixture) is killed and restarted in place (`VllmLab.restart()`: same
ports, arguments and log file), so the tests after this one still have a server and the fixture's teardown
stops the new process group. One restart costs a vLLM start-up (30-50 s); the whole test takes ~1.5 min.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from attrib_agent.lab.record import record_run
from attrib_agent.lab.server import LabEndpoints, VllmLab
from attrib_agent.lab.sidecar import AgentProcess, agent_beside, poll_until
from attrib_agent.lab.summary import shorts, ttft_s
from attrib_agent.lab.workload import get_scenario, prompt_token_ids

SLOWED_S = 0.25
Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _counters(text: str) -> Series:
    """Every sample of the agent's counters and histograms (the series that may only grow)."""
    out: Series = {}
    for fam in text_string_to_metric_families(text):
        if fam.type not in ("counter", "histogram"):
            continue
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(text: str, name: str, **labels: str) -> float | None:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


class InFlight:
    """One whale streaming in a thread, so vLLM dies in the middle of its decode."""

    def __init__(self, lab: LabEndpoints, request_id: str) -> None:
        self.tokens = 0
        self.error: str | None = None
        self._body = {"model": lab.model, "prompt": prompt_token_ids(3000, 11), "max_tokens": 2000,
                      "ignore_eos": True, "temperature": 0.0, "stream": True,
                      "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        self._url = f"{lab.vllm_url}/v1/completions"
        self._rid = request_id
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with httpx.Client(trust_env=False, timeout=httpx.Timeout(60.0, connect=5.0)) as c, \
                    c.stream("POST", self._url, json=self._body, headers={"X-Request-Id": self._rid}) as resp:
                for line in resp.iter_lines():
                    if '"completion_tokens"' in line:
                        self.tokens += 1
        except (httpx.HTTPError, ValueError) as exc:
            self.error = type(exc).__name__


def _answers(c: httpx.Client, agent: AgentProcess, ids: list[str], timeout_s: float, *,
             final: bool = True) -> dict[str, Any]:
    """The agent's answer for each request once all are final (200), or with `final=False` once each has a
    result, final or partial (202 with culprits); whatever they are after `timeout_s` otherwise."""
    def get() -> dict[str, Any]:
        out = {}
        for rid in ids:
            r = c.get(f"{agent.api_url}/v1/requests/{rid}/culprits")
            out[rid] = r.json() | {"_code": r.status_code}
        return out

    def done() -> dict[str, Any] | None:
        got = get()
        ok = all(a["_code"] == 200 if final else a.get("status") in ("final", "partial") for a in got.values())
        return got if ok else None
    return poll_until(done, timeout_s, 1.0) or get()


@pytest.fixture(scope="module")
def restart_run(lab: LabEndpoints, lab_state: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    owner = VllmLab.owner_of(lab)
    if owner is None:
        pytest.skip("the session's vLLM was not started by this process: it cannot be restarted in place")
    root = tmp_path_factory.mktemp("restart")
    out: dict[str, Any] = {"timings": {}}
    t_start = time.monotonic()
    with agent_beside(lab, root) as agent, httpx.Client(trust_env=False, timeout=10) as c:
        def metrics() -> str:
            return c.get(f"{agent.api_url}/metrics").text

        # 1. Part of the work: a whole short scenario, attributed, then a whale still decoding at the kill.
        res1 = record_run(lab, get_scenario("smoke"), root / "rec1", attempts=5)
        out["client1"] = {r["vllm_request_id"]: r for r in res1.results if r["status"] == "ok"}
        out["answers1"] = _answers(c, agent, list(out["client1"]), 60)
        whale = InFlight(lab, f"inflight-{res1.meta['run_tag']}")
        out["inflight_id"] = f"cmpl-inflight-{res1.meta['run_tag']}-0"
        whale.thread.start()
        poll_until(lambda: whale.tokens >= 3 or not whale.thread.is_alive(), 60, 0.05)
        out["metrics_before"] = metrics()
        out["readyz_before"] = c.get(f"{agent.api_url}/readyz").json()
        restarted = False
        try:
            # 2. vLLM dies (its whole process group, SIGKILL) while the agent keeps running.
            t_kill = time.monotonic()
            out["inflight_tokens_at_kill"] = whale.tokens
            owner.kill()
            whale.thread.join(30)
            gaps_before = _value(out["metrics_before"], "attrib_vllm_gaps_total") or 0.0

            def gap_marked() -> str | None:
                m = metrics()
                marked = (_value(m, "attrib_vllm_gaps_total") or 0) > gaps_before
                return m if marked and _value(m, "attrib_source_up", source="vllm_metrics") == 0.0 else None
            out["metrics_down"] = poll_until(gap_marked, 15, 0.25)
            out["down_metrics_text"] = metrics()
            out["healthz_down"] = c.get(f"{agent.api_url}/healthz")
            out["readyz_down"] = c.get(f"{agent.api_url}/readyz")
            out["agent_alive_down"] = agent.proc is not None and agent.proc.poll() is None
            out["timings"]["down_s"] = time.monotonic() - t_kill
        finally:
            # 3. The same vLLM again: same port, same log file (the agent keeps tailing it), same span route.
            t_restart = time.monotonic()
            owner.restart()
            restarted = True
            out["timings"]["restart_s"] = time.monotonic() - t_restart
            if lab_state.exists():
                lab.save(lab_state)  # the new process group, for anyone attaching later
        assert restarted
        # The new capture process forwards the new vLLM's spans to the agent again.
        c.post(f"{lab.capture_url}/lab/forward",
               json={"url": f"http://127.0.0.1:{agent.otlp_http_port}/v1/traces"}).raise_for_status()
        restarts_before = _value(out["metrics_before"], "attrib_vllm_restarts_total") or 0.0

        def back_and_counted() -> str | None:
            m = metrics()
            counted = (_value(m, "attrib_vllm_restarts_total") or 0) > restarts_before
            return m if counted and _value(m, "attrib_source_up", source="vllm_metrics") == 1.0 else None
        out["metrics_back"] = poll_until(back_and_counted, 30, 0.25) or metrics()

        def gap_closed() -> dict[str, Any] | None:
            body: dict[str, Any] = c.get(f"{agent.api_url}/readyz").json()
            return body if body.get("vllm_gap_since") is None else None
        out["readyz_back"] = poll_until(gap_closed, 10, 0.25) or c.get(f"{agent.api_url}/readyz").json()
        out["metrics_back_closed"] = metrics()

        # 4. Work after the restart, attributed by the same agent.
        res2 = record_run(lab, get_scenario("smoke"), root / "rec2", attempts=5)
        out["client2"] = {r["vllm_request_id"]: r for r in res2.results if r["status"] == "ok"}
        out["answers2"] = _answers(c, agent, list(out["client2"]), 60, final=False)
        # Final too, well before partial_timeout_s: the request lost in the crash does not hold them back.
        out["answers2_final"] = _answers(c, agent, list(out["client2"]), 10)
        served = {rid: c.get(f"{agent.api_url}/v1/requests/{rid}/culprits") for rid in out["client1"]}
        out["answers1_after"] = {rid: a.json() | {"_code": a.status_code} for rid, a in served.items()}
        out["metrics_after"] = metrics()
        dead = c.get(f"{agent.api_url}/v1/requests/{out['inflight_id']}/culprits")
        out["inflight_status_after"] = dead.json().get("status")  # "aborted": it ended with the old server
        out["healthz_after"] = c.get(f"{agent.api_url}/healthz")
        out["agent_alive_after"] = agent.proc is not None and agent.proc.poll() is None
        out["timings"]["total_s"] = time.monotonic() - t_start
    out["log"] = (root / "agent.log").read_text(errors="replace")
    (root / "answers.json").write_text(json.dumps({k: out[k] for k in ("answers1", "answers2", "answers2_final",
                                                                     "inflight_id")}, indent=1, default=str))
    print("\nrestart test:", {k: round(v, 1) for k, v in out["timings"].items()},
          "in-flight tokens at kill:", out["inflight_tokens_at_kill"],
          "in-flight whale's status after:", out["inflight_status_after"],
          "gap while down:", {k: v for k, v in out["readyz_down"].json().items() if "gap" in k},
          "cost model (steps, coefficients) before/after:",
          [(_value(out[k], "attrib_engine_steps_total"),
            sorted((s.labels.get("term"), round(s.value, 6)) for f in text_string_to_metric_families(out[k])
                   if f.name == "attrib_cost_model_coefficient" for s in f.samples))
           for k in ("metrics_before", "metrics_after")])
    yield out


def test_the_agent_stays_up_and_marks_the_gap_while_vllm_is_down(restart_run: dict[str, Any]) -> None:
    r = restart_run
    assert r["agent_alive_down"] and r["agent_alive_after"], r["log"][-3000:]
    assert r["healthz_down"].status_code == 200 and r["healthz_after"].status_code == 200
    assert r["metrics_down"], ("no gap counted, or vllm_metrics still up, while vLLM was down",
                               r["down_metrics_text"][-2000:])
    # Not ready while vLLM is unreachable, and /readyz says why.
    assert r["readyz_down"].status_code == 503
    assert any("vllm_metrics" in m for m in r["readyz_down"].json()["missing"])
    # /readyz and /metrics say a gap is open and for how long, and that it closed once vLLM answered again.
    gaps = r["readyz_before"]["vllm_gaps"]
    down, back = r["readyz_down"].json(), r["readyz_back"]
    assert down["vllm_gap_since"] is not None and down["vllm_gap_s"] > 0 and down["vllm_gaps"] == gaps + 1, down
    assert back["vllm_gap_since"] is None and back["vllm_gap_s"] == 0, back
    assert back["vllm_gaps"] == gaps + 1, ("one outage with a restart in it is one gap", back)
    assert (_value(r["down_metrics_text"], "attrib_vllm_gap_seconds") or 0) > 0
    assert _value(r["metrics_back_closed"], "attrib_vllm_gap_seconds") == 0
    assert _value(r["metrics_after"], "attrib_vllm_gaps_total") == gaps + 1


def test_the_restart_is_counted_and_no_counter_goes_backwards(restart_run: dict[str, Any]) -> None:
    r = restart_run
    before = _value(r["metrics_before"], "attrib_vllm_restarts_total") or 0.0
    after = _value(r["metrics_after"], "attrib_vllm_restarts_total") or 0.0
    assert after == before + 1, (before, after)
    assert _value(r["metrics_after"], "attrib_source_up", source="vllm_metrics") == 1.0
    samples = [_counters(r[k]) for k in ("metrics_before", "down_metrics_text", "metrics_back", "metrics_back_closed",
                                         "metrics_after")]
    for earlier, later in zip(samples, samples[1:], strict=False):
        went_back = {k: (v, later[k]) for k, v in earlier.items() if k in later and later[k] < v}
        vanished = set(earlier) - set(later)
        assert not went_back and not vanished, (went_back, vanished)
    # The agent kept counting the new vLLM's engine steps.
    assert (_value(r["metrics_after"], "attrib_engine_steps_total") or 0) > \
        (_value(r["metrics_back"], "attrib_engine_steps_total") or 0)


def test_results_from_before_the_kill_are_still_served(restart_run: dict[str, Any]) -> None:
    before, after = restart_run["answers1"], restart_run["answers1_after"]
    assert before and all(a["_code"] == 200 for a in before.values()), before
    for rid, a in before.items():
        assert after[rid]["_code"] == 200, (rid, after[rid])
        assert after[rid]["culprits"] == a["culprits"]


def test_requests_after_the_restart_are_attributed_to_the_whale(restart_run: dict[str, Any]) -> None:
    client, answers = restart_run["client2"], restart_run["answers2"]
    status = {rid: a.get("status") for rid, a in answers.items()}
    assert set(status.values()) <= {"final", "partial"}, (status, restart_run["log"][-3000:])
    whales = {rid for rid, c in client.items() if c["is_whale"]}
    slowed = [c for c in shorts(client.values()) if (ttft_s(c) or 0) > SLOWED_S]
    assert slowed, "the whale's prefill should slow some shorts"
    named = [c["vllm_request_id"] for c in slowed
             if answers[c["vllm_request_id"]]["culprits"]
             and answers[c["vllm_request_id"]]["culprits"][0]["request_id"] in whales]
    assert len(named) >= 0.8 * len(slowed), (len(named), len(slowed), {c["vllm_request_id"]: answers[
        c["vllm_request_id"]] for c in slowed})


def test_requests_lost_in_the_crash_end_at_the_restart(restart_run: dict[str, Any]) -> None:
    r = restart_run
    lost = r["inflight_id"]
    named_lost = {rid: [c for c in a.get("culprits") or [] if c["request_id"] == lost]
                  for rid, a in r["answers2"].items()}
    assert not any(named_lost.values()), named_lost
    assert r["inflight_status_after"] == "aborted"
    answers = r["answers2_final"]
    assert all(a["_code"] == 200 for a in answers.values()), {rid: a.get("status") for rid, a in answers.items()}
