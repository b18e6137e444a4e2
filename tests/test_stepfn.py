"""Step function shapes: cached, and never shared by functions whose shapes differ."""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import pydantic
import pytest

import fusee
from fusee import _codec, _stepfn
from fusee._stepfn import code_deciding, mark_returns_awaitable, returns_awaitable, shape_of
from fusee.testing import crash_everywhere

F = TypeVar("F", bound=Callable[..., Any])


@dataclasses.dataclass(frozen=True)
class Quote:
    total: int


def logged(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


@logged
def keyed(s: fusee.StepCtx) -> str:
    return s.key


@logged
def quote() -> Quote:
    return Quote(3)


@logged
def plain() -> int:
    return 1


def test_two_wrappers_of_one_decorator_keep_their_own_shapes() -> None:
    assert keyed.__code__ is quote.__code__  # the premise: one code object
    assert shape_of(keyed).takes_ctx
    assert not shape_of(quote).takes_ctx
    assert shape_of(quote).decode(_codec.encode(Quote(3))) == Quote(3)
    assert shape_of(plain).decode(_codec.encode(1)) == 1


def test_lambdas_written_once_share_one_shape() -> None:
    makers = [lambda i=i: i for i in range(3)]
    assert shape_of(makers[0]) is shape_of(makers[2])


def test_a_wrapper_seen_returning_an_awaitable_does_not_mark_its_siblings() -> None:
    @logged
    def first() -> int:
        return 1

    @logged
    def second() -> int:
        return 2

    mark_returns_awaitable(first)
    assert returns_awaitable(first)
    assert not returns_awaitable(second)


def _annotated() -> int:
    return 1


@pytest.mark.parametrize(
    ("fn", "by_code"),
    [
        pytest.param(lambda: 1, True, id="lambda"),
        pytest.param(_annotated, False, id="annotated"),
        pytest.param(logged(lambda: 1), False, id="wrapper"),
        pytest.param(functools.partial(int, "1"), False, id="partial"),
    ],
)
def test_the_code_decides_a_plain_function_only(fn: Callable[..., Any], by_code: bool) -> None:
    assert (code_deciding(fn) is not None) is by_code


def test_a_callable_that_is_not_a_function_has_a_shape_too() -> None:
    class Step:
        def __call__(self, s: fusee.StepCtx) -> int:
            return 1

    assert shape_of(Step()).takes_ctx
    with pytest.raises(TypeError, match="a step needs a callable"):
        shape_of(42)  # type: ignore[arg-type]


@fusee.workflow("decorated-steps")
async def decorated(ctx: fusee.Ctx) -> tuple[str, int]:
    key = await ctx.step("keyed", keyed)
    q = await ctx.step("quote", quote)
    return key, q.total


@pytest.mark.asyncio
async def test_two_decorated_steps_run_with_their_own_shapes_after_a_crash_too() -> None:
    key, total = await crash_everywhere(decorated)
    assert key.endswith("/0")
    assert total == 3


# --- result types through wrappers ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Tracking:
    number: str


class Parcel(pydantic.BaseModel):
    weight_g: int


class Shipping:
    def label(self, shipment: str) -> Tracking:
        return Tracking(shipment)

    async def label_async(self, shipment: str) -> Tracking:
        return Tracking(shipment)

    def parcels(self) -> list[Parcel]:
        return [Parcel(weight_g=1)]

    def by_sku(self) -> dict[str, Tracking]:
        return {"a": Tracking("1")}

    def untyped(self):  # type: ignore[no-untyped-def]
        return Tracking("1")


class Labeler:
    """A callable object: its ``__call__`` declares the result."""

    def __call__(self, shipment: str) -> Tracking:
        return Tracking(shipment)


class AsyncLabeler:
    async def __call__(self) -> Parcel:
        return Parcel(weight_g=2)


def label(shipment: str, carrier: str = "post") -> Tracking:
    return Tracking(f"{carrier}:{shipment}")


async def label_async(shipment: str) -> Tracking:
    return Tracking(shipment)


shipping = Shipping()

THROUGH = [
    pytest.param(functools.partial(label, "s-1"), Tracking("x"), False, id="partial"),
    pytest.param(
        functools.partial(functools.partial(label, "s-1"), carrier="ups"),
        Tracking("x"),
        False,
        id="nested-partial",
    ),
    pytest.param(functools.partial(label_async, "s-1"), Tracking("x"), True, id="async-partial"),
    pytest.param(functools.partial(shipping.label, "s"), Tracking("x"), False, id="partial-method"),
    pytest.param(
        functools.partial(shipping.label_async, "s"), Tracking("x"), True, id="partial-async-method"
    ),
    pytest.param(shipping.parcels, [Parcel(weight_g=1)], False, id="method-list-of-models"),
    pytest.param(shipping.by_sku, {"a": Tracking("1")}, False, id="method-dict-of-dataclasses"),
    pytest.param(logged(functools.partial(label, "s-1")), Tracking("x"), False, id="wraps-partial"),
    pytest.param(functools.partial(Labeler(), "s-1"), Tracking("x"), False, id="partial-object"),
    pytest.param(AsyncLabeler(), Parcel(weight_g=2), True, id="async-object"),
    pytest.param(
        functools.partial(functools.lru_cache(label), "s-1"), Tracking("x"), False, id="lru-cache"
    ),
]


@pytest.mark.parametrize(("fn", "value", "is_async"), THROUGH)
def test_a_result_type_is_read_through_wrappers(fn: Any, value: Any, is_async: bool) -> None:
    shape = shape_of(fn)
    assert shape.declared
    assert not shape.takes_ctx
    assert shape.is_async is is_async
    assert shape.decode(_codec.encode(value)) == value


def test_a_function_with_no_return_type_declares_none_through_a_partial() -> None:
    shape = shape_of(functools.partial(shipping.untyped))
    assert not shape.declared
    assert shape.decode(_codec.encode(Tracking("1"))) == {"number": "1"}


def test_a_bound_method_and_its_function_keep_their_own_shapes() -> None:
    class Plain:
        def run(self):  # type: ignore[no-untyped-def]
            return 1

    # Both orders: the method's function shares its code object with it.
    assert shape_of(Plain.run).takes_ctx  # self
    assert not shape_of(Plain().run).takes_ctx
    assert shape_of(Plain.run).takes_ctx


def _closure_returning(t: Any) -> Callable[[], Any]:
    def make() -> Any:
        return None

    # What `def make() -> t` makes when annotations are evaluated at definition.
    make.__annotations__ = {"return": t}
    return make


def test_two_closures_of_one_code_with_other_annotations_keep_their_decoders() -> None:
    as_tracking, as_parcel = _closure_returning(Tracking), _closure_returning(Parcel)
    assert as_tracking.__code__ is as_parcel.__code__  # the premise: one code object
    assert shape_of(as_tracking).decode(_codec.encode(Tracking("1"))) == Tracking("1")
    assert shape_of(as_parcel).decode(_codec.encode(Parcel(weight_g=3))) == Parcel(weight_g=3)
    assert shape_of(_closure_returning(Tracking)) is shape_of(as_tracking)


# --- one shape per function -----------------------------------------------------------------------


def _fresh_callables(kind: str, n: int) -> list[Callable[..., Any]]:
    def annotated_closure(i: int) -> Callable[[], Tracking]:
        def make() -> Tracking:
            return Tracking(str(i))

        return make

    made: dict[str, Callable[[int], Callable[..., Any]]] = {
        "partial": lambda i: functools.partial(label, str(i)),
        "nested-partial": lambda i: functools.partial(functools.partial(label, str(i)), "ups"),
        "bound-method": lambda i: Shipping().parcels,
        "partial-of-method": lambda i: functools.partial(Shipping().label, str(i)),
        "annotated-closure": annotated_closure,
        "callable-object": lambda i: functools.partial(Labeler(), str(i)),
        "wrapper": lambda i: logged(functools.partial(label, str(i))),
    }
    return [made[kind](i) for i in range(n)]


@pytest.mark.parametrize(
    "kind",
    [
        "partial",
        "nested-partial",
        "bound-method",
        "partial-of-method",
        "annotated-closure",
        "callable-object",
        "wrapper",
    ],
)
def test_a_thousand_fresh_callables_of_one_function_are_inspected_once(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    inspected: list[object] = []
    hinted: list[object] = []
    real_inspect, real_hints = _stepfn._inspect, typing.get_type_hints

    def counting_inspect(fn: Any) -> _stepfn.StepShape:
        inspected.append(fn)
        return real_inspect(fn)

    def counting_hints(obj: Any, *args: Any, **kw: Any) -> dict[str, Any]:
        hinted.append(obj)
        return real_hints(obj, *args, **kw)

    fns = _fresh_callables(kind, 1_000)
    monkeypatch.setattr(_stepfn, "_inspect", counting_inspect)
    monkeypatch.setattr(typing, "get_type_hints", counting_hints)
    shapes = {id(shape_of(fn)) for fn in fns}
    assert len(shapes) == 1
    assert len(inspected) <= 1
    assert len(hinted) <= 1
    (shape,) = {shape_of(fn) for fn in fns}
    assert shape.declared
