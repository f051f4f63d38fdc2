"""Each attributed victim as an `attrib.slowdown` span inside vLLM's own trace, linked to its culprits' spans.

The span is a child of the victim's `llm_request` span (same trace, parent = that span, via a non-recording
remote parent), so a trace backend shows the slowdown under the request it slowed; one link per culprit
points at the culprit's `llm_request` span. Ids, counts and times only: no request content.

Attribute names: GenAI semantic conventions where one exists (`gen_ai.usage.input_tokens`, ...), vLLM's own
`gen_ai.request.id` (not in the conventions, but it is the key vLLM's span carries, so one query finds both
spans), and `attrib.*` for the rest. The tracer provider is injected: tests use an in-memory exporter, the
agent `tracer_provider_for` (export.py), whose BatchSpanProcessor queue bounds what waits for export.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final, Protocol

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.util.types import Attributes, AttributeValue

from attrib_agent import __version__
from attrib_agent.attribution.result import AttributionResult, Cause, Culprit
from attrib_agent.attribution.tally import victim_class
from attrib_agent.sinks.otel.export import tracer_provider_for
from attrib_agent.timeline.model import RequestLifecycle
from attrib_agent.timeline.preemption import InferredPreemption

__all__ = ["SPAN_NAME", "SKIP_REASONS", "SlowdownSpans", "SpanOf", "top_cause", "tracer_provider_for"]

logger = logging.getLogger(__name__)

SPAN_NAME: Final = "attrib.slowdown"
QUEUE_EVENT: Final = "attrib.queue_wait"
PREEMPTION_EVENT: Final = "attrib.preempted"
INSTRUMENTATION_SCOPE: Final = "attrib_agent"
# Why a result got no span: not final yet, below the noise floor, vLLM's span unknown (tracing off, lost,
# or evicted), ids that are not a valid span context, no arrival time, or a bug caught at the sink boundary.
SKIP_REASONS: Final = ("partial", "quiet", "no_span", "bad_span_context", "no_arrival", "error")

_TRACE_ID: Final = re.compile(r"[0-9a-f]{32}")
_SPAN_ID: Final = re.compile(r"[0-9a-f]{16}")

SpanOf = Callable[[str], tuple[str, str] | None]


class Lifecycles(Protocol):
    """Where the victim's queue wait and preemptions are read: the timeline, the pipeline or the agent state."""

    def lifecycle(self, request_id: str) -> RequestLifecycle | None: ...

    def actionable_preemptions(self) -> list[InferredPreemption]: ...


class SlowdownSpans:
    """Emits one span per final attributed victim; `emitted_total` and `skipped[reason]` say what happened.

    `emit_quiet` also emits victims whose slowdown is below the noise floor (off by default: most requests are
    quiet and their spans would say nothing). At most `max_links` culprits are linked, the most blamed first.
    """

    def __init__(self, tracer_provider: TracerProvider, *, emit_quiet: bool = False, max_links: int = 16) -> None:
        if max_links < 0:
            raise ValueError("max_links must be >= 0")
        self.tracer_provider = tracer_provider
        self.emit_quiet = emit_quiet
        self.max_links = max_links
        self._tracer = tracer_provider.get_tracer(INSTRUMENTATION_SCOPE, __version__)
        self.emitted_total = 0
        self.links_total = 0
        self.unlinked_culprits_total = 0  # culprits whose own llm_request span was not known
        self.skipped: Counter[str] = Counter()

    def emit(self, result: AttributionResult, span_of: SpanOf, *, lifecycle: RequestLifecycle | None = None,
             preemptions: Sequence[InferredPreemption] = ()) -> bool:
        """Emit the victim's span; False (counted in `skipped`) when it gets none. Never raises.

        `span_of` is `AttributionPipeline.span_of`; `lifecycle` and `preemptions` (the timeline's) add the
        queue-wait and preemption events when given.
        """
        try:
            reason = self._skip_reason(result, span_of)
            if reason is not None:
                self.skipped[reason] += 1
                return False
            self._emit(result, span_of, lifecycle, preemptions)
        except Exception:  # the sink boundary: a bug here must not stop the agent
            logger.exception("attrib.slowdown span for %s failed", result.request_id)
            self.skipped["error"] += 1
            return False
        self.emitted_total += 1
        return True

    def emit_all(self, results: Iterable[AttributionResult], span_of: SpanOf,
                 timeline: Lifecycles | None = None) -> int:
        """Emit a batch (what `AttributionPipeline.feed` returned); the timeline's preemptions are inferred once."""
        batch = list(results)
        preemptions: list[InferredPreemption] = []
        if timeline is not None and any(r.final and (self.emit_quiet or not r.no_interference) for r in batch):
            try:
                preemptions = timeline.actionable_preemptions()  # the ones counted and blamed
            except Exception:  # the events are extras: spans still go out without them
                logger.exception("preemption inference for spans failed")
        n = 0
        for r in batch:
            lc = _lifecycle(timeline, r.request_id) if timeline is not None and r.final else None
            n += self.emit(r, span_of, lifecycle=lc, preemptions=preemptions)
        return n

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.tracer_provider.force_flush(timeout_millis)

    # ---- building the span -------------------------------------------------------------------------------
    def _skip_reason(self, r: AttributionResult, span_of: SpanOf) -> str | None:
        if not r.final:
            return "partial"
        if r.no_interference and not self.emit_quiet:
            return "quiet"
        ids = span_of(r.request_id) or ((r.trace_id, r.span_id) if r.trace_id and r.span_id else None)
        if ids is None:
            return "no_span"
        if _span_context(*ids) is None:
            return "bad_span_context"
        return "no_arrival" if r.arrival_ts is None else None

    def _emit(self, r: AttributionResult, span_of: SpanOf, lifecycle: RequestLifecycle | None,
              preemptions: Sequence[InferredPreemption]) -> None:
        ids = span_of(r.request_id) or (r.trace_id or "", r.span_id or "")
        parent = _span_context(*ids)
        assert parent is not None and r.arrival_ts is not None  # _skip_reason checked both
        culprits = sorted(r.culprits, key=lambda c: (c.ttft_s + c.itl_s, c.request_id), reverse=True)
        links: list[Link] = []
        unlinked: list[str] = []
        for c in culprits[:self.max_links]:
            ctx = span_of(c.request_id)
            sc = _span_context(*ctx) if ctx is not None else None
            if sc is None:
                unlinked.append(c.request_id)
            else:
                links.append(Link(sc, _link_attributes(c, r.itl_gaps)))
        start_ns = _ns(r.arrival_ts)
        end_ns = max(start_ns, _ns(r.finished_ts))
        attrs = victim_attributes(r)
        if unlinked:
            attrs["attrib.culprits.unlinked"] = unlinked
        span = self._tracer.start_span(SPAN_NAME, context=trace.set_span_in_context(NonRecordingSpan(parent)),
                                       kind=SpanKind.INTERNAL, attributes=attrs, links=links, start_time=start_ns)
        for name, ts, event_attrs in _events(r, lifecycle, preemptions):
            span.add_event(name, event_attrs, timestamp=min(max(_ns(ts), start_ns), end_ns))
        span.end(end_time=end_ns)
        self.links_total += len(links)
        self.unlinked_culprits_total += len(unlinked)


def victim_attributes(r: AttributionResult) -> dict[str, AttributeValue]:
    """The span's own attributes; None values are left out (OTel attributes cannot be null)."""
    gaps = r.itl_gaps
    top = r.top_culprit()
    values: dict[str, AttributeValue | None] = {
        "gen_ai.request.id": r.request_id,
        "gen_ai.usage.input_tokens": r.prompt_tokens,
        "gen_ai.usage.output_tokens": r.completion_tokens,
        "attrib.engine": r.engine,
        "attrib.victim_class": victim_class(r),
        "attrib.no_interference": r.no_interference,
        "attrib.quality": r.quality,
        "attrib.mode": r.mode,  # exact (the step plugin's facts) or inferred
        "attrib.chosen_by": r.chosen_by,  # share (the hash sample) or slowed (taken outside it while shedding)
        # one figure in seconds of the victim's time, to sort by: TTFT slowdown + ITL slowdown x token gaps
        "attrib.slowdown_s": r.ttft_slowdown_s + r.itl_slowdown_s * gaps,
        "attrib.ttft.observed_s": r.ttft_s,
        "attrib.ttft.baseline_s": r.ttft_baseline_s,
        "attrib.ttft.slowdown_s": r.ttft_slowdown_s,
        "attrib.unexplained_s": r.unexplained_ttft_s,
        "attrib.itl.observed_s": r.itl_s,
        "attrib.itl.baseline_s": r.itl_baseline_s,
        "attrib.itl.slowdown_s": r.itl_slowdown_s,
        "attrib.itl.unexplained_s": r.unexplained_itl_s,
        "attrib.culprits.count": len(r.culprits),
        "attrib.top_culprit.request_id": top.request_id if top else None,
        "attrib.top_culprit.share": top.share if top else None,
        "attrib.top_cause": top_cause(top, gaps) if top else None,
    }
    return {k: v for k, v in values.items() if v is not None}


def top_cause(c: Culprit, itl_gaps: int) -> str:
    """The cause carrying most of a culprit's blame, TTFT and ITL seconds together, split as the metrics split
    it (e.g. `preemption` for a victim preempted mid-stream; blame with no observed mechanism is `other`)."""
    seconds = c.blame_by_cause(itl_gaps)
    return max(seconds.items(), key=lambda kv: (kv[1], kv[0]))[0] if seconds else Cause.OTHER.value


def _link_attributes(c: Culprit, itl_gaps: int) -> Attributes:
    return {"attrib.culprit.request_id": c.request_id, "attrib.culprit.is_whale": c.is_whale,
            "attrib.blamed.ttft_s": c.ttft_s, "attrib.blamed.itl_s": c.itl_s, "attrib.share": c.share,
            "attrib.cause": top_cause(c, itl_gaps), "attrib.culprit.kv_block_seconds": c.kv_block_seconds}


def _events(r: AttributionResult, lc: RequestLifecycle | None,
            preemptions: Sequence[InferredPreemption]) -> list[tuple[str, float, Mapping[str, AttributeValue]]]:
    """The queue wait (ends when vLLM first scheduled the victim) and each preemption of the victim."""
    out: list[tuple[str, float, Mapping[str, AttributeValue]]] = []
    if lc is not None and lc.request_id == r.request_id and lc.scheduled_ts is not None and lc.queue_s is not None:
        out.append((QUEUE_EVENT, lc.scheduled_ts, {"attrib.queue.wait_s": lc.queue_s}))
    for p in preemptions:
        if p.request_id != r.request_id:
            continue
        attrs: dict[str, AttributeValue] = {"attrib.preemption.iteration": p.preempted_iteration,
                                            "attrib.preemption.confidence": p.confidence,
                                            "attrib.preemption.evidence": list(p.evidence)}
        if p.resumed_ts is not None:
            attrs["attrib.preemption.resumed_after_s"] = p.resumed_ts - p.preempted_ts
        out.append((PREEMPTION_EVENT, p.preempted_ts, attrs))
    return out


def _lifecycle(timeline: Lifecycles, request_id: str) -> RequestLifecycle | None:
    try:
        return timeline.lifecycle(request_id)
    except Exception:  # the queue-wait event is an extra: the span still goes out without it
        logger.exception("lifecycle lookup for %s failed", request_id)
        return None


def _span_context(trace_id: str, span_id: str) -> SpanContext | None:
    """vLLM's span as a remote, sampled parent (it was exported, so it was sampled), or None if malformed."""
    if not (_TRACE_ID.fullmatch(trace_id) and _SPAN_ID.fullmatch(span_id)):
        return None
    sc = SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return sc if sc.is_valid else None


def _ns(ts: float) -> int:
    return int(round(ts * 1e9))
