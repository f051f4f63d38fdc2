"""The agent's settings: rows (`setting.Setting`) declared beside their owners -> flags, environment, TOML, docs.

This face holds what the sources and sinks use to declare their rows (`Setting`, the value parsers in
`values`, the value types); `settings.py` gathers the rows from the registrations, `agent_config.py` makes
`AgentConfig` from them, `load.py` merges the layers, `file.py` reads the TOML file. Those sit above the
sources and sinks (they read their registrations), so import them by module: `config.load.load_config`.
"""

from attrib_agent.config.setting import Setting
from attrib_agent.config.types import ConfigError, HostPort, OtlpTarget, Secret

__all__ = ["ConfigError", "HostPort", "OtlpTarget", "Secret", "Setting"]
