"""What a step function is: its shape (argument, sync or async, result type), cached.

`ctx.step` asks for a function's shape on every call, and the callable is
often new each time: a lambda written once in a loop, a
``functools.partial``, a bound method, a closure. Inspecting a signature and
resolving type hints costs far more than a step's own bookkeeping, so the
shape is computed once per *underlying function* and found again by a key
made of what decides it:

- a plain function (no annotations, not a wrapper): its code object;
- an annotated function (a closure): its code, its annotations and its
  globals (where string annotations resolve);
- a ``functools.wraps`` wrapper: its own key and the key of what it wraps;
- a bound method: the key of its ``__func__`` (``self`` is not part of it);
- a ``functools.partial``: the key of its ``func``, how many positional
  arguments it binds and which keywords;
- an instance of a class with a ``__call__``: its class.

A callable none of these describe (a builtin, a class) is cached by the
object itself, weakly. The rule: two callables share a shape only when
their shapes cannot differ.
"""

from __future__ import annotations

import functools
import inspect
import types
import weakref
from collections.abc import Callable, Hashable
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
        is_async: Calling it makes a coroutine (an ``async def``, also
            through a partial, a bound method or a class's ``__call__``).
        decode: Decodes its recorded result to its return annotation (or to
            the step's ``result_type``).
        declared: Its result type is declared (an annotation).
    """

    takes_ctx: bool
    is_async: bool
    decode: Callable[[bytes], Any]
    declared: bool


# By code object: the shape of each function whose code alone decides it
# (no annotations, not a wrapper), or an annotated code's first `_Annotated`.
# Which functions these are is a property of the code: every function made
# from one `def` has annotations or has none, and every wrapper one
# decorator makes carries `__wrapped__`.
_BY_CODE: dict[types.CodeType, StepShape | _Annotated] = {}
# Shapes by `_key`. Kept for the process's life, as the code objects in
# the keys are.
_BY_KEY: dict[Hashable, StepShape] = {}
_BY_FUNCTION: weakref.WeakKeyDictionary[Callable[..., Any], StepShape] = weakref.WeakKeyDictionary()
_AWAITABLE_BY_CODE: set[object] = set()
_AWAITABLE_BY_FUNCTION: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()
# How deep `_key` and `_result_hints` follow wrappers and partials.
_DEPTH = 32


class _Annotated:
    """An annotated function's code, annotations and globals, as a key part (by identity).

    One is made per distinct (code, annotations, globals), in `_TOKENS`.
    The first one of each code is also in `_BY_CODE`, with its shape once
    known: a function called again, or a closure made again with equal
    annotations, finds it with one comparison instead of hashing its
    annotations.
    """

    __slots__ = ("annotations", "globals", "shape")

    def __init__(self, annotations: dict[str, Any], globals: dict[str, Any]) -> None:
        self.annotations = annotations
        # Held: `_TOKENS`'s key names the globals by id, which stays theirs.
        self.globals = globals
        # Set when the shape of the function itself (not a wrapper's) is known.
        self.shape: StepShape | None = None

    def holds(self, fn: types.FunctionType) -> bool:
        ann = fn.__annotations__
        return fn.__globals__ is self.globals and (
            ann is self.annotations or ann == self.annotations
        )


_TOKENS: dict[Hashable, _Annotated] = {}


def _is_plain(fn: Callable[..., Any]) -> bool:
    """Whether ``fn``'s code object alone decides its shape."""
    return not getattr(fn, "__annotations__", None) and not hasattr(fn, "__wrapped__")


def shape_of(fn: Callable[..., Any]) -> StepShape:
    """The shape of step function ``fn`` (cached per underlying function).

    Raises:
        TypeError: ``fn`` is not callable, or takes more than one argument.

    Example:
        >>> shape_of(lambda s: s.key).takes_ctx
        True
    """
    # Only a function: a bound method has its function's __code__ too, but
    # not its shape.
    if type(fn) is types.FunctionType:
        known = _BY_CODE.get(fn.__code__)
        if known is not None:
            if isinstance(known, StepShape):
                return known
            shape = known.shape
            if shape is not None:
                ann = fn.__annotations__
                if fn.__globals__ is known.globals and (
                    ann is known.annotations or ann == known.annotations
                ):
                    return shape
    key = _key(fn, _DEPTH)
    if key is not None:
        shape = _BY_KEY.get(key)
        if shape is None:
            shape = _BY_KEY[key] = _inspect(fn)
            if type(key) is types.CodeType:
                _BY_CODE[key] = shape
            elif isinstance(key, _Annotated):
                key.shape = shape
        return shape
    shape = _lookup(fn)
    if shape is None:
        shape = _inspect(fn)
        _remember(fn, shape)
    return shape


def _key(fn: Any, depth: int) -> Hashable | None:
    """What decides ``fn``'s shape, as a hashable key; None if nothing short of ``fn`` does."""
    if depth == 0:
        return None
    cls = type(fn)
    if cls is types.FunctionType:
        return _function_key(fn, depth)
    if cls is types.MethodType:
        inner = _key(fn.__func__, depth - 1)
        return None if inner is None else ("method", inner)
    if isinstance(fn, functools.partial):
        inner = _key(fn.func, depth - 1)
        return None if inner is None else ("partial", inner, len(fn.args), tuple(fn.keywords))
    if cls is types.BuiltinFunctionType:
        owner = fn.__self__
        # A module's function lives as long as its module; a method of an
        # object would keep (and hash) the object.
        return fn if owner is None or isinstance(owner, types.ModuleType) else None
    if hasattr(fn, "__wrapped__"):
        # A wrapper object (functools.lru_cache): by its class, what it
        # wraps and the annotations it copied.
        inner = _key(fn.__wrapped__, depth - 1)
        try:
            own = (cls, tuple(getattr(fn, "__annotations__", {}).items()))
            hash(own)
        except TypeError:
            return None
        return None if inner is None else ("wraps", own, inner)
    if isinstance(_call_of(fn), types.FunctionType):
        return ("call", cls)
    return None


def _function_key(fn: types.FunctionType, depth: int) -> Hashable | None:
    """A function's key: its code, with its annotations and globals if it has annotations.

    A wrapper's key holds the key of what it wraps too.
    """
    code = fn.__code__
    ann = fn.__annotations__
    own: Hashable = code
    if ann:
        token = _BY_CODE.get(code)
        if not isinstance(token, _Annotated) or not token.holds(fn):
            try:
                key = (code, tuple(ann.items()), id(fn.__globals__))
                token = _TOKENS.get(key)
            except TypeError:  # an annotation that is not hashable
                return None
            if token is None:
                token = _TOKENS[key] = _Annotated(ann, fn.__globals__)
            _BY_CODE.setdefault(code, token)
        own = token
    wrapped = fn.__dict__.get("__wrapped__")
    if wrapped is None:
        return own
    inner = _key(wrapped, depth - 1)
    return None if inner is None else ("wraps", own, inner)


def _call_of(fn: object) -> object:
    """The ``__call__`` of ``fn``'s class if ``fn`` is an instance of a Python class, else None."""
    if isinstance(fn, type):
        return None
    return getattr(type(fn), "__call__", None)  # noqa: B004 (the method itself, not callable())


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
    hints = _result_hints(fn)
    hint = hints.get("return", Any)
    try:
        decode = _codec.decoder_for(hint)
    except PayloadError:
        # A return type the codec cannot convert to (an iterator, a plain
        # class): the result comes back as recorded.
        decode = _codec.decoder_for(Any)
    return StepShape(
        takes_ctx=bool(required),
        is_async=_is_async(fn),
        decode=decode,
        declared="return" in hints,
    )


def _result_hints(fn: Any) -> dict[str, Any]:
    """The type hints that declare what calling ``fn`` returns.

    Through partials (to their ``func``), callable objects (to their
    ``__call__``) and wrappers that declare no return type of their own (to
    what they wrap).
    """
    for _ in range(_DEPTH):
        if isinstance(fn, functools.partial):
            fn = fn.func
            continue
        if isinstance(_call_of(fn), types.FunctionType) and not hasattr(fn, "__wrapped__"):
            fn = fn.__call__
            continue
        hints = hints_of(fn)
        wrapped = getattr(fn, "__wrapped__", None)
        if "return" in hints or wrapped is None:
            return hints
        fn = wrapped
    return {}


def _is_async(fn: Any) -> bool:
    """Whether calling ``fn`` makes a coroutine (a class's ``async def __call__`` too)."""
    if inspect.iscoroutinefunction(fn):
        return True
    for _ in range(_DEPTH):
        if not isinstance(fn, functools.partial):
            break
        fn = fn.func
    call = _call_of(fn)
    return isinstance(call, types.FunctionType) and inspect.iscoroutinefunction(call)


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
