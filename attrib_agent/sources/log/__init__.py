"""vLLM's log: a follower (file with rotation, or stdin) and a line parser, wrapped as one source.

`tailer.py` reads lines, `parser.py` turns them into events with the table in `patterns.py`.
"""

from attrib_agent.sources.log.parser import LogLineParser
from attrib_agent.sources.log.source import SPEC, LogSource
from attrib_agent.sources.log.tailer import LogFollower, StdinLines

__all__ = ["SPEC", "LogFollower", "LogLineParser", "LogSource", "StdinLines"]
