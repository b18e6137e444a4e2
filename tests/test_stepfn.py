"""Step function shapes: cached, and never shared by functions whose shapes differ."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

import fusee
from fusee import _codec
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
