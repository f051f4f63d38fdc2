"""The agent's `/metrics`: one collector reading the `AgentState` at scrape time (every series in docs/metrics.md).

`families.py` is the catalogue (names, types, labels); `slowdown.py`, `engine.py` and `health.py` build one
section each; `collector.py` assembles them.
"""

from attrib_agent.sinks.prometheus.collector import AgentCollector, registry_for
from attrib_agent.sinks.prometheus.families import SPECS, FamilySpec

__all__ = ["SPECS", "AgentCollector", "FamilySpec", "registry_for"]
