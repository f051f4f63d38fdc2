"""The lab's canary plan: text prompts carry the canary into vLLM's generated output and spans, token-id prompts
carry none; the trace context it sends is one vLLM's OpenTelemetry propagator accepts (tracestate kept)."""

from __future__ import annotations

from opentelemetry.trace import get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from attrib_agent.lab.client import canary_headers
from attrib_agent.lab.record import make_plan
from attrib_agent.lab.workload import get_scenario

CANARY = "CANARY-0123456789abcdef"


def test_text_prompts_carry_the_canary_token_prompts_do_not() -> None:
    plan = make_plan(get_scenario("canary"), "abc123", CANARY) + make_plan(get_scenario("shorts"), "abc123", CANARY)
    text = [p for p in plan if p.prompt_text]
    assert len(text) == 4 and all(p.canary == CANARY and p.prompt_text.startswith(CANARY) for p in text)
    assert all(p.canary is None for p in plan if not p.prompt_text)


def test_the_trace_context_is_valid_and_keeps_the_canary() -> None:
    headers = canary_headers(CANARY, "abc123-t000")
    ctx = get_current_span(TraceContextTextMapPropagator().extract(headers)).get_span_context()
    assert ctx.is_valid and ctx.trace_state.get("lab") == CANARY
    assert canary_headers(CANARY, "abc123-t000") == headers != canary_headers(CANARY, "abc123-t001")
