"""Runs in memory: loading a run from its journal, parking it, waking it.

A run is loaded while it has work or was active within ``park_after``;
a suspended run (`RunMachine.is_suspended`) is then parked: dropped from
memory with its row saying when to wake it. A timer, signal, update,
cancel or child result wakes it: its journal is replayed and the delivery
made.

The rule: what the host keeps beside a run's machine (signals, waits,
timers, children, attributes) is rebuilt from its journal alone, so a
parked or crashed run comes back exactly as it was.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, assert_never

from fusee import _codec
from fusee._driver import ReplayHost, RunDriver
from fusee._status import FINISHED_STATUSES, RunStatus
from fusee.engine._carry import seed
from fusee.engine._inbox import deliver_command
from fusee.engine._state import RunState, Shard, shard_index
from fusee.engine._timers import DEADLINE, TIMER, WAKE
from fusee.errors import FuseeError, RunQueued, StaleLease, UnknownWorkflow
from fusee.machine import ChildCompleted, Completion, OpKind
from fusee.record import (
    Attempt,
    Attributes,
    Awaiting,
    Cancel,
    Child,
    ChildDone,
    Chunk,
    Completed,
    Done,
    Event,
    Fired,
    Heartbeat,
    Patch,
    Record,
    Resume,
    Send,
    Signal,
    Start,
    Status,
    Step,
    StreamEnd,
    Timer,
    Update,
    UpdateDone,
    Value,
    Wait,
    Waited,
)
from fusee.remote._journal import decode_journal, no_run
from fusee.remote._versions import UNVERSIONED
from fusee.store import RunRow

if TYPE_CHECKING:
    from fusee._definitions import WorkflowDef
    from fusee.engine._engine import Engine

__all__ = ["Runs", "pinned_elsewhere", "unknown_workflow"]


class Runs:
    """The loaded runs of one engine, by shard, and their loading and parking.

    Example:
        See `fusee.engine.Engine`, which keeps one.
    """

    def __init__(self, engine: Engine, shards: int) -> None:
        self._engine = engine
        self.shards = [Shard() for _ in range(shards)]
        self._loading: dict[str, asyncio.Future[RunState | None]] = {}
        # Ended runs whose row still says "running" while their outbox
        # empties (`Engine.ended`): ended, though their row does not say so
        # yet, so a message to one never loads it again.
        self.ending: dict[str, RunState] = {}

    # --- lookup ------------------------------------------------------------------------------

    def shard(self, id: str) -> Shard:
        """The shard of run ``id``."""
        return self.shards[shard_index(id, len(self.shards))]

    def shard_index(self, id: str) -> int:
        """The number of run ``id``'s shard."""
        return shard_index(id, len(self.shards))

    def loaded(self, id: str) -> RunState | None:
        """The loaded state of run ``id``, or None (parked, ended, never seen)."""
        return self.shard(id).runs.get(id)

    def is_loading(self, id: str) -> bool:
        """Whether run ``id`` is being loaded from its journal now."""
        return id in self._loading

    async def loading_settled(self, id: str) -> None:
        """Returns once no load of run ``id`` is under way (loaded, or found missing)."""
        while (pending := self._loading.get(id)) is not None:
            await asyncio.wait((pending,))

    def all(self) -> list[RunState]:
        """Every loaded run (a snapshot)."""
        return [state for shard in self.shards for state in list(shard.runs.values())]

    # --- rows --------------------------------------------------------------------------------

    def row(
        self, state: RunState, *, wake_ms: int | None = None, finished_ms: int | None = None
    ) -> RunRow:
        """The row of ``state``'s run as it stands."""
        # Positional: a row is made at every start and end, and keywords
        # cost a class call a dict. The row copies the attributes.
        parent = state.parent
        return RunRow(
            state.id,
            state.run,
            state.workflow.name,
            state.row_status,
            state.started_ms,
            finished_ms,
            wake_ms,
            state.attributes,
            parent.id if parent is not None else None,
            self._engine.version,
        )

    def may_run(self, wf: WorkflowDef[Any, Any], version: int) -> bool:
        """Whether this engine runs a run of ``wf`` started on version ``version`` (its number).

        A pinned workflow's run runs on its version only; an ``auto`` one's,
        one started before versions were recorded, and any run of an engine
        that does not pin (`Engine.pins`), on any.
        """
        engine = self._engine
        return (
            not engine.pins
            or version in (UNVERSIONED, engine.version_number)
            or wf.versioning == "auto"
        )

    def put_row(self, state: RunState) -> None:
        """Queues ``state``'s row with the next group commit."""
        self._engine.committer.put_row(self.row(state))

    # --- making and loading ------------------------------------------------------------------

    def make_state(self, wf: WorkflowDef[Any, Any], records: list[Record], gate: int) -> RunState:
        """A new state for a run of ``wf`` with journal ``records`` (not loaded yet)."""
        engine = self._engine
        start = records[0]
        assert isinstance(start, Start)
        driver = RunDriver(engine.host, wf, records, gate, strict=engine.strict)
        if (wf.on_error or engine.on_error) == "pause":
            driver.on_bug = engine.host.paused
        state = RunState(
            driver, wf, start.started_ms, start.parent, start.policy, self.shard(start.id)
        )
        driver.host_data = state
        state.journal_len = len(records)
        seed(state, start.meta)
        if engine.strict:
            state.records = list(records)
        return state

    async def wake(
        self, id: str, row: RunRow | None = None, *, recovering: bool = False
    ) -> RunState | None:
        """The loaded run of ``id``, loading it from its journal if it is parked.

        ``row`` is the id's row when the caller just read it (recovery), and
        ``recovering`` says the load is recovery's: the run's outbox is then
        delivered again. Returns None if the run has finished.

        Raises:
            fusee.NotFound: No run has this id.
            fusee.DeterminismError: The run's code diverged from its journal.
        """
        state = self.loaded(id)
        if state is not None:
            return state
        engine = self._engine
        stuck = engine.stuck_error(id)
        if stuck is not None:
            raise stuck
        pending = self._loading.get(id)
        if pending is not None:
            state = await asyncio.shield(pending)
            # Woken after the load, this caller may find the run unloaded
            # meanwhile (parked, dropped, the engine closed): its state is
            # then closed, and the caller needs the run's current one.
            engine.check_open()
            if state is not None and self.loaded(id) is not state:
                return await self.wake(id, row, recovering=recovering)
            return state
        fut: asyncio.Future[RunState | None] = engine.loop.create_future()
        self._loading[id] = fut
        try:
            state = await self._load(id, row, recovering)
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()
            if isinstance(e, FuseeError) and not isinstance(e, StaleLease | RunQueued):
                # The run cannot be loaded: whoever waits for its result
                # hears why instead of waiting forever (a run that moved to
                # another worker is waited for there: `Engine.drop_shards`;
                # a queued one runs once its queue admits it).
                engine.fail_waiters(id, e)
            raise
        else:
            fut.set_result(state)
        finally:
            del self._loading[id]
        return state

    async def _load(
        self, id: str, row: RunRow | None = None, recovering: bool = False
    ) -> RunState | None:
        engine = self._engine
        if row is None:
            row = await engine.store.get(id)
        if row is None:
            raise no_run(id)
        if row.status in FINISHED_STATUSES or id in self.ending:
            return None
        if row.status == RunStatus.QUEUED:
            # No journal yet: signals and cancels to it are handled by `Queues`.
            raise RunQueued(id)
        wf = engine.workflows.get(row.workflow)
        if wf is None:
            raise UnknownWorkflow(unknown_workflow(row.workflow, engine.workflows))
        entries = await engine.store.load(id, row.run)
        # The engine may have stopped while the store read (a close, or the
        # test host's crash): a run loaded now would never be closed, and its
        # code would be left to the garbage collector.
        engine.check_open()
        if not engine.owns(id):
            # Its shard moved to another worker while it was being read.
            raise StaleLease([self.shard_index(id)])
        started = self.loaded(id)
        if started is not None:
            # Started here while the store was read (a queue admitted it as a
            # message loaded it): that run is the one, never a second copy.
            return started
        records = through_end(decode_journal(id, row.run, entries))
        first = records[0]
        if isinstance(first, Start) and not self.may_run(wf, first.version):
            raise UnknownWorkflow(pinned_elsewhere(id, wf.name, row.version, engine.version))
        engine.record_watch.check(id, row.run, len(entries))
        engine.timers.disarm(id, -1)
        state = self.make_state(wf, records, entries[-1][0])
        state.journal_len = len(entries)
        start = records[0]
        assert isinstance(start, Start)
        state.telemetry = engine.telemetry.run(start, "recovered" if recovering else "woken")
        state.row_status = RunStatus(row.status)
        state.shard.add(state)
        # A row that does not say "suspended" is not a parked run's: the run
        # was loaded when its process stopped (or its shard moved), and what
        # it owed other runs may have been lost with it (a run owing nothing
        # says "suspended" once it waits: `EngineHost.turned`).
        self.rebuild(state, records, recovering=recovering or row.status != RunStatus.SUSPENDED)
        state.driver.start()
        if state.driver.end is None:
            # Signals its journal holds for waits still open (a crash came
            # between them), or set aside: offered once the code, replayed,
            # has reached its waits again, since a wait's type decides
            # whether it takes a signal (`Messages.match`).
            engine.messages.match(state)
        done = records[-1]
        if state.driver.end is not None and isinstance(done, Done):
            # A journal that ends with the run's `Done` under a row still
            # unfinished (the row's write was lost with a crash inside a
            # batch): the run is finished as if the `Done` were new, so its
            # row, its result's waiters and its parent hear of it.
            engine.ended(state, done, entries[-1][0])
            return None
        # A woken run takes a delivery that makes it go on: its row says
        # "running" at once (even when the store's does: a park's
        # "suspended" row may still be on its way), so that a crash before it
        # parks again recovers it.
        if state.row_status == RunStatus.SUSPENDED:
            state.row_status = RunStatus.RUNNING
        self.put_row(state)
        return state

    def rebuild(self, state: RunState, records: list[Record], *, recovering: bool = False) -> None:
        """What the host keeps beside the machine, from the journal.

        Signals, open waits and their deadlines, timers, children, updates'
        outcomes and attributes; with ``recovering``, the sends too (delivered
        again: the crash may have lost them, and their targets count each once).
        """
        engine = self._engine
        id, run = state.id, state.run
        timers: dict[int, int] = {}
        deadlines: dict[int, int] = {}
        children: dict[int, Child] = {}
        sends: list[Send] = []
        for rec in records:
            match rec:
                case Signal():
                    state.signals.append(rec)
                    if rec.dedup:
                        state.dedups.add(rec.dedup)
                case Send():
                    sends.append(rec)
                case Update():
                    state.update_ids[rec.id] = len(state.update_ids)
                case UpdateDone():
                    state.update_outcomes[rec.ordinal] = (rec.status, rec.payload)
                case Wait():
                    state.waits[rec.seq] = rec.name
                    if rec.deadline_ms:
                        deadlines[rec.seq] = rec.deadline_ms
                case Waited():
                    state.waits.pop(rec.seq, None)
                    deadlines.pop(rec.seq, None)
                    if rec.outcome.is_signal:
                        state.consumed.add(rec.outcome.ordinal)
                case Timer():
                    timers[rec.seq] = rec.fire_at_ms
                case Fired():
                    timers.pop(rec.seq, None)
                case Child():
                    children[rec.seq] = rec
                case ChildDone():
                    children.pop(rec.seq, None)
                case Attributes():
                    state.attributes.update(_codec.decode(rec.payload))
                case Cancel():
                    deadlines.clear()
                    state.cancelled = True
                case (
                    Start()
                    | Step()
                    | Attempt()
                    | Resume()
                    | Value()
                    | Done()
                    | Heartbeat()
                    | Awaiting()
                    | Completed()
                    | Patch()
                    | Chunk()
                    | StreamEnd()
                    | Event()
                ):
                    # The machine rebuilds these itself (`RunMachine`).
                    continue
                case _:
                    assert_never(rec)
        for seq, at in timers.items():
            engine.timers.arm(id, run, seq, at, TIMER)
        for seq, at in deadlines.items():
            engine.timers.arm(id, run, seq, at, DEADLINE)
        engine.deadlines.arm(state)
        for child in children.values():
            engine.messages.owe(state, child)
        if recovering:
            for send in sends:
                engine.messages.owe(state, send)

    async def reload(self, state: RunState) -> RunState | None:
        """Loads ``state``'s run again from its journal, on the engine's current code.

        For a run a bug paused (``on_error="pause"``): its code is replayed
        from the start, so a fix deployed since takes over where it raised.
        """
        engine = self._engine
        await engine.committer.durable(state.driver.machine.gate)
        if self.loaded(state.id) is state:
            state.shard.remove(state)
            state.driver.close()
            if state.telemetry is not None:
                state.telemetry.unloaded("resumed")
        return await self.wake(state.id)

    # --- deliveries to runs that may be parked -----------------------------------------------

    def fire(self, id: str, run: int, seq: int, completion: Completion) -> None:
        """Delivers ``completion`` to operation ``seq`` of run ``run`` of ``id``."""
        state = self.loaded(id)
        if state is not None:
            if state.run == run:
                state.driver.complete(seq, completion)
            return
        self._engine.spawn(self.deliver(id, run, seq, completion))

    async def deliver(
        self, id: str, run: int, seq: int, completion: Completion, *, settle: bool = False
    ) -> None:
        """`fire` for a run that may have to be woken first (or that another worker serves).

        With ``settle`` it returns once what the completion made the run
        record is durable (an inbox's ``deliver`` is answered then, never
        before: a crash before would lose it).
        """
        engine = self._engine
        if not engine.owns(id):
            # Only a child's end reaches a run from another shard.
            assert isinstance(completion, ChildCompleted)
            await engine.store.post_command(deliver_command(id, run, seq, completion))
            return
        state = await self.wake(id)
        taken = state is not None and state.run == run and state.driver.complete(seq, completion)
        if taken and settle and state is not None:
            await engine.committer.durable(state.driver.machine.gate)

    def wake_soon(self, id: str) -> None:
        """Wakes parked run ``id`` (its wake-up time came)."""
        self._engine.spawn(self.wake(id))

    # --- parking -----------------------------------------------------------------------------

    def arm_wake(self, row: RunRow) -> None:
        """Arms a parked run's wake-up from its row."""
        if row.wake_ms is not None:
            self._engine.timers.arm(row.id, row.run, -1, row.wake_ms, WAKE)

    def _parkable(self, state: RunState) -> bool:
        return (
            self.loaded(state.id) is state
            and state.driver.machine.is_suspended()
            and not state.steps
            and not state.updates
            and not state.outbox
        )

    def wake_ms(self, state: RunState) -> int | None:
        """When a suspended run must be woken if it is parked (None: only by a message)."""
        wake = min(state.due.values(), default=None)
        m = state.driver.machine
        if any(m.pending_kind(seq) is OpKind.CHILD for seq in range(m.next_seq())):
            # A child's end reaches its parked parent as a delivery the
            # parent records later; a crash in between would lose it (the
            # finished child is not recovered). A parent parked on a child is
            # therefore woken at once by recovery, which replays it and asks
            # its children again (`rebuild` -> `start_child`).
            now = self._engine.clock.now_ms()
            wake = now if wake is None else min(wake, now)
        return wake

    async def park(self, state: RunState) -> None:
        """Drops suspended ``state`` from memory once its records are durable."""
        state.park_handle = None
        engine = self._engine
        driver = state.driver
        if engine.closed or not self._parkable(state):
            return
        await engine.committer.durable(driver.machine.gate, bounded=False)
        if not self._parkable(state):
            return
        if engine.strict:
            self.check_replay(state)
            if driver.error is not None:
                return
        wake = self.wake_ms(state)
        state.shard.remove(state)
        driver.close()
        if state.telemetry is not None:
            state.telemetry.unloaded("parked")
        state.row_status = RunStatus.SUSPENDED
        engine.committer.put_row(self.row(state, wake_ms=wake))

    def check_replay(self, state: RunState) -> None:
        """The dev profile's strict replay: the journal so far, replayed against the code."""
        if state.records is None or _interrupted(state):
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
            self._engine.host.stuck(state.driver, replay.error)

    def close_all(self) -> None:
        """Ends every loaded run's code and unloads it (the engine stops)."""
        for shard in self.shards:
            for state in shard.runs.values():
                state.driver.close()
                if state.telemetry is not None:
                    state.telemetry.unloaded("closed")
            shard.clear()
        self.ending.clear()


def through_end(records: list[Record]) -> list[Record]:
    """A run's journal as it is read: from its last `Start` up to its `Done`.

    No record follows a run's end; a store written before that rule held
    may still have some (a signal acknowledged while the run was ending),
    and must still read. A `Start` whose batch was torn (a store that broke
    its all-or-nothing rule, so the start was never acknowledged) leaves a
    prefix the next start of the run follows: that prefix is never read.
    """
    start = 0
    end = len(records)
    for i, rec in enumerate(records):
        t = type(rec)
        if t is Start and i > start:
            start, end = i, len(records)
        elif t is Done and end == len(records):
            end = i + 1
    if start == 0 and end == len(records):
        return records
    return records[start:end]


def pinned_elsewhere(id: str, workflow: str, version: str, here: str) -> str:
    """Why an engine does not run run ``id``: it is pinned to another version.

    Example:
        >>> pinned_elsewhere("o-1", "checkout", "v1", "v2").split(";")[0]
        "run 'o-1' started on version 'v1' and runs on it only (workflow 'checkout' is pinned)"
    """
    return (
        f"run {id!r} started on version {version!r} and runs on it only (workflow "
        f"{workflow!r} is pinned); this engine runs version {here!r}: a worker of version "
        f"{version!r} serves it (`fusee versions` lists them), or mark the workflow "
        '@fusee.workflow(..., versioning="auto") to move its runs to new code'
    )


def unknown_workflow(name: str, workflows: Any) -> str:
    """The message for a workflow name an engine was not given."""
    known = ", ".join(sorted(workflows)) or "none"
    return (
        f"workflow '{name}' is not registered with this engine (it has: {known}); "
        "pass it in Engine.open(..., workflows=[...])"
    )


def _interrupted(state: RunState) -> bool:
    """Whether the run failed with the watchdog's interruption.

    Its replay would run the same code that never yielded, with no watchdog
    looking at it (the replay is not a loaded run): the run's end says it all.
    """
    end = state.driver.end
    if end is None or end.status is not Status.FAILED:
        return False
    error = _codec.decode(end.payload)
    return isinstance(error, list) and bool(error) and error[0] == "WatchdogError"
