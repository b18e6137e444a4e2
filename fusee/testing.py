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

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

from fusee._durations import parse_duration
from fusee.engine._clock import VirtualClock
from fusee.engine._engine import Engine
from fusee.engine._hooks import Hooks
from fusee.engine._run import IdPolicy, Run, RunInfo
from fusee.errors import FuseeError, StoreError
from fusee.record import Step, decode
from fusee.store import Entry, RunRow, Store
from fusee.store.memory import MemoryStore
from fusee.store.sqlite import SqliteStore

if TYPE_CHECKING:
    from types import TracebackType

    from fusee._definitions import WorkflowDef

__all__ = ["TestEngine", "crash_everywhere"]

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741 - a workflow's input type


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
    ) -> None:
        self.workflows = list(workflows)
        self.store: Store = store if store is not None else MemoryStore()
        self.clock = VirtualClock(start_ms)
        self._profile = profile
        self._park_after = park_after
        self._engine: Engine | None = None
        self._mocks: dict[tuple[str, str], Callable[..., Any]] = {}
        self.crashes = 0
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
        )
        engine = Engine(
            self.store,
            self.workflows,
            park_after=self._park_after,
            clock=self.clock,
            profile=self._profile,
            watchdog=None,
            hooks=hooks,
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
    ) -> Run[T]: ...
    @overload
    async def start(
        self, workflow: WorkflowDef[I, T], id: str, input: I, *, id_policy: IdPolicy = ...
    ) -> Run[T]: ...
    @overload
    async def start(
        self, workflow: str, id: str, input: Any = None, *, id_policy: IdPolicy = ...
    ) -> Run[Any]: ...

    async def start(
        self,
        workflow: WorkflowDef[Any, Any] | str,
        id: str,
        input: Any = None,
        *,
        id_policy: IdPolicy = IdPolicy.REJECT,
    ) -> Run[Any]:
        """`Engine.start`; the handle stays valid across crashes."""
        run = await self.engine.start(workflow, id, input, id_policy=id_policy)
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

    async def complete(self, token: str, value: Any = None) -> None:
        """`Engine.complete`."""
        await self.engine.complete(token, value)

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
        return await self._current()._result(id)

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

    def _stream(self, id: str, name: str) -> AsyncIterator[Any]:
        return self._current()._stream(id, name)

    async def _describe(self, id: str) -> RunInfo:
        return await self._current()._describe(id)

    # --- time, crashes, mocks ---------------------------------------------------------------

    def mock_step(self, workflow: str, step: str, fn: Callable[..., Any]) -> None:
        """Runs ``fn`` instead of step ``step`` of workflow ``workflow`` (sync or async).

        Example:
            >>> t = TestEngine()
            >>> t.mock_step("checkout", "charge", lambda: "ch_test")
        """
        self._mocks[(workflow, step)] = fn

    async def settle(self) -> None:
        """Returns once the engine has nothing left to do at the current virtual time."""
        await self._settle(threads=False)

    async def _settle(self, *, threads: bool) -> None:
        # threads: also wait for step attempts bounded on the virtual clock
        # that run in a worker thread (a result() does; advance() does not).
        engine = self.engine
        quiet = 0
        while quiet < 3:
            before = (engine.committer.lsn, engine.committer.durable_lsn, engine.tasks_in_flight)
            for _ in range(4):
                await asyncio.sleep(0)
            # Engine tasks (waking a parked run, starting a child) read the
            # store, which for SQLite happens on a thread: busy too, or a
            # settle could return while one is still on its way.
            busy = (
                engine.hooks.busy_steps > 0
                or (threads and engine.steps.bounded_threads > 0)
                or (not engine.committer.idle and engine.committer.failed is None)
                or engine.tasks_in_flight > 0
            )
            if busy:
                # A step function runs in a worker thread: give it real time.
                await asyncio.sleep(0.001)
            after = (engine.committer.lsn, engine.committer.durable_lsn, engine.tasks_in_flight)
            quiet = quiet + 1 if (before == after and not busy) else 0

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
        while not fut.done():
            await self._settle(threads=True)
            if fut.done():
                return
            nxt = self.clock.next_at()
            if nxt is None:
                # Nothing will happen on its own: only the test can move the run.
                await asyncio.wait([fut], timeout=0.005)
            else:
                self.clock.advance_to(nxt)

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


def _reopened(store: Store) -> Store:
    """The store a restarted process would open: an SQLite directory gets a new object."""
    if isinstance(store, SqliteStore):
        return SqliteStore(store.path.parent, durability=store._durability)
    # The memory store outlives the crash as the object itself (it is the "disk").
    return store


class _CrashAfter(StoreError):
    pass


class _LoggingStore(MemoryStore):
    """A memory store that also keeps every record in log order."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[Entry] = []

    async def append(self, entries: Sequence[Entry], runs: Sequence[RunRow] = ()) -> None:
        await super().append(entries, runs)
        self.log.extend(entries)

    def record_count(self) -> int:
        return len(self.log)


class _CrashingStore(_LoggingStore):
    """A memory store that keeps only its first ``keep`` records, then fails once."""

    def __init__(self, keep: int) -> None:
        super().__init__()
        self.keep = keep
        self.armed = True

    async def append(self, entries: Sequence[Entry], runs: Sequence[RunRow] = ()) -> None:
        if self.armed:
            room = self.keep - self.record_count()
            if room < len(entries):
                self.armed = False
                if room > 0:
                    await super().append(entries[:room], ())
                raise _CrashAfter(f"simulated crash after record {self.keep}")
        await super().append(entries, runs)


async def crash_everywhere(
    workflow: WorkflowDef[Any, T],
    input: Any = None,
    *,
    workflows: Iterable[WorkflowDef[Any, Any]] = (),
    id: str = "crash-everywhere",
    mocks: Mapping[tuple[str, str], Callable[..., Any]] | None = None,
    drive: Callable[[TestEngine, Run[T]], Awaitable[None]] | None = None,
) -> T:
    """Runs ``workflow`` once, then once per record position, crashing after that record.

    Each crashed run recovers and must end with the same result, and no step
    whose result was durable before the crash may run again.

    Args:
        workflow: The workflow under test.
        input: Its input.
        workflows: Other workflows it needs (children).
        id: The run's id.
        mocks: Step mocks, as for `TestEngine.mock_step`.
        drive: Called after each start and recovery (to send signals; give
            them dedup ids so a signal sent twice counts once).

    Returns:
        The result, equal in every run.

    Raises:
        AssertionError: A crashed run ended differently or ran a durable step again.

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

    async def once(store: _LoggingStore) -> tuple[Any, int, TestEngine]:
        t = TestEngine(all_workflows, store)
        for (w, s), fn in (mocks or {}).items():
            t.mock_step(w, s, fn)
        async with t:
            while True:
                try:
                    # ATTACH: after a crash the start may or may not be durable.
                    run = await t.start(workflow, id, input, id_policy=IdPolicy.ATTACH)
                    if drive is not None:
                        await drive(t, run)
                    break
                except Exception:
                    if not isinstance(t.engine.committer.failed, _CrashAfter):
                        raise
                    await t.crash()
            outcome = await _outcome(t, run, drive)
            return outcome, store.record_count(), t

    expected, total, _ = await once(_LoggingStore())
    for keep in range(1, total):
        store = _CrashingStore(keep)
        got, _, t = await once(store)
        if got != expected:
            raise AssertionError(
                f"crashing after record {keep} of {total} changed the outcome: "
                f"{got!r} instead of {expected!r}"
            )
        _check_no_durable_step_ran_again(t, store, keep)
    if isinstance(expected, _Raised):
        raise expected.error
    return expected  # type: ignore[no-any-return]


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
        except Exception as e:
            if not isinstance(t.engine.committer.failed, _CrashAfter):
                return _Raised(e)
        # The simulated crash happened: recover and go on.
        await t.crash()
        if drive is not None:
            try:
                await drive(t, run)
            except Exception:
                if not isinstance(t.engine.committer.failed, _CrashAfter):
                    raise


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
