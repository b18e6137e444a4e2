"""What a step function is: its shape (argument, sync or async, result type), cached.

`ctx.step` asks for a function's shape on every call, and a lambda written
once in a loop is a new function object each time: its shape is cached by
code object. A code object alone decides the shape only when nothing kept
on the function object can change it: functions with annotations, or
wrappers (``functools.wraps`` copies ``__wrapped__`` and the annotations of
the function they wrap, and every wrapper made by one decorator shares the
decorator's code object), are cached by the function object itself, weakly.

The rule: two function objects share a cache entry only when their shape
cannot differ.
"""

from __future__ import annotations

import inspect
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fusee import _codec
from fusee._definitions import hints_of
from fusee.errors import PayloadError

__all__ = [
    "StepShape",
    "code_deciding",
    "mark_returns_awaitable",
    "returns_awaitable",
    "shape_of",
    "takes_arg",
]


@dataclass(frozen=True, slots=True)
class StepShape:
    """How to call a step function and decode its result.

    Attributes:
        takes_ctx: It takes one argument, the `fusee.StepCtx`.
        is_async: It is a coroutine function.
        decode: Decodes its recorded result to its return annotation (or to
            the step's ``result_type``).
        declared: Its result type is declared (an annotation).
    """

    takes_ctx: bool
    is_async: bool
    decode: Callable[[bytes], Any]
    declared: bool


# A code object maps to its shape when it alone decides the shape, else to
# None (its functions are cached one by one). Which of the two is a property
# of the code: every function made from one `def` has annotations or has
# none, and every wrapper one decorator makes carries `__wrapped__`.
_BY_CODE: dict[object, StepShape | None] = {}
_BY_FUNCTION: weakref.WeakKeyDictionary[Callable[..., Any], StepShape] = weakref.WeakKeyDictionary()
_AWAITABLE_BY_CODE: set[object] = set()
_AWAITABLE_BY_FUNCTION: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()
_MISSING: Any = object()


def _is_plain(fn: Callable[..., Any]) -> bool:
    """Whether ``fn``'s code object alone decides its shape."""
    return not getattr(fn, "__annotations__", None) and not hasattr(fn, "__wrapped__")


def shape_of(fn: Callable[..., Any]) -> StepShape:
    """The shape of step function ``fn`` (cached).

    Raises:
        TypeError: ``fn`` is not callable, or takes more than one argument.

    Example:
        >>> shape_of(lambda s: s.key).takes_ctx
        True
    """
    code = getattr(fn, "__code__", None)
    shape = _BY_CODE.get(code, _MISSING) if code is not None else None
    if shape is None:
        shape = _lookup(fn)
    if shape is not None and shape is not _MISSING:
        return shape
    shape = _inspect(fn)
    if code is not None and _is_plain(fn):
        _BY_CODE[code] = shape
    else:
        if code is not None:
            _BY_CODE[code] = None
        _remember(fn, shape)
    return shape


def _inspect(fn: Callable[..., Any]) -> StepShape:
    if not callable(fn):
        raise TypeError(f"a step needs a callable, got {fn!r}")
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        params = []  # type: ignore[assignment]
    required = [
        p
        for p in params
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    if len(required) > 1:
        raise TypeError(
            f"step function {getattr(fn, '__qualname__', fn)!r} takes {len(required)} arguments; "
            "a step function takes none, or one: the fusee.StepCtx"
        )
    hints = hints_of(fn)
    hint = hints.get("return", Any)
    try:
        decode = _codec.decoder_for(hint)
    except PayloadError:
        # A return type the codec cannot convert to (an iterator, a plain
        # class): the result comes back as recorded.
        decode = _codec.decoder_for(Any)
    return StepShape(
        takes_ctx=bool(required),
        is_async=inspect.iscoroutinefunction(fn),
        decode=decode,
        declared="return" in hints,
    )


def _lookup(fn: Callable[..., Any]) -> StepShape | None:
    try:
        return _BY_FUNCTION.get(fn)
    except TypeError:  # not hashable or not weakly referable: not cached
        return None


def _remember(fn: Callable[..., Any], shape: StepShape) -> None:
    try:
        _BY_FUNCTION[fn] = shape
    except TypeError:
        return


def takes_arg(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes a required positional argument (a mock's `fusee.StepCtx`).

    Example:
        >>> takes_arg(lambda: 1), takes_arg(lambda s: 1)
        (False, True)
    """
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for p in params
    )


def returns_awaitable(fn: Callable[..., Any]) -> bool:
    """Whether sync callable ``fn`` was seen to return an awaitable.

    Such a callable (a lambda around an async call) only builds a coroutine
    when called, so it runs on the loop, with no thread hop.

    Example:
        >>> returns_awaitable(lambda: 1)
        False
    """
    if getattr(fn, "__code__", None) in _AWAITABLE_BY_CODE:
        return True
    try:
        return fn in _AWAITABLE_BY_FUNCTION
    except TypeError:
        return False


def code_deciding(fn: Callable[..., Any]) -> types.CodeType | None:
    """``fn``'s code object if it alone decides whether ``fn`` returns an awaitable, else None.

    Then every function of that code is known once one of them is
    (`mark_returns_awaitable`): the lambdas a workflow makes per run share it.

    Example:
        >>> code_deciding(lambda: 1) is not None
        True
    """
    code = getattr(fn, "__code__", None)
    return code if code is not None and _is_plain(fn) else None


def mark_returns_awaitable(fn: Callable[..., Any]) -> None:
    """Records that sync callable ``fn`` returns an awaitable (`returns_awaitable`)."""
    code = code_deciding(fn)
    if code is not None:
        _AWAITABLE_BY_CODE.add(code)
        return
    try:
        _AWAITABLE_BY_FUNCTION.add(fn)
    except TypeError:
        return
