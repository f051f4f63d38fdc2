"""The agent's settings: one table (`settings.SETTINGS`) -> flags, environment, TOML file and docs.

`load.py` builds the `AgentConfig` from the layers, `file.py` reads the TOML file, `values.py` parses each
kind of value, `types.py` holds the small value types (Secret, HostPort, OtlpTarget).
"""

from attrib_agent.config.load import AgentConfig, add_run_arguments, load_config
from attrib_agent.config.settings import SETTINGS, Setting
from attrib_agent.config.types import ConfigError, HostPort, OtlpTarget, Secret

__all__ = ["SETTINGS", "AgentConfig", "ConfigError", "HostPort", "OtlpTarget", "Secret", "Setting",
           "add_run_arguments", "load_config"]
