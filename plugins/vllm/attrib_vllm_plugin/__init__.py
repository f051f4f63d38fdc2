"""attrib-agent's exact mode inside vLLM: per-step scheduler facts, sent over a local non-blocking channel.

vLLM calls `register()` in each of its processes (entry point group `vllm.general_plugins`). It does
nothing unless `ATTRIB_PLUGIN_SOCKET` or `ATTRIB_PLUGIN_FILE` is set, so installing the package alone
changes nothing. Format: docs/exact-mode.md in the attrib-agent repository.
"""

from __future__ import annotations

import logging

from attrib_vllm_plugin.channel import ENV_FILE, ENV_SOCKET, Fanout
from attrib_vllm_plugin.steps import FORMAT_VERSION, external_id

__all__ = ["ENV_FILE", "ENV_SOCKET", "FORMAT_VERSION", "external_id", "register"]
SUPPORTED_VLLM = ("0.32",)

logger = logging.getLogger("vllm.attrib_steps")


def register() -> None:
    """vLLM's general-plugin hook: wrap the v1 scheduler when configured; never raises."""
    try:
        out = Fanout.from_env()
        if out is None:
            return
        from vllm.v1.core.sched.scheduler import Scheduler

        from attrib_vllm_plugin.hook import StepExporter, install

        if install(StepExporter(out), Scheduler):
            logger.info("attrib step plugin on: per-step scheduler facts to %s",
                        ", ".join(c.path for c in out.channels))
    except Exception as e:  # an import or a changed vLLM: off, with one line
        logger.warning("attrib step plugin not enabled (%s: %s); vLLM is unaffected", type(e).__name__, e)
