"""The test engine: `TestEngine`, the engine on a virtual clock, with crashes and mocks.

Time stands still until the test moves it (`TestEngine.advance`) or awaits
a run's result: then idle time skips to the next timer (`_wait_skipping`).
"""

from __future__ import annotations

import asyncio
import builtins
import contextvars
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal

from fusee._driver import _error_of
from fusee._durations import parse_duration
from fusee._payloads import DEFAULT_MAX_PAYLOAD, DEFAULT_OFFLOAD_OVER, DEFAULT_WARN_RECORDS
from fusee.engine import Engine
from fusee.engine._clock import VirtualClock
from fusee.engine._hooks import Hooks
from fusee.engine._run import Run, RunInfo
from fusee.engine._schedules import check_schedules
from fusee.engine._starts import Executes, StartOptions
from fusee.errors import FuseeError, RunPaused, UnknownWorkflow, WatchdogError
from fusee.record import PAUSED, Attempt, Resume, Step, decode
from fusee.remote._versions import check_version
from fusee.store import Store
from fusee.store.memory import MemoryStore
from fusee.store.sqlite import SqliteStore
from fusee.testing._step_names import _step_names

if TYPE_CHECKING:
    from types import TracebackType

    from fusee._definitions import WorkflowDef
    from fusee._events import EventDef
    from fusee._queue import Queue, QueueStats
    from fusee._schedule import Schedule
    from fusee.blobs import BlobStore
    from fusee.codecs import PayloadCodec
    from fusee.engine._schedules import Scheduler

__all__ = ["TestEngine"]

# The run whose result the current task awaits: the wait that skips idle
# time reads it to tell a paused run from one that waits for the test.
_awaited: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "fusee_testing_awaited", default=None
)


class TestEngine(Executes):
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
        version: Its engines' version, as `fusee.Engine.open`'s (None:
            derived from the workflows' source). A second `TestEngine` on the
            same store with another version is a deploy.

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
        version: str | None = None,
    ) -> None:
        if on_pause not in ("raise", "wait"):
            raise ValueError(f'on_pause must be "raise" or "wait", not {on_pause!r}')
        self.on_pause = on_pause
        self.on_error = on_error
        self._version = check_version(version) if version is not None else None
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
            version=self._version,
        )
        self._engine = engine
        await engine.recover()

    # --- the Engine API, on the current engine ---------------------------------------------

    async def _start(
        self,
        workflow: WorkflowDef[Any, Any] | str,
        id: str,
        input: Any,
        options: StartOptions,
    ) -> Run[Any]:
        """`Engine.start`; the handle stays valid across crashes."""
        run = await self.engine._start(workflow, id, input, options)
        return Run(self, run.id)

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
