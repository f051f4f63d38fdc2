"""The one place that touches vLLM: wrap `Scheduler.schedule` so each step's decision is sent on.

Every line of the plugin's own work runs inside one guard: the first exception logs one line and turns
the plugin off for the life of the process, and the engine carries on as if it had never been installed.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from typing import Any

from attrib_vllm_plugin.channel import Fanout
from attrib_vllm_plugin.steps import StepCounter, hello_record, step_record

logger = logging.getLogger("vllm.attrib_steps")
_PATCHED = "_attrib_steps_original"
QUEUE_SIZE = 4096  # steps waiting to be sent (~10 s of fast decode steps)


class StepExporter:
    """Per-process state: the channels, the step counter, the sender thread, and whether we are still enabled.

    The engine's thread only copies the step's facts (ids and counts it must read before the scheduler moves
    on); encoding and sending happen on a daemon thread fed through a bounded queue, dropped-and-counted
    when full, so the engine never waits on them.
    """

    def __init__(self, out: Fanout, queue_size: int = QUEUE_SIZE) -> None:
        self.out = out
        self.enabled = True
        self.queued_drops = 0
        self.last_cost_us = 0  # the engine thread's time in the plugin on the previous step
        self._counters: dict[int, StepCounter] = {}  # id(scheduler) -> its counter (one scheduler per engine)
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=queue_size)
        self._thread: threading.Thread | None = None

    @property
    def dropped(self) -> int:
        return self.queued_drops + self.out.dropped

    def after_schedule(self, sched: Any, sched_out: Any) -> None:
        if not self.enabled:
            return
        t0 = time.perf_counter()
        try:
            if self._thread is None:  # started in the process that schedules (threads do not survive a fork)
                self._thread = threading.Thread(target=self._send_loop, name="attrib-steps", daemon=True)
                self._thread.start()
            counter = self._counters.get(id(sched))
            if counter is None:
                counter = self._counters[id(sched)] = StepCounter()
                self._put(hello_record(sched))
            iteration = counter.take(sched_out.total_num_scheduled_tokens)
            record = step_record(sched, sched_out, iteration, self.dropped)
            record["cost_us"] = self.last_cost_us
            self._put(record)
            self.last_cost_us = int((time.perf_counter() - t0) * 1e6)
        except Exception as e:  # the one boundary: never into the engine
            self._disable(e)

    def _put(self, record: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.queued_drops += 1

    def _send_loop(self) -> None:
        while self.enabled:
            record = self._queue.get()
            try:
                self.out.send(record)
            except Exception as e:
                self._disable(e)
            finally:
                self._queue.task_done()

    def _disable(self, e: BaseException) -> None:
        self.enabled = False
        logger.warning("attrib step plugin disabled after an error (%s: %s); vLLM is unaffected",
                       type(e).__name__, e)

    def flush(self, timeout_s: float = 5.0) -> None:
        """Wait until the queue is empty (tests; vLLM never calls it)."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)


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
