"""Routing study: two vLLM scheduler instances on one clock, routed round-robin, least-loaded, or by the agent's
admission forecast, and the short requests' TTFT under each (docs/forecast.md, "Routing example")."""
