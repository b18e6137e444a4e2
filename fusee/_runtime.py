"""What `Ctx` needs from the run it belongs to: the `Runtime` protocol and operation types.

`fusee.context` (the API workflow code calls) and `fusee._driver` (the run
that implements it) both build on this module; the driver implements
`Runtime` and makes the run's `Ctx`, and the context never imports the
driver (as in Temporal's and Restate's SDKs).

The rule: a `Runtime` call never waits; everything that waits is a future
of the run's loop, resolved by a delivery.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from fusee._codec import decoder_for
from fusee._definitions import hints_of
from fusee.errors import PayloadError

if TYPE_CHECKING:
    from fusee._definitions import Retry, UpdateDef
    from fusee._loop import WorkflowLoop
    from fusee.errors import DeterminismError
    from fusee.machine import RunMachine
    from fusee.record import Record, Start

__all__ = ["CURRENT_UPDATE", "ContinueAsNew", "Handlers", "Runtime", "StepCall", "UpdateInfo"]


@dataclass(frozen=True, slots=True)
class UpdateInfo:
    """The update whose handler is running (``ctx.current_update()``).

    Example:
        >>> UpdateInfo("u-1", "bump").name
        'bump'
    """

    id: str
    """The update's id (the caller's ``id=``, or one the engine made)."""
    name: str
    """The update's name (what a dynamic handler was called for)."""


# Set in each update handler's own task: the handler, and whatever it awaits,
# sees its update; the run's main code sees None.
CURRENT_UPDATE: contextvars.ContextVar[UpdateInfo | None] = contextvars.ContextVar(
    "fusee_current_update", default=None
)


class ContinueAsNew(BaseException):
    """Raised by ``ctx.continue_as_new``: the run ends and a new one starts with ``input``.

    A BaseException so that ``except Exception`` in workflow code does not
    swallow it by accident.
    """

    def __init__(self, input: bytes) -> None:
        super().__init__("continue as new")
        self.input = input


@dataclass(slots=True, eq=False)
class StepCall:
    """A step (or async completion's token function) the host must run.

    Attributes:
        seq: The step's journal position.
        name: The step's name.
        fn: The callable: no argument, or one `fusee.StepCtx`.
        retry: The retry policy.
        timeout_s: Per-attempt timeout in seconds, or None.
        inline: A sync function runs on the engine's loop, not in a thread.
        read_only: It may run before the run's earlier records are durable.
        is_await: An async completion's token function (its result is not
            the step's result: the token's completion is).
        takes_ctx: The callable takes the `fusee.StepCtx`.
        is_async: The callable is a coroutine function.
        attempt: The attempt it starts at, in its retry budget.
        not_before_ms: When it may start (`fusee.record.PAUSED`: after a resume).
        declared: Its result type is declared (an annotation or ``result_type``).
        heartbeat_timeout_s: An attempt that does not heartbeat this long fails.
    """

    seq: int
    name: str
    fn: Callable[..., Any]
    retry: Retry
    timeout_s: float | None
    inline: bool
    read_only: bool
    is_await: bool
    takes_ctx: bool
    is_async: bool
    attempt: int
    not_before_ms: int
    declared: bool = True
    heartbeat_timeout_s: float | None = None


@dataclass(slots=True, eq=False)
class Handlers:
    """The query, update and signal handlers workflow code registered (``ctx.on_query``, ...)."""

    queries: dict[str, Callable[[Any], Any]] = field(default_factory=dict)
    updates: dict[str, tuple[UpdateDef[Any], Callable[[Any], Any], Callable[[Any], Any] | None]] = (
        field(default_factory=dict)
    )
    dynamic_query: Callable[[str, Any], Any] | None = None
    """``ctx.on_query(None, h)``: called ``h(name, arg)`` for a query no handler names."""
    dynamic_update: tuple[Callable[[str, Any], Any], Callable[[str, Any], Any] | None] | None = None
    """``ctx.on_update(None, h, validator)``: for an update no handler names."""
    signals: dict[str, tuple[Callable[[bytes], Any], Callable[[Any], Any]]] = field(
        default_factory=dict
    )
    """``ctx.on_signal(sig, h)``: the signal's decoder and ``h``, by name."""
    dynamic_signal: Callable[[str, Any], Any] | None = None
    """``ctx.on_signal(None, h)``: called ``h(name, payload)`` for a signal no one else takes."""

    def update_result_decoder(self, name: str) -> Callable[[bytes], Any] | None:
        """What update ``name``'s result decodes to: its `UpdateDef`'s ``result_type``, or
        else its handler's return annotation (None: plain values).

        Example:
            >>> from fusee._definitions import update
            >>> h = Handlers()
            >>> def bump(n: int) -> float:
            ...     return n / 2
            >>> h.updates["bump"] = (update("bump", int), bump, None)
            >>> h.update_result_decoder("bump")(update("x").encode(3))
            3.0
        """
        entry = self.updates.get(name)
        if entry is None:
            return None
        udef, handler, _ = entry
        if udef.result_type is not Any:
            return udef.decode_result
        hint = hints_of(handler).get("return", Any)
        if hint is Any:
            return None
        try:
            return decoder_for(hint, name=f"the result of update '{name}'")
        except PayloadError:
            return None  # an annotation that is no payload type: plain values


class Runtime(Protocol):
    """What a run's `fusee.Ctx` calls: its machine and loop, and the host's services.

    Each Ctx operation's whole sequence (begin on the machine, append the
    arm record, register the future, hand a step to the host) is written in
    `fusee.context` against this protocol.
    """

    @property
    def machine(self) -> RunMachine:
        """The run's journal machine."""
        ...

    @property
    def loop(self) -> WorkflowLoop:
        """The run's deterministic loop."""
        ...

    @property
    def start_record(self) -> Start:
        """The run's `Start` record."""
        ...

    @property
    def handlers(self) -> Handlers:
        """The run's query and update handlers."""
        ...

    @property
    def child_queues(self) -> dict[int, tuple[str, str | None]]:
        """The queue and key of each child started through a queue, by position."""
        ...

    @property
    def child_delays(self) -> dict[int, int]:
        """When each delayed child may start (Unix ms), by position."""
        ...

    @property
    def send_delays(self) -> dict[int, int]:
        """When each delayed send goes (Unix ms), by position."""
        ...

    def now_ms(self) -> int:
        """The host's wall clock (live values and deadlines only)."""
        ...

    def append(self, record: Record | None) -> None:
        """Appends a record the code's call produced (None: nothing to append)."""
        ...

    def register(
        self,
        seq: int,
        kind: str,
        name: str,
        decode: Callable[[bytes], Any] | None,
        extra: Any = None,
    ) -> asyncio.Future[Any]:
        """A future for operation ``seq``, resolved by its delivery."""
        ...

    def run_step(self, call: StepCall) -> None:
        """Hands a step (or a token function) to the host to run."""
        ...

    def timer_set(self, seq: int, fire_at_ms: int) -> None:
        """Operation ``seq`` is a timer at ``fire_at_ms`` (loop time moves there when it fires)."""
        ...

    def diverged_at_call(self, error: DeterminismError) -> DeterminismError:
        """A ctx call found the code off its journal: the run stops after the turn."""
        ...

    def wait_begun(self, name: str) -> None:
        """The code began a ``wait_for`` of signal ``name``: the dynamic handler leaves it alone."""
        ...

    def signal_handler_set(self, name: str | None) -> None:
        """A handler for ``name`` (None: the dynamic one) is set: it gets the signals it missed."""
        ...
