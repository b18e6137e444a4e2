"""The embedded engine: `Engine`, its opening, recovery and closing, and the run API.

It hosts runs (`_runs`), makes their journals durable by group commit
(`_commit`), runs their steps (`_steps`), fires their timers (`_timers`),
delivers messages to them (`_messages`), serves their streams (`_streams`)
and watches their code (`_watchdog`); `_host` is what their drivers call.

The rule: what leaves the process (a step function's run, a result handed
to a caller, a signal sent, a child started) waits until the records it
depends on are durable; nothing else waits for the disk.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import sys
from collections.abc import AsyncIterator, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from fusee import _codec
from fusee._durations import duration_ms, parse_duration
from fusee._status import FINISHED_STATUSES, RunStatus
from fusee.engine._clock import Clock, WallClock
from fusee.engine._commit import Committer
from fusee.engine._hooks import Hooks
from fusee.engine._host import EngineHost
from fusee.engine._inbox import Inbox
from fusee.engine._journal import decode_journal, end_value, no_run
from fusee.engine._messages import Messages
from fusee.engine._run import IdPolicy, Run, RunInfo, info_of
from fusee.engine._runs import Runs, unknown_workflow
from fusee.engine._state import RunState
from fusee.engine._steps import StepExecutor
from fusee.engine._streams import Streams
from fusee.engine._timers import Timers
from fusee.engine._watchdog import Watchdog
from fusee.errors import AlreadyExists, DeterminismError, FuseeError, StoreError, UnknownWorkflow
from fusee.machine import ChildCompleted
from fusee.record import DETACHED, Done, Parent, Start, Status, encode
from fusee.store import RunRow, Store, open_store

if TYPE_CHECKING:
    from types import TracebackType

    from fusee._definitions import WorkflowDef

__all__ = ["Engine"]

log = logging.getLogger("fusee")

T = TypeVar("T")

_STATUS_OF_END = {
    Status.OK: RunStatus.COMPLETED,
    Status.FAILED: RunStatus.FAILED,
    Status.CANCELLED: RunStatus.CANCELLED,
    Status.TIMED_OUT: RunStatus.FAILED,
    Status.CONTINUED: RunStatus.CONTINUED,
}

# Ended runs whose end `Run.result` answers from memory (`Engine._ends`).
_ENDS_KEPT = 1024


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
        hooks: Hooks | None = None,
    ) -> None:
        self.store = store
        self.workflows: dict[str, WorkflowDef[Any, Any]] = {}
        for wf in workflows:
            if wf.name in self.workflows and self.workflows[wf.name] is not wf:
                raise ValueError(f"two workflows named '{wf.name}' were given to one engine")
            self.workflows[wf.name] = wf
        if type(shards) is not int or shards < 1:
            raise ValueError(f"shards must be an int >= 1, got {shards!r}")
        self.park_after_ms = duration_ms(park_after)
        self.clock: Clock = clock if clock is not None else WallClock()
        profile = profile if profile is not None else os.environ.get("FUSEE_PROFILE")
        if profile not in (None, "", "dev", "prod"):
            raise ValueError(f"profile must be 'dev' or None, got {profile!r}")
        self.strict = profile == "dev"
        self.watchdog_s = parse_duration(watchdog) if watchdog is not None else None
        self.hooks = hooks if hooks is not None else Hooks()
        # The engine's own loop. Host callbacks run inside workflow turns,
        # where the running loop is the run's WorkflowLoop: never ask asyncio.
        self.loop: asyncio.AbstractEventLoop = asyncio.get_running_loop()
        if isinstance(self.clock, WallClock):
            self.clock.loop = self.loop
        self.committer = Committer(store, on_fail=self._store_failed)
        self.host = EngineHost(self)
        self.runs = Runs(self, shards)
        self.timers = Timers(
            self.clock, self.loop, self.runs.shard, self.runs.fire, self.runs.wake_soon
        )
        self.messages = Messages(self)
        self.streams = Streams(store, self.committer, self.check_open)
        self.steps = StepExecutor(self.host, self.loop)
        self.closed = False
        self._results: dict[str, list[asyncio.Future[None]]] = {}
        self._starting: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stuck: dict[str, DeterminismError] = {}
        # How the last runs to end ended: `Run.result` soon after the end
        # (a caller that started many runs, then asks each) reads no store.
        self._ends: collections.OrderedDict[str, tuple[WorkflowDef[Any, Any], Done]] = (
            collections.OrderedDict()
        )
        self._watchdog: Watchdog | None = None
        self.inbox = Inbox(self)

    # --- opening and closing -----------------------------------------------------------------

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
        await engine.recover()
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

    async def recover(self) -> None:
        """Starts the engine's writers and picks up every unfinished run of its store."""
        self.committer.start()
        if self.watchdog_s is not None and sys.gettrace() is None:
            self._watchdog = Watchdog(self.runs.all, self.watchdog_s, self._watchdog_report)
        for row in await self.store.unfinished():
            if row.status == RunStatus.SUSPENDED:
                self.runs.arm_wake(row)
            else:
                self.spawn(self.runs.wake(row.id, row))
        # A run that ended in continue-as-new starts its next run once its
        # `Done` is durable, in a later write: a row still "continued" at
        # open lost that write in a crash, so its next run starts now.
        for row in await self.store.list(status=RunStatus.CONTINUED):
            self.spawn(self._continue(row))
        self.inbox.start()

    def _watchdog_report(self, text: str) -> None:
        self.hooks.watchdog_reports.append(text)

    async def _continue(self, row: RunRow) -> None:
        entries = await self.store.load(row.id, row.run)
        start, done = decode_journal(row.id, row.run, [entries[0], entries[-1]])
        wf = self.workflows.get(row.workflow)
        if not isinstance(start, Start) or not isinstance(done, Done) or wf is None:
            log.warning("run %r continued as new but cannot be continued here", row.id)
            return
        if self.runs.loaded(row.id) is None and not self.runs.is_loading(row.id):
            self.create_run(wf, row.id, done.payload, parent=start.parent, policy=start.policy)

    async def close(self) -> None:
        """Stops the engine: waits for in-flight writes, leaves every run to recover."""
        if self.closed:
            return
        self._stop()
        for task in list(self._tasks):
            task.cancel()
        states = self.runs.all()
        for state in states:
            for t in state.steps:
                t.cancel()
        tasks = list(self._tasks) + [t for st in states for t in st.steps]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await self.committer.close()
        self.runs.close_all()
        await self.store.close()

    def abandon(self) -> None:
        """Drops everything but the store, as a crash would (the test host's ``crash``)."""
        self._stop()
        self.committer.abandon()
        for task in list(self._tasks):
            task.cancel()
        for state in self.runs.all():
            for t in state.steps:
                t.cancel()
        self.runs.close_all()

    def _stop(self) -> None:
        self.closed = True
        self.inbox.stop()
        # Stream readers and update callers of this engine hear that it
        # closed instead of waiting forever.
        self.streams.release_all()
        self.messages.release_updates()
        if self._watchdog is not None:
            self._watchdog.stop()

    def check_open(self) -> None:
        """Raises if the engine is closed or its store failed."""
        if self.closed:
            raise FuseeError("this engine is closed; open a new one with fusee.Engine.open(...)")
        if self.committer.failed is not None:
            raise self.committer.failed

    # --- tasks, divergence, waiters ----------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Runs ``coro`` as an engine task (kept referenced, its failure logged)."""
        task: asyncio.Task[Any] = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("fusee engine task failed", exc_info=task.exception())

    @property
    def tasks_in_flight(self) -> int:
        """How many engine tasks (waking runs, starting children) are running."""
        return len(self._tasks)

    def stuck_error(self, id: str) -> DeterminismError | None:
        """Why run ``id`` stopped, if its code diverged from its journal."""
        return self._stuck.get(id)

    def diverged(self, id: str, error: DeterminismError) -> None:
        """Run ``id``'s code diverged: it stops, and its result's waiters hear why."""
        self._stuck[id] = error
        log.error("run %r stopped: %s", id, error)
        for fut in self._results.pop(id, []):
            if not fut.done():
                fut.set_result(None)

    def fail_waiters(self, id: str, error: BaseException) -> None:
        """The waiters of run ``id``'s result get ``error`` (it cannot be loaded)."""
        for waiter in self._results.pop(id, []):
            if not waiter.done():
                waiter.set_exception(error)

    def _store_failed(self, error: StoreError) -> None:
        log.error("the store failed; runs stop until the engine is reopened: %s", error)
        for futs in self._results.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(error)
        self._results.clear()

    # --- starting runs -----------------------------------------------------------------------

    def workflow(self, workflow: WorkflowDef[Any, Any] | str) -> WorkflowDef[Any, Any]:
        """The engine's workflow of that name.

        Raises:
            fusee.UnknownWorkflow: The engine was not given it.
        """
        name = workflow if isinstance(workflow, str) else workflow.name
        wf = self.workflows.get(name)
        if wf is None:
            raise UnknownWorkflow(unknown_workflow(name, self.workflows))
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
        self.check_open()
        wf = self.workflow(workflow)
        if not isinstance(id, str) or not id:
            raise ValueError(f"a run needs a non-empty string id, got {id!r}")
        data = _codec.encode(input, name=f"the input of run '{id}'")
        if id in self._starting:
            if id_policy is IdPolicy.ATTACH:
                return Run(self, id)
            raise AlreadyExists(f"run '{id}' is being started; {_policy_hint()}")
        self._starting.add(id)
        try:
            existing = self.runs.loaded(id) is not None or self.runs.is_loading(id)
            row = None if existing else await self.store.get(id)
            if existing or row is not None:
                status = row.status if row is not None else RunStatus.RUNNING
                if id_policy is IdPolicy.ATTACH:
                    return Run(self, id)
                if id_policy is IdPolicy.REJECT or status not in FINISHED_STATUSES:
                    raise AlreadyExists(f"run '{id}' exists ({status}); {_policy_hint()}")
            lsn = self.create_run(wf, id, data, parent=None, policy=0)
        finally:
            self._starting.discard(id)
        await self.committer.durable(lsn)
        return Run(self, id)

    def create_run(
        self, wf: WorkflowDef[Any, Any], id: str, data: bytes, *, parent: Parent | None, policy: int
    ) -> int:
        """Appends a new run's `Start`, loads it and runs its first turn; returns the LSN."""
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
        state = self.runs.make_state(wf, [start], lsn)
        self.runs.shard(id).add(state)
        self.runs.put_row(state)
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
        await self.messages.complete(token, value)

    # --- run handle operations (`Run` calls these) -------------------------------------------

    async def _result(self, id: str) -> Any:
        while True:
            stuck = self._stuck.get(id)
            if stuck is not None:
                raise stuck
            if self.committer.failed is not None:
                raise self.committer.failed
            state = self.runs.loaded(id)
            if state is None and not self.runs.is_loading(id):
                self.check_open()
                ended = self._ends.get(id)
                if ended is not None:
                    return end_value(*ended)
                row = await self.store.get(id)
                if row is None:
                    raise no_run(id)
                if row.status in FINISHED_STATUSES and row.status != RunStatus.CONTINUED:
                    return await self._finished_result(id, row)
                if row.status in (RunStatus.RUNNING, RunStatus.PAUSED):
                    # An unfinished run neither loaded nor parked failed to
                    # load (a damaged journal, a workflow this engine was not
                    # given): loading it here gives the caller that error.
                    if await self.runs.wake(id) is None:
                        # It had ended after all; its row is on its way.
                        await self.committer.flush()
                    continue
            fut: asyncio.Future[None] = self.loop.create_future()
            self._results.setdefault(id, []).append(fut)
            wait = self.hooks.wait_result
            await (fut if wait is None else wait(fut))
            fut.result()  # a store failure ends the wait with its error

    async def _finished_result(self, id: str, row: RunRow) -> Any:
        entries = await self.store.load(id, row.run)
        done = decode_journal(id, row.run, entries[-1:])[0]
        if not isinstance(done, Done):
            raise StoreError(f"run '{id}' is marked {row.status} but its journal has no end record")
        return end_value(self.workflow(row.workflow), done)

    async def _signal(
        self, id: str, name: str, payload: bytes, dedup: int, by: bytes | None
    ) -> None:
        await self.messages.signal(id, name, payload, dedup, by)

    async def _query(self, id: str, name: str, arg: bytes) -> Any:
        return await self.messages.query(id, name, arg)

    async def _update(self, id: str, name: str, update_id: str | None, payload: bytes) -> Any:
        return await self.messages.update(id, name, update_id, payload)

    async def _cancel(self, id: str, reason: str) -> None:
        await self.messages.cancel(id, reason)

    async def _resume(self, id: str) -> None:
        await self.messages.resume(id)

    def _stream(self, id: str, name: str) -> AsyncIterator[Any]:
        return self.streams.read(id, name)

    async def _describe(self, id: str) -> RunInfo:
        state = self.runs.loaded(id)
        if state is None:
            await self.committer.flush()
            row = await self.store.get(id)
            if row is None:
                raise no_run(id)
            return self._info_of(row)
        return self._info_of(self.runs.row(state))

    def _info_of(self, row: RunRow) -> RunInfo:
        return info_of(row, self.runs.loaded(row.id), self._stuck.get(row.id))

    # --- a run's end -------------------------------------------------------------------------

    def ended(self, state: RunState, done: Done, lsn: int) -> None:
        """Run ``state`` appended its `Done`: its row now, the rest once it is durable."""
        state.row_status = _STATUS_OF_END.get(done.status, RunStatus.FAILED)
        self.committer.put_row(self.runs.row(state, finished_ms=done.finished_ms))
        if state.park_handle is not None:
            state.park_handle.cancel()
        self.timers.disarm_waits(state)

        def durable() -> None:
            ended = _codec.encode(
                ["RunEnded", f"run '{state.id}' ended before the update's handler finished"]
            )
            for caller in list(state.updates):
                if not caller.done():
                    caller.set_result((Status.CANCELLED, ended))
            if self.strict:
                self.runs.check_replay(state)
            shard = self.runs.shard(state.id)
            if shard.runs.get(state.id) is state:
                shard.remove(state)
                state.driver.close()
            shard.drop_timers_of(state.id)
            if done.status is Status.CONTINUED:
                self.create_run(
                    state.workflow, state.id, done.payload, parent=state.parent, policy=state.policy
                )
                return
            ends = self._ends
            ends[state.id] = (state.workflow, done)
            if len(ends) > _ENDS_KEPT:
                ends.popitem(last=False)
            self.streams.notify(state.id)
            for fut in self._results.pop(state.id, []):
                if not fut.done():
                    fut.set_result(None)
            parent = state.parent
            if parent is not None and not state.policy & DETACHED:
                self.spawn(
                    self.runs.deliver(
                        parent.id, parent.run, parent.seq, ChildCompleted(done.status, done.payload)
                    )
                )

        self.committer.on_durable(lsn, durable)


def _policy_hint() -> str:
    return (
        "pass id_policy=fusee.IdPolicy.ATTACH to get its handle, "
        "or IdPolicy.REPLACE to start over once it has finished"
    )
