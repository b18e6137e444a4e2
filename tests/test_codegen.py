"""fusee._codegen: the generated ``__init__`` and ``replace`` of frozen slotted dataclasses."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from fusee._codegen import fast_init, replacer


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class _Point:
    x: int
    y: int = 0
    tags: list[str] = dataclasses.field(default_factory=list)


@fast_init
@dataclasses.dataclass(frozen=True, slots=True)
class _Checked:
    name: str
    seen: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a name is needed")
        self.seen.append(self.name)


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        ((1,), {}, _Point(1, 0, [])),
        ((1, 2), {}, _Point(1, 2, [])),
        ((1,), {"tags": ["a"]}, _Point(1, 0, ["a"])),
        ((), {"y": 3, "x": 2}, _Point(2, 3, [])),
    ],
    ids=["defaults", "positional", "factory-field-given", "keywords"],
)
def test_a_fast_init_sets_what_the_dataclass_init_would(
    args: tuple[Any, ...], kwargs: dict[str, Any], expected: _Point
) -> None:
    assert _Point(*args, **kwargs) == expected


def test_a_default_factory_makes_a_new_value_for_each_instance() -> None:
    a, b = _Point(1), _Point(2)
    a.tags.append("mine")
    assert b.tags == []


def test_post_init_runs_after_every_field_is_set() -> None:
    assert _Checked("ada").seen == ["ada"]
    with pytest.raises(ValueError, match="a name is needed"):
        _Checked("")


def test_the_class_stays_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        _Point(1).x = 2  # type: ignore[misc]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Order:
    id: str
    total: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class _Lease:
    shard: int
    epoch: int = 0
    _: dataclasses.KW_ONLY
    owner: str  # no default, after a defaulted field: allowed once keyword-only
    renewals: list[int] = dataclasses.field(default_factory=list)


def _shape(cls: type[Any]) -> list[tuple[str, inspect._ParameterKind, bool]]:
    """Each ``__init__`` parameter's name, kind and whether it has a default."""
    return [
        (p.name, p.kind, p.default is not inspect.Parameter.empty)
        for p in inspect.signature(cls.__init__).parameters.values()
    ]


# The dataclass's own __init__, before fast_init replaces it.
_PLAIN_INITS = {cls: _shape(cls) for cls in (_Order, _Lease)}
fast_init(_Order)
fast_init(_Lease)


@pytest.mark.parametrize("cls", [_Order, _Lease], ids=["kw-only-class", "kw-only-marker"])
def test_a_fast_init_has_the_dataclass_inits_signature(cls: type[Any]) -> None:
    assert _shape(cls) == _PLAIN_INITS[cls]


def test_keyword_only_fields_are_refused_by_position_as_the_dataclass_refuses_them() -> None:
    assert _Order(id="o-1", total=5) == _Order(total=5, id="o-1")
    with pytest.raises(TypeError, match="positional argument"):
        _Order("o-1")  # type: ignore[call-arg]
    lease = _Lease(3, owner="w-1")
    assert (lease.shard, lease.epoch, lease.owner, lease.renewals) == (3, 0, "w-1", [])
    with pytest.raises(TypeError, match="positional argument"):
        _Lease(3, 1, "w-1")  # type: ignore[call-arg]


def test_a_field_left_out_of_init_is_refused() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Partial:
        x: int
        y: int = dataclasses.field(default=0, init=False)

    with pytest.raises(TypeError, match="does not support field 'y' of Partial"):
        fast_init(Partial)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, _Point(1, 2, ["a"])),
        ({"y": 5}, _Point(1, 5, ["a"])),
        ({"x": 0, "tags": []}, _Point(0, 2, [])),
    ],
    ids=["none", "one", "two"],
)
def test_replacer_copies_every_field_but_those_it_is_given(
    changes: dict[str, Any], expected: _Point
) -> None:
    replace = replacer(_Point)
    original = _Point(1, 2, ["a"])

    copy = replace(original, **changes)

    assert copy == expected == dataclasses.replace(original, **changes)
    assert copy is not original
    assert original == _Point(1, 2, ["a"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        copy.x = 3  # type: ignore[misc]


def test_replacer_refuses_an_unknown_field_and_a_class_with_post_init() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        replacer(_Point)(_Point(1), z=2)
    with pytest.raises(TypeError, match="__post_init__"):
        replacer(_Checked)
