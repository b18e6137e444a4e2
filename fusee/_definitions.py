"""Workflow, signal, query and update definitions, and retry policies.

Definitions are plain values: there is no global registry, so two
definitions of one name (old and new code) may live in one process. An
engine knows the workflows it was given.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar, overload

from fusee._codec import decoder_for
from fusee._durations import parse_duration
from fusee.errors import PayloadError

__all__ = [
    "KnownSignals",
    "QueryDef",
    "Retry",
    "SignalDef",
    "UpdateDef",
    "WorkflowDef",
    "checked",
    "hints_of",
    "query",
    "signal",
    "update",
    "workflow",
]

I = TypeVar("I")  # noqa: E741 - the conventional name for an input type
R = TypeVar("R")
T = TypeVar("T")
# WorkflowDef's own: its input type is contravariant (a covariant one would
# let mypy widen it to ``object`` and accept any input in
# ``engine.start(wf, id, input)``), its result type covariant, so a list of
# different workflows is still a list of workflows.
I_contra = TypeVar("I_contra", contravariant=True)
R_co = TypeVar("R_co", covariant=True)
if TYPE_CHECKING:
    from typing_extensions import TypeVar as _TypeVarWithDefault

    # An update's result type defaults to Any: ``UpdateDef[int]`` reads as
    # ``UpdateDef[int, Any]`` (to type checkers; at run time name both).
    U = _TypeVarWithDefault("U", default=Any)
else:
    U = TypeVar("U")

Duration = str | int | float | timedelta


@dataclass(frozen=True, slots=True)
class Retry:
    """How a failing step is retried.

    A step that raises is retried after ``initial``, then after each delay
    times ``backoff``, capped at ``max_interval``, ``attempts`` times in all.
    When the attempts run out the step is paused (and so the run) until
    ``run.resume()``, or, with ``on_exhausted="fail"``, fails: the
    workflow's ``await`` raises `fusee.StepFailed`. Exceptions of the
    ``non_retryable`` types (and `fusee.Failure`) fail the step at once.

    Example:
        >>> r = Retry(attempts=3, initial="1s", backoff=2.0, max_interval="3s")
        >>> [r.delay_s(n) for n in (1, 2, 3)]
        [1.0, 2.0, 3.0]
    """

    attempts: int = 5
    initial: Duration = "1s"
    backoff: float = 2.0
    max_interval: Duration = "1m"
    non_retryable: tuple[type[BaseException], ...] = ()
    on_exhausted: Literal["pause", "fail"] = "pause"
    initial_s: float = field(init=False, repr=False, compare=False)
    max_interval_s: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if type(self.attempts) is not int or self.attempts < 1:
            raise ValueError(f"Retry(attempts={self.attempts!r}): attempts must be an int >= 1")
        if not isinstance(self.backoff, int | float) or self.backoff < 1:
            raise ValueError(f"Retry(backoff={self.backoff!r}): backoff must be a number >= 1")
        if self.on_exhausted not in ("pause", "fail"):
            raise ValueError(
                f"Retry(on_exhausted={self.on_exhausted!r}): on_exhausted is 'pause' or 'fail'"
            )
        for t in self.non_retryable:
            if not (isinstance(t, type) and issubclass(t, BaseException)):
                raise ValueError(f"Retry(non_retryable=...): {t!r} is not an exception type")
        object.__setattr__(self, "initial_s", parse_duration(self.initial))
        object.__setattr__(self, "max_interval_s", parse_duration(self.max_interval))

    def delay_s(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        return float(min(self.initial_s * self.backoff ** (attempt - 1), self.max_interval_s))


DEFAULT_RETRY: typing.Final = Retry()


@dataclass(frozen=True, slots=True)
class SignalDef(Generic[T]):
    """A signal a workflow can wait for: its name and payload type.

    Make one with `fusee.signal`.

    Example:
        >>> review = signal("review", bool)
        >>> (review.name, review.decode(review.encode(True)))
        ('review', True)
    """

    name: str
    type: Any = Any
    decode: Callable[[bytes], T] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_name("signal", self.name)
        object.__setattr__(self, "decode", decoder_for(self.type))

    @staticmethod
    def encode(value: object) -> bytes:
        """The payload's bytes (the codec's)."""
        from fusee._codec import encode

        return encode(value)

    def encode_checked(self, value: object) -> bytes:
        """The payload's bytes, once they are known to decode to the signal's type.

        Raises:
            fusee.PayloadError: ``value`` does not fit the type (nothing is sent).

        Example:
            >>> try:
            ...     signal("review", bool).encode_checked("yes")
            ... except PayloadError:
            ...     print("refused")
            refused
        """
        return checked(value, self.decode, f"the payload of signal '{self.name}'", self.type)


@dataclass(frozen=True, slots=True)
class QueryDef(Generic[R_co]):
    """A query a workflow answers: its name and its answer's type.

    Make one with `fusee.query`. ``run.query`` returns the handler's answer,
    decoded to ``result_type`` (plain values when it is ``Any``).

    Example:
        >>> status = query("status", dict[str, int])
        >>> (status.name, status.decode_result(status.encode({"done": 3})))
        ('status', {'done': 3})
    """

    name: str
    result_type: Any = Any
    decode_result: Callable[[bytes], R_co] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_name("query", self.name)
        object.__setattr__(self, "decode_result", decoder_for(self.result_type))

    @staticmethod
    def encode(value: object) -> bytes:
        """The bytes of an argument or an answer (the codec's)."""
        from fusee._codec import encode

        return encode(value)


@dataclass(frozen=True, slots=True)
class UpdateDef(Generic[T, U]):
    """An update a workflow accepts: its name, payload type and result type.

    Make one with `fusee.update`. ``run.update`` returns the handler's
    result, decoded to ``result_type``.

    Example:
        >>> bump = update("bump", int, int)
        >>> bump.decode(bump.encode(3))
        3
    """

    name: str
    type: Any = Any
    result_type: Any = Any
    decode: Callable[[bytes], T] = field(init=False, repr=False, compare=False)
    decode_result: Callable[[bytes], U] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_name("update", self.name)
        object.__setattr__(self, "decode", decoder_for(self.type))
        object.__setattr__(self, "decode_result", decoder_for(self.result_type))

    @staticmethod
    def encode(value: object) -> bytes:
        """The payload's bytes (the codec's)."""
        from fusee._codec import encode

        return encode(value)

    def encode_checked(self, value: object) -> bytes:
        """The payload's bytes, once they are known to decode to the update's type.

        Raises:
            fusee.PayloadError: ``value`` does not fit the type (nothing is sent).

        Example:
            >>> len(update("bump", int).encode_checked(3))
            1
        """
        return checked(value, self.decode, f"the payload of update '{self.name}'", self.type)


class KnownSignals:
    """The signal definitions a door knows, by name: payloads are checked against them.

    An engine learns those of the modules its workflows come from (each
    workflow function's module globals), and ``fusee worker`` those of the
    modules it imports too. Two definitions of one name that disagree on
    the payload's type leave that name unchecked: the wait's own type
    decides, inside the run.

    Example:
        >>> known = KnownSignals([{"review": signal("review", bool)}])
        >>> known.check("order-1", "review", SignalDef.encode(True))
        >>> try:
        ...     known.check("order-1", "review", SignalDef.encode("yes"))
        ... except PayloadError:
        ...     print("refused")
        refused
    """

    __slots__ = ("_by_name",)

    def __init__(self, namespaces: Iterable[Mapping[str, Any]] = ()) -> None:
        # None: definitions of that name disagree on the type.
        self._by_name: dict[str, SignalDef[Any] | None] = {}
        self.learn(namespaces)

    @classmethod
    def of_workflows(cls, workflows: Iterable[WorkflowDef[Any, Any]]) -> KnownSignals:
        """The signals defined at the top level of the workflows' own modules.

        Example:
            >>> KnownSignals.of_workflows([]).names()
            []
        """
        return cls(getattr(wf.fn, "__globals__", {}) for wf in workflows)

    def learn(self, namespaces: Iterable[Mapping[str, Any]]) -> None:
        """Adds the `SignalDef` values of ``namespaces`` (a module's ``vars()``)."""
        found = self._by_name
        for namespace in namespaces:
            for value in list(namespace.values()):
                if isinstance(value, SignalDef):
                    if value.name in found and found[value.name] != value:
                        found[value.name] = None
                    else:
                        found.setdefault(value.name, value)

    def names(self) -> list[str]:
        """The names known, sorted."""
        return sorted(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def check(self, run_id: str, name: str, payload: bytes) -> None:
        """Refuses ``payload`` for signal ``name`` to run ``run_id`` if it does not fit.

        Raises:
            fusee.PayloadError: The payload does not fit the known definition
                (a name not known, or known with disagreeing types, passes).
        """
        declared = self._by_name.get(name)
        if declared is None or declared.type is Any:
            return
        try:
            declared.decode(payload)
        except PayloadError as e:
            raise PayloadError(
                f"signal {name!r} to run {run_id!r} was not sent: its payload does not fit "
                f"the signal's type {_type_name(declared.type)}, so nothing was recorded; "
                f"send a {_type_name(declared.type)}: {e}"
            ) from None


def checked(value: object, decode: Callable[[bytes], Any], what: str, hint: object) -> bytes:
    """``value``'s bytes, once ``decode`` (to its declared type ``hint``) accepts them.

    The check is the decode the run will do, done at the door: a value that
    does not fit is refused before anything is recorded.

    Raises:
        fusee.PayloadError: The value cannot be encoded, or does not fit ``hint``.

    Example:
        >>> from fusee._codec import decoder_for
        >>> len(checked(3, decoder_for(int), "n", int))
        1
    """
    from fusee._codec import encode

    data = encode(value, name=what)
    try:
        decode(data)
    except PayloadError as e:
        raise PayloadError(
            f"{what} does not fit its declared type {_type_name(hint)}, "
            f"so nothing was recorded: {e}"
        ) from None
    return data


def _type_name(hint: object) -> str:
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__qualname__
    return repr(hint).replace("typing.", "")


def _check_name(what: str, name: object) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a {what} needs a non-empty name, got {name!r}")


@overload
def signal(name: str, type: type[T]) -> SignalDef[T]: ...
@overload
def signal(name: str, type: Any = ...) -> SignalDef[Any]: ...


def signal(name: str, type: Any = Any) -> SignalDef[Any]:
    """Defines a signal: ``ctx.wait_for(sig)`` in the workflow, ``run.signal(sig, x)`` outside.

    Args:
        name: The signal's name, as recorded in journals.
        type: The payload's type; payloads are checked against it when sent
            and decoded to it. A class gives a `SignalDef` of that type to
            mypy; other hints (``int | None``) give ``SignalDef[Any]``.

    Example:
        >>> review = signal("review", bool)
    """
    return SignalDef(name, type)


@overload
def query(name: str) -> QueryDef[Any]: ...
@overload
def query(name: str, result_type: type[R]) -> QueryDef[R]: ...
@overload
def query(name: str, result_type: Any) -> QueryDef[Any]: ...


def query(name: str, result_type: Any = Any) -> QueryDef[Any]:
    """Defines a query: ``ctx.on_query(q, handler)`` in the workflow, ``run.query(q)`` outside.

    Args:
        name: The query's name.
        result_type: The answer's type: ``run.query`` returns the handler's
            answer decoded to it (a pydantic model, a dataclass, ...). A
            class gives a `QueryDef` of that type to mypy; without it the
            answer comes back as plain values (dicts, lists, ...).

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class Progress:
        ...     done: int
        ...     total: int
        >>> progress = query("progress", Progress)
        >>> progress.decode_result(progress.encode(Progress(1, 3)))
        Progress(done=1, total=3)
    """
    return QueryDef(name, result_type)


@overload
def update(name: str, type: type[T], result_type: type[R]) -> UpdateDef[T, R]: ...
@overload
def update(name: str, type: type[T]) -> UpdateDef[T, Any]: ...
@overload
def update(name: str, type: Any = ..., result_type: Any = ...) -> UpdateDef[Any, Any]: ...


def update(name: str, type: Any = Any, result_type: Any = Any) -> UpdateDef[Any, Any]:
    """Defines an update: ``ctx.on_update(u, handler)`` in the workflow, ``run.update(u, x)``.

    Args:
        name: The update's name, as recorded in journals.
        type: The payload's type (checked when sent).
        result_type: The handler's result type: ``run.update`` returns it.

    Example:
        >>> bump = update("bump", int, int)
    """
    return UpdateDef(name, type, result_type)


@dataclass(frozen=True, slots=True, eq=False)
class WorkflowDef(Generic[I_contra, R_co]):
    """A workflow: its name and its ``async def`` function.

    Make one with `fusee.workflow`. Its input and result are encoded with
    the codec and decoded to the function's annotated types. ``versioning``
    says which engine version its runs run on (`VERSIONINGS`).

    Example:
        >>> @workflow("greet")
        ... async def greet(ctx: Ctx, name: str) -> str:
        ...     return f"hello {name}"
        >>> (greet.name, greet.input_type, greet.result_type)
        ('greet', <class 'str'>, <class 'str'>)
    """

    name: str
    fn: Callable[..., Coroutine[Any, Any, R_co]]
    input_type: Any
    result_type: Any
    takes_input: bool
    decode_input: Callable[[bytes], I_contra] = field(repr=False)
    decode_result: Callable[[bytes], R_co] = field(repr=False)
    on_error: str | None = None
    """What a bug in its code does to a run: ``"fail"``, ``"pause"`` (None: the engine's choice)."""
    versioning: Versioning = "pinned"

    def __repr__(self) -> str:
        return f"<workflow {self.name!r} ({self.fn.__module__}.{self.fn.__qualname__})>"

    @property
    def location(self) -> str:
        """``file:line`` where the workflow function is defined."""
        code = getattr(self.fn, "__code__", None)
        if code is None:
            return self.fn.__qualname__
        return f"{code.co_filename}:{code.co_firstlineno}"


WorkflowFn = Callable[..., Coroutine[Any, Any, Any]]

Versioning = Literal["pinned", "auto"]

VERSIONINGS: typing.Final = ("pinned", "auto")
"""Which engine version a workflow's runs run on (``@fusee.workflow(name, versioning=...)``):

- ``pinned`` (the default): the version they started on, to their end; an
  engine of another version leaves them to a worker of theirs;
- ``auto``: the engine's that loads them next, so a deploy moves them to the
  new code at their next load (the code must replay their journals: guard
  changes with ``ctx.patched``).
"""


def hints_of(fn: Callable[..., Any]) -> dict[str, Any]:
    """``fn``'s type hints, each resolved on its own.

    One annotation that does not resolve (a name imported only for type
    checking) leaves the others usable instead of losing them all.

    Example:
        >>> def f(ctx: "Missing", n: int) -> str: ...
        >>> hints_of(f)
        {'n': <class 'int'>, 'return': <class 'str'>}
    """
    try:
        return typing.get_type_hints(fn)
    except Exception:
        pass
    out: dict[str, Any] = {}
    target = inspect.unwrap(fn)
    namespace = getattr(target, "__globals__", {})
    for name, ann in getattr(target, "__annotations__", {}).items():
        try:
            # Twice at most: a quoted annotation under postponed evaluation
            # is a string of a string.
            for _ in range(2):
                if isinstance(ann, str):
                    ann = eval(ann, namespace)
        except Exception:
            continue
        if not isinstance(ann, str):
            out[name] = ann
    return out


ON_ERROR = ("fail", "pause")
"""What a bug in workflow code may do to its run (`workflow`'s ``on_error``)."""


def check_on_error(on_error: object, where: str) -> None:
    """Raises ValueError unless ``on_error`` is one of `ON_ERROR` (or None)."""
    if on_error is not None and on_error not in ON_ERROR:
        raise ValueError(
            f"{where} on_error must be 'fail' (the run fails) or 'pause' (the run waits "
            f"for a fix and run.resume()), not {on_error!r}"
        )


def _versioning(versioning: object) -> Versioning:
    if versioning not in VERSIONINGS:
        raise ValueError(f"versioning must be 'pinned' or 'auto', not {versioning!r}")
    return versioning


def _make_workflow(
    fn: WorkflowFn,
    name: str | None,
    on_error: str | None = None,
    versioning: Versioning = "pinned",
) -> WorkflowDef[Any, Any]:
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(
            f"@fusee.workflow needs an `async def` function, got {fn!r}; "
            "write `async def my_workflow(ctx: fusee.Ctx, input: T) -> R`"
        )
    params = list(inspect.signature(fn).parameters.values())
    if not 1 <= len(params) <= 2:
        raise TypeError(
            f"workflow function {fn.__qualname__} takes {len(params)} parameters; "
            "it takes the context and at most one input: `(ctx, input)`"
        )
    hints = hints_of(fn)
    input_type = hints.get(params[1].name, Any) if len(params) == 2 else type(None)
    result_type = hints.get("return", Any)
    return WorkflowDef(
        name=name or fn.__name__,
        fn=fn,
        input_type=input_type,
        result_type=result_type,
        takes_input=len(params) == 2,
        decode_input=decoder_for(input_type),
        decode_result=decoder_for(result_type),
        on_error=on_error,
        versioning=versioning,
    )


class WorkflowDecorator(Protocol):
    """What ``@fusee.workflow("name")`` returns: a decorator typed by the function it gets."""

    @overload
    def __call__(self, fn: Callable[[Any, I], Coroutine[Any, Any, R]], /) -> WorkflowDef[I, R]: ...
    @overload
    def __call__(self, fn: Callable[[Any], Coroutine[Any, Any, R]], /) -> WorkflowDef[None, R]: ...


# A function of (ctx, input) gives WorkflowDef[input's type, result type]; a
# function of ctx alone gives WorkflowDef[None, R] (it is started with no input).
@overload
def workflow(name: Callable[[Any, I], Coroutine[Any, Any, R]], /) -> WorkflowDef[I, R]: ...
@overload
def workflow(name: Callable[[Any], Coroutine[Any, Any, R]], /) -> WorkflowDef[None, R]: ...
@overload
def workflow(
    name: str | None = None,
    /,
    *,
    on_error: str | None = None,
    versioning: Versioning = "pinned",
) -> WorkflowDecorator: ...


def workflow(
    name: str | WorkflowFn | None = None,
    /,
    *,
    on_error: str | None = None,
    versioning: Versioning = "pinned",
) -> WorkflowDef[Any, Any] | WorkflowDecorator:
    """Makes an ``async def f(ctx, input)`` function a workflow.

    Use as ``@fusee.workflow("name")``, or bare ``@fusee.workflow`` to name
    it after the function.

    Args:
        name: The workflow's type name, as recorded in journals.
        on_error: What an exception escaping the code does when it is a bug
            (not `fusee.StepFailed`, `fusee.ChildFailed` or `fusee.Failure`):
            ``"fail"`` ends the run ``failed``; ``"pause"`` leaves it
            ``paused`` with the traceback until ``run.resume()`` replays it
            on the code deployed since. None: the engine's choice
            (``Engine.open(on_error=)``, "fail" by default).
        versioning: ``"pinned"`` (default): each run runs to its end on the
            engine version it started on; ``"auto"``: a run moves to the
            version of the engine that loads it next (`VERSIONINGS`).

    Returns:
        A `WorkflowDef` to pass to ``Engine.open(workflows=[...])`` and
        ``engine.start``.

    Example:
        >>> @workflow
        ... async def checkout(ctx: Ctx, order_id: str) -> str:
        ...     return order_id
        >>> checkout.name
        'checkout'
        >>> @workflow("quote", on_error="pause")
        ... async def quote(ctx: Ctx, sku: str) -> int:
        ...     return {"A1": 12}[sku]  # a KeyError pauses the run until a fix
        >>> quote.on_error
        'pause'
    """
    check_on_error(on_error, "@fusee.workflow's")
    how = _versioning(versioning)
    if callable(name):
        return _make_workflow(name, None, on_error, how)
    if name is not None:
        _check_name("workflow", name)

    def decorate(fn: WorkflowFn) -> WorkflowDef[Any, Any]:
        return _make_workflow(fn, name, on_error, how)

    return decorate
