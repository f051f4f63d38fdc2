"""vLLM's request id forms, the one place they are written: the engine's internal id and the frontend's.

vLLM 0.32 hands a request to the engine as `<external id>-<8 hex>` (input_processor `assign_request_id`; the
`Added request` log line and the scheduler name it so), `<i>_<external>-<8 hex>` for the i-th child of an n>1
request, or the external id itself under VLLM_DISABLE_REQUEST_ID_RANDOMIZATION. The Responses API sends each
turn as `<response id>_<turn>` (responses/serving.py `sub_request_id`), so its first one is `resp_..._0`.
"""

from __future__ import annotations

import re
from typing import Final

INTERNAL_SUFFIX: Final = re.compile(r"(?P<base>.+)-[0-9a-f]{8}")  # fullmatch: the engine's id, `base` the frontend's
CHILD_PREFIX: Final = re.compile(r"\d{1,6}_(?P<parent>.+)")  # an n>1 request's child, after its suffix is gone
RESPONSES_FIRST_TURN: Final = "_0"  # the Responses API's first engine request for a response id


def external_id(internal: str) -> str:
    """The frontend's id for the engine's `internal` one (itself when it carries no random suffix)."""
    m = INTERNAL_SUFFIX.fullmatch(internal)
    return m.group("base") if m else internal


def frontend_ids(engine_id: str) -> tuple[str, ...]:
    """The ids the frontend may know an engine id by, nearest first: the id without its random suffix, then, for
    an n>1 request's child (`<i>_<id>`), its parent's; none when it carries no suffix."""
    m = INTERNAL_SUFFIX.fullmatch(engine_id)
    if m is None:
        return ()
    base = m.group("base")
    child = CHILD_PREFIX.fullmatch(base)
    return (base, child.group("parent")) if child else (base,)
