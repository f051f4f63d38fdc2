"""The running agent: the core (queue -> pipeline -> sinks), the live sources around it, and replay.

Wiring only: what a source or a sink is lives in `sources/source.py` and `sinks/sink.py`, which ones exist
in their registries; the agent loops over them.
"""

from attrib_agent.agent.core import AgentCore, ServeOptions
from attrib_agent.agent.live import LiveAgent
from attrib_agent.agent.replay import REPLAY_SOURCE_NAMES, replay_into

__all__ = ["REPLAY_SOURCE_NAMES", "AgentCore", "LiveAgent", "ServeOptions", "replay_into"]
