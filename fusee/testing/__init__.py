"""Testing workflows: `TestEngine` and `crash_everywhere`.

`TestEngine` is the `Engine` on the memory store (or a store the test
gives it) with a virtual clock that
stands still until the test moves it (`TestEngine.advance`) or awaits a
run's result (then idle time skips to the next timer, as in Temporal's
time-skipping environment). `TestEngine.crash` loses everything but the
store and recovers, as a process restart would. The dev profile is on:
every run's journal is replayed against the code when it waits or ends.

Example:
    >>> import asyncio, fusee
    >>> @fusee.workflow("nap")
    ... async def nap(ctx) -> str:
    ...     await ctx.sleep("nap", "1d")
    ...     return "rested"
    >>> async def main() -> str:
    ...     async with TestEngine(workflows=[nap]) as t:
    ...         return await t.execute(nap, "nap-1")   # a day passes in no time
    >>> asyncio.run(main())
    'rested'
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import contextlib
import contextvars
import dataclasses
import datetime
import inspect
import logging
import textwrap
import uuid
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from fusee._driver import _error_of
from fusee._durations import parse_duration
from fusee._payloads import DEFAULT_MAX_PAYLOAD, DEFAULT_OFFLOAD_OVER, DEFAULT_WARN_RECORDS
from fusee.engine import Engine
from fusee.engine._clock import VirtualClock
from fusee.engine._commit import Unrecoverable
from fusee.engine._hooks import Hooks
from fusee.engine._run import IdPolicy, Run, RunInfo
from fusee.engine._schedules import check_schedules
from fusee.errors import (
    Cancelled,
    FuseeError,
    RunFinished,
    RunPaused,
    UnknownWorkflow,
    WatchdogError,
)
from fusee.record import PAUSED, Attempt, Resume, Start, Step, decode
from fusee.store import Entry, RunRow, Store
from fusee.store._queues import QueueItem
from fusee.store.memory import MemoryStore
from fusee.store.sqlite import SqliteStore

if TYPE_CHECKING:
    from types import TracebackType

    from fusee._definitions import WorkflowDef
    from fusee._events import EventDef
    from fusee._queue import Queue, QueueStats
    from fusee._schedule import Schedule
    from fusee.blobs import BlobStore
    from fusee.codecs import PayloadCodec
    from fusee.engine._schedules import Scheduler

__all__ = ["TestEngine", "crash_everywhere"]

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741 - a workflow's input type

# The run whose result the current task awaits: the wait that skips idle
# time reads it to tell a paused run from one that waits for the test.
_awaited: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "fusee_testing_awaited", default=None
)


class TestEngine:
    """The engine on the memory store and a virtual clock, with crashes and mocks.

    Args:
        workflows: The workflows it runs.
        store: A store to reopen (for example with changed code): the
            `fusee.store.memory.MemoryStore` of another `TestEngine`, or a
            `fusee.store.SqliteStore` (a crash then reopens its directory
            with a new store object, as a restarted process would); a new
            memory store by default.
        start_ms: The virtual clock's start (Unix ms).
        profile: ``"dev"`` (default): strict replay of every journal.
        park_after: How long a suspended run stays in memory.
        step_grace: How much real time a running step function gets to
            return before `settle`, `advance` and ``result()`` go on
            without it (it keeps running; its result arrives later).
        schedules: The `fusee.Schedule` values it ticks, on its virtual clock.
        watchdog: How long workflow code may run without yielding (``"2s"``
            by default; None: no watchdog). Code that blocks longer makes the
            next `settle`, `advance`, ``result()`` or `execute` raise
            `fusee.WatchdogError` with the stack the watchdog saw. It is off
            under a debugger (``sys.gettrace()``), as in the engine.
        queues: The `fusee.Queue` values runs may be started through, on
            the virtual clock (rate windows and debounces count its time).
        on_pause: What ``execute()`` and ``result()`` do when the run they
            await pauses (a step ran out of attempts, under `fusee.Retry`'s
            default ``on_exhausted="pause"``) and nothing else can move it
            on (the engine is idle, no timer of the run's own is left):
            ``"raise"`` (default) raises `fusee.RunPaused`, naming the step,
            its attempts and its last error; ``"wait"`` waits for a resume
            (from another task of the test, or an update's handler).
        on_error: What a bug escaping a workflow's code does to its run when
            the workflow does not say, as in `fusee.Engine.open`: ``"fail"``
            (default) or ``"pause"``. A run paused so makes ``execute()`` and
            ``result()`` raise `fusee.RunPaused` as a paused step does.
        tracer_provider: The OpenTelemetry tracer provider its engines'
            spans go to (an SDK provider with an in-memory exporter, say),
            as in `fusee.Engine.open`; default: the global one.
        meter_provider: The same for metrics.
        retention: Delete finished runs that ended this long ago, as in
            `fusee.Engine.open`, on the virtual clock (None: keep them).
        codecs: The payload codec chain, as in `fusee.Engine.open`.
        blobs: The blob store payloads over ``offload_over`` go to (none
            by default: payloads stay in the journal).
        offload_over: As in `fusee.Engine.open`.
        max_payload: As in `fusee.Engine.open` (``"4MiB"``).
        warn_records: As in `fusee.Engine.open`.

    Example:
        >>> async def test(t: TestEngine) -> None:
        ...     t.mock_step("checkout", "charge", lambda s: "ch_1")
        ...     await t.advance("1d")
        ...     await t.crash()
    """

    __test__ = False  # not a pytest test class, despite its name

    def __init__(
        self,
        workflows: Iterable[WorkflowDef[Any, Any]] = (),
        store: Store | None = None,
        *,
        start_ms: int = 1_767_225_600_000,
        profile: str | None = "dev",
        park_after: Any = "5s",
        step_grace: Any = "500ms",
        watchdog: Any = "2s",
        queues: Iterable[Queue] = (),
        schedules: Iterable[Schedule] = (),
        on_pause: Literal["raise", "wait"] = "raise",
        on_error: str = "fail",
        tracer_provider: Any = None,
        meter_provider: Any = None,
        retention: Any = None,
        codecs: Iterable[PayloadCodec] = (),
        blobs: BlobStore | None = None,
        offload_over: Any = DEFAULT_OFFLOAD_OVER,
        max_payload: Any = DEFAULT_MAX_PAYLOAD,
        warn_records: int | None = DEFAULT_WARN_RECORDS,
    ) -> None:
        if on_pause not in ("raise", "wait"):
            raise ValueError(f'on_pause must be "raise" or "wait", not {on_pause!r}')
        self.on_pause = on_pause
        self.on_error = on_error
        self._tracer_provider = tracer_provider
        self._retention = retention
        self._payloads: dict[str, Any] = {
            "codecs": list(codecs),
            "blobs": blobs,
            "offload_over": offload_over,
            "max_payload": max_payload,
            "warn_records": warn_records,
        }
        self._meter_provider = meter_provider
        self.workflows = list(workflows)
        self.queues = list(queues)
        self.schedules_given = list(schedules)
        check_schedules(self.workflows, self.schedules_given)
        self._step_grace_s = parse_duration(step_grace)
        self._watchdog = watchdog
        # Reports of every life, appended by the watchdog's thread; the
        # first `_reported` of them have been raised already.
        self._watchdog_reports: list[str] = []
        self._reported = 0
        self.store: Store = store if store is not None else MemoryStore()
        self._worker = f"test-{uuid.uuid4().hex[:8]}"
        self.clock = VirtualClock(start_ms)
        self._profile = profile
        self._park_after = park_after
        self._engine: Engine | None = None
        self._mocks: dict[tuple[str, str], Callable[..., Any]] = {}
        self.crashes = 0
        # Set by `crash_everywhere`: the virtual time by which the awaited run
        # must end (a run that waits past it, or for nothing that can come,
        # fails the test instead of hanging it).
        self._give_up_at_ms: int | None = None
        # Every step invocation as (life, (id, run, seq)); life counts crashes.
        self.step_log: list[tuple[int, tuple[str, int, int]]] = []

    @property
    def engine(self) -> Engine:
        """The engine of the current life (a new one after each `crash`)."""
        if self._engine is None:
            raise RuntimeError("use `async with TestEngine(...) as t:` before calling it")
        return self._engine

    async def __aenter__(self) -> TestEngine:
        await self._open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._engine is not None:
            await self._engine.close()
            self._engine = None

    async def _open(self) -> None:
        await self.store.open()
        hooks = Hooks(
            mocks=self._mocks,
            step_log=self.step_log,
            life=self.crashes,
            wait_result=self._wait_skipping,
            watchdog_reports=self._watchdog_reports,
        )
        engine = Engine(
            self.store,
            self.workflows,
            park_after=self._park_after,
            clock=self.clock,
            profile=self._profile,
            watchdog=self._watchdog,
            hooks=hooks,
            # One name across its crashes: on a shared store each restart
            # takes the shards of the life before at once, as a worker
            # restarted under its name does.
            worker=self._worker,
            queues=self.queues,
            schedules=self.schedules_given,
            tracer_provider=self._tracer_provider,
            meter_provider=self._meter_provider,
            retention=self._retention,
            **self._payloads,
            on_error=self.on_error,
        )
        self._engine = engine
        await engine.recover()

    # --- the Engine API, on the current engine ---------------------------------------------

    @overload
    async def start(
        self,
        workflow: WorkflowDef[None, T],
        id: str,
        input: None = None,
        *,
        id_policy: IdPolicy = ...,
        queue: Queue | str | None = ...,
        key: str | None = ...,
        priority: int = ...,
        debounce: Any = ...,
        timeout: Any = ...,
        delay: Any = ...,
        start_at: datetime.datetime | None = ...,
    ) -> Run[T]: ...
    @overload
    async def start(
        self,
        workflow: WorkflowDef[I, T],
        id: str,
        input: I,
        *,
        id_policy: IdPolicy = ...,
        queue: Queue | str | None = ...,
        key: str | None = ...,
        priority: int = ...,
        debounce: Any = ...,
        timeout: Any = ...,
        delay: Any = ...,
        start_at: datetime.datetime | None = ...,
    ) -> Run[T]: ...
    @overload
    async def start(
        self,
        workflow: str,
        id: str,
        input: Any = None,
        *,
        id_policy: IdPolicy = ...,
        queue: Queue | str | None = ...,
        key: str | None = ...,
        priority: int = ...,
        debounce: Any = ...,
        timeout: Any = ...,
        delay: Any = ...,
        start_at: datetime.datetime | None = ...,
    ) -> Run[Any]: ...

    async def start(
        self,
        workflow: WorkflowDef[Any, Any] | str,
        id: str,
        input: Any = None,
        *,
        id_policy: IdPolicy = IdPolicy.REJECT,
        queue: Queue | str | None = None,
        key: str | None = None,
        priority: int = 0,
        debounce: Any = None,
        timeout: Any = None,
        delay: Any = None,
        start_at: datetime.datetime | None = None,
    ) -> Run[Any]:
        """`Engine.start`; the handle stays valid across crashes."""
        run = await self.engine.start(
            workflow,
            id,
            input,
            id_policy=id_policy,
            queue=queue,
            key=key,
            priority=priority,
            debounce=debounce,
            timeout=timeout,
            delay=delay,
            start_at=start_at,
        )
        return Run(self, run.id)

    @overload
    async def execute(
        self,
        workflow: WorkflowDef[None, T],
        id: str,
        input: None = None,
        *,
        id_policy: IdPolicy = ...,
    ) -> T: ...
    @overload
    async def execute(
        self, workflow: WorkflowDef[I, T], id: str, input: I, *, id_policy: IdPolicy = ...
    ) -> T: ...
    @overload
    async def execute(
        self, workflow: str, id: str, input: Any = None, *, id_policy: IdPolicy = ...
    ) -> Any: ...

    async def execute(
        self,
        workflow: WorkflowDef[Any, Any] | str,
        id: str,
        input: Any = None,
        *,
        id_policy: IdPolicy = IdPolicy.REJECT,
    ) -> Any:
        """`Engine.execute`, skipping idle time."""
        run = await self.start(workflow, id, input, id_policy=id_policy)
        return await run.result()

    def get(self, id: str) -> Run[Any]:
        """`Engine.get`; the handle stays valid across crashes."""
        return Run(self, self.engine.get(id).id)

    def list(self, **filters: Any) -> AsyncIterator[RunInfo]:
        """`Engine.list`."""
        return self.engine.list(**filters)

    async def queue_stats(self) -> builtins.list[QueueStats]:
        """`Engine.queue_stats`."""
        return await self.engine.queue_stats()

    async def complete(self, token: str, value: Any = None) -> None:
        """`Engine.complete`."""
        await self.engine.complete(token, value)

    @property
    def schedules(self) -> Scheduler:
        """`Engine.schedules` of the current life: pause, resume, trigger, list."""
        return self.engine.schedules

    def is_loaded(self, id: str) -> bool:
        """Whether run ``id`` is in memory now (False: parked, ended or unknown).

        Example:
            >>> TestEngine().is_loaded  # doctest: +ELLIPSIS
            <bound method TestEngine.is_loaded ...>
        """
        return self.engine.runs.loaded(id) is not None

    # --- what Run handles call: routed to the engine of the current life ------------------

    def _current(self) -> Engine:
        if self._engine is None:
            raise FuseeError(
                "this TestEngine is closed; use run handles inside `async with TestEngine(...)`, "
                "or reopen its store: TestEngine(workflows, store=t.store)"
            )
        return self._engine

    async def _result(self, id: str) -> Any:
        awaited = _awaited.set(id)
        try:
            return await self._current()._result(id)
        finally:
            _awaited.reset(awaited)
            self._raise_watchdog_report()

    def _raise_watchdog_report(self) -> None:
        """Raises `fusee.WatchdogError` for the first report not raised yet."""
        reports = self._watchdog_reports
        if len(reports) > self._reported:
            report = reports[self._reported]
            self._reported = len(reports)
            raise WatchdogError(
                "the watchdog caught workflow code blocking the engine's loop "
                f"(TestEngine(watchdog=...) sets its limit): {report}"
            )

    async def _signal(
        self, id: str, name: str, payload: bytes, dedup: int, by: bytes | None
    ) -> None:
        await self._current()._signal(id, name, payload, dedup, by)

    async def _query(self, id: str, name: str, arg: bytes) -> Any:
        return await self._current()._query(id, name, arg)

    async def _update(self, id: str, name: str, update_id: str | None, payload: bytes) -> Any:
        return await self._current()._update(id, name, update_id, payload)

    async def _cancel(self, id: str, reason: str) -> None:
        await self._current()._cancel(id, reason)

    async def _resume(self, id: str) -> None:
        await self._current()._resume(id)

    async def _delete(self, id: str) -> None:
        await self._current()._delete(id)

    async def _start_now(self, id: str) -> None:
        await self._current()._start_now(id)

    def _stream(self, id: str, name: str) -> AsyncIterator[Any]:
        return self._current()._stream(id, name)

    async def _get_event(self, id: str, key: EventDef[Any], timeout_s: float | None) -> Any:
        return await self._current()._get_event(id, key, timeout_s)

    async def _describe(self, id: str) -> RunInfo:
        return await self._current()._describe(id)

    async def _fork(self, id: str, new_id: str, at: int | str, input: bytes | None) -> None:
        await self._current()._fork(id, new_id, at, input)

    # --- time, crashes, mocks ---------------------------------------------------------------

    def mock_step(
        self, workflow: WorkflowDef[Any, Any] | str, step: str, fn: Callable[..., Any]
    ) -> None:
        """Runs ``fn`` instead of step ``step`` of ``workflow`` (sync or async).

        The step's name is checked against the workflow's code: the names its
        function (and the helper functions it passes its ``ctx`` to) give
        ``ctx.step`` and ``ctx.await_completion`` as string literals. When
        that cannot list every name (the source is not available, a name is
        computed, or ``ctx`` goes where the code cannot be followed), any
        name is accepted.

        Args:
            workflow: The workflow (a `fusee.WorkflowDef` of this engine's
                workflows, or its name).
            step: The step's name.
            fn: What to run instead, taking the `fusee.StepCtx` or nothing.

        Raises:
            UnknownWorkflow: ``workflow`` is not one of this engine's workflows.
            ValueError: The workflow's code has no step named ``step``.

        Example:
            >>> import fusee
            >>> @fusee.workflow("checkout")
            ... async def checkout(ctx: fusee.Ctx) -> str:
            ...     return await ctx.step("charge", lambda: "ch_live")
            >>> t = TestEngine(workflows=[checkout])
            >>> t.mock_step(checkout, "charge", lambda: "ch_test")
            >>> t.mock_step(checkout, "refund", lambda: None)
            Traceback (most recent call last):
            ...
            ValueError: workflow 'checkout' has no step named 'refund'; its steps are 'charge'
        """
        name = workflow if isinstance(workflow, str) else workflow.name
        defs = [w for w in self.workflows if w.name == name]
        if not defs:
            known = ", ".join(repr(w.name) for w in self.workflows) or "none"
            raise UnknownWorkflow(
                f"workflow {name!r} is not one of this TestEngine's workflows ({known}); "
                "pass it in TestEngine(workflows=[...]) before mocking its steps"
            )
        found = [_step_names(w.fn) for w in defs]
        if all(names is not None for names in found):
            known_steps = sorted(set().union(*(n for n in found if n is not None)))
            if step not in known_steps:
                listed = ", ".join(repr(n) for n in known_steps)
                steps = f"its steps are {listed}" if known_steps else "its code names no step"
                raise ValueError(f"workflow {name!r} has no step named {step!r}; {steps}")
        self._mocks[(name, step)] = fn

    async def settle(self) -> None:
        """Returns once the engine has nothing left to do at the current virtual time.

        Running step functions do not hold it for long: each gets up to
        ``step_grace`` of real time (counted from the engine's last progress)
        to return; one still running after that is left running, and its
        result reaches the run on a later `settle`, `advance` or ``result()``.
        A step that waits for the test (an event it sets later) or for
        virtual time therefore never deadlocks the test.

        Raises:
            WatchdogError: Workflow code blocked the loop longer than the
                watchdog's limit since the last check.

        Example:
            >>> async def test(t: TestEngine) -> None:
            ...     await t.settle()
        """
        await self._settle(threads=False)

    async def _settle(self, *, threads: bool) -> None:
        # threads: also wait for step attempts bounded on the virtual clock
        # that run in a worker thread (a result() does; advance() does not).
        engine = self.engine
        loop = asyncio.get_running_loop()
        quiet = 0
        grace_ends: float | None = None
        while quiet < 3:
            before = _progress(engine)
            for _ in range(4):
                await asyncio.sleep(0)
            # Engine tasks (waking a parked run, starting a child) read the
            # store, which for SQLite happens on a thread: busy too, or a
            # settle could return while one is still on its way.
            # During a store outage the writes, and the engine tasks waiting
            # for them, wait for a retry on the virtual clock: only advance()
            # or a result() moves it. An attempt in flight is work, though.
            outage = engine.committer.backing_off
            internal = (
                (not engine.committer.idle and engine.committer.failed is None and not outage)
                or (engine.tasks_in_flight > 0 and not outage)
                or _reading(engine.store)
                or (threads and engine.steps.bounded_threads > 0)
            )
            stepping = engine.hooks.busy_steps > 0
            if internal or stepping:
                if not internal and grace_ends is not None and loop.time() >= grace_ends:
                    # Nothing but step functions past their grace is left.
                    break
                # A step function runs in a worker thread: give it real time.
                await asyncio.sleep(0.001)
            after = _progress(engine)
            if before != after or grace_ends is None:
                grace_ends = loop.time() + self._step_grace_s
            quiet = quiet + 1 if (before == after and not internal and not stepping) else 0
        self._raise_watchdog_report()

    async def advance(self, duration: Any) -> None:
        """Moves the virtual clock forward by ``duration``, firing each timer at its time.

        Example:
            >>> async def test(t: TestEngine) -> None:
            ...     await t.advance("1h30m")
        """
        target = self.clock.now_ms() + round(parse_duration(duration) * 1000)
        await self.settle()
        while True:
            nxt = self.clock.next_at()
            if nxt is None or nxt > target:
                break
            self.clock.advance_to(nxt)
            await self.settle()
        self.clock.advance_to(target)
        await self.settle()

    async def _wait_skipping(self, fut: asyncio.Future[Any]) -> None:
        idle = 0
        while not fut.done():
            await self._settle(threads=True)
            if fut.done():
                return
            paused = await self._paused_error()
            if paused is not None:
                # Every waiter is told with `if not fut.done()`: a cancelled
                # one is skipped when the run moves on after all.
                fut.cancel()
                raise paused
            nxt = self.clock.next_at()
            bound = self._give_up_at_ms
            if bound is not None and (nxt is None or nxt > bound):
                idle += 1
                if idle > _STALL_ROUNDS:
                    fut.cancel()
                    raise _Stalled(await _waiting_runs(self.engine))
            if nxt is None or (bound is not None and nxt > bound):
                # Nothing will happen on its own: only the test can move the run.
                await asyncio.wait([fut], timeout=0.005)
            else:
                idle = 0
                self.clock.advance_to(nxt)

    async def _paused_error(self) -> RunPaused | None:
        """`fusee.RunPaused` for the run this task awaits, if it is paused and may not wait."""
        id = _awaited.get()
        if self.on_pause == "wait" or id is None:
            return None
        engine = self.engine
        # A parked run is loaded before its result is awaited (`Engine._result`).
        state = engine.runs.loaded(id)
        if state is not None and state.driver.end is None and state.driver.bug is not None:
            return _bug_pause(id, state.driver.bug)
        if state is None or state.driver.end is not None or not state.driver.machine.is_paused():
            return None
        if state.due:
            # A timer of its own (a sleep or a wait's deadline in another
            # branch) may yet move it on: time skips to it first.
            return None
        return _pause_of(id, await engine.store.load(id, state.run))

    async def crash(self) -> None:
        """Loses everything but the store, then recovers as a restarted process would.

        Records not yet durable are lost; running steps are abandoned.
        """
        self.engine.abandon()
        for _ in range(3):
            await asyncio.sleep(0)
        await self.store.close()
        self.store = _reopened(self.store)
        self.crashes += 1
        await self._open()


# The Ctx methods whose first argument names a step function (what mocks replace).
_STEP_METHODS = frozenset({"step", "await_completion"})
# How deep `_step_names` follows ctx into helper functions.
_HELPER_DEPTH = 4


def _step_names(fn: Callable[..., Any]) -> set[str] | None:
    """The step names workflow function ``fn`` can call, or None if they cannot all be known.

    Read from the source: literal names given to ``ctx.step``/``ctx.await_completion``
    in ``fn`` (nested functions included) and in the functions ``fn`` passes its
    ctx to. None when a source is not available, a name is not a literal, or
    ctx goes anywhere else (stored, passed to something that is not a plain
    function): the names used there cannot be read.

    Example:
        >>> async def wf(ctx):
        ...     await ctx.step("a", lambda: 1)
        ...     await ctx.step(f"b-{1}", lambda: 1)
        >>> _step_names(wf) is None
        True
    """
    names: set[str] = set()
    params = _positional_params(fn)
    if not params:
        return None
    return names if _scan(fn, params[0], names, set(), 0) else None


def _positional_params(fn: Callable[..., Any]) -> list[str]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in sig.parameters.values() if p.kind in kinds]


def _function_node(fn: Callable[..., Any]) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == fn.__name__:
            return node
    return None


def _scan(fn: Callable[..., Any], ctx: str, names: set[str], seen: set[object], depth: int) -> bool:
    """Adds the step names ``fn`` gives its parameter ``ctx``; False when it cannot tell."""
    fn = inspect.unwrap(fn)
    key = (getattr(fn, "__code__", fn), ctx)
    if key in seen:
        return True
    seen.add(key)
    node = _function_node(fn)
    if node is None or depth > _HELPER_DEPTH:
        return False
    handled: set[int] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and _is_name(sub.value, ctx):
            handled.add(id(sub.value))
        if not isinstance(sub, ast.Call):
            continue
        func = sub.func
        if isinstance(func, ast.Attribute) and _is_name(func.value, ctx):
            if func.attr in _STEP_METHODS:
                first = sub.args[0] if sub.args else _keyword(sub, "name")
                if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                    return False
                names.add(first.value)
            continue
        passed: list[tuple[int | None, str | None]] = [
            (i, None) for i, a in enumerate(sub.args) if _is_name(a, ctx)
        ]
        passed += [(None, k.arg) for k in sub.keywords if _is_name(k.value, ctx)]
        if not passed:
            continue
        helper = _resolve(fn, func)
        if helper is None:
            return False
        params = _positional_params(helper)
        for index, keyword in passed:
            if keyword is None and (index is None or index >= len(params)):
                return False
            param = keyword if keyword is not None else params[index or 0]
            if not _scan(helper, param, names, seen, depth + 1):
                return False
        for a in [*sub.args, *(k.value for k in sub.keywords)]:
            if _is_name(a, ctx):
                handled.add(id(a))
    # Any other use of ctx (stored, returned, starred) goes where it cannot be followed.
    return all(
        id(sub) in handled
        for sub in ast.walk(node)
        if isinstance(sub, ast.Name) and sub.id == ctx and isinstance(sub.ctx, ast.Load)
    )


def _is_name(node: ast.AST | None, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _resolve(fn: Callable[..., Any], func: ast.expr) -> Callable[..., Any] | None:
    """The plain function a call's ``func`` names in ``fn``'s scope, or None."""
    parts: list[str] = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    try:
        scope = {**getattr(fn, "__globals__", {}), **inspect.getclosurevars(fn).nonlocals}
    except (TypeError, ValueError):
        return None
    obj = scope.get(func.id)
    for attr in reversed(parts):
        obj = getattr(obj, attr, None)
    obj = inspect.unwrap(obj) if callable(obj) else None
    return obj if inspect.isfunction(obj) else None


def _progress(engine: Engine) -> tuple[int, int, int, int]:
    """What changes whenever the engine does something (settle compares it)."""
    c = engine.committer
    return (c.lsn, c.durable_lsn, engine.tasks_in_flight, engine.hooks.busy_steps)


def _reading(store: Store) -> bool:
    """Whether ``store`` has a read under way on a thread of its own (`SqliteStore.reading`).

    A caller outside the engine's tasks (a signal or update from the test
    that loads a parked run) waits for it: the test's clock must not run on
    while the read takes real time.
    """
    return bool(getattr(store, "reading", False))


def _reopened(store: Store) -> Store:
    """The store a restarted process would open: an SQLite directory gets a new object."""
    if isinstance(store, SqliteStore):
        return SqliteStore(store.path.parent, durability=store._durability)
    # The memory store outlives the crash as the object itself (it is the "disk").
    return store


def _bug_pause(id: str, traceback: str) -> RunPaused:
    """`fusee.RunPaused` for a run a bug in its code paused: its last traceback line says what.

    Example:
        >>> _bug_pause("o-1", "KeyError: 'sku'").error
        "KeyError: 'sku'"
    """
    lines = [line for line in traceback.strip().splitlines() if line.strip()]
    return RunPaused(id, "(its workflow code)", 1, lines[-1] if lines else "an error")


def _pause_of(id: str, journal: Iterable[tuple[int, bytes]]) -> RunPaused | None:
    """`fusee.RunPaused` for the step of ``journal`` paused last, or None if none is paused.

    Example:
        >>> _pause_of("order-1", []) is None
        True
    """
    paused: dict[int, Attempt] = {}
    for _, data in journal:
        rec = decode(data)
        if isinstance(rec, Attempt) and rec.retry_at_ms == PAUSED:
            paused[rec.seq] = rec
        elif isinstance(rec, Attempt | Resume | Step):
            paused.pop(rec.seq, None)
    if not paused:
        return None
    last = next(reversed(paused.values()))
    error_type, message = _error_of(last.error)
    return RunPaused(id, last.name, last.attempt, f"{error_type}: {message}")


# Rounds of 5 ms `_wait_skipping` gives a task of the test (not the engine)
# to move a run that nothing in the engine will move, before it gives up.
_STALL_ROUNDS = 20


class _Stalled(AssertionError):
    """The awaited run cannot end within `crash_everywhere`'s bound of virtual time."""


async def _waiting_runs(engine: Engine) -> str:
    """The unfinished runs of ``engine``'s store, and what each loaded one waits for."""
    parts = []
    for row in sorted(await engine.store.unfinished(), key=lambda r: r.id):
        state = engine.runs.loaded(row.id)
        what = ""
        if state is not None and state.waits:
            what = ", waiting for signal " + ", ".join(repr(n) for n in state.waits.values())
        parts.append(f"{row.id!r} ({row.status}{what})")
    return "it did not end; runs still waiting: " + ("; ".join(parts) or "none")


class _CrashAfter(Unrecoverable):
    """A simulated crash: the process is gone, so the engine does not retry the write."""


def _caused_by_simulated_crash(error: BaseException | None) -> bool:
    """Whether ``error`` is, or was caused by, a crash `crash_everywhere` simulates.

    The pytest plugin's error check lets these pass: they are expected.

    Example:
        >>> _caused_by_simulated_crash(ValueError("boom"))
        False
    """
    todo = [error] if error is not None else []
    seen: set[int] = set()
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, _CrashAfter):
            return True
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        todo.extend(c for c in (e.__cause__, e.__context__) if c is not None)
    return False


def _is_simulated_crash(record: logging.LogRecord) -> bool:
    """Whether log ``record`` reports a simulated crash (in its exception or its args)."""
    if record.exc_info and _caused_by_simulated_crash(record.exc_info[1]):
        return True
    args = record.args if isinstance(record.args, tuple) else ()
    return any(isinstance(a, BaseException) and _caused_by_simulated_crash(a) for a in args)


class _SimulatedCrashFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _is_simulated_crash(record)


@contextlib.contextmanager
def _quiet_simulated_crashes() -> Iterator[None]:
    """Drops the log records of `crash_everywhere`'s simulated crashes, and only those.

    The engine logs a store failure at ERROR, as it should for a real one;
    the crashes crash_everywhere makes on purpose would read as failures.
    """
    loggers = [logging.getLogger("fusee"), logging.getLogger("asyncio")]
    quiet = _SimulatedCrashFilter()
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)


class _LoggingStore(MemoryStore):
    """A memory store that also keeps every record in log order."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[Entry] = []

    async def append(
        self,
        entries: Sequence[Entry],
        runs: Sequence[RunRow] = (),
        *,
        items: Sequence[QueueItem] = (),
        forget: Sequence[int] = (),
    ) -> None:
        await super().append(entries, runs, items=items, forget=forget)
        self.log.extend(entries)

    def record_count(self) -> int:
        return len(self.log)


class _CrashingStore(_LoggingStore):
    """A memory store that keeps only its first ``keep`` records, then fails once."""

    def __init__(self, keep: int) -> None:
        super().__init__()
        self.keep = keep
        self.armed = True

    async def append(
        self,
        entries: Sequence[Entry],
        runs: Sequence[RunRow] = (),
        *,
        items: Sequence[QueueItem] = (),
        forget: Sequence[int] = (),
    ) -> None:
        if self.armed:
            room = self.keep - self.record_count()
            if room < len(entries):
                self.armed = False
                if room > 0:
                    kept, lost = entries[:room], entries[room:]
                    # A queue item's change goes with its run's records (an
                    # admission with its `Start`, a freed slot with its
                    # `Done`): kept where they are all kept, as rows are.
                    lost_ids = {e.id for e in lost}
                    before = {id: await self.get(id) for id in lost_ids}
                    await super().append(
                        kept,
                        _rows_of_prefix(kept, lost, runs, before),
                        items=[i for i in items if i.id not in lost_ids],
                        forget=forget,
                    )
                raise _CrashAfter(f"simulated crash after record {self.keep}")
        await super().append(entries, runs, items=items, forget=forget)


def _rows_of_prefix(
    kept: Sequence[Entry],
    lost: Sequence[Entry],
    runs: Sequence[RunRow],
    before: Mapping[str, RunRow | None],
) -> list[RunRow]:
    """The rows a crash after ``kept`` leaves, as if each run's records and row were one write.

    A run whose records in the batch are all kept keeps its row. A run with
    records kept and records lost is in the middle of what the batch
    records: its row says "running", whatever it said before (``before``)
    or the batch would have made it say, so that recovery loads it and
    goes on from its journal. A real store writes a batch whole; this
    prefix is no state it can be in, and "running" is the one row under
    which the kept records act (a "suspended" row would hide what they
    owe other runs; an ended one, an end not recorded).
    """
    lost_ids = {e.id for e in lost}
    rows = [row for row in runs if row.id not in lost_ids]
    have = {row.id for row in rows}
    batch_rows = {row.id: row for row in runs}
    for e in kept:
        if e.id not in lost_ids or e.id in have:
            continue
        row = batch_rows.get(e.id) or before.get(e.id)
        if row is None:
            rec = decode(e.data)
            if not isinstance(rec, Start):
                continue
            row = RunRow(rec.id, rec.run, rec.wtype, "running", rec.started_ms)
        rows.append(dataclasses.replace(row, status="running", finished_ms=None, wake_ms=None))
        have.add(e.id)
    return rows


async def crash_everywhere(
    workflow: WorkflowDef[Any, T],
    input: Any = None,
    *,
    workflows: Iterable[WorkflowDef[Any, Any]] = (),
    id: str = "crash-everywhere",
    mocks: Mapping[tuple[str, str], Callable[..., Any]] | None = None,
    drive: Callable[[TestEngine, Run[T]], Awaitable[None]] | None = None,
    within: Any = "30d",
    engine_options: Mapping[str, Any] | None = None,
) -> T:
    """Runs ``workflow`` once, then once per record position, crashing after that record.

    Each crashed run recovers and must end with the same result (a value, an
    error, or `fusee.Cancelled` for a cancelled run), and no step whose result
    was durable before the crash may run again. The engine's log records of
    these simulated crashes are dropped (they are expected); every other
    record is logged as usual.

    Args:
        workflow: The workflow under test.
        input: Its input.
        workflows: Other workflows it needs (children).
        id: The run's id.
        mocks: Step mocks, as for `TestEngine.mock_step`.
        drive: Called after each start and recovery (to send signals; give
            them dedup ids so a signal sent twice counts once).
        within: How much virtual time each run may take to end. A run still
            waiting then, or waiting for something nothing left will send (a
            message a crash lost), fails the test.
        engine_options: More `TestEngine` arguments for every engine
            (``codecs=``, ``blobs=``, ``max_payload=``, ...).

    Returns:
        The result, equal in every run.

    Raises:
        AssertionError: A crashed run ended differently, ran a durable step
            again, or did not end (naming the crash position and the runs
            still waiting).

    Example:
        >>> import asyncio, fusee
        >>> @fusee.workflow("two")
        ... async def two(ctx) -> int:
        ...     a = await ctx.step("a", lambda: 1)
        ...     return a + await ctx.step("b", lambda: 1)
        >>> asyncio.run(crash_everywhere(two))
        2
    """
    all_workflows = [workflow, *[w for w in workflows if w is not workflow]]
    within_ms = round(parse_duration(within) * 1000)

    async def once(store: _LoggingStore) -> tuple[Any, int, TestEngine]:
        t = TestEngine(all_workflows, store, **(engine_options or {}))
        t._give_up_at_ms = t.clock.now_ms() + within_ms
        for (w, s), fn in (mocks or {}).items():
            t.mock_step(w, s, fn)
        async with t:
            while True:
                try:
                    # ATTACH: after a crash the start may or may not be durable.
                    run = await t.start(workflow, id, input, id_policy=IdPolicy.ATTACH)
                    if drive is not None:
                        await _drive_again(drive, t, run)
                    break
                except Exception:
                    if not isinstance(t.engine.committer.failed, _CrashAfter):
                        raise
                    await t.crash()
            outcome = await _outcome(t, run, drive)
            return outcome, store.record_count(), t

    with _quiet_simulated_crashes():
        result: T = await _crash_passes(once)
    return result


async def _crash_passes(
    once: Callable[[_LoggingStore], Awaitable[tuple[Any, int, TestEngine]]],
) -> Any:
    try:
        expected, total, _ = await once(_LoggingStore())
    except _Stalled as e:
        raise AssertionError(f"without a crash: {e}") from None
    for keep in range(1, total):
        store = _CrashingStore(keep)
        try:
            got, _, t = await once(store)
        except _Stalled as e:
            raise AssertionError(f"crashing after record {keep} of {total}: {e}") from None
        if got != expected:
            raise AssertionError(
                f"crashing after record {keep} of {total} changed the outcome: "
                f"{got!r} instead of {expected!r}"
            )
        _check_no_durable_step_ran_again(t, store, keep)
    if isinstance(expected, _Raised):
        raise expected.error
    return expected


class _Raised:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Raised)
            and type(other.error) is type(self.error)
            and str(other.error) == str(self.error)
        )

    def __repr__(self) -> str:
        return f"raised {type(self.error).__name__}: {self.error}"


async def _outcome(
    t: TestEngine, run: Run[Any], drive: Callable[[TestEngine, Run[Any]], Awaitable[None]] | None
) -> Any:
    while True:
        try:
            return await run.result()
        except _Stalled:
            raise
        # A cancelled run's end (fusee.Cancelled is a BaseException) is an
        # outcome too; asyncio's own CancelledError cancels the test instead.
        except (Exception, Cancelled) as e:
            if not isinstance(t.engine.committer.failed, _CrashAfter):
                return _Raised(e)
        # The simulated crash happened: recover and go on.
        await t.crash()
        if drive is not None:
            try:
                await _drive_again(drive, t, run)
            except Exception:
                if not isinstance(t.engine.committer.failed, _CrashAfter):
                    raise


async def _drive_again(
    drive: Callable[[TestEngine, Run[Any]], Awaitable[None]], t: TestEngine, run: Run[Any]
) -> None:
    try:
        await drive(t, run)
    except RunFinished:
        # Recovered at (or past) its end: what drive sends again, with its
        # dedup ids, had reached the run before the crash.
        return


def _check_no_durable_step_ran_again(t: TestEngine, store: _LoggingStore, keep: int) -> None:
    durable: set[tuple[str, int, int]] = set()
    for entry in store.log[:keep]:
        rec = decode(entry.data)
        if isinstance(rec, Step):
            durable.add((entry.id, entry.run, rec.seq))
    again = [key for life, key in t.step_log if life > 0 and key in durable]
    if again:
        raise AssertionError(
            f"crashing after record {keep}: steps whose results were durable ran again: {again}"
        )
