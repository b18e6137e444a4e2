"""The host side of runs: what a run's driver and the step executor call back.

Records are the host's instructions: a `Timer` arms a timer, a `Wait` a
signal wait, a `Child` starts a child, a `Send` sends a signal, a `Done`
ends the run. The driver calls `EngineHost.append` for each record; the
step executor hands results back through `step_result`.

The rule: what leaves the process (a child started, a signal sent, a
stream's chunk read) waits until the record that produced it is durable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol, assert_never

from fusee import _codec
from fusee._status import RunStatus
from fusee.engine._streams import StepStream
from fusee.engine._timers import DEADLINE, TIMER
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
    encode,
    encode_step,
)

if TYPE_CHECKING:
    from fusee._driver import RunDriver
    from fusee._payloads import Payloads, RecordWatch
    from fusee._runtime import StepCall
    from fusee.engine._clock import Clock
    from fusee.engine._commit import Committer
    from fusee.engine._events import Events
    from fusee.engine._hooks import Hooks
    from fusee.engine._runs import Runs
    from fusee.engine._state import RunState
    from fusee.engine._steps import StepExecutor
    from fusee.engine._streams import Streams
    from fusee.engine._timers import Timers
    from fusee.errors import DeterminismError

__all__ = ["EngineHost"]

log = logging.getLogger("fusee")

# Read after every turn: an enum member read from its class goes through
# the enum metaclass's attribute hook (Python 3.11), ten times a global's cost.
_RUNNING = RunStatus.RUNNING
_PAUSED = RunStatus.PAUSED

# Records that are the machine's own bookkeeping (or, for a signal, recorded
# by `Messages.signal` itself): nothing for the host to do. One set lookup
# for them, the most frequent, rather than a walk down `_react`'s cases.
_QUIET: frozenset[type[Record]] = frozenset(
    {
        Start,
        Step,
        Attempt,
        Resume,
        Fired,
        Signal,
        Value,
        ChildDone,
        Heartbeat,
        Awaiting,
        Completed,
        Patch,
        Handled,
    }
)


class Owing(Protocol):
    """What the host asks of the messages room: waits matched, a run's outbox filled."""

    def match(self, state: RunState) -> None: ...

    def owe(self, state: RunState, rec: Child | Send, lsn: int = 0) -> None: ...

    def owe_cancel(self, state: RunState, seq: int, child: str) -> None: ...


class Admitting(Protocol):
    """What the host asks of the queues room: the runs an end admitted started."""

    @property
    def book(self) -> object | None: ...

    def start_admitted(self) -> None: ...


class Parts(Protocol):
    """The engine's parts the host reaches, built after it (the Engine implements it).

    The host is made first (the run table and the step executor take it),
    so it asks for the others when a run calls back, never at its making;
    it reports a run's end and divergence to the facade through `ended` and
    `diverged`.
    """

    @property
    def runs(self) -> Runs: ...

    @property
    def timers(self) -> Timers: ...

    @property
    def steps(self) -> StepExecutor: ...

    @property
    def streams(self) -> Streams: ...

    @property
    def events(self) -> Events: ...

    @property
    def messages(self) -> Owing: ...

    @property
    def queues(self) -> Admitting: ...

    def ended(self, state: RunState, done: Done, lsn: int) -> None: ...

    def diverged(self, id: str, error: DeterminismError) -> None: ...


class EngineHost:
    """Implements `fusee._driver.RunHost` and `fusee.engine._steps.StepHost` for an engine.

    Example:
        See `fusee.engine.Engine`, which makes one for its runs.
    """

    # What the step executor reads are plain attributes, not properties: it
    # reads them several times a step.
    __slots__ = (
        "_park_after_ms",
        "_parts",
        "_payloads",
        "_record_watch",
        "_spawn",
        "_strict",
        "clock",
        "closed",
        "committer",
        "hooks",
    )

    def __init__(
        self,
        *,
        committer: Committer,
        clock: Clock,
        hooks: Hooks,
        payloads: Payloads,
        strict: bool,
        park_after_ms: int,
        spawn: Callable[[Coroutine[Any, Any, Any]], object],
        parts: Parts,
        record_watch: RecordWatch,
    ) -> None:
        self._record_watch = record_watch
        self._parts = parts
        self._payloads = payloads
        self._strict = strict
        self._park_after_ms = park_after_ms
        self._spawn = spawn
        self.committer = committer
        self.clock = clock
        self.hooks = hooks
        # Set by `Engine` when it closes or is abandoned.
        self.closed = False

    async def sleep_until(self, at_ms: int) -> None:
        await self._parts.timers.sleep_until(at_ms)

    # --- RunHost ------------------------------------------------------------------------------

    def now_ms(self) -> int:
        return self.clock.now_ms()

    def append(self, driver: RunDriver, record: Record) -> int:
        lsn = self.committer.append(driver.id, driver.run, encode(record))
        state: RunState | None = driver.host_data
        if state is None or not state.loaded:
            return lsn
        state.count_record()
        if state.records is not None:
            state.records.append(record)
        if type(record) in _QUIET:
            return lsn
        self._react(state, record, lsn)
        return lsn

    def append_step(
        self, driver: RunDriver, seq: int, name: str, attempt: int, status: Status, payload: bytes
    ) -> int:
        state: RunState | None = driver.host_data
        if state is not None and state.loaded:
            if state.records is not None:
                # The dev profile keeps every record: made, as `append` makes it.
                return self.append(driver, Step(driver.run, seq, name, attempt, status, payload))
            state.count_record()
        # A `Step` is quiet (`_QUIET`): nothing else to do for it.
        payloads = self._payloads
        sealed = payloads.seal_step(payload) if payloads.codecs else None
        if sealed is None:
            data = encode_step(driver.run, seq, name, attempt, status, payload)
            return self.committer.append(driver.id, driver.run, data)
        data = encode_step(driver.run, seq, name, attempt, status, sealed)
        lsn = self.committer.append(driver.id, driver.run, data)
        payloads.presealed.add(lsn)
        return lsn

    def _react(self, state: RunState, record: Record, lsn: int) -> None:
        parts = self._parts
        id, run = state.id, state.run
        # The cases are tried in order: every run ends with a `Done`.
        match record:
            case Done():
                parts.ended(state, record, lsn)
            case Timer():
                parts.timers.arm(id, run, record.seq, record.fire_at_ms, TIMER)
            case Wait():
                state.waits[record.seq] = record.name
                if record.deadline_ms:
                    parts.timers.arm(id, run, record.seq, record.deadline_ms, DEADLINE)
                parts.messages.match(state)
            case Waited():
                state.waits.pop(record.seq, None)
                parts.timers.disarm(id, record.seq)
            case Child() | Send():
                parts.messages.owe(state, record, lsn)
            case Update():
                state.update_ids[record.id] = len(state.update_ids)
            case UpdateDone():
                state.update_outcomes[record.ordinal] = (record.status, record.payload)
            case Attributes():
                state.attributes.update(_codec.decode(record.payload))
                parts.runs.put_row(state)
            case Chunk() | StreamEnd():
                self.committer.on_durable(lsn, lambda: parts.streams.notify(id))
            case Event():
                self.committer.on_durable(lsn, lambda: parts.events.notify(id))
            case Cancel():
                state.mark_cancelled()
                parts.timers.disarm_waits(state)
            case (
                Start()
                | Step()
                | Attempt()
                | Resume()
                | Fired()
                | Signal()
                | Value()
                | ChildDone()
                | Heartbeat()
                | Awaiting()
                | Completed()
                | Patch()
                | Handled()
            ):
                # `_QUIET`: `append` does not call here for these.
                return
            case _:
                assert_never(record)

    def run_step(self, driver: RunDriver, call: StepCall) -> None:
        state: RunState | None = driver.host_data
        if state is None or not state.loaded:
            return
        self._parts.steps.run(state, call)

    def stuck(self, driver: RunDriver, error: DeterminismError) -> None:
        self._parts.diverged(driver.id, error)

    def paused(self, driver: RunDriver, traceback: str) -> None:
        state: RunState | None = driver.host_data
        log.warning(
            "run %r paused: its code raised (a bug, its workflow pauses on bugs); deploy a "
            "fix and call run.resume() (or `fusee resume %s`) to replay it on the new code\n%s",
            driver.id,
            driver.id,
            traceback.rstrip(),
        )
        if state is not None and state.loaded and state.pause():
            self._parts.runs.put_row(state)

    def turned(self, driver: RunDriver) -> None:
        state: RunState | None = driver.host_data
        parts = self._parts
        if state is not None and state.steps:
            # A turn may drop a running step (a lost race, a cancel) or end
            # the run: the step hears it and its task is cancelled.
            parts.steps.drop_unwanted(state)
        if driver.end is not None and parts.queues.book is not None:
            # The runs its end admitted: their `Start`s join its `Done`'s write.
            parts.queues.start_admitted()
        if state is None or not state.loaded or driver.end is not None:
            return
        watch = self._record_watch
        if state.journal_len > watch.over:
            watch.check(state.id, state.run, state.journal_len)
        m = driver.machine
        # A run that owes other runs messages is not idle: its row says
        # "running" until its outbox is empty (`Engine.outbox_done` turns it
        # again), so that recovery loads it and re-derives what it owes.
        if driver.bug is not None:
            return  # paused by a bug: `paused` wrote its row, nothing moves it but a resume
        idle = not state.steps and not state.outbox and driver.error is None and m.is_suspended()
        # The row says what describe says (`status_of`): every surface shows
        # one status, loaded or parked.
        status = _PAUSED if m.is_paused() else _RUNNING
        if idle and status is _RUNNING:
            status = RunStatus.SUSPENDED
        if driver.error is not None:
            status = RunStatus.DIVERGED
        if status != state.row_status:
            if status is RunStatus.PAUSED:
                paused = sorted(
                    {m.pending_name(s) or "?" for s in range(m.next_seq()) if m.step_paused(s)}
                )
                log.warning(
                    "run %r paused: step %s ran out of attempts; fix the cause and call "
                    "run.resume() (or `fusee resume %s`) to retry it",
                    state.id,
                    ", ".join(repr(p) for p in paused),
                    state.id,
                )
            state.mark(status)
            wake = parts.runs.wake_ms(state) if status is RunStatus.SUSPENDED else None
            self.committer.put_row(parts.runs.row(state, wake_ms=wake))
            if status is RunStatus.SUSPENDED and self._strict:
                # The dev profile checks the journal so far against the code
                # at each wait, naming the step that differs.
                parts.runs.check_replay(state)
                if driver.error is not None:
                    return
        if idle:
            clock = self.clock
            state.idle(
                lambda: clock.call_at(
                    clock.now_ms() + self._park_after_ms,
                    lambda: self._spawn(parts.runs.park(state)),
                )
            )
        else:
            state.busy()

    def child_dropped(self, driver: RunDriver, seq: int, child: str) -> None:
        state: RunState | None = driver.host_data
        if state is None or not state.loaded:
            return
        # An attached child does not outlive the wait for it: cancelled once
        # the parent's records saying so are durable (a child not started yet
        # never starts: `Messages.start_child` checks `dropped_children`).
        self._parts.messages.owe_cancel(state, seq, child)

    # --- StepHost -----------------------------------------------------------------------------

    def _acting(self, state: RunState) -> bool:
        """Whether what a step reports may still be recorded for ``state``'s run.

        Not once the store failed: what the run did since its last good write
        is lost, and reopening the engine recovers it from its journal.
        """
        return state.loaded and self.committer.failed is None

    def step_result(self, state: RunState, seq: int, status: Status, payload: bytes) -> None:
        if self._acting(state):
            state.driver.step_done(seq, status, payload)

    def step_paused(self, state: RunState) -> None:
        state.resumed.clear()
        if self._acting(state):
            self.turned(state.driver)

    def token_out(self, state: RunState, seq: int) -> None:
        if self._acting(state):
            state.driver.append(state.driver.machine.awaiting(seq))
            self.turned(state.driver)

    def heartbeat(self, state: RunState, seq: int, data: bytes) -> None:
        if not self._acting(state):
            return
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
                self.heartbeat(state, seq, latest)

        self.committer.on_durable(state.driver.machine.gate, sent)

    def step_stream(self, state: RunState, seq: int, name: str) -> StepStream:
        return StepStream(state, seq, name)
