"""The per-engine timeline: request lifecycles, engine steps with their members, the KV block ledger and
inferred preemptions, rebuilt from vLLM's logs, metrics and spans (pure: events in, values out)."""

from attrib_agent.timeline.engine_timeline import DEFAULT_TOKEN_BUDGET, EngineTimeline, MembershipQuality
from attrib_agent.timeline.ledger import KvBlockLedger, KvReconciliation, MetricsSample, RequestKv, ResidualStats
from attrib_agent.timeline.lifecycle import LifecycleBook
from attrib_agent.timeline.model import RequestLifecycle, StepMember, StepRecord
from attrib_agent.timeline.preemption import InferredPreemption, PreemptionCounts

__all__ = [
    "DEFAULT_TOKEN_BUDGET",
    "EngineTimeline",
    "InferredPreemption",
    "KvBlockLedger",
    "KvReconciliation",
    "LifecycleBook",
    "MembershipQuality",
    "MetricsSample",
    "PreemptionCounts",
    "RequestKv",
    "RequestLifecycle",
    "ResidualStats",
    "StepMember",
    "StepRecord",
]
