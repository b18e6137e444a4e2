"""The API workflow and step code calls: `Ctx` and `StepCtx`.

Every `Ctx` operation that waits (``step``, ``sleep``, ``wait_for``,
``child``, ``await_completion``) takes the next journal position when it is
*called*, not when it is awaited, and returns a future of the run's loop.
Values that differ from one run to the next (``now``, ``random``, ``uuid4``)
are recorded and replayed.

The rule: workflow code reaches the outside world only through these calls;
anything else it does must give the same result every time it runs.
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
import datetime
import os
import threading
import uuid
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NoReturn, Protocol, TypeVar, overload

from fusee import _codec
from fusee._definitions import DEFAULT_RETRY, Retry, checked
from fusee._durations import parse_duration
from fusee._events import event_key
from fusee._runtime import CURRENT_UPDATE, ContinueAsNew, StepCall, UpdateInfo
from fusee._stepfn import StepShape, shape_of
from fusee.errors import DeterminismError, FuseeError
from fusee.record import CANCEL_SEND, DETACHED, Timer, value_kind

if TYPE_CHECKING:
    from types import TracebackType

    from fusee._definitions import QueryDef, SignalDef, UpdateDef, WorkflowDef
    from fusee._events import EventDef
    from fusee._logger import RunLogger
    from fusee._runtime import Runtime


class _Named(Protocol):
    """What ``ctx.child(queue=)`` reads of a `fusee.Queue` (defined in a higher layer)."""

    @property
    def name(self) -> str: ...


__all__ = [
    "CancelFlag",
    "Ctx",
    "StepCtx",
    "UpdateInfo",
    "WorkflowInfo",
    "WorkflowStream",
    "begin_sleep",
    "current_step",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
R = TypeVar("R")

Duration = str | int | float | datetime.timedelta


class _Recorded:
    """What a call recorded at once returns, so that it may be awaited like the others."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield


_RECORDED: Final = _Recorded()


@dataclass(frozen=True, slots=True)
class WorkflowInfo:
    """Who the running workflow is (``ctx.info``).

    ``scheduled_at`` is the tick of the `fusee.Schedule` that started the
    run (a backfill's too), None for a run started otherwise.

    Example:
        >>> WorkflowInfo("order-1", 3, "checkout", datetime.datetime(2026, 1, 1)).id
        'order-1'
    """

    id: str
    run: int
    workflow: str
    started_at: datetime.datetime
    scheduled_at: datetime.datetime | None = None


class Waitable(Protocol[T_co]):
    """What ``ctx.wait_for`` reads of a `fusee.SignalDef`: its name and decoder.

    Covariant, unlike `fusee.SignalDef` (whose payload type must match
    exactly where a payload is sent): waiting on a ``SignalDef[int]`` gives
    an ``int``, also where an ``int | None`` is expected.
    """

    @property
    def name(self) -> str: ...
    @property
    def type(self) -> Any: ...
    @property
    def decode(self) -> Callable[[bytes], T_co]: ...


class Ctx:
    """The workflow's handle on its run: every durable operation goes through it.

    Workflow functions receive it as their first argument.

    Example:
        >>> import fusee
        >>> @fusee.workflow("hello")
        ... async def hello(ctx, name: str) -> str:
        ...     greeting = await ctx.step("greet", lambda: f"hello {name}")
        ...     await ctx.sleep("pause", "1s")
        ...     return greeting
    """

    __slots__ = ("_logger", "_machine", "_rt")

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self._machine = runtime.machine
        self._logger: RunLogger | None = None

    @property
    def logger(self) -> RunLogger:
        """A `logging.Logger`-like logger that logs each line once per run (not on replay).

        Records go to the ``fusee.workflow.<workflow>`` logger with the run's
        id, workflow and step as ``extra`` fields and a message prefix.

        Example:
            >>> async def f(ctx: Ctx, order: str) -> None:
            ...     ctx.logger.info("charging %s", order)
        """
        if self._logger is None:
            from fusee._logger import RunLogger

            self._logger = RunLogger(self._machine, self._rt.start_record, current_step)
        return self._logger

    @property
    def info(self) -> WorkflowInfo:
        """The run's id, run number, workflow name, start time and schedule tick.

        Example:
            >>> async def f(ctx: Ctx) -> str:
            ...     return ctx.info.id
        """
        s = self._rt.start_record
        tick = s.meta.scheduled_ms if s.meta is not None else 0
        return WorkflowInfo(
            s.id,
            s.run,
            s.wtype,
            datetime.datetime.fromtimestamp(s.started_ms / 1000, datetime.UTC),
            datetime.datetime.fromtimestamp(tick / 1000, datetime.UTC) if tick else None,
        )

    def journal_size(self) -> int:
        """Operations the run has started so far; deterministic, so code may decide on it.

        Example:
            >>> async def f(ctx: Ctx, n: int) -> None:
            ...     if ctx.journal_size() > 10_000:
            ...         ctx.continue_as_new(n)
        """
        return self._machine.journal_size()

    def _diverged(self, e: DeterminismError) -> DeterminismError:
        return self._rt.diverged_at_call(e)

    # --- steps -----------------------------------------------------------------------------------

    @overload
    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        result_type: type[T],
        retry: Retry | None = None,
        timeout: Duration | None = None,
        heartbeat_timeout: Duration | None = None,
        inline: bool = False,
        read_only: bool = False,
    ) -> asyncio.Future[T]: ...
    @overload
    def step(
        self,
        name: str,
        fn: Callable[..., Awaitable[T]],
        *,
        retry: Retry | None = None,
        timeout: Duration | None = None,
        heartbeat_timeout: Duration | None = None,
        inline: bool = False,
        read_only: bool = False,
    ) -> asyncio.Future[T]: ...
    @overload
    def step(
        self,
        name: str,
        fn: Callable[..., T],
        *,
        retry: Retry | None = None,
        timeout: Duration | None = None,
        heartbeat_timeout: Duration | None = None,
        inline: bool = False,
        read_only: bool = False,
    ) -> asyncio.Future[T]: ...

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        result_type: Any = None,
        retry: Retry | None = None,
        timeout: Duration | None = None,
        heartbeat_timeout: Duration | None = None,
        inline: bool = False,
        read_only: bool = False,
    ) -> asyncio.Future[Any]:
        """Runs ``fn`` once, durably: its result is recorded and replayed after a crash.

        Args:
            name: The step's name, as recorded (replay checks it).
            fn: A sync or async callable taking no argument or one
                `StepCtx`. Sync functions run in a worker thread unless
                ``inline``.
            result_type: The type the result is decoded to when ``fn`` has
                no return annotation (a lambda). A dataclass, pydantic model
                or msgspec struct returned with no declared type fails the
                step with `fusee.PayloadError`.
            retry: How failures are retried (default: `fusee.Retry()`).
            timeout: Per-attempt limit (a duration) on the engine's clock; a
                timeout is a failure, retried.
            heartbeat_timeout: An attempt that does not call
                ``s.heartbeat()`` within this long (from its start and from
                each heartbeat) is failed and retried.
            inline: Run a sync function on the engine's loop (it must not block).
            read_only: It changes nothing outside, so it may run before the
                run's earlier records are durable.

        Returns:
            A future of the result, decoded to ``fn``'s return annotation
            (or ``result_type``).

        Raises:
            fusee.StepFailed: (from the future) the step failed for good.

        Example:
            >>> import dataclasses
            >>> @dataclasses.dataclass
            ... class Quote:
            ...     price: int
            >>> async def f(ctx: Ctx) -> Quote:
            ...     return await ctx.step("quote", lambda: Quote(3), result_type=Quote)
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"ctx.step needs a non-empty name, got {name!r}")
        shape = shape_of(fn)
        decode = shape.decode
        declared = shape.declared
        if result_type is not None and not declared:
            decode = _codec.decoder_for(result_type, name=f"the result of step '{name}'")
            declared = True
        d = self._rt
        try:
            seq, start = self._machine.begin_step(name)
        except DeterminismError as e:
            raise self._diverged(e) from None
        fut = d.register(seq, "step", name, decode)
        if start.attempt != 0:
            self._run(
                seq,
                name,
                fn,
                shape,
                start.attempt,
                start.not_before_ms,
                retry,
                timeout,
                # Positional: keywords cost the call a match of each name.
                inline,
                read_only,
                False,  # is_await
                declared,
                heartbeat_timeout,
            )
        return fut

    def _run(
        self,
        seq: int,
        name: str,
        fn: Callable[..., Any],
        shape: StepShape,
        attempt: int,
        not_before_ms: int,
        retry: Retry | None,
        timeout: Duration | None,
        inline: bool = False,
        read_only: bool = False,
        is_await: bool = False,
        declared: bool = True,
        heartbeat_timeout: Duration | None = None,
    ) -> None:
        # Hands the host a step (or a token function) to run. Positional:
        # one is made per step, and keywords cost a dict's worth of work.
        call = StepCall(
            seq,
            name,
            fn,
            retry if retry is not None else DEFAULT_RETRY,
            parse_duration(timeout) if timeout is not None else None,
            inline,
            read_only,
            is_await,
            shape.takes_ctx,
            shape.is_async,
            attempt,
            not_before_ms,
            declared,
            parse_duration(heartbeat_timeout) if heartbeat_timeout is not None else None,
        )
        self._rt.run_step(call)

    @overload
    def await_completion(
        self,
        name: str,
        fn: Callable[[StepCtx], Any],
        *,
        result_type: type[T],
        retry: Retry | None = None,
        timeout: Duration | None = None,
    ) -> asyncio.Future[T]: ...
    @overload
    @overload
    def await_completion(
        self,
        name: str,
        fn: Callable[[StepCtx], Any],
        *,
        retry: Retry | None = None,
        timeout: Duration | None = None,
    ) -> asyncio.Future[Any]: ...

    def await_completion(
        self,
        name: str,
        fn: Callable[[StepCtx], Any],
        *,
        result_type: Any = None,
        retry: Retry | None = None,
        timeout: Duration | None = None,
    ) -> asyncio.Future[Any]:
        """Hands a token out (``fn(s)``, ``s.token``), then waits for ``engine.complete(token, v)``.

        ``fn`` runs as a step does (retried on failure); once it returns, the
        run waits, costing nothing, for the outside world to complete the
        token.

        Args:
            name: The operation's name, as recorded.
            fn: Hands ``s.token`` out (an email, a webhook registration).
            result_type: The completion's type: ``engine.complete`` refuses a
                value that does not fit it, and the value is decoded to it.
            retry: How ``fn``'s failures are retried.
            timeout: Bounds the whole wait (``fn``'s attempts and the wait
                for ``complete``), on a durable timer: the ``await`` raises
                `TimeoutError`, and a later ``complete`` is ignored.

        Example:
            >>> async def f(ctx: Ctx) -> bool:
            ...     return await ctx.await_completion(
            ...         "approval", lambda s: print(s.token), result_type=bool, timeout="1d"
            ...     )
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"ctx.await_completion needs a non-empty name, got {name!r}")
        shape = shape_of(fn)
        timeout_s = parse_duration(timeout) if timeout is not None else None
        decode = (
            _codec.decoder_for(result_type, name=f"the completion of '{name}'")
            if result_type is not None
            else _codec.decode
        )
        d = self._rt
        try:
            seq, start = self._machine.begin_await(name)
        except DeterminismError as e:
            raise self._diverged(e) from None
        fut = d.register(seq, "await", name, decode)
        if start.mode == "run":
            self._run(
                seq,
                name,
                fn,
                shape,
                start.attempt,
                start.not_before_ms,
                retry,
                None,
                is_await=True,
            )
        if timeout_s is None:
            return fut
        # The bound is a durable timer (the operation after the await's), so
        # a crash keeps it: replay takes the same two positions and races
        # them the same way.
        _, timer = begin_sleep(d, f"{name} (timeout)", timeout_s)
        return d.loop.create_task(_bounded(fut, timer, name, timeout_s), name=f"fusee:{name}")

    # --- time, signals, children -----------------------------------------------------------------

    def sleep(self, name: str, duration: Duration) -> asyncio.Future[None]:
        """A durable sleep: the run may be parked meanwhile and survives restarts.

        Args:
            name: The sleep's name, as recorded.
            duration: ``"500ms"``, ``"10m"``, ``"1h30m"``, ``"1d"``, seconds, or a timedelta.

        Example:
            >>> async def f(ctx: Ctx) -> None:
            ...     await ctx.sleep("cool-off", "10m")
        """
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"ctx.sleep needs a name first, got {name!r}: write ctx.sleep('nap', '10m')"
            )
        _, fut = begin_sleep(self._rt, name, parse_duration(duration))
        return fut

    def wait_for(
        self, signal: Waitable[T], *, timeout: Duration | None = None
    ) -> asyncio.Future[T | None]:
        """Waits for the next ``signal``; resolves to its payload, or None on timeout.

        Signals sent before the wait are buffered, oldest first.

        Example:
            >>> import fusee
            >>> review = fusee.signal("review", bool)
            >>> async def f(ctx: Ctx) -> bool | None:
            ...     return await ctx.wait_for(review, timeout="1d")
        """
        d = self._rt
        deadline = d.now_ms() + round(parse_duration(timeout) * 1000) if timeout is not None else 0
        try:
            seq, arm = self._machine.begin_wait(signal.name, deadline)
        except DeterminismError as e:
            raise self._diverged(e) from None
        # Registered before its `Wait` is appended: the host offers the
        # run's signals to the wait then, and the wait's type decides
        # which it takes.
        fut = d.register(seq, "wait", signal.name, signal.decode)
        d.wait_begun(signal.name)
        d.append(arm.record)
        return fut

    def child(
        self,
        workflow: WorkflowDef[Any, T],
        id: str,
        input: Any = None,
        *,
        detached: bool = False,
        queue: _Named | str | None = None,
        key: str | None = None,
        timeout: Any = None,
        delay: Any = None,
    ) -> asyncio.Future[T]:
        """Starts child run ``id`` of ``workflow``; resolves to its result.

        A detached child outlives this run and its future resolves to None
        once it is started. With ``queue`` (a `fusee.Queue` of the engine,
        or its name) the child is queued until the queue admits it, under
        ``key`` for the queue's ``per_key`` limit; a queue the engine does
        not have fails the child with `fusee.UnknownQueue`.

        With ``timeout`` (a duration) the child has a deadline: once it
        passes, the child is cancelled (reason ``"deadline exceeded"``) and
        its future raises `fusee.Cancelled`. An attached child's deadline
        is never past this run's own (`Engine.start(..., timeout=)`).

        With ``delay`` (a duration) the child is ``queued`` until that long
        after this call (the time is recorded, so a replay asks for the same
        one), as ``Engine.start(..., delay=)`` queues a run.

        Raises:
            fusee.ChildFailed: (from the future) the child failed.

        Example:
            >>> import fusee
            >>> @fusee.workflow("ship")
            ... async def ship(ctx, order_id: str) -> str:
            ...     return f"shipped {order_id}"
            >>> async def f(ctx: Ctx, order_id: str) -> str:
            ...     return await ctx.child(ship, f"ship-{order_id}", order_id, timeout="1h")
        """
        if not isinstance(id, str) or not id:
            raise TypeError(f"ctx.child needs a non-empty run id, got {id!r}")
        _check_text(id, "ctx.child's run id")
        d = self._rt
        data = checked(
            input, workflow.decode_input, f"the input of child '{id}'", workflow.input_type
        )
        # Read live only: on replay the journal's `Child` holds the deadline.
        deadline_ms = 0
        if timeout is not None:
            deadline_ms = d.now_ms() + _timeout_ms(timeout, "a child's timeout")
        not_before_ms = 0
        if delay is not None:
            delay_ms = _timeout_ms(delay, "a child's delay")
            # A recorded time: the child's start, redone after a crash, asks
            # for the time the first asked for.
            now = self._value(value_kind.NOW, lambda: d.now_ms().to_bytes(8, "little"))
            not_before_ms = int.from_bytes(now, "little") + delay_ms
        if not detached:
            deadline_ms = _capped(deadline_ms, self._machine.info().deadline_ms)
        try:
            seq, arm = self._machine.begin_child(
                workflow.name, id, DETACHED if detached else 0, deadline_ms, data
            )
        except DeterminismError as e:
            raise self._diverged(e) from None
        if queue is not None:
            name = queue if isinstance(queue, str) else queue.name
            if key is not None and not isinstance(key, str):
                raise TypeError(f"ctx.child's queue key must be a string or None, not {key!r}")
            d.child_queues[seq] = (name, key)
        if not_before_ms:
            d.child_delays[seq] = not_before_ms
        d.append(arm.record)
        if detached:
            fut: asyncio.Future[Any] = d.loop.create_future()
            fut.set_result(None)
            return fut
        return d.register(seq, "child", workflow.name, workflow.decode_result, id)

    def send(self, target: str, signal: SignalDef[T], payload: T, *, delay: Any = None) -> None:
        """Signals run ``target``, once this run's record of sending is durable.

        With ``delay`` (a duration) the signal goes that long after this
        call (the time is recorded), still exactly once across crashes. This
        run stays loaded and its end's row waits until it has gone; its
        later sends to the same target do not wait for it.

        Example:
            >>> import fusee
            >>> go = fusee.signal("go", bool)
            >>> async def f(ctx: Ctx) -> None:
            ...     ctx.send("other-run", go, True)
            ...     ctx.send("other-run", go, False, delay="1h")
        """
        if not isinstance(target, str) or not target:
            raise TypeError(f"ctx.send needs a non-empty run id, got {target!r}")
        _check_text(target, "ctx.send's run id")
        if signal.name == CANCEL_SEND:
            raise ValueError(
                f"the signal name {CANCEL_SEND!r} is fusee's own; cancel a run with ctx.cancel"
            )
        data = signal.encode_checked(payload)
        at_ms = 0
        if delay is not None:
            delay_ms = _timeout_ms(delay, "a send's delay")
            now = self._value(value_kind.NOW, lambda: self._rt.now_ms().to_bytes(8, "little"))
            at_ms = int.from_bytes(now, "little") + delay_ms
        try:
            seq, record = self._machine.send(target, signal.name, data)
        except DeterminismError as e:
            raise self._diverged(e) from None
        if at_ms:
            self._rt.send_delays[seq] = at_ms
        self._rt.append(record)

    def cancel(self, run_id: str, reason: str | None = None) -> None:
        """Cancels run ``run_id``, as `Run.cancel` does, once this run's record of it is durable.

        Journaled and delivered through this run's outbox exactly once,
        across crashes, as ``ctx.send`` is; a run that has ended or does not
        exist is left alone (logged). A queued run is dropped before it starts.

        Args:
            run_id: The run to cancel (not this run's own id).
            reason: What its code's `fusee.Cancelled` says; by default
                ``"cancelled by run '<this run's id>'"``.

        Example:
            >>> async def f(ctx: Ctx, order_id: str) -> None:
            ...     ctx.cancel(f"ship-{order_id}", reason="order withdrawn")
        """
        if not isinstance(run_id, str) or not run_id:
            raise TypeError(f"ctx.cancel needs a non-empty run id, got {run_id!r}")
        _check_text(run_id, "ctx.cancel's run id")
        if reason is not None and not isinstance(reason, str):
            raise TypeError(f"ctx.cancel's reason must be a string or None, not {reason!r}")
        me = self._machine.info().id
        if run_id == me:
            raise ValueError(
                f"ctx.cancel cannot cancel its own run '{me}'; raise fusee.Cancelled, "
                "or return, to end it"
            )
        text = reason if reason is not None else f"cancelled by run '{me}'"
        try:
            _, record = self._machine.send(run_id, CANCEL_SEND, _codec.encode(text))
        except DeterminismError as e:
            raise self._diverged(e) from None
        self._rt.append(record)

    # --- recorded values -------------------------------------------------------------------------

    def _value(self, kind: int, make: Callable[[], bytes]) -> bytes:
        try:
            _, value, record = self._machine.value(kind, make)
        except DeterminismError as e:
            raise self._diverged(e) from None
        self._rt.append(record)
        return value

    def now(self) -> datetime.datetime:
        """The current time (UTC), recorded: replay sees the same time.

        Example:
            >>> async def f(ctx: Ctx) -> str:
            ...     return ctx.now().isoformat()
        """
        rt = self._rt
        v = self._value(value_kind.NOW, lambda: rt.now_ms().to_bytes(8, "little"))
        return datetime.datetime.fromtimestamp(int.from_bytes(v, "little") / 1000, datetime.UTC)

    def random(self) -> float:
        """A random float in [0, 1), recorded.

        Example:
            >>> async def f(ctx: Ctx) -> bool:
            ...     return ctx.random() < 0.5
        """
        v = self._value(value_kind.RANDOM, lambda: os.urandom(8))
        return (int.from_bytes(v, "little") >> 11) / float(1 << 53)

    def uuid4(self) -> uuid.UUID:
        """A random UUID, recorded.

        Example:
            >>> async def f(ctx: Ctx) -> str:
            ...     return str(ctx.uuid4())
        """
        return uuid.UUID(bytes=self._value(value_kind.UUID, lambda: uuid.uuid4().bytes), version=4)

    def patched(self, id: str) -> bool:
        """Whether this run takes patch ``id``'s new code here (versioning).

        True for new runs and for running ones that reach this point after
        the patch was deployed; False while replaying a journal that passed
        this point under the old code.

        Example:
            >>> async def f(ctx: Ctx) -> float:
            ...     return 0.2 if ctx.patched("fix-tax") else 0.19
        """
        on, record = self._machine.patched(id)
        self._rt.append(record)
        return on

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        """Records search attributes: ``engine.list`` and ``fusee list --attr`` filter on them.

        Example:
            >>> async def f(ctx: Ctx) -> None:
            ...     ctx.set_attributes({"customer": "ana"})
        """
        if not isinstance(attributes, Mapping):
            raise TypeError(f"ctx.set_attributes needs a mapping, got {attributes!r}")
        data = _codec.encode(dict(attributes), name="the attributes")
        try:
            _, record = self._machine.set_attributes(data)
        except DeterminismError as e:
            raise self._diverged(e) from None
        self._rt.append(record)

    def set_event(self, key: str | EventDef[T], value: T) -> Awaitable[None]:
        """Records ``value`` as the run's latest for event ``key``; ``run.get_event`` reads it.

        It is recorded when called; the result may be awaited (``await
        ctx.set_event(...)``, as for every other operation) or dropped.

        Raises:
            fusee.PayloadError: ``value`` cannot be encoded, or does not fit
                a typed key's type (nothing is recorded).

        Example:
            >>> async def f(ctx: Ctx) -> None:
            ...     await ctx.set_event("progress", {"pct": 40})
        """
        k = event_key(key)
        data = k.encode_checked(value)
        try:
            _, record = self._machine.set_event(k.name, data)
        except DeterminismError as e:
            raise self._diverged(e) from None
        self._rt.append(record)
        return _RECORDED

    # --- streams, queries, updates ---------------------------------------------------------------

    def stream(self, name: str) -> WorkflowStream:
        """A stream the workflow appends to and clients read live (``run.stream(name)``).

        Example:
            >>> async def f(ctx: Ctx) -> None:
            ...     async with ctx.stream("tokens") as out:
            ...         await out.append("hi")
        """
        return WorkflowStream(self._rt, name)

    @overload
    def on_query(self, query: QueryDef[Any], handler: Callable[[Any], Any]) -> None: ...
    @overload
    def on_query(self, query: None, handler: Callable[[str, Any], Any]) -> None: ...

    def on_query(self, query: QueryDef[Any] | None, handler: Callable[..., Any]) -> None:
        """Answers ``query`` with ``handler(arg)``; it must not change the run.

        With ``query=None`` the handler is dynamic: it answers every query no
        other handler names, called as ``handler(name, arg)``.

        Example:
            >>> import fusee
            >>> status = fusee.query("status")
            >>> async def f(ctx: Ctx) -> None:
            ...     ctx.on_query(status, lambda _: {"phase": "review"})
            ...     ctx.on_query(None, lambda name, arg: f"no query {name}")
        """
        if query is None:
            self._rt.handlers.dynamic_query = handler
            return
        self._rt.handlers.queries[query.name] = handler

    @overload
    def on_signal(
        self, signal: Waitable[T], handler: Callable[[T], Any] | Callable[[T], Awaitable[Any]]
    ) -> None: ...
    @overload
    def on_signal(
        self,
        signal: None,
        handler: Callable[[str, Any], Any] | Callable[[str, Any], Awaitable[Any]],
    ) -> None: ...

    def on_signal(self, signal: Waitable[Any] | None, handler: Callable[..., Any]) -> None:
        """Calls ``handler(payload)`` for each signal ``signal`` the run receives.

        The handler (sync, or async: it then runs as workflow code and may
        await steps and sleeps) is called in journal order, at the signal's
        place in the journal, so a replay calls it at the same point with
        the same payloads. Signals the run received before the handler was
        set are handed to it at once, oldest first. It sees every signal of
        its name, including one a ``wait_for`` also takes. A payload that
        does not fit the signal's type is logged and left out. A handler
        that raises is a bug in workflow code: the run fails (or pauses,
        with ``on_error="pause"``). Setting a handler again replaces it.

        With ``signal=None`` the handler is dynamic, called
        ``handler(name, payload)`` (plain values) for each signal no other
        handler or wait takes. The rule, so that a signal meant for
        ``wait_for`` never goes astray: a signal whose name has a named
        handler is that handler's; one whose name the workflow waits for (a
        ``fusee.signal`` defined at the top level of the workflow's module,
        as the doors know it, or a name the code has begun a ``wait_for``
        of) stays buffered for its waits; any other signal (a name the
        workflow does not know) is the dynamic handler's, taken at its
        arrival, and a later ``wait_for`` of that name does not see it.

        Example:
            >>> import fusee
            >>> seen = fusee.signal("seen", str)
            >>> async def f(ctx: Ctx) -> None:
            ...     views: list[str] = []
            ...     other: list[tuple[str, object]] = []
            ...     ctx.on_signal(seen, views.append)
            ...     ctx.on_signal(None, lambda name, payload: other.append((name, payload)))
        """
        if not callable(handler):
            raise TypeError(f"ctx.on_signal needs a callable handler, got {handler!r}")
        if signal is None:
            self._rt.handlers.dynamic_signal = handler
            self._rt.signal_handler_set(None)
            return
        self._rt.handlers.signals[signal.name] = (signal.decode, handler)
        self._rt.signal_handler_set(signal.name)

    @overload
    def on_update(
        self,
        update: UpdateDef[T, R],
        handler: Callable[[T], R] | Callable[[T], Awaitable[R]],
        validator: Callable[[T], None] | None = None,
    ) -> None: ...
    @overload
    def on_update(
        self,
        update: None,
        handler: Callable[[str, Any], Any],
        validator: Callable[[str, Any], None] | None = None,
    ) -> None: ...

    def on_update(
        self,
        update: UpdateDef[Any, Any] | None,
        handler: Callable[..., Any],
        validator: Callable[..., None] | None = None,
    ) -> None:
        """Accepts ``update``: ``validator`` may reject it (raise); ``handler`` runs at its turn.

        The handler (sync or async) starts at the update's place in the
        journal, so it replays identically; its result goes to the caller of
        ``run.update``. Inside it, `current_update` names the update.

        With ``update=None`` the handler is dynamic: it takes every update no
        other handler names, called as ``handler(name, payload)`` (and
        ``validator(name, payload)``) with the payload as plain values.

        Example:
            >>> import fusee
            >>> bump = fusee.update("bump", int)
            >>> async def f(ctx: Ctx) -> None:
            ...     total = [0]
            ...     ctx.on_update(bump, lambda n: total.__setitem__(0, total[0] + n))
            ...     ctx.on_update(None, lambda name, payload: f"{name} noted")
        """
        if update is None:
            self._rt.handlers.dynamic_update = (handler, validator)
            return
        self._rt.handlers.updates[update.name] = (update, handler, validator)

    def current_update(self) -> UpdateInfo | None:
        """The update whose handler is running here (its id and name), or None outside one.

        Example:
            >>> async def f(ctx: Ctx) -> None:
            ...     def audit(name: str, payload: object) -> str:
            ...         info = ctx.current_update()
            ...         return f"{name} ({info.id if info else '?'})"
            ...     ctx.on_update(None, audit)
        """
        return CURRENT_UPDATE.get()

    def continue_as_new(self, input: Any = None) -> NoReturn:
        """Ends this run and starts a new one of the same workflow and id with ``input``.

        Raises:
            ContinueAsNew: always; never returns.

        Example:
            >>> async def f(ctx: Ctx, n: int) -> None:
            ...     ctx.continue_as_new(n + 1)
        """
        raise ContinueAsNew(_codec.encode(input, name="the input of the next run"))


class WorkflowStream:
    """A stream written by workflow code (``async with ctx.stream(name) as out``).

    Example:
        >>> async def f(ctx: Ctx) -> None:
        ...     async with ctx.stream("tokens") as out:
        ...         await out.append("a")
    """

    __slots__ = ("_name", "_rt")

    def __init__(self, runtime: Runtime, name: str) -> None:
        self._rt = runtime
        self._name = name

    async def __aenter__(self) -> WorkflowStream:
        try:
            self._rt.machine.stream_open(self._name, None)
        except RuntimeError as e:
            raise FuseeError(str(e)) from None
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def append(self, value: Any) -> None:
        """Appends ``value`` to the stream (recorded; replay does not append it again)."""
        data = _codec.encode(value, name=f"a chunk of stream '{self._name}'")
        try:
            record = self._rt.machine.stream_append(self._name, None, data)
        except RuntimeError as e:
            raise FuseeError(str(e)) from None
        self._rt.append(record)

    async def close(self) -> None:
        """Completes the stream; readers see its end."""
        try:
            record = self._rt.machine.stream_close(self._name, None)
        except RuntimeError as e:
            raise FuseeError(str(e)) from None
        self._rt.append(record)


def begin_sleep(rt: Runtime, name: str, delay_s: float) -> tuple[int, asyncio.Future[Any]]:
    """A durable sleep of ``delay_s`` seconds: ``ctx.sleep`` and the loop's timers.

    ``asyncio.sleep(x)`` and ``asyncio.timeout`` reach it through the run's
    loop (`fusee._loop.WorkflowLoop.call_later`), so both kinds of sleep are
    one operation.

    Returns:
        The operation's position and its future.
    """
    if delay_s > _MAX_SLEEP_S or delay_s != delay_s:
        raise ValueError(
            f"a sleep of {delay_s!r} seconds is out of range; "
            f"sleep at most {_MAX_SLEEP_S:.0f} seconds (about 100 years)"
        )
    try:
        seq, arm = rt.machine.begin_sleep(name, rt.now_ms() + round(delay_s * 1000))
    except DeterminismError as e:
        raise rt.diverged_at_call(e) from None
    record = arm.record
    if record is not None:
        assert isinstance(record, Timer)
        rt.timer_set(seq, record.fire_at_ms)
        rt.append(record)
    return seq, rt.register(seq, "sleep", name, None)


async def _bounded(
    fut: asyncio.Future[Any], timer: asyncio.Future[Any], name: str, timeout_s: float
) -> Any:
    """``fut``'s result, unless ``timer`` fires first: then `TimeoutError`, ``fut`` dropped."""
    try:
        await asyncio.wait([fut, timer], return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        fut.cancel()
        timer.cancel()
        raise
    if fut.done():
        timer.cancel()
        return fut.result()
    fut.cancel()
    timer.result()  # a cancelled run's timer raises its cancellation
    raise TimeoutError(
        f"await_completion '{name}' was not completed within {timeout_s:g}s "
        "(its token is no longer accepted)"
    )


def _check_text(id: str, what: str) -> None:
    try:
        id.encode()
    except UnicodeEncodeError:
        raise ValueError(
            f"{what} {id!r} is not valid text (a lone surrogate has no UTF-8 form); "
            "use an id of valid characters"
        ) from None


# About 100 years: a deadline past it is a bug (or an overflow), not a plan.
_MAX_SLEEP_S = 100 * 365 * 86400.0

_current_step: contextvars.ContextVar[StepCtx | _LaterStepCtx | None] = contextvars.ContextVar(
    "fusee_current_step", default=None
)


class _LaterStepCtx(abc.ABC):
    """A step's `StepCtx`, made when first asked for (`current_step`).

    An engine sets one as the current step of an attempt whose function
    takes no `StepCtx`: most such functions never ask for theirs, and a
    `StepCtx` is the dearest object of a step's attempt. Asked twice, it
    gives the same one.
    """

    __slots__ = ("made",)

    def __init__(self) -> None:
        self.made: StepCtx | None = None

    @abc.abstractmethod
    def make(self) -> StepCtx:
        """Makes the `StepCtx` (once: `get` keeps it); the engine's subclass says how."""

    def get(self) -> StepCtx:
        """The `StepCtx`, made now if it was not yet."""
        ctx = self.made
        if ctx is None:
            # Under a lock: a thread of the step's (`asyncio.to_thread` copies
            # the context) may ask while the engine makes it for the task the
            # attempt goes on in, and both must get the one the engine cancels.
            with _MAKING_STEP_CTX:
                ctx = self.made
                if ctx is None:
                    ctx = self.made = self.make()
        return ctx


_MAKING_STEP_CTX = threading.Lock()


class CancelFlag:
    """Set when a step attempt is no longer wanted (``s.cancelled``); readable from any thread.

    Like `asyncio.Event`: ``is_set()`` (or plain truth) from sync code,
    ``await wait()`` from async code.

    Example:
        >>> flag = CancelFlag()
        >>> (bool(flag), flag.is_set())
        (False, False)
        >>> flag.set()
        >>> bool(flag)
        True
    """

    # One is made per step attempt, so it costs one object and two slots:
    # no lock or event of its own (a set is a plain store, read from any
    # thread), and its waiters, rare, are kept under one shared lock.
    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        """Whether the attempt was cancelled."""
        return self._set

    def __bool__(self) -> bool:
        return self._set

    def set(self) -> None:
        """Sets the flag and wakes every ``wait()``, on each waiter's own loop."""
        with _FLAG_LOCK:
            self._set = True
            waiters, self._waiters = self._waiters, None
        for fut in waiters or ():
            fut.get_loop().call_soon_threadsafe(_wake, fut)

    async def wait(self) -> None:
        """Returns once the flag is set (at once if it is)."""
        fut = asyncio.get_running_loop().create_future()
        with _FLAG_LOCK:
            if self._set:
                return
            if self._waiters is None:
                self._waiters = []
            self._waiters.append(fut)
        try:
            await fut
        finally:
            with _FLAG_LOCK:
                if self._waiters is not None and fut in self._waiters:
                    self._waiters.remove(fut)


_FLAG_LOCK = threading.Lock()


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class StepCtx:
    """What a step function may know and do about its own execution.

    Attributes:
        key: An idempotency key, ``"{id}/{run}/{seq}"``: the same for every
            attempt and after a crash; pass it to payment APIs and the like.
        attempt: This attempt's number in the current retry budget (1-based).
        token: For ``ctx.await_completion``: the token to hand out.
        cancelled: A `CancelFlag` set when this attempt is no longer wanted
            (it timed out, the workflow dropped the step, the run was
            cancelled or ended): a long sync step polls it and stops. An
            async step's task is also cancelled.

    Example:
        >>> def charge(s: StepCtx) -> str:
        ...     return f"charged with key {s.key} on attempt {s.attempt}"
    """

    __slots__ = ("_heartbeat", "_progress", "_stream", "attempt", "cancelled", "key", "token")

    def __init__(
        self,
        key: str,
        attempt: int,
        token: str | None,
        progress: Callable[[], Any],
        heartbeat: Callable[[Any], None],
        stream: Callable[[str], Any],
    ) -> None:
        self.key = key
        self.attempt = attempt
        self.token = token
        self.cancelled = CancelFlag()
        self._progress = progress
        self._heartbeat = heartbeat
        self._stream = stream

    @property
    def progress(self) -> Any:
        """The last progress recorded by `heartbeat`, in this attempt or an earlier one."""
        return self._progress()

    def heartbeat(self, progress: Any = None) -> None:
        """Reports that the step is alive, with ``progress`` kept for a retry to resume from.

        Example:
            >>> def export(s: StepCtx) -> None:
            ...     start = s.progress or 0
            ...     for page in range(start, 10):
            ...         s.heartbeat(page)
        """
        self._heartbeat(progress)

    def stream(self, name: str) -> Any:
        """A stream this step writes; it ends when the step's result is recorded.

        Example:
            >>> async def gen(s: StepCtx) -> None:
            ...     async with s.stream("tokens") as out:
            ...         await out.append("hi")
        """
        return self._stream(name)


def current_step() -> StepCtx | None:
    """The `StepCtx` of the step running in this context (None outside steps).

    Lets code deep inside a step reach its idempotency key or heartbeat.

    Example:
        >>> current_step() is None
        True
    """
    step = _current_step.get()
    if isinstance(step, _LaterStepCtx):
        return step.get()
    return step


def _timeout_ms(duration: Any, what: str) -> int:
    """A child's timeout or delay, or a send's delay, in milliseconds (a positive duration)."""
    ms = round(parse_duration(duration) * 1000)
    if ms <= 0:
        raise ValueError(f"{what} must be a positive duration ('30s', '1h'), not {duration!r}")
    return ms


def _capped(deadline_ms: int, parent_ms: int) -> int:
    """A child's deadline, never past its parent's (0 stands for none)."""
    if not parent_ms:
        return deadline_ms
    return parent_ms if not deadline_ms else min(deadline_ms, parent_ms)
