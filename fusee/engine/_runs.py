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
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Protocol, assert_never

from fusee import _codec
from fusee._driver import ReplayHost, RunDriver, RunHost
from fusee._status import FINISHED_STATUSES, RunStatus
from fusee.engine._carry import seed
from fusee.engine._leases import APPLYING
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
    Handled,
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
from fusee.remote._wire import deliver_command
from fusee.store import RunRow

if TYPE_CHECKING:
    from fusee._definitions import WorkflowDef
    from fusee._payloads import RecordWatch
    from fusee.engine._clock import Clock
    from fusee.engine._commit import Committer
    from fusee.engine._deadlines import Deadlines
    from fusee.engine._leases import Leases
    from fusee.engine._telemetry import RunTelemetry, Telemetry
    from fusee.engine._timers import Timers
    from fusee.errors import DeterminismError
    from fusee.store import Store

__all__ = ["Runs", "pinned_elsewhere", "unknown_workflow"]


class DriverHost(RunHost, Protocol):
    """The host a run's driver calls (`EngineHost`): a bug that pauses, a divergence."""

    def paused(self, driver: RunDriver, traceback: str) -> None: ...

    def stuck(self, driver: RunDriver, error: DeterminismError) -> None: ...


class Owing(Protocol):
    """What loading a run asks of the messages room: waits matched, its outbox filled."""

    def match(self, state: RunState) -> None: ...

    def owe(self, state: RunState, rec: Child | Send, lsn: int = 0) -> None: ...


class Parts(Protocol):
    """The engine's parts the run table reaches, built after it (the Engine implements it).

    The run table is made before the timers (which fire into it) and the
    rooms above it, so it asks for them when a run loads, never at its
    making; it reports a loaded run found ended to the facade (`ended`).
    """

    @property
    def timers(self) -> Timers: ...

    @property
    def deadlines(self) -> Deadlines: ...

    @property
    def messages(self) -> Owing: ...

    @property
    def telemetry(self) -> Telemetry: ...

    @property
    def leases(self) -> Leases | None: ...

    def ended(self, state: RunState, done: Done, lsn: int) -> None: ...


class Runs:
    """The loaded runs of one engine, by shard, and their loading and parking.

    Example:
        See `fusee.engine.Engine`, which keeps one.
    """

    def __init__(
        self,
        shards: int,
        *,
        store: Store,
        committer: Committer,
        clock: Clock,
        loop: asyncio.AbstractEventLoop,
        host: DriverHost,
        workflows: Mapping[str, WorkflowDef[Any, Any]],
        version: str,
        version_number: int,
        pins: bool,
        strict: bool,
        on_error: str,
        record_watch: RecordWatch,
        spawn: Callable[[Coroutine[Any, Any, Any]], object],
        check_open: Callable[[], None],
        closed: Callable[[], bool],
        owns: Callable[[str], bool],
        stuck_error: Callable[[str], DeterminismError | None],
        fail_waiters: Callable[[str, BaseException], None],
        parts: Parts,
    ) -> None:
        self._store = store
        self._committer = committer
        self._clock = clock
        self._loop = loop
        self._host = host
        self._workflows = workflows
        self._version = version
        self._version_number = version_number
        self._pins = pins
        self._strict = strict
        self._on_error = on_error
        self._record_watch = record_watch
        self._spawn = spawn
        self._check_open = check_open
        self._closed = closed
        self._owns = owns
        self._stuck_error = stuck_error
        self._fail_waiters = fail_waiters
        self._parts = parts
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
            self._version,
            # A bug's traceback goes with the row, for other processes' describe.
            state.driver.bug,
        )

    def may_run(self, wf: WorkflowDef[Any, Any], version: int) -> bool:
        """Whether this engine runs a run of ``wf`` started on version ``version`` (its number).

        A pinned workflow's run runs on its version only; an ``auto`` one's,
        one started before versions were recorded, and any run of an engine
        that does not pin (`Engine.pins`), on any.
        """
        return (
            not self._pins
            or version in (UNVERSIONED, self._version_number)
            or wf.versioning == "auto"
        )

    def put_row(self, state: RunState) -> None:
        """Queues ``state``'s row with the next group commit."""
        self._committer.put_row(self.row(state))

    # --- making and loading ------------------------------------------------------------------

    def make_state(
        self,
        wf: WorkflowDef[Any, Any],
        records: list[Record],
        gate: int,
        *,
        telemetry: RunTelemetry | None = None,
        start_lsn: int = 0,
        journal_len: int | None = None,
    ) -> RunState:
        """A new state for a run of ``wf`` with journal ``records`` (not loaded yet)."""
        start = records[0]
        assert isinstance(start, Start)
        driver = RunDriver(self._host, wf, records, gate, strict=self._strict)
        if (wf.on_error or self._on_error) == "pause":
            driver.on_bug = self._host.paused
        state = RunState(
            driver,
            wf,
            start.started_ms,
            start.parent,
            start.policy,
            self.shard(start.id),
            telemetry=telemetry,
            start_lsn=start_lsn,
            records=list(records) if self._strict else None,
            journal_len=len(records) if journal_len is None else journal_len,
        )
        driver.host_data = state
        seed(state, start.meta)
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
        stuck = self._stuck_error(id)
        if stuck is not None:
            raise stuck
        pending = self._loading.get(id)
        if pending is not None:
            state = await asyncio.shield(pending)
            # Woken after the load, this caller may find the run unloaded
            # meanwhile (parked, dropped, the engine closed): its state is
            # then closed, and the caller needs the run's current one.
            self._check_open()
            if state is not None and self.loaded(id) is not state:
                return await self.wake(id, row, recovering=recovering)
            return state
        fut: asyncio.Future[RunState | None] = self._loop.create_future()
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
                self._fail_waiters(id, e)
            raise
        else:
            fut.set_result(state)
        finally:
            del self._loading[id]
        return state

    async def _load(
        self, id: str, row: RunRow | None = None, recovering: bool = False
    ) -> RunState | None:
        if row is None:
            row = await self._store.get(id)
        if row is None:
            raise no_run(id)
        if row.status in FINISHED_STATUSES or id in self.ending:
            return None
        if row.status == RunStatus.QUEUED:
            # No journal yet: signals and cancels to it are handled by `Queues`.
            raise RunQueued(id)
        leases = self._parts.leases
        if leases is not None and not APPLYING.get() and await leases.elsewhere(row.version):
            # A run of another version's lane: the store's inbox takes the
            # caller's message to that lane's worker (a command routed here
            # by the store is this lane's, whatever this worker last read).
            raise StaleLease([self.shard_index(id)])
        wf = self._workflows.get(row.workflow)
        if wf is None:
            raise UnknownWorkflow(unknown_workflow(row.workflow, self._workflows))
        entries = await self._store.load(id, row.run)
        if leases is not None:
            # Its records may be another lane's, numbered past this worker's.
            self._committer.advance(entries[-1][0])
        # The engine may have stopped while the store read (a close, or the
        # test host's crash): a run loaded now would never be closed, and its
        # code would be left to the garbage collector.
        self._check_open()
        if not self._owns(id):
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
            if leases is not None and not APPLYING.get():
                # Served here while its version's lane had no live worker, as
                # this worker last read: the store routes the caller's
                # message by what it knows now (back here, it is answered
                # that the run waits for a worker of its version).
                raise StaleLease([self.shard_index(id)])
            raise UnknownWorkflow(pinned_elsewhere(id, wf.name, row.version, self._version))
        self._record_watch.check(id, row.run, len(entries))
        self._parts.timers.disarm(id, -1)
        start = records[0]
        assert isinstance(start, Start)
        telemetry = self._parts.telemetry.run(start, "recovered" if recovering else "woken")
        state = self.make_state(
            wf, records, entries[-1][0], telemetry=telemetry, journal_len=len(entries)
        )
        state.mark(RunStatus(row.status))
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
            self._parts.messages.match(state)
        done = records[-1]
        if state.driver.end is not None and isinstance(done, Done):
            # A journal that ends with the run's `Done` under a row still
            # unfinished (the row's write was lost with a crash inside a
            # batch): the run is finished as if the `Done` were new, so its
            # row, its result's waiters and its parent hear of it.
            self._parts.ended(state, done, entries[-1][0])
            return None
        # A woken run takes a delivery that makes it go on: its row says
        # "running" at once (even when the store's does: a park's
        # "suspended" row may still be on its way), so that a crash before it
        # parks again recovers it.
        if state.row_status == RunStatus.SUSPENDED:
            state.mark(RunStatus.RUNNING)
        self.put_row(state)
        return state

    def rebuild(self, state: RunState, records: list[Record], *, recovering: bool = False) -> None:
        """What the host keeps beside the machine, from the journal.

        Signals, open waits and their deadlines, timers, children, updates'
        outcomes and attributes; with ``recovering``, the sends too (delivered
        again: the crash may have lost them, and their targets count each once).
        """
        id, run = state.id, state.run
        timers: dict[int, int] = {}
        deadlines: dict[int, int] = {}
        children: dict[int, Child] = {}
        sends: list[Send] = []
        for rec in records:
            match rec:
                case Signal():
                    state.add_signal(rec)
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
                    state.mark_cancelled()
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
                    | Handled()
                    | Chunk()
                    | StreamEnd()
                    | Event()
                ):
                    # The machine rebuilds these itself (`RunMachine`).
                    continue
                case _:
                    assert_never(rec)
        for seq, at in timers.items():
            self._parts.timers.arm(id, run, seq, at, TIMER)
        for seq, at in deadlines.items():
            self._parts.timers.arm(id, run, seq, at, DEADLINE)
        self._parts.deadlines.arm(state)
        for child in children.values():
            self._parts.messages.owe(state, child)
        if recovering:
            for send in sends:
                self._parts.messages.owe(state, send)

    async def reload(self, state: RunState) -> RunState | None:
        """Loads ``state``'s run again from its journal, on the engine's current code.

        For a run a bug paused (``on_error="pause"``): its code is replayed
        from the start, so a fix deployed since takes over where it raised.
        """
        await self._committer.durable(state.driver.machine.gate)
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
        self._spawn(self.deliver(id, run, seq, completion))

    async def deliver(
        self, id: str, run: int, seq: int, completion: Completion, *, settle: bool = False
    ) -> None:
        """`fire` for a run that may have to be woken first (or that another worker serves).

        With ``settle`` it returns once what the completion made the run
        record is durable (an inbox's ``deliver`` is answered then, never
        before: a crash before would lose it).
        """
        if not self._owns(id):
            # Only a child's end reaches a run from another shard.
            assert isinstance(completion, ChildCompleted)
            await self._store.post_command(deliver_command(id, run, seq, completion))
            return
        try:
            state = await self.wake(id)
        except StaleLease:
            if APPLYING.get() or not isinstance(completion, ChildCompleted):
                raise
            # Another lane's run (or its shard moved as it loaded): its
            # worker takes the child's end through the store's inbox.
            await self._store.post_command(deliver_command(id, run, seq, completion))
            return
        taken = state is not None and state.run == run and state.driver.complete(seq, completion)
        if taken and settle and state is not None:
            await self._committer.durable(state.driver.machine.gate)

    def wake_soon(self, id: str) -> None:
        """Wakes parked run ``id`` (its wake-up time came)."""
        self._spawn(self.wake(id))

    # --- parking -----------------------------------------------------------------------------

    def arm_wake(self, row: RunRow) -> None:
        """Arms a parked run's wake-up from its row."""
        if row.wake_ms is not None:
            self._parts.timers.arm(row.id, row.run, -1, row.wake_ms, WAKE)

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
            now = self._clock.now_ms()
            wake = now if wake is None else min(wake, now)
        return wake

    async def park(self, state: RunState) -> None:
        """Drops suspended ``state`` from memory once its records are durable."""
        state.park_timer_fired()
        driver = state.driver
        if self._closed() or not self._parkable(state):
            return
        await self._committer.durable(driver.machine.gate, bounded=False)
        if not self._parkable(state):
            return
        if self._strict:
            self.check_replay(state)
            if driver.error is not None:
                return
        wake = self.wake_ms(state)
        state.shard.remove(state)
        driver.close()
        if state.telemetry is not None:
            state.telemetry.unloaded("parked")
        state.mark(RunStatus.SUSPENDED)
        self._committer.put_row(self.row(state, wake_ms=wake))

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
            self._host.stuck(state.driver, replay.error)

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
