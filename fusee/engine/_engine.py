"""The embedded engine: hosts runs, makes their journals durable, runs their steps.

It appends records (group commit: one durable write covers every record
that arrived meanwhile), runs steps once their gate is durable, fires
timers, matches signals, starts children, parks idle runs and recovers after
a crash. Records are its instructions: a `Timer` arms a timer, a `Wait` a
signal wait, a `Child` starts a child, a `Send` sends a signal, a `Done`
ends the run.

The rule: what leaves the process (a step function's run, a result handed
to a caller, a signal sent, a child started) waits until the records it
depends on are durable; nothing else waits for the disk.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import enum
import functools
import hashlib
import logging
import os
import sys
import threading
import time
import traceback
import zlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from fusee import _codec
from fusee._driver import ReplayHost, RunDriver, StepCall
from fusee._durations import duration_ms, parse_duration
from fusee.context import StepCtx
from fusee.engine._clock import Clock, WallClock
from fusee.engine._commit import Committer
from fusee.engine._steps import eager_ok, run_eagerly, run_step
from fusee.errors import (
    AlreadyExists,
    Cancelled,
    CorruptRecord,
    DeterminismError,
    FuseeError,
    NotFound,
    StoreError,
    UnknownWorkflow,
    WorkflowFailed,
)
from fusee.machine import ChildCompleted, OpKind, SignalMatched, TimerFired, WaitTimedOut
from fusee.record import (
    DETACHED,
    Attributes,
    Cancel,
    Child,
    ChildDone,
    Chunk,
    Completed,
    Done,
    Fired,
    Parent,
    Record,
    Send,
    Signal,
    Start,
    Status,
    Step,
    StreamEnd,
    Timer,
    Wait,
    Waited,
    decode,
    encode,
)
from fusee.store import RunRow, Store, open_store

if TYPE_CHECKING:
    from types import TracebackType

    from fusee._definitions import QueryDef, SignalDef, UpdateDef, WorkflowDef
    from fusee.engine._clock import TimerHandle

__all__ = ["Engine", "IdPolicy", "Run", "RunInfo"]

log = logging.getLogger("fusee")

T = TypeVar("T")

_OK = Status.OK
_FAILED = Status.FAILED
_CANCELLED = Status.CANCELLED
_CONTINUED = Status.CONTINUED

_FINISHED = frozenset({"completed", "failed", "cancelled", "continued"})
_STATUS_OF_END = {
    _OK: "completed",
    _FAILED: "failed",
    _CANCELLED: "cancelled",
    Status.TIMED_OUT: "failed",
    _CONTINUED: "continued",
}


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


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What `Run.describe` and `Engine.list` tell about a run.

    Example:
        >>> RunInfo("order-1", 3, "checkout", "completed", None, None, {}, ()).status
        'completed'
    """

    id: str
    run: int
    workflow: str
    status: str
    """One of running, suspended, paused, completed, failed, cancelled, continued."""
    started_at: datetime.datetime | None
    finished_at: datetime.datetime | None
    attributes: Mapping[str, Any]
    paused_steps: tuple[str, ...]
    error: str | None = None
    """Why the run cannot go on (its code diverged from its journal), if so."""


def _time(ms: int | None) -> datetime.datetime | None:
    return None if ms is None else datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


def _dedup_key(dedup: str | None) -> int:
    if dedup is None:
        return 0
    # 63 bits so that 0 stays "no key".
    return (
        int.from_bytes(hashlib.blake2b(dedup.encode(), digest_size=8).digest(), "little") >> 1
    ) or 1


@dataclass(eq=False)
class _RunState:
    """A loaded run: its driver and what the host keeps beside it."""

    driver: RunDriver
    workflow: WorkflowDef[Any, Any]
    started_ms: int
    parent: Parent | None
    policy: int
    # Signals by ordinal, the ones consumed, and open waits by position.
    signals: list[tuple[str, bytes]] = field(default_factory=list)
    consumed: set[int] = field(default_factory=set)
    dedups: set[int] = field(default_factory=set)
    waits: dict[int, str] = field(default_factory=dict)
    attributes: dict[str, Any] = field(default_factory=dict)
    resumed: asyncio.Event = field(default_factory=asyncio.Event)
    park_handle: TimerHandle | None = None
    steps: set[asyncio.Task[None]] = field(default_factory=set)
    heartbeat_due: dict[int, bytes] = field(default_factory=dict)
    # Due times of the run's armed timers and wait deadlines, by position:
    # a parked run is woken at the earliest.
    due: dict[int, int] = field(default_factory=dict)
    records: list[Record] | None = None
    row_status: str = "running"
    # Its shard, found once: host callbacks run for every record and step.
    shard: _Shard | None = None
    # Whether this state is its run's loaded one (not parked, ended or
    # replaced): kept by `_Shard.add` and `_Shard.remove`, and asked several
    # times a step, so a flag rather than a lookup.
    loaded: bool = False

    # Callers of `Run.update` waiting for the handler's answer.
    updates: set[asyncio.Future[tuple[Status, bytes]]] = field(default_factory=set)

    @property
    def id(self) -> str:
        return self.driver.id

    @property
    def run(self) -> int:
        return self.driver.run


class Run(Generic[T]):
    """A handle on a run, by its id: valid across crashes, restarts and continue-as-new.

    Get one from `Engine.start` or `Engine.get`.

    Example:
        >>> async def main(engine: Engine) -> None:
        ...     run = engine.get("order-1")
        ...     print(await run.result())
    """

    __slots__ = ("_engine", "id")

    def __init__(self, engine: Engine, id: str) -> None:
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

    async def signal(
        self, signal: SignalDef[Any], payload: Any = None, *, dedup: str | None = None
    ) -> None:
        """Sends ``signal`` to the run; returns once the signal is durable.

        Args:
            signal: The signal definition.
            payload: Its payload.
            dedup: An id: a second signal with the same id is ignored.

        Raises:
            fusee.NotFound: No run has this id.
            fusee.FuseeError: The run has finished.
        """
        await self._engine._signal(
            self.id, signal.name, _codec.encode(payload), _dedup_key(dedup), None
        )

    async def query(self, query: QueryDef, arg: Any = None) -> Any:
        """Asks the run's query handler; works on parked and finished runs too."""
        return await self._engine._query(self.id, query.name, _codec.encode(arg))

    async def update(
        self, update: UpdateDef[Any], payload: Any = None, *, id: str | None = None
    ) -> Any:
        """Sends an update; returns the handler's result once it is durable.

        Raises:
            fusee.FuseeError: The validator rejected it or the handler raised.
        """
        return await self._engine._update(self.id, update.name, id, _codec.encode(payload))

    async def cancel(self, reason: str = "cancelled") -> None:
        """Cancels the run: every pending operation raises `fusee.Cancelled` in the code."""
        await self._engine._cancel(self.id, reason)

    async def resume(self) -> None:
        """Resumes the run's paused steps, each with a fresh retry budget."""
        await self._engine._resume(self.id)

    def stream(self, name: str) -> AsyncIterator[Any]:
        """Reads stream ``name`` from its start, live, until it ends."""
        return self._engine._stream(self.id, name)

    async def describe(self) -> RunInfo:
        """The run's status, times, attributes and paused steps."""
        return await self._engine._describe(self.id)


# Ended runs whose end `Run.result` answers from memory (`Engine._ends`).
_ENDS_KEPT = 1024

# What an `_Alarm` does when its time comes.
_TIMER, _DEADLINE, _WAKE = 0, 1, 2


class _Alarm:
    """A timer's callback: fires a run's timer or wait deadline, or wakes a parked run.

    Names the run by id and number, never by its state: it outlives parking
    and must not keep a parked run in memory. A slotted object rather than
    closures: a parked run keeps one per timer (W4 counts its bytes).
    """

    __slots__ = ("engine", "id", "kind", "run", "seq")

    def __init__(self, engine: Engine, id: str, run: int, seq: int, kind: int) -> None:
        self.engine = engine
        self.id = id
        self.run = run
        self.seq = seq
        self.kind = kind

    def __call__(self) -> None:
        engine, id, seq = self.engine, self.id, self.seq
        if engine._shard(id).timers.pop((id, seq), None) is None:
            return
        state = engine._loaded(id)
        if state is not None:
            state.due.pop(seq, None)
        if self.kind == _WAKE:
            engine._spawn(engine._wake(id))
        else:
            done = TimerFired() if self.kind == _TIMER else WaitTimedOut()
            engine._fire(id, self.run, seq, done)


class _EngineStepCtx(StepCtx):
    """The `StepCtx` the engine hands a step: its hooks are methods, not closures.

    One is made per attempt (a StepCtx of closures cost about a tenth of a
    trivial step's time).
    """

    __slots__ = ("_engine", "_seq", "_state")

    def __init__(
        self, engine: Engine, state: _RunState, seq: int, key: str, attempt: int, token: str | None
    ) -> None:
        self.key = key
        self.attempt = attempt
        self.token = token
        self._engine = engine
        self._state = state
        self._seq = seq

    @property
    def progress(self) -> Any:
        p = self._state.driver.machine.progress(self._seq)
        return None if p is None else _codec.decode(p)

    def heartbeat(self, progress: Any = None) -> None:
        data = _codec.encode(progress, name="the heartbeat's progress")
        engine = self._engine
        if threading.get_ident() == engine._thread_id:
            engine._heartbeat(self._state, self._seq, data)
        else:
            engine._loop.call_soon_threadsafe(engine._heartbeat, self._state, self._seq, data)

    def stream(self, name: str) -> _StepStream:
        return _StepStream(self._engine, self._state, self._seq, name)


class _Shard:
    """A share of the runs: its loaded runs and its timers."""

    __slots__ = ("runs", "timers")

    def add(self, state: _RunState) -> None:
        """Makes ``state`` its run's loaded one."""
        old = self.runs.get(state.id)
        if old is not None:
            old.loaded = False
        self.runs[state.id] = state
        state.loaded = True

    def remove(self, state: _RunState) -> None:
        """Unloads ``state`` if it is its run's loaded one."""
        if self.runs.get(state.id) is state:
            del self.runs[state.id]
        state.loaded = False

    def clear(self) -> None:
        """Unloads every run."""
        for state in self.runs.values():
            state.loaded = False
        self.runs.clear()

    def __init__(self) -> None:
        self.runs: dict[str, _RunState] = {}
        # (id, seq) -> handle; seq -1 is a parked run's wake-up.
        self.timers: dict[tuple[str, int], TimerHandle] = {}


class Engine:
    """The embedded durable execution engine.

    Open it with `Engine.open` and use it as an async context manager.

    Example:
        >>> import asyncio, fusee
        >>> @fusee.workflow("add")
        ... async def add(ctx, n: int) -> int:
        ...     return await ctx.step("plus-one", lambda: n + 1)
        >>> async def main() -> int:
        ...     async with await fusee.Engine.open("memory", workflows=[add]) as engine:
        ...         return await engine.execute(add, "add-1", 41)
        >>> asyncio.run(main())
        42
    """

    def __init__(
        self,
        store: Store,
        workflows: Iterable[WorkflowDef[Any, Any]],
        *,
        shards: int = 4,
        park_after: Any = "5s",
        clock: Clock | None = None,
        profile: str | None = None,
        watchdog: Any = "2s",
    ) -> None:
        self.store = store
        self.workflows: dict[str, WorkflowDef[Any, Any]] = {}
        for wf in workflows:
            if wf.name in self.workflows and self.workflows[wf.name] is not wf:
                raise ValueError(f"two workflows named '{wf.name}' were given to one engine")
            self.workflows[wf.name] = wf
        if type(shards) is not int or shards < 1:
            raise ValueError(f"shards must be an int >= 1, got {shards!r}")
        self.shards = [_Shard() for _ in range(shards)]
        self.park_after_ms = duration_ms(park_after)
        self.clock: Clock = clock if clock is not None else WallClock()
        profile = profile if profile is not None else os.environ.get("FUSEE_PROFILE")
        if profile not in (None, "", "dev", "prod"):
            raise ValueError(f"profile must be 'dev' or None, got {profile!r}")
        self.strict = profile == "dev"
        self.watchdog_s = parse_duration(watchdog) if watchdog is not None else None
        self.committer = Committer(store, on_fail=self._store_failed)
        self.mocks: dict[tuple[str, str], Callable[..., Any]] = {}
        self._results: dict[str, list[asyncio.Future[None]]] = {}
        self._loading: dict[str, asyncio.Future[_RunState | None]] = {}
        self._starting: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stuck: dict[str, DeterminismError] = {}
        # How the last runs to end ended: `Run.result` soon after the end
        # (a caller that started many runs, then asks each) reads no store.
        self._ends: collections.OrderedDict[str, tuple[WorkflowDef[Any, Any], Done]] = (
            collections.OrderedDict()
        )
        # Readers of a run's streams, woken when a chunk or end is durable.
        self._stream_events: dict[str, list[asyncio.Event]] = {}
        self._tokens = 0
        self._closed = False
        self._watchdog: _Watchdog | None = None
        self.watchdog_reports: list[str] = []
        # The engine's own loop. Host callbacks run inside workflow turns,
        # where the running loop is the run's WorkflowLoop: never ask asyncio.
        self._loop: asyncio.AbstractEventLoop = asyncio.get_running_loop()
        # The loop's thread: a step's heartbeat from any other goes through the loop.
        self._thread_id = threading.get_ident()
        if isinstance(self.clock, WallClock):
            self.clock.loop = self._loop
        # Step functions running now, and every invocation as (life, (id, run,
        # seq)): the test host settles on the first and checks replays with the
        # second. The run is in the key because runs of one id (continue-as-new,
        # REPLACE) reuse seqs: without it a new run's step looked like a rerun.
        self.busy_steps = 0
        # None outside the test host: a log of every step would grow forever.
        self.step_log: list[tuple[int, tuple[str, int, int]]] | None = None
        self.life = 0

    # --- opening and closing ---------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        target: str | os.PathLike[str],
        *,
        workflows: Iterable[WorkflowDef[Any, Any]],
        shards: int = 4,
        park_after: Any = "5s",
        durability: str = "fsync",
        profile: str | None = None,
        watchdog: Any = "2s",
    ) -> Engine:
        """Opens an engine on ``target`` and recovers its unfinished runs.

        Args:
            target: A directory (SQLite in that directory, the embedded
                default) or ``"memory"`` (keeps nothing).
            workflows: The workflows this engine runs.
            shards: How many shards the runs are spread over.
            park_after: How long a suspended run stays in memory.
            durability: ``"fsync"`` (default) or ``"none"`` (tests, demos).
            profile: ``"dev"`` replays each run's journal against the code
                when it waits or ends, reporting a difference at once.
            watchdog: Report workflow code that runs this long without
                yielding (None: never).

        Example:
            >>> async def main() -> None:
            ...     async with await Engine.open("./data", workflows=[]) as engine:
            ...         ...
        """
        store = open_store(os.fspath(target), durability=durability)
        await store.open()
        engine = cls(
            store,
            workflows,
            shards=shards,
            park_after=park_after,
            profile=profile,
            watchdog=watchdog,
        )
        await engine._recover()
        return engine

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _recover(self) -> None:
        self.committer.start()
        if self.watchdog_s is not None and sys.gettrace() is None:
            self._watchdog = _Watchdog(self, self.watchdog_s)
        for row in await self.store.unfinished():
            if row.status == "suspended":
                self._arm_wake(row)
            else:
                self._spawn(self._wake(row.id, row))
        # Fix: a run that ended in continue-as-new starts its next run only
        # once its `Done` is durable, in a later write. A crash between the
        # two left the id's row "continued" (not unfinished) and the next run
        # was never started: its result() waited forever. A row still
        # "continued" at open is such a run; start its next run now.
        for row in await self.store.list(status="continued"):
            self._spawn(self._continue(row))

    async def _continue(self, row: RunRow) -> None:
        entries = await self.store.load(row.id, row.run)
        start, done = _decode_journal(row.id, row.run, [entries[0], entries[-1]])
        wf = self.workflows.get(row.workflow)
        if not isinstance(start, Start) or not isinstance(done, Done) or wf is None:
            log.warning("run %r continued as new but cannot be continued here", row.id)
            return
        if self._loaded(row.id) is None and row.id not in self._loading:
            self._create_run(wf, row.id, done.payload, parent=start.parent, policy=start.policy)

    async def close(self) -> None:
        """Stops the engine: waits for in-flight writes, leaves every run to recover."""
        if self._closed:
            return
        self._closed = True
        self._release_waiters()
        if self._watchdog is not None:
            self._watchdog.stop()
        for task in list(self._tasks):
            task.cancel()
        for shard in self.shards:
            for state in list(shard.runs.values()):
                for t in state.steps:
                    t.cancel()
        tasks = list(self._tasks) + [
            t for s in self.shards for st in s.runs.values() for t in st.steps
        ]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await self.committer.close()
        for shard in self.shards:
            for h in shard.timers.values():
                h.cancel()
            shard.timers.clear()
            for state in shard.runs.values():
                state.driver.close()
            shard.clear()
        await self.store.close()

    def _abandon(self) -> None:
        """Drops everything but the store, as a crash would (the test host's ``crash``)."""
        self._closed = True
        self._release_waiters()
        if self._watchdog is not None:
            self._watchdog.stop()
        self.committer.abandon()
        for task in list(self._tasks):
            task.cancel()
        for shard in self.shards:
            for h in shard.timers.values():
                h.cancel()
            for state in shard.runs.values():
                for t in state.steps:
                    t.cancel()
                state.driver.close()
            shard.clear()
            shard.timers.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise FuseeError("this engine is closed; open a new one with fusee.Engine.open(...)")
        if self.committer.failed is not None:
            raise self.committer.failed

    # --- shards, tasks, timers -------------------------------------------------------------------

    def _shard(self, id: str) -> _Shard:
        # crc32, not hash(): the same id maps to the same shard in every process.
        return self.shards[zlib.crc32(id.encode()) % len(self.shards)]

    def _loaded(self, id: str) -> _RunState | None:
        return self._shard(id).runs.get(id)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("fusee engine task failed", exc_info=exc)

    def _arm(self, id: str, run: int, seq: int, at_ms: int, kind: int) -> None:
        """Sets a timer (`_TIMER`), a wait's deadline (`_DEADLINE`) or a parked run's wake-up."""
        timers = self._shard(id).timers
        state = self._loaded(id)
        if state is not None and seq >= 0:
            state.due[seq] = at_ms
        if (id, seq) in timers:
            return
        timers[(id, seq)] = self.clock.call_at(at_ms, _Alarm(self, id, run, seq, kind))

    def _disarm(self, id: str, seq: int) -> None:
        state = self._loaded(id)
        if state is not None:
            state.due.pop(seq, None)
        h = self._shard(id).timers.pop((id, seq), None)
        if h is not None:
            h.cancel()

    def _arm_wake(self, row: RunRow) -> None:
        if row.wake_ms is not None:
            self._arm(row.id, row.run, -1, row.wake_ms, _WAKE)

    async def _sleep_until(self, at_ms: int) -> None:
        """Sleeps on the engine's clock until ``at_ms``."""
        fut: asyncio.Future[None] = self._loop.create_future()
        h = self.clock.call_at(at_ms, lambda: _settle(fut, None))
        try:
            await fut
        finally:
            h.cancel()

    # --- the RunHost protocol --------------------------------------------------------------------

    def now_ms(self) -> int:
        return self.clock.now_ms()

    def append(self, driver: RunDriver, record: Record) -> int:
        lsn = self.committer.append(driver.id, driver.run, encode(record))
        state: _RunState | None = driver.host_data
        if state is None or not state.loaded:
            return lsn
        if state.records is not None:
            state.records.append(record)
        t = type(record)
        if t is Step or t is Fired or t is Completed:
            return lsn
        self._react(state, record, lsn)
        return lsn

    def _react(self, state: _RunState, record: Record, lsn: int) -> None:
        # Timer callbacks name the run by id and number, never by its state:
        # they outlive parking, and must not keep a parked run in memory.
        id, run = state.id, state.run
        if isinstance(record, Timer):
            seq = record.seq
            self._arm(id, run, record.seq, record.fire_at_ms, _TIMER)
        elif isinstance(record, Wait):
            state.waits[record.seq] = record.name
            if record.deadline_ms:
                self._arm(id, run, record.seq, record.deadline_ms, _DEADLINE)
            self._match(state)
        elif isinstance(record, Waited):
            state.waits.pop(record.seq, None)
            self._disarm(id, record.seq)
        elif isinstance(record, Child):
            self.committer.on_durable(lsn, lambda: self._spawn(self._start_child(state, record)))
        elif isinstance(record, Send):
            self.committer.on_durable(
                lsn,
                lambda: self._spawn(self._send(record.target, record.name, record.payload, id)),
            )
        elif isinstance(record, Attributes):
            state.attributes.update(_codec.decode(record.payload))
            self._put_row(state)
        elif isinstance(record, Chunk | StreamEnd):
            self.committer.on_durable(lsn, lambda: self._notify_streams(id))
        elif isinstance(record, Done):
            self._ended(state, record, lsn)
        elif isinstance(record, Cancel):
            for seq in list(state.waits):
                self._disarm(id, seq)

    def run_step(self, driver: RunDriver, call: StepCall) -> None:
        state: _RunState | None = driver.host_data
        if state is None or not state.loaded:
            return
        if eager_ok(call) and not (self.mocks and (driver.workflow.name, call.name) in self.mocks):
            # Run it once its gate is durable, from the committer's release
            # (never inside this turn: the step is not workflow code).
            gate = driver.machine.gate
            if call.read_only or gate <= self.committer.durable_lsn:
                self._loop.call_soon(self._eager, state, call)
            else:
                self.committer.on_durable(gate, functools.partial(self._eager, state, call))
            return
        self._step_task(state, call, None)

    def _eager(self, state: _RunState, call: StepCall) -> None:
        if not state.loaded:
            return
        try:
            first = run_eagerly(self, state, call)
        except Exception:
            # Called from the committer's release: an error here must not
            # stop the committer, which every run depends on.
            log.exception("fusee step %r of run %r failed to start", call.name, state.id)
            return
        if first is not None:
            self._step_task(state, call, first)

    def _step_task(self, state: _RunState, call: StepCall, first: Any) -> None:
        task = self._loop.create_task(run_step(self, state, call, first))
        state.steps.add(task)
        task.add_done_callback(lambda t: self._step_task_done(state, t))

    def _step_task_done(self, state: _RunState, task: asyncio.Task[None]) -> None:
        state.steps.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("fusee step task failed", exc_info=task.exception())
        if not state.steps:
            self.turned(state.driver)

    def stuck(self, driver: RunDriver, error: DeterminismError) -> None:
        self._stuck[driver.id] = error
        log.error("run %r stopped: %s", driver.id, error)
        for fut in self._results.pop(driver.id, []):
            if not fut.done():
                fut.set_result(None)

    def turned(self, driver: RunDriver) -> None:
        state: _RunState | None = driver.host_data
        if state is None or not state.loaded or driver.end is not None:
            return
        m = driver.machine
        if m.is_paused():
            if state.row_status != "paused":
                state.row_status = "paused"
                self._put_row(state)
        elif state.row_status == "paused":
            state.row_status = "running"
            self._put_row(state)
        if not state.steps and driver.error is None and m.is_suspended():
            if state.park_handle is None:
                state.park_handle = self.clock.call_at(
                    self.clock.now_ms() + self.park_after_ms, lambda: self._spawn(self._park(state))
                )
        elif state.park_handle is not None:
            state.park_handle.cancel()
            state.park_handle = None

    # --- step results, heartbeats, tokens --------------------------------------------------------

    def _step_result(self, state: _RunState, seq: int, status: Status, payload: bytes) -> None:
        if state.loaded:
            state.driver.step_done(seq, status, payload)

    def _paused(self, state: _RunState) -> None:
        state.resumed.clear()
        self.turned(state.driver)

    def _token_out(self, state: _RunState, seq: int) -> None:
        state.driver.append(state.driver.machine.awaiting(seq))
        self.turned(state.driver)

    def _step_ctx(self, state: _RunState, call: StepCall, attempt: int) -> StepCtx:
        m = state.driver.machine
        seq = call.seq
        token = None
        if call.is_await:
            token_attempt = m.await_attempt(seq)
            if token_attempt is not None:
                token = f"{state.id}/{state.run}/{seq}/{token_attempt}"
        return _EngineStepCtx(self, state, seq, m.key(seq), attempt, token)

    def _heartbeat(self, state: _RunState, seq: int, data: bytes) -> None:
        # Coalesced: while one heartbeat of a step is on its way to the disk,
        # later ones replace each other and only the last is appended.
        if seq in state.heartbeat_due:
            state.heartbeat_due[seq] = data
            return
        rec = state.driver.machine.heartbeat(seq, data)
        if rec is None:
            return
        state.heartbeat_due[seq] = data
        state.driver.append(rec)

        def sent() -> None:
            latest = state.heartbeat_due.pop(seq, None)
            if latest is not None and latest != data:
                self._heartbeat(state, seq, latest)

        self.committer.on_durable(state.driver.machine.gate, sent)

    # --- signals ---------------------------------------------------------------------------------

    def _match(self, state: _RunState) -> None:
        if not state.waits:
            return
        for seq in sorted(state.waits):
            name = state.waits[seq]
            for ordinal, (sname, payload) in enumerate(state.signals):
                if sname == name and ordinal not in state.consumed:
                    state.consumed.add(ordinal)
                    del state.waits[seq]
                    self._disarm(state.id, seq)
                    state.driver.complete(seq, SignalMatched(ordinal, payload))
                    break

    async def _signal(
        self, id: str, name: str, payload: bytes, dedup: int, by: bytes | None
    ) -> None:
        self._check_open()
        state = await self._wake(id)
        if state is None:
            row = await self.store.get(id)
            raise FuseeError(
                f"run '{id}' has finished ({row.status if row else 'unknown'}); "
                f"signal '{name}' was not delivered: signals go to running runs"
            )
        if dedup and dedup in state.dedups:
            return
        if dedup:
            state.dedups.add(dedup)
        state.signals.append((name, payload))
        state.driver.append(Signal(state.run, name, dedup, payload, by))
        lsn = state.driver.machine.gate
        self._match(state)
        await self.committer.durable(lsn)

    async def _send(self, target: str, name: str, payload: bytes, sender: str) -> None:
        try:
            await self._signal(target, name, payload, 0, _codec.encode(sender))
        except (NotFound, FuseeError) as e:
            log.warning(
                "run %r sent signal %r to %r, which was not delivered: %s", sender, name, target, e
            )

    # --- waking, loading, parking ----------------------------------------------------------------

    def _fire(self, id: str, run: int, seq: int, completion: Any) -> None:
        state = self._loaded(id)
        if state is not None:
            if state.run == run:
                state.driver.complete(seq, completion)
            return
        self._spawn(self._deliver(id, run, seq, completion))

    async def _deliver(self, id: str, run: int, seq: int, completion: Any) -> None:
        state = await self._wake(id)
        if state is not None and state.run == run:
            state.driver.complete(seq, completion)

    async def _wake(self, id: str, row: RunRow | None = None) -> _RunState | None:
        """The loaded run of ``id``, loading it from its journal if it is parked.

        ``row`` is the id's row when the caller just read it (recovery).
        Returns None if the run has finished. Raises NotFound if there is none.
        """
        state = self._loaded(id)
        if state is not None:
            return state
        if id in self._stuck:
            raise self._stuck[id]
        pending = self._loading.get(id)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[_RunState | None] = self._loop.create_future()
        self._loading[id] = fut
        try:
            state = await self._load(id, row)
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()
            if isinstance(e, FuseeError):
                # The run cannot be loaded: whoever waits for its result
                # hears why instead of waiting forever.
                for waiter in self._results.pop(id, []):
                    if not waiter.done():
                        waiter.set_exception(e)
            raise
        else:
            fut.set_result(state)
        finally:
            del self._loading[id]
        return state

    async def _load(self, id: str, row: RunRow | None = None) -> _RunState | None:
        if row is None:
            row = await self.store.get(id)
        if row is None:
            raise NotFound(f"no run has id '{id}'; `fusee list` shows the runs of a store")
        if row.status in _FINISHED:
            return None
        wf = self.workflows.get(row.workflow)
        if wf is None:
            raise UnknownWorkflow(_unknown(row.workflow, self.workflows))
        entries = await self.store.load(id, row.run)
        records = _decode_journal(id, row.run, entries)
        self._disarm(id, -1)
        state = self._make_state(wf, records, entries[-1][0])
        state.row_status = row.status
        self._shard(id).add(state)
        self._rebuild(state, records)
        state.driver.start()
        done = records[-1]
        if state.driver.end is not None and isinstance(done, Done):
            # Fix: a journal that ends with the run's `Done` under a row still
            # unfinished (the row's write was lost: crash_everywhere's crash
            # inside a batch, or a store restored from parts) replayed to its
            # end and then sat loaded forever, its row "running", its result
            # and its parent never told. Finish it as if the `Done` were new.
            self._ended(state, done, entries[-1][0])
            return None
        # Fix: the row was set back to "running" only when the replayed run
        # was not suspended, but a parked run is woken to take a delivery (a
        # signal, an update, a completion, a child's result) that makes it run
        # on only after this. Its row stayed "suspended" (wake_ms stale or
        # None) and a crash before it parked again left it unrecovered for
        # good: a run with an acknowledged signal that never went on. The row
        # is written even when the store's says "running": a park's
        # "suspended" row may still be on its way to the store.
        if state.row_status == "suspended":
            state.row_status = "running"
        self._put_row(state)
        return state

    def _make_state(self, wf: WorkflowDef[Any, Any], records: list[Record], gate: int) -> _RunState:
        start = records[0]
        assert isinstance(start, Start)
        driver = RunDriver(self, wf, records, gate, strict=self.strict)
        state = _RunState(driver, wf, start.started_ms, start.parent, start.policy)
        state.shard = self._shard(start.id)
        driver.host_data = state
        if self.strict:
            state.records = list(records)
        return state

    def _rebuild(self, state: _RunState, records: list[Record]) -> None:
        # What the host keeps beside the machine, from the journal: signals,
        # open waits and their deadlines, timers, children, attributes.
        id, run = state.id, state.run
        timers: dict[int, int] = {}
        deadlines: dict[int, int] = {}
        children: dict[int, Child] = {}
        for rec in records:
            if isinstance(rec, Signal):
                state.signals.append((rec.name, rec.payload))
                if rec.dedup:
                    state.dedups.add(rec.dedup)
            elif isinstance(rec, Wait):
                state.waits[rec.seq] = rec.name
                if rec.deadline_ms:
                    deadlines[rec.seq] = rec.deadline_ms
            elif isinstance(rec, Waited):
                state.waits.pop(rec.seq, None)
                deadlines.pop(rec.seq, None)
                if rec.outcome.is_signal:
                    state.consumed.add(rec.outcome.ordinal)
            elif isinstance(rec, Timer):
                timers[rec.seq] = rec.fire_at_ms
            elif isinstance(rec, Fired):
                timers.pop(rec.seq, None)
            elif isinstance(rec, Child):
                children[rec.seq] = rec
            elif isinstance(rec, ChildDone):
                children.pop(rec.seq, None)
            elif isinstance(rec, Attributes):
                state.attributes.update(_codec.decode(rec.payload))
            elif isinstance(rec, Cancel):
                deadlines.clear()
        for seq, at in timers.items():
            self._arm(id, run, seq, at, _TIMER)
        for seq, at in deadlines.items():
            self._arm(id, run, seq, at, _DEADLINE)
        self._match(state)
        for child in children.values():
            self._spawn(self._start_child(state, child))

    async def _park(self, state: _RunState) -> None:
        state.park_handle = None
        driver = state.driver
        if (
            self._loaded(state.id) is not state
            or not driver.machine.is_suspended()
            or state.steps
            or state.updates
        ):
            return
        await self.committer.durable(driver.machine.gate)
        if (
            self._loaded(state.id) is not state
            or not driver.machine.is_suspended()
            or state.steps
            or state.updates
        ):
            return
        if self.strict:
            self._check_replay(state)
            if driver.error is not None:
                return
        wake = min(state.due.values(), default=None)
        m = driver.machine
        if any(m.pending_kind(seq) is OpKind.CHILD for seq in range(m.next_seq())):
            # Fix: a child's end reaches its parked parent as a delivery the
            # parent records later; a crash in between lost it for good (the
            # parent's row said "suspended" with nothing to wake it, and the
            # finished child is not recovered). A parent parked on a child is
            # therefore woken at once by recovery, which replays it and asks
            # its children again (`_rebuild` -> `_start_child`).
            now = self.clock.now_ms()
            wake = now if wake is None else min(wake, now)
        self._shard(state.id).remove(state)
        driver.close()
        state.row_status = "suspended"
        self.committer.put_row(self._row(state, wake_ms=wake))

    def _check_replay(self, state: _RunState) -> None:
        """The dev profile's strict replay: the journal so far, replayed against the code."""
        if state.records is None:
            return
        replay = RunDriver(
            ReplayHost(), state.workflow, list(state.records), state.driver.machine.gate
        )
        try:
            replay.start()
        finally:
            replay.close()
        if replay.error is not None:
            state.driver.error = replay.error
            self.stuck(state.driver, replay.error)

    # --- rows ------------------------------------------------------------------------------------

    def _row(
        self, state: _RunState, *, wake_ms: int | None = None, finished_ms: int | None = None
    ) -> RunRow:
        return RunRow(
            id=state.id,
            run=state.run,
            workflow=state.workflow.name,
            status=state.row_status,
            started_ms=state.started_ms,
            finished_ms=finished_ms,
            wake_ms=wake_ms,
            attributes=dict(state.attributes),
            parent=state.parent.id if state.parent is not None else None,
        )

    def _put_row(self, state: _RunState) -> None:
        self.committer.put_row(self._row(state))

    # --- starting runs ---------------------------------------------------------------------------

    def _workflow(self, workflow: WorkflowDef[Any, Any] | str) -> WorkflowDef[Any, Any]:
        name = workflow if isinstance(workflow, str) else workflow.name
        wf = self.workflows.get(name)
        if wf is None:
            raise UnknownWorkflow(_unknown(name, self.workflows))
        return wf

    async def start(
        self,
        workflow: WorkflowDef[Any, T] | str,
        id: str,
        input: Any = None,
        *,
        id_policy: IdPolicy = IdPolicy.REJECT,
    ) -> Run[T]:
        """Starts a run of ``workflow`` with id ``id``; returns once its start is durable.

        Raises:
            fusee.UnknownWorkflow: The engine was not given that workflow.
            fusee.AlreadyExists: The id is taken (see `IdPolicy`).
            fusee.PayloadError: ``input`` cannot be encoded.

        Example:
            >>> async def main(engine: Engine) -> None:
            ...     run = await engine.start("checkout", "order-1", {"sku": "A1"})
        """
        self._check_open()
        wf = self._workflow(workflow)
        if not isinstance(id, str) or not id:
            raise ValueError(f"a run needs a non-empty string id, got {id!r}")
        data = _codec.encode(input, name=f"the input of run '{id}'")
        if id in self._starting:
            if id_policy is IdPolicy.ATTACH:
                return Run(self, id)
            raise AlreadyExists(f"run '{id}' is being started; {_policy_hint()}")
        self._starting.add(id)
        try:
            existing = self._loaded(id) is not None or id in self._loading
            row = None if existing else await self.store.get(id)
            if existing or row is not None:
                status = row.status if row is not None else "running"
                if id_policy is IdPolicy.ATTACH:
                    return Run(self, id)
                if id_policy is IdPolicy.REJECT or status not in _FINISHED:
                    raise AlreadyExists(f"run '{id}' exists ({status}); {_policy_hint()}")
            lsn = self._create_run(wf, id, data, parent=None, policy=0)
        finally:
            self._starting.discard(id)
        await self.committer.durable(lsn)
        return Run(self, id)

    def _create_run(
        self, wf: WorkflowDef[Any, Any], id: str, data: bytes, *, parent: Parent | None, policy: int
    ) -> int:
        self._ends.pop(id, None)
        run = self.committer.lsn + 1
        start = Start(
            run=run,
            id=id,
            wtype=wf.name,
            started_ms=self.clock.now_ms(),
            policy=policy,
            parent=parent,
            input=data,
        )
        lsn = self.committer.append(id, run, encode(start))
        assert lsn == run
        state = self._make_state(wf, [start], lsn)
        self._shard(id).add(state)
        self._put_row(state)
        state.driver.start()
        return lsn

    async def execute(
        self,
        workflow: WorkflowDef[Any, T] | str,
        id: str,
        input: Any = None,
        *,
        id_policy: IdPolicy = IdPolicy.REJECT,
    ) -> T:
        """Starts a run and waits for its result.

        Example:
            >>> async def main(engine: Engine) -> None:
            ...     receipt = await engine.execute("checkout", "order-2", {"sku": "A1"})
        """
        run = await self.start(workflow, id, input, id_policy=id_policy)
        return await run.result()

    def get(self, id: str) -> Run[Any]:
        """A handle on the run with id ``id`` (checked when used).

        Example:
            >>> async def main(engine: Engine) -> None:
            ...     await engine.get("order-1").cancel("customer asked")
        """
        return Run(self, id)

    async def list(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[RunInfo]:
        """The runs of the store, filtered.

        Example:
            >>> async def main(engine: Engine) -> None:
            ...     async for info in engine.list(status="running", workflow="checkout"):
            ...         print(info.id)
        """
        await self.committer.flush()
        rows = await self.store.list(
            status=None, workflow=workflow, attributes=attributes, limit=None
        )
        count = 0
        for row in rows:
            info = self._info_of(row)
            if status is not None and info.status != status:
                continue
            yield info
            count += 1
            if limit is not None and count >= limit:
                return

    async def complete(self, token: str, value: Any = None) -> None:
        """Resolves the ``ctx.await_completion`` that handed out ``token``.

        Raises:
            ValueError: ``token`` is not a token fusee handed out.
            fusee.NotFound: Its run does not exist.

        Example:
            >>> async def main(engine: Engine, token: str) -> None:
            ...     await engine.complete(token, {"approved": True})
        """
        self._check_open()
        try:
            id, run, seq, attempt = token.rsplit("/", 3)
            run_n, seq_n, attempt_n = int(run), int(seq), int(attempt)
        except (AttributeError, ValueError):
            raise ValueError(f"{token!r} is not an await_completion token") from None
        state = await self._wake(id)
        if state is None or state.run != run_n:
            return
        data = _codec.encode(value, name="the completion's value")
        if state.driver.complete_async(seq_n, attempt_n, _OK, data):
            await self.committer.durable(state.driver.machine.gate)

    # --- run handle operations -------------------------------------------------------------------

    async def _result(self, id: str) -> Any:
        while True:
            if id in self._stuck:
                raise self._stuck[id]
            if self.committer.failed is not None:
                raise self.committer.failed
            state = self._loaded(id)
            if state is None and id not in self._loading:
                self._check_open()
                ended = self._ends.get(id)
                if ended is not None:
                    return _end_value(*ended)
                row = await self.store.get(id)
                if row is None:
                    raise NotFound(f"no run has id '{id}'; `fusee list` shows the runs of a store")
                if row.status in _FINISHED and row.status != "continued":
                    return await self._finished_result(id, row)
                if row.status in ("running", "paused"):
                    # Fix: an unfinished run that is neither loaded nor parked
                    # failed to load (a damaged journal, a workflow this engine
                    # was not given) and nothing would ever end the wait:
                    # load it here, so the caller gets that error.
                    if await self._wake(id) is None:
                        # It had ended after all; its row is on its way.
                        await self.committer.flush()
                    continue
            fut: asyncio.Future[None] = self._loop.create_future()
            self._results.setdefault(id, []).append(fut)
            await self._wait_result(fut)
            fut.result()  # a store failure ends the wait with its error

    async def _wait_result(self, fut: asyncio.Future[None]) -> None:
        """Waits for a run's end (the test host skips idle time here)."""
        await fut

    def _store_failed(self, error: StoreError) -> None:
        log.error("the store failed; runs stop until the engine is reopened: %s", error)
        for futs in self._results.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(error)
        self._results.clear()

    async def _finished_result(self, id: str, row: RunRow) -> Any:
        entries = await self.store.load(id, row.run)
        done = _decode_journal(id, row.run, entries[-1:])[0]
        if not isinstance(done, Done):
            raise StoreError(f"run '{id}' is marked {row.status} but its journal has no end record")
        return _end_value(self._workflow(row.workflow), done)

    def _ended(self, state: _RunState, done: Done, lsn: int) -> None:
        status = _STATUS_OF_END.get(done.status, "failed")
        state.row_status = status
        self.committer.put_row(self._row(state, finished_ms=done.finished_ms))
        if state.park_handle is not None:
            state.park_handle.cancel()
        for seq in list(state.waits):
            self._disarm(state.id, seq)

        def durable() -> None:
            ended = _codec.encode(
                ["RunEnded", f"run '{state.id}' ended before the update's handler finished"]
            )
            for caller in list(state.updates):
                _settle(caller, (_CANCELLED, ended))
            if self.strict:
                self._check_replay(state)
            shard = self._shard(state.id)
            if shard.runs.get(state.id) is state:
                shard.remove(state)
                state.driver.close()
            for key in [k for k in shard.timers if k[0] == state.id]:
                shard.timers.pop(key).cancel()
            if done.status is _CONTINUED:
                wf = state.workflow
                self._create_run(
                    wf, state.id, done.payload, parent=state.parent, policy=state.policy
                )
                return
            ends = self._ends
            ends[state.id] = (state.workflow, done)
            if len(ends) > _ENDS_KEPT:
                ends.popitem(last=False)
            self._notify_streams(state.id)
            for fut in self._results.pop(state.id, []):
                if not fut.done():
                    fut.set_result(None)
            parent = state.parent
            if parent is not None and not state.policy & DETACHED:
                self._spawn(
                    self._deliver(
                        parent.id, parent.run, parent.seq, ChildCompleted(done.status, done.payload)
                    )
                )

        self.committer.on_durable(lsn, durable)

    async def _start_child(self, parent: _RunState, rec: Child) -> None:
        link = Parent(parent.id, parent.run, rec.seq)
        row = await self.store.get(rec.id) if self._loaded(rec.id) is None else None
        loaded = self._loaded(rec.id)
        if loaded is not None or row is not None:
            entries: list[tuple[int, bytes]] = []
            if loaded is not None:
                # Fix: its journal was read from the store, where a child
                # started a moment ago (by the parent's previous life, say)
                # may not be yet: NotFound, and the parent never heard of it.
                parent_of = loaded.parent
            else:
                assert row is not None
                entries = await self.store.load(rec.id, row.run)
                first = decode(entries[0][1]) if entries else None
                parent_of = first.parent if isinstance(first, Start) else None
            if parent_of != link:
                self._fire(
                    parent.id,
                    parent.run,
                    rec.seq,
                    ChildCompleted(
                        _FAILED,
                        _codec.encode(
                            ["AlreadyExists", f"run id '{rec.id}' is taken by another run"]
                        ),
                    ),
                )
                return
            if row is not None and row.status in _FINISHED and not rec.flags & DETACHED:
                done = decode(entries[-1][1])
                if isinstance(done, Done):
                    self._fire(
                        parent.id, parent.run, rec.seq, ChildCompleted(done.status, done.payload)
                    )
            return
        wf = self.workflows.get(rec.wtype)
        if wf is None:
            self._fire(
                parent.id,
                parent.run,
                rec.seq,
                ChildCompleted(
                    _FAILED, _codec.encode(["UnknownWorkflow", _unknown(rec.wtype, self.workflows)])
                ),
            )
            return
        self._create_run(wf, rec.id, rec.input, parent=link, policy=rec.flags)

    async def _query(self, id: str, name: str, arg: bytes) -> Any:
        self._check_open()
        state = await self._wake(id)
        if state is not None:
            return _codec.decode(state.driver.query(name, arg))
        # A finished run: replay its journal to a throwaway driver and ask it.
        row = await self.store.get(id)
        assert row is not None
        entries = await self.store.load(id, row.run)
        records = _decode_journal(id, row.run, entries)
        replay = RunDriver(ReplayHost(), self._workflow(row.workflow), records, entries[-1][0])
        try:
            replay.start()
            return _codec.decode(replay.query(name, arg))
        finally:
            replay.close()

    async def _update(self, id: str, name: str, update_id: str | None, payload: bytes) -> Any:
        self._check_open()
        state = await self._wake(id)
        if state is None or state.driver.end is not None:
            raise FuseeError(f"run '{id}' has finished; update '{name}' was not delivered")
        self._tokens += 1
        token = self._tokens
        fut: asyncio.Future[tuple[Status, bytes]] = self._loop.create_future()

        def answered(status: Status, out: bytes) -> None:
            lsn = state.driver.machine.gate
            self.committer.on_durable(lsn, lambda: _settle(fut, (status, out)))

        # Fix: the caller waited forever when the run ended (or parked, or
        # the engine closed) while the update's handler had not answered. The
        # run keeps its callers' futures: its end answers them, and it does
        # not park while one waits.
        state.updates.add(fut)
        try:
            state.driver.offer_update(
                token, name, update_id or f"{id}/update/{token}", payload, answered
            )
            status, out = await fut
        finally:
            state.updates.discard(fut)
        if status is _OK:
            return _codec.decode(out)
        t, m = _error_pair(out)
        raise FuseeError(f"update '{name}' of run '{id}' failed: {t}: {m}")

    async def _cancel(self, id: str, reason: str) -> None:
        self._check_open()
        state = await self._wake(id)
        if state is None:
            return
        state.driver.request_cancel(_codec.encode(reason))
        await self.committer.durable(state.driver.machine.gate)

    async def _resume(self, id: str) -> None:
        self._check_open()
        state = await self._wake(id)
        if state is None:
            return
        records = state.driver.machine.resume(None)
        for rec in records:
            state.driver.append(rec)
        state.resumed.set()
        self.turned(state.driver)
        await self.committer.durable(state.driver.machine.gate)

    async def _stream(self, id: str, name: str) -> AsyncIterator[Any]:
        sent = 0
        while True:
            # Fix: a reader waiting for the next chunk when the engine closed
            # (or crashed, in the test host) waited forever; `close` wakes the
            # readers and they end here with a clear error.
            self._check_open()
            # Registered before reading: a chunk that becomes durable while
            # the journal is read still wakes this reader.
            event = asyncio.Event()
            self._stream_events.setdefault(id, []).append(event)
            try:
                await self.committer.flush()
                row = await self.store.get(id)
                if row is None:
                    raise NotFound(f"no run has id '{id}'; `fusee list` shows the runs of a store")
                entries = await self.store.load(id, row.run)
                chunks: list[bytes] = []
                ended = row.status in _FINISHED
                for rec in _decode_journal(id, row.run, entries):
                    if isinstance(rec, Chunk) and rec.stream == name:
                        chunks.append(rec.payload)
                    elif isinstance(rec, StreamEnd) and rec.stream == name:
                        ended = True
                for c in chunks[sent:]:
                    yield _codec.decode(c)
                sent = len(chunks)
                if ended:
                    return
                await event.wait()
            finally:
                events = self._stream_events.get(id, [])
                if event in events:
                    events.remove(event)

    def _notify_streams(self, id: str) -> None:
        for event in self._stream_events.get(id, ()):
            event.set()

    def _release_waiters(self) -> None:
        # Closing (or the test host's crash): stream readers and update
        # callers of this engine hear so instead of waiting forever.
        for id in self._stream_events:
            self._notify_streams(id)
        closed = _codec.encode(["EngineClosed", "the engine closed before the update's answer"])
        for shard in self.shards:
            for state in shard.runs.values():
                for fut in list(state.updates):
                    _settle(fut, (_CANCELLED, closed))

    async def _describe(self, id: str) -> RunInfo:
        state = self._loaded(id)
        if state is None:
            await self.committer.flush()
            row = await self.store.get(id)
            if row is None:
                raise NotFound(f"no run has id '{id}'; `fusee list` shows the runs of a store")
            return self._info_of(row)
        return self._info_of(self._row(state))

    def _info_of(self, row: RunRow) -> RunInfo:
        state = self._loaded(row.id)
        status = row.status
        paused: tuple[str, ...] = ()
        error = self._stuck.get(row.id)
        if state is not None and state.run == row.run:
            m = state.driver.machine
            if state.driver.end is None:
                status = (
                    "paused" if m.is_paused() else ("suspended" if m.is_suspended() else "running")
                )
            paused = tuple(
                sorted({m.pending_name(s) or "" for s in range(m.next_seq()) if m.step_paused(s)})
            )
        return RunInfo(
            id=row.id,
            run=row.run,
            workflow=row.workflow,
            status=status,
            started_at=_time(row.started_ms),
            finished_at=_time(row.finished_ms),
            attributes=dict(row.attributes),
            paused_steps=paused,
            error=str(error) if error is not None else None,
        )


class _StepStream:
    """A stream a step writes (``s.stream(name)``); it ends with the step's result."""

    def __init__(self, engine: Engine, state: _RunState, seq: int, name: str) -> None:
        self._engine = engine
        self._state = state
        self._seq = seq
        self._name = name
        self._skip = 0

    async def __aenter__(self) -> _StepStream:
        opened = self._state.driver.machine.stream_open(self._name, self._seq)
        # A step that runs again continues after what its earlier attempts recorded.
        self._skip = opened.recorded
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None:
            # Fix: an attempt that raised closed the stream, so its retry's
            # chunks were dropped (the machine ignores appends to a closed
            # stream). Left open, the retry continues after the recorded
            # chunks, and the step's final result ends the stream.
            return
        self._state.driver.append(self._state.driver.machine.stream_close(self._name, self._seq))

    async def append(self, value: Any) -> None:
        if self._skip > 0:
            self._skip -= 1
            return
        data = _codec.encode(value, name=f"a chunk of stream '{self._name}'")
        self._state.driver.append(
            self._state.driver.machine.stream_append(self._name, self._seq, data)
        )


class _Watchdog:
    """Reports workflow code that runs too long without yielding, with its stack."""

    def __init__(self, engine: Engine, limit_s: float) -> None:
        self._engine = engine
        self._limit = limit_s
        self._thread_id = threading.get_ident()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fusee-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        reported: set[int] = set()
        while not self._stop.wait(self._limit / 4):
            now = time.monotonic()
            for shard in self._engine.shards:
                for state in list(shard.runs.values()):
                    started = state.driver.turn_started
                    if started is None or now - started < self._limit or id(state) in reported:
                        continue
                    reported.add(id(state))
                    frame = sys._current_frames().get(self._thread_id)
                    stack = "".join(traceback.format_stack(frame)) if frame is not None else ""
                    msg = (
                        f"workflow code of run '{state.id}' has run {now - started:.1f}s without "
                        "yielding; blocking work belongs in a step (await ctx.step(...)).\n" + stack
                    )
                    self._engine.watchdog_reports.append(msg)
                    log.warning("%s", msg)


def _end_value(wf: WorkflowDef[Any, Any], done: Done) -> Any:
    """A run's result as `Run.result` returns it, or its failure raised."""
    if done.status is _OK:
        return wf.decode_result(done.payload)
    if done.status is _CANCELLED:
        raise Cancelled(_text(done.payload))
    err = _codec.decode(done.payload)
    if isinstance(err, list) and len(err) == 3:
        raise WorkflowFailed(str(err[0]), str(err[1]), str(err[2]))
    raise WorkflowFailed("Error", str(err))


def _decode_journal(id: str, run: int, entries: Iterable[tuple[int, bytes]]) -> list[Record]:
    # Fix: a damaged record raised the bare decoder's CorruptRecord, which
    # did not say whose journal it was in; the caller needs the run to act.
    records = []
    for lsn, data in entries:
        try:
            records.append(decode(data))
        except CorruptRecord as e:
            raise CorruptRecord(
                f"the journal of run '{id}' (run {run}) has a damaged record at LSN {lsn}: {e}; "
                "restore the store from a backup (other runs are not affected)"
            ) from e
    return records


def _settle(fut: asyncio.Future[T], value: T) -> None:
    if not fut.done():
        fut.set_result(value)


def _unknown(name: str, workflows: Mapping[str, Any]) -> str:
    known = ", ".join(sorted(workflows)) or "none"
    return (
        f"workflow '{name}' is not registered with this engine (it has: {known}); "
        "pass it in Engine.open(..., workflows=[...])"
    )


def _policy_hint() -> str:
    return (
        "pass id_policy=fusee.IdPolicy.ATTACH to get its handle, "
        "or IdPolicy.REPLACE to start over once it has finished"
    )


def _text(payload: bytes) -> str:
    v = _codec.decode(payload)
    return v if isinstance(v, str) else repr(v)


def _error_pair(payload: bytes) -> tuple[str, str]:
    v = _codec.decode(payload)
    if isinstance(v, list) and len(v) >= 2:
        return str(v[0]), str(v[1])
    return "Error", str(v)
