"""Prefix-cache hits inferred from the step lines (a known prompt computing fewer tokens than it has left) and
the copies of shared prefix blocks the KV ledger counts once."""

from __future__ import annotations

from attrib_agent.timeline.sched_state import StepInput, Track
from attrib_agent.timeline.step_counts import Slot
from attrib_agent.timeline.step_tokens import _prefix_hits
from attrib_agent.timeline.steps import _shared_copies


def _line(context_tokens: int, generation: int = 0) -> StepInput:
    return StepInput(0, 0, 1, 1.0, 0.1, 1, context_tokens, generation, generation, 0.1)


def test_a_prompt_whose_prefill_ends_in_fewer_tokens_found_the_rest_cached() -> None:
    t = Track("a", 0.0, 0, prompt=1857)
    s = Slot(t, "prefill", 1857, admitted=True)
    _prefix_hits([s], _line(65), budget=2048)
    assert (s.tokens, s.hit) == (65, 1792)


def test_no_shortfall_no_hit_and_settled_hits_are_not_guessed_again() -> None:
    fresh, settled = Track("a", 0.0, 0, prompt=300), Track("b", 0.0, 1, prompt=300, cached=0)
    slots = [Slot(fresh, "prefill", 300), Slot(settled, "prefill", 300)]
    _prefix_hits(slots, _line(600), budget=2048)
    assert [s.hit for s in slots] == [0, 0]
    _prefix_hits(slots, _line(400), budget=2048)
    assert [s.hit for s in slots] == [200, 0] and slots[0].tokens == 100


def test_a_hit_is_shared_with_an_earlier_holder_else_it_is_the_only_copy() -> None:
    first = Track("a", 0.0, 0, prompt=1857, computed=1858, cached=1792)  # hit blocks nobody running holds
    other = Track("b", 0.0, 1, prompt=1856, computed=1857, cached=0)  # a different prefix: it did not hit
    later = Track("c", 0.0, 2, prompt=1857, computed=1858, cached=1664)  # shares a's blocks
    assert _shared_copies([first], 128, None) == 0
    assert _shared_copies([first, other, later], 128, 32.0) == 13  # 3 x 15 blocks held, 32 in use: one shared
    assert later.prefix_root == "a"
    again = Track("c", 0.0, 2, prompt=1857, computed=1858, cached=1664)
    assert _shared_copies([first, other, again], 128, 45.0) == 0  # all 45 in use: its hit was a free copy
    assert again.prefix_root == "c"
    assert _shared_copies([first, other, again], 128, 32.0) == 0  # decided once, at the step that saw the hit


def test_whole_block_hits_go_to_the_latest_admitted_level_and_else_shared_evenly() -> None:
    """The first of a new prefix computes it and the ones admitted after it in the step hit it (vLLM caches blocks
    at allocation); sharers of one prefix hit the same whole blocks."""
    def admitted(prompts: list[int]) -> list[Slot]:
        return [Slot(Track(f"r{i}", 0.0, i, prompt=p), "prefill", p, admitted=True) for i, p in enumerate(prompts)]

    four = admitted([896] * 4)
    _prefix_hits(four, _line(896 + 3 * 128), budget=2048, block_size=128)
    assert [s.hit for s in four] == [0, 768, 768, 768] and [s.tokens for s in four] == [896, 128, 128, 128]
    three = admitted([896, 896, 897])  # 17 blocks: one of them hit a block less
    _prefix_hits(three, _line(128 + 128 + 257), budget=2048, block_size=128)
    assert [s.hit for s in three] == [768, 768, 640]
    odd = admitted([896] * 4)  # not whole blocks: shared evenly, as without a block size
    _prefix_hits(odd, _line(896 + 3 * 128 + 5), budget=2048, block_size=128)
    assert [s.hit for s in odd] == [575, 575, 575, 574]
