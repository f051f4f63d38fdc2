"""Grafana dashboards for attrib-agent, generated as code with grafana-foundation-sdk.

`python -m dashboards.build` writes `dashboards/json/*.json`; a test regenerates them and fails on drift.
The alert rules live beside them in `dashboards/rules/` (a plain Prometheus rules file and its promtool tests).
"""
