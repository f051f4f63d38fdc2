"""The one place that touches vLLM: wrap `Scheduler.schedule` so each step's decision is sent on.

Every line of the plugin's own work runs inside one guard: the first exception logs one line and turns
the plugin off for the life of the process, and the engine carries on as if it had never been installed.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

from attrib_vllm_plugin.channel import Fanout
from attrib_vllm_plugin.steps import StepCounter, hello_record, step_record

logger = logging.getLogger("vllm.attrib_steps")
_PATCHED = "_attrib_steps_original"


class StepExporter:
    """Per-process state: the channels, the step counter, and whether we are still enabled."""

    def __init__(self, out: Fanout) -> None:
        self.out = out
        self.enabled = True
        self._counters: dict[int, StepCounter] = {}  # id(scheduler) -> its counter (one scheduler per engine)
        self.last_cost_us = 0  # the plugin's own time on the previous step (read, encode, send)

    def after_schedule(self, sched: Any, sched_out: Any) -> None:
        if not self.enabled:
            return
        t0 = time.perf_counter()
        try:
            counter = self._counters.get(id(sched))
            if counter is None:
                counter = self._counters[id(sched)] = StepCounter()
                self.out.send(hello_record(sched))
            iteration = counter.take(sched_out.total_num_scheduled_tokens)
            record = step_record(sched, sched_out, iteration, self.out.dropped)
            record["cost_us"] = self.last_cost_us
            self.out.send(record)
            self.last_cost_us = int((time.perf_counter() - t0) * 1e6)
        except Exception as e:  # the one boundary: never into the engine
            self.enabled = False
            logger.warning("attrib step plugin disabled after an error (%s: %s); vLLM is unaffected",
                           type(e).__name__, e)


def install(exporter: StepExporter, scheduler_cls: Any) -> bool:
    """Wrap `scheduler_cls.schedule` (subclasses that do not override it, like AsyncScheduler, inherit it)."""
    if getattr(scheduler_cls.schedule, _PATCHED, None) is not None:
        return False
    original = scheduler_cls.schedule

    @functools.wraps(original)
    def schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        exporter.after_schedule(self, out)
        return out

    setattr(schedule, _PATCHED, original)
    scheduler_cls.schedule = schedule
    return True
