"""Run handles and what they tell: `Run`, `RunInfo`, `IdPolicy`, and a run's status.

The rule: a run's status is decided by `status_of` alone; describe, list,
the CLI and the UI show what it decides.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, overload

from fusee import _codec
from fusee._definitions import WorkflowDef
from fusee._durations import parse_duration
from fusee._events import event_key
from fusee._status import RunStatus
from fusee.remote._info import KEEP_INPUT, RunInfo, check_id, dedup_key, row_info

if TYPE_CHECKING:
    from fusee._definitions import QueryDef, SignalDef, UpdateDef
    from fusee._events import EventDef
    from fusee.engine._state import RunState
    from fusee.store import RunRow

__all__ = [
    "KEEP_INPUT",
    "IdPolicy",
    "Run",
    "RunInfo",
    "RunOperations",
    "check_id",
    "check_workflow",
    "dedup_key",
    "info_of",
    "status_of",
]

T = TypeVar("T")
P = TypeVar("P")  # a signal's or update's payload type
R = TypeVar("R")  # an update's result type


class IdPolicy(enum.Enum):
    """What `Engine.start` does when the id is taken.

    - ``REJECT`` (default): raise `fusee.AlreadyExists`.
    - ``ATTACH``: return the existing run's handle.
    - ``REPLACE``: a finished run's id may start a new run; a running one
      is still rejected.

    Example:
        >>> IdPolicy.ATTACH.name
        'ATTACH'
    """

    REJECT = "reject"
    ATTACH = "attach"
    REPLACE = "replace"


class RunOperations(Protocol):
    """What a `Run` handle asks of its engine (the engine, or the test host)."""

    async def _result(self, id: str) -> Any: ...
    async def _signal(
        self, id: str, name: str, payload: bytes, dedup: int, by: bytes | None
    ) -> None: ...
    async def _query(self, id: str, name: str, arg: bytes) -> Any: ...
    async def _update(self, id: str, name: str, update_id: str | None, payload: bytes) -> Any: ...
    async def _cancel(self, id: str, reason: str) -> None: ...
    async def _resume(self, id: str) -> None: ...
    async def _delete(self, id: str) -> None: ...
    async def _start_now(self, id: str) -> None: ...
    def _stream(self, id: str, name: str) -> AsyncIterator[Any]: ...
    async def _get_event(self, id: str, key: EventDef[Any], timeout_s: float | None) -> Any: ...
    async def _describe(self, id: str) -> RunInfo: ...
    async def _fork(self, id: str, new_id: str, at: int | str, input: bytes | None) -> None: ...


def check_workflow(workflow: object) -> WorkflowDef[Any, Any] | str:
    """``workflow`` if it is a `fusee.WorkflowDef` or a workflow's name.

    Raises:
        TypeError: It is anything else (an undecorated function, say).

    Example:
        >>> check_workflow("checkout")
        'checkout'
    """
    if isinstance(workflow, WorkflowDef | str):
        return workflow
    name = getattr(workflow, "__qualname__", None)
    what = f"function {name}" if callable(workflow) and name else repr(workflow)
    raise TypeError(
        f"expected a workflow, got {what}; decorate the `async def` with @fusee.workflow "
        "(or pass the workflow's name)"
    )


class Run(Generic[T]):
    """A handle on a run, by its id: valid across crashes, restarts and continue-as-new.

    Get one from `Engine.start` or `Engine.get`.

    Example:
        >>> async def main(engine: Engine) -> None:
        ...     run = engine.get("order-1")
        ...     print(await run.result())
    """

    __slots__ = ("_engine", "id")

    def __init__(self, engine: RunOperations, id: str) -> None:
        self._engine = engine
        self.id = id

    def __repr__(self) -> str:
        return f"<Run {self.id!r}>"

    async def result(self) -> T:
        """Waits for the run to end and returns its result (following continue-as-new).

        Raises:
            fusee.WorkflowFailed: The workflow raised.
            fusee.Cancelled: The run was cancelled.
            fusee.DeterminismError: The run's code diverged from its journal.
            fusee.NotFound: No run has this id.
        """
        return await self._engine._result(self.id)  # type: ignore[no-any-return]

    @overload
    async def signal(
        self, signal: SignalDef[None], payload: None = None, *, dedup: str | None = None
    ) -> None: ...
    @overload
    async def signal(
        self, signal: SignalDef[P], payload: P, *, dedup: str | None = None
    ) -> None: ...

    async def signal(
        self, signal: SignalDef[Any], payload: Any = None, *, dedup: str | None = None
    ) -> None:
        """Sends ``signal`` to the run; returns once the signal is durable.

        Args:
            signal: The signal definition.
            payload: Its payload, of the signal's type.
            dedup: An id: a second signal with the same id is ignored.

        Raises:
            fusee.PayloadError: ``payload`` does not fit the signal's type
                (nothing is recorded).
            fusee.NotFound: No run has this id.
            fusee.FuseeError: The run has finished.
        """
        data = signal.encode_checked(payload)
        await self._engine._signal(self.id, signal.name, data, dedup_key(dedup), None)

    async def query(self, query: QueryDef[R], arg: Any = None) -> R:
        """Asks the run's query handler; works on parked and finished runs too.

        The answer is decoded to the query's ``result_type`` (plain values
        without one).

        Raises:
            fusee.QueryFailed: The handler raised, or the run has none.
            fusee.PayloadError: The answer does not fit ``result_type``.

        Example:
            >>> import fusee
            >>> status = fusee.query("status", dict[str, int])
            >>> async def main(run: Run[None]) -> dict[str, int]:
            ...     return await run.query(status)
        """
        answer = await self._engine._query(self.id, query.name, _codec.encode(arg))
        if query.result_type is Any:
            return answer  # type: ignore[no-any-return]
        return query.decode_result(
            _codec.encode(answer, name=f"the answer to query '{query.name}'")
        )

    @overload
    async def update(
        self, update: UpdateDef[None, R], payload: None = None, *, id: str | None = None
    ) -> R: ...
    @overload
    async def update(self, update: UpdateDef[P, R], payload: P, *, id: str | None = None) -> R: ...

    async def update(
        self, update: UpdateDef[Any, Any], payload: Any = None, *, id: str | None = None
    ) -> Any:
        """Sends an update; returns the handler's result once it is durable.

        The result is decoded to the update's ``result_type``; without one,
        through an engine, to the handler's return annotation (a `Client`,
        which has no workflow code, returns plain values then).

        Raises:
            fusee.PayloadError: ``payload`` does not fit the update's type
                (nothing is recorded).
            fusee.FuseeError: The validator rejected it or the handler raised.
        """
        if id is not None:
            check_id(id, "an update")
        data = update.encode_checked(payload)
        result = await self._engine._update(self.id, update.name, id, data)
        if update.result_type is Any:
            return result
        return update.decode_result(
            _codec.encode(result, name=f"the result of update '{update.name}'")
        )

    async def cancel(self, reason: str = "cancelled") -> None:
        """Cancels the run: every pending operation raises `fusee.Cancelled` in the code."""
        await self._engine._cancel(self.id, reason)

    async def resume(self) -> None:
        """Resumes the run's paused steps, each with a fresh retry budget.

        A run paused by a bug in its code (``on_error="pause"``) is replayed
        from its journal on the engine's current code: deploy the fix, then
        resume it.

        Example:
            >>> async def main(engine: Engine) -> None:
            ...     await engine.get("order-1").resume()
        """
        await self._engine._resume(self.id)

    async def delete(self) -> None:
        """Deletes the finished run from the store: its journal, row, events and streams.

        Its id may then start again (under its `IdPolicy`, as if it never
        ran). A run that has not finished is refused: cancel it first.

        Raises:
            fusee.NotFound: No run has this id.
            fusee.RunNotFinished: The run has not finished.

        Example:
            >>> async def main(engine: Engine) -> None:
            ...     await engine.get("order-1").delete()
        """
        await self._engine._delete(self.id)

    async def start_now(self) -> None:
        """Starts a delayed run (``start(..., delay=)``) now instead of at its time.

        A run no longer queued (started, or ended) is left as it is; a run
        queued on a `fusee.Queue` is admitted as soon as the queue's limits allow.

        Raises:
            fusee.NotFound: No run has this id.

        Example:
            >>> async def main(engine: Engine) -> None:
            ...     run = await engine.start("report", "r-1", delay="1h")
            ...     await run.start_now()
        """
        await self._engine._start_now(self.id)

    def stream(self, name: str) -> AsyncIterator[Any]:
        """Reads stream ``name`` from its start, live, until it ends."""
        return self._engine._stream(self.id, name)

    @overload
    async def get_event(self, key: EventDef[P], *, timeout: Any = None) -> P: ...
    @overload
    async def get_event(self, key: str, *, timeout: Any = None) -> Any: ...

    async def get_event(self, key: str | EventDef[Any], *, timeout: Any = None) -> Any:
        """The run's latest value of event ``key`` (``ctx.set_event``), waiting until it is set.

        Args:
            key: The event's key: a string, or a `fusee.event` (its value
                decodes to its type).
            timeout: How long to wait (a duration: ``"30s"``, seconds, a
                ``timedelta``); None waits as long as the run may set it.

        Raises:
            TimeoutError: The timeout passed first, or the run ended without
                setting the key (raised at once: it never will).
            fusee.NotFound: No run has this id.

        Example:
            >>> async def main(engine: Engine) -> None:
            ...     pct = await engine.get("report-1").get_event("progress", timeout="30s")
        """
        k = event_key(key)
        timeout_s = None if timeout is None else parse_duration(timeout)
        return await self._engine._get_event(self.id, k, timeout_s)

    async def describe(self) -> RunInfo:
        """The run's status, times, attributes and paused steps."""
        return await self._engine._describe(self.id)

    async def fork(self, new_id: str, *, at: int | str, input: Any = KEEP_INPUT) -> Run[T]:
        """Starts run ``new_id`` from a copy of this run's journal before position ``at``.

        The steps before ``at`` do not run again: their results are copied.
        The new run goes on live from there; this run is not changed.

        Args:
            new_id: The new run's id (no run may have it).
            at: A 0-based operation number, as ``fusee show`` prints it, or
                a step name (its first position).
            input: The new run's input; by default this run's.

        Returns:
            The new run's handle, once its journal is durable.

        Raises:
            ValueError: ``at`` is not a position of this run (negative, past
                its end, an unknown name), or ``new_id`` is not a valid id.
            fusee.NotFound: No run has this id.
            fusee.AlreadyExists: A run has id ``new_id``.
            fusee.PayloadError: ``input`` does not fit the workflow's input type.

        Example:
            >>> async def main(engine: Engine) -> None:
            ...     retry = await engine.get("order-1").fork("order-1-again", at="charge")
        """
        check_id(new_id, "a fork")
        data = (
            None
            if input is KEEP_INPUT
            else _codec.encode(input, name=f"the input of run '{new_id}'")
        )
        await self._engine._fork(self.id, new_id, at, data)
        return Run(self._engine, new_id)


def status_of(row: RunRow, state: RunState | None, diverged: bool) -> RunStatus:
    """A run's status: from its loaded state when there is one, else from its row.

    Example:
        >>> from fusee.store import RunRow
        >>> status_of(RunRow("a", 1, "wf", "suspended", 0), None, False)
        <RunStatus.SUSPENDED: 'suspended'>
    """
    if diverged:
        return RunStatus.DIVERGED
    if state is not None and state.run == row.run and state.driver.end is None:
        m = state.driver.machine
        if m.is_paused() or state.driver.bug is not None:
            return RunStatus.PAUSED
        return RunStatus.SUSPENDED if m.is_suspended() else RunStatus.RUNNING
    return RunStatus(row.status)


def info_of(row: RunRow, state: RunState | None, error: BaseException | None) -> RunInfo:
    """What `Run.describe` tells of a run with ``row``, its loaded state and its divergence."""
    paused: tuple[str, ...] = ()
    # A run loaded elsewhere, or parked: its row's error (a bug that paused it).
    bug: str | None = row.error
    if state is not None and state.run == row.run:
        bug = state.driver.bug
        m = state.driver.machine
        paused = tuple(
            sorted({m.pending_name(s) or "" for s in range(m.next_seq()) if m.step_paused(s)})
        )
    return row_info(row, status_of(row, state, error is not None), paused, error or bug)
