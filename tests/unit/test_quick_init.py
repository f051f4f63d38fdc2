"""`quick_init` (events.py): the faster constructor of frozen slotted dataclasses builds the very values the
dataclass's own `__init__` builds, keeps them frozen, and refuses classes it cannot build the same way."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import FrozenInstanceError, dataclass, field

import pytest

from attrib_agent import events
from attrib_agent.events import quick_init
from attrib_agent.timeline import lifecycle, model, step_outcome

QUICK = [c for mod in (events, model, step_outcome, lifecycle) for c in vars(mod).values()
         if isinstance(c, type) and c.__module__ == mod.__name__ and dataclasses.is_dataclass(c)
         and c.__init__.__qualname__ == f"{c.__qualname__}.__init__" and "_set0" in c.__init__.__code__.co_names]


def _reference(cls: type) -> type:
    """The same fields as a plain frozen dataclass (its generated __init__)."""
    spec = [(f.name, object, field(default=f.default) if f.default is not dataclasses.MISSING else
             field(default_factory=f.default_factory) if f.default_factory is not dataclasses.MISSING else field())
            for f in dataclasses.fields(cls)]
    return dataclasses.make_dataclass("Ref", spec, frozen=True, slots=True)


def test_every_frozen_value_of_the_contract_and_the_timeline_is_quick() -> None:
    names = {c.__name__ for c in QUICK}
    assert {"EngineStep", "RequestSpan", "MetricsSnapshot", "StepMember", "StepRecord", "StepOutcome",
            "Departure", "RequestLifecycle", "BookEntry"} <= names


@pytest.mark.parametrize("cls", QUICK, ids=lambda c: c.__name__)
def test_same_values_signature_and_frozenness(cls: type) -> None:
    ref = _reference(cls)
    assert inspect.signature(cls.__init__).parameters.keys() == inspect.signature(ref.__init__).parameters.keys()
    required = [f for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]
    args = [f"v{i}" for i in range(len(required))]
    built, expected = cls(*args), ref(*args)
    assert [getattr(built, f.name) for f in dataclasses.fields(cls)] == \
        [getattr(expected, f.name) for f in dataclasses.fields(ref)]
    everything = {f.name: i for i, f in enumerate(dataclasses.fields(cls))}
    assert cls(**everything) == cls(*everything.values())
    assert dataclasses.replace(cls(**everything), **{required[0].name: "x"}) != cls(**everything)
    with pytest.raises(FrozenInstanceError):
        setattr(built, required[0].name, 1)
    with pytest.raises(TypeError):
        cls(*args, *range(len(everything)))  # too many
    with pytest.raises(TypeError):
        cls(*args[:-1])  # one missing


def test_a_default_factory_makes_a_new_value_each_time() -> None:
    @quick_init
    @dataclass(frozen=True, slots=True)
    class Box:
        a: int
        items: list[int] = field(default_factory=list)

    one, two = Box(1), Box(2)
    assert one.items == [] and one.items is not two.items and Box(3, [4]).items == [4]


def test_refuses_what_it_cannot_build_the_same_way() -> None:
    @dataclass(slots=True)
    class Mutable:
        a: int

    @dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclass(frozen=True, slots=True)
    class PostInit:
        a: int

        def __post_init__(self) -> None:
            pass

    for cls in (Mutable, NoSlots, PostInit):
        with pytest.raises(TypeError):
            quick_init(cls)
