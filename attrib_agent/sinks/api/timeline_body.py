"""`/v1/timeline`'s body with each step's JSON kept: a rebuild encodes only the steps it has not sent before.

The page polls the timeline while the engine runs; between two polls a few steps are new and the rest (up to
`max_steps`, ~900 in two minutes of a busy CPU engine) are the same frozen objects the timeline held before
(re-inference replaces a step's outcome object, never changes one). Encoding those again was ~40 % of a rebuild
(docs/performance.md section 4). The text is byte for byte what encoding the whole document gives.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Final

from attrib_agent.read_model import TimelineReads
from attrib_agent.sinks.api.plumbing import dumps
from attrib_agent.sinks.api.timeline import MAX_STEPS, Step, step_dict, timeline_parts

MAX_KEPT_STEPS: Final = MAX_STEPS  # one largest page's worth


class StepTexts:
    """Each step's JSON, by the identity of its (frozen) input and outcome; the oldest dropped past `max_steps`.
    An entry holds its objects, so an id cannot be reused while it is kept."""

    def __init__(self, max_steps: int = MAX_KEPT_STEPS) -> None:
        if max_steps < 1:
            raise ValueError("max_steps must be >= 1")
        self.max_steps = max_steps
        self._texts: OrderedDict[tuple[int, int], tuple[Step, str]] = OrderedDict()
        self.encoded = 0

    def text(self, step: Step) -> str:
        key = (id(step[0]), id(step[1]))
        hit = self._texts.get(key)
        if hit is not None and hit[0][0] is step[0] and hit[0][1] is step[1]:
            return hit[1]
        text = dumps(step_dict(*step))
        self.encoded += 1
        self._texts[key] = (step, text)
        while len(self._texts) > self.max_steps:
            self._texts.popitem(last=False)
        return text

    def __len__(self) -> int:
        return len(self._texts)


def timeline_body(view: TimelineReads, since: float | None, until: float | None, texts: StepTexts, *,
                  max_steps: int, window_s: float | None, extra: dict[str, Any]) -> bytes:
    """The JSON of `timeline_json(...) | extra`, its steps from `texts`."""
    head, chosen, tail = timeline_parts(view, since, until, max_steps=max_steps, window_s=window_s)
    parts = [dumps(head)[1:-1], '"steps":[' + ",".join(texts.text(step) for step in chosen) + "]",
             dumps(tail | extra)[1:-1]]
    return ("{" + ",".join(p for p in parts if p) + "}").encode("utf-8")
