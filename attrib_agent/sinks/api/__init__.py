"""The HTTP API and page: who slowed request X, who slows everyone lately, and the timeline behind it.

`app.py` holds the routes, `plumbing.py` the JSON/auth/header plumbing under them, and `ids.py`, `top.py`,
`timeline.py` parse and answer one endpoint each; every handler reads only the `AgentState`.
"""

from attrib_agent.sinks.api.app import OPEN_PATHS, PAGE_FILES, api_app

__all__ = ["OPEN_PATHS", "PAGE_FILES", "api_app"]
