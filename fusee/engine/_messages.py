"""Messages to runs: signals, sends, queries, updates, cancels, resumes, completions, children.

Each wakes its run if it is parked, records what it carries, and returns
once that record is durable.

The rule: a message is acknowledged (its call returns) only once its record
is durable, and a signal is matched to waits in the order the journal
records them, so replay matches the same signal to the same wait.

A message payload never fails a run. A signal whose definition the engine
knows (`fusee._definitions.KnownSignals`: those of its workflows' modules) is refused
with `fusee.PayloadError` before anything is recorded. One it cannot check
(sent by name only, or a name of disagreeing definitions) is recorded, and
a wait whose type it does not fit sets it aside: the wait goes on and takes
the next one that fits. No record says so: the decision is the wait's
decoder's, a function of the payload and the code, so replay and recovery
make it again the same way, and a reader of the journal sees it as a signal
left unconsumed while a wait of its name was open (`fusee._jsonview.SignalMarks`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from fusee import _codec
from fusee._definitions import KnownSignals
from fusee._driver import UPDATE_REJECTED, ReplayHost, RunDriver
from fusee._status import FINISHED_STATUSES, RunStatus
from fusee.engine._carry import carried_of
from fusee.engine._run import dedup_key
from fusee.engine._runs import through_end, unknown_workflow
from fusee.engine._state import cancel_key
from fusee.errors import (
    FuseeError,
    NotFound,
    PayloadError,
    RunFinished,
    RunQueued,
    StaleLease,
    UnknownQueue,
    UpdateFailed,
    UpdateRejected,
)
from fusee.machine import ChildCompleted, SignalMatched
from fusee.record import (
    CANCEL_SEND,
    DETACHED,
    Child,
    Parent,
    Send,
    Signal,
    Start,
    Status,
    Update,
    UpdateDone,
    decode,
)
from fusee.remote import CompletionToken
from fusee.remote._journal import decode_journal, end_record, error_pair

if TYPE_CHECKING:
    from fusee._definitions import WorkflowDef
    from fusee.engine._clock import Clock
    from fusee.engine._commit import Committer
    from fusee.engine._leases import Leases
    from fusee.engine._queues import CreateRun, Queues
    from fusee.engine._runs import Runs
    from fusee.engine._state import RunState
    from fusee.engine._timers import Timers
    from fusee.remote import Remote
    from fusee.store import RunRow, Store

__all__ = ["Messages"]

log = logging.getLogger("fusee")

T = TypeVar("T")

_OK = Status.OK
_FAILED = Status.FAILED

# How often a message to a run not started yet (admitted from its queue, or
# the next run of a continue-as-new) looks again (doubling up to the second).
_ADMITTED_POLL_S: Final = 0.01
_ADMITTED_POLL_MAX_S: Final = 0.2


class _Held:
    """A message its queued run holds (`Messages._target_or_queued`)."""


_HELD: Final = _Held()


class Turning(Protocol):
    """What the messages room asks of the host: a run's turn after a resume."""

    def turned(self, driver: RunDriver) -> None: ...


class Routing(Protocol):
    """What a run's sends and cancels ask of the router (`fusee.engine._router.Router`)."""

    async def signal(
        self, id: str, name: str, payload: bytes, dedup: int, by: bytes | None
    ) -> None: ...

    async def cancel(self, id: str, reason: str) -> None: ...


class Parts(Protocol):
    """The engine's parts the messages room reaches, built after it (the Engine implements it)."""

    @property
    def queues(self) -> Queues: ...

    @property
    def router(self) -> Routing: ...


class Messages:
    """Delivers messages to the runs of one engine.

    Example:
        See `fusee.Run.signal`, `fusee.Run.update` and friends, which call it.
    """

    def __init__(
        self,
        *,
        store: Store,
        committer: Committer,
        clock: Clock,
        loop: asyncio.AbstractEventLoop,
        runs: Runs,
        timers: Timers,
        host: Turning,
        remote: Remote,
        leases: Leases | None,
        workflows: Mapping[str, WorkflowDef[Any, Any]],
        workflow: Callable[[WorkflowDef[Any, Any] | str], WorkflowDef[Any, Any]],
        spawn: Callable[[Coroutine[Any, Any, Any]], object],
        check_open: Callable[[], None],
        closed: Callable[[], bool],
        owns: Callable[[str], bool],
        create_run: CreateRun,
        outbox_done: Callable[[RunState, int], None],
        continue_run: Callable[[RunRow], Awaitable[None]],
        parts: Parts,
    ) -> None:
        self._store = store
        self._committer = committer
        self._clock = clock
        self._loop = loop
        self._runs = runs
        self._timers = timers
        self._host = host
        self._remote = remote
        # Read by `forwards`: None on a store no worker shares.
        self.leases = leases
        self._workflows = workflows
        self._workflow_of = workflow
        self._spawn = spawn
        self._check_open = check_open
        self._closed = closed
        self._owns = owns
        self._create_run = create_run
        self._outbox_done = outbox_done
        self._continue_run = continue_run
        self._parts = parts
        self._tokens = 0
        # The signal definitions signals are checked against before they are
        # recorded (``fusee worker`` adds its modules').
        self.known = KnownSignals.of_workflows(workflows.values())

    # --- signals -----------------------------------------------------------------------------

    def match(self, state: RunState) -> None:
        """Hands buffered signals to open waits, oldest wait first.

        A wait takes the oldest signal of its name whose payload fits its
        type; one that does not fit is set aside (logged, left unconsumed).
        One the code's dynamic signal handler took is no wait's.
        """
        if not state.waits:
            return
        timers = self._timers
        driver = state.driver
        for seq in sorted(state.waits):
            # A delivery runs the code, which may drop another wait or end
            # the run: a wait gone meanwhile takes nothing.
            name = state.waits.get(seq)
            if name is None:
                continue
            decode = driver.wait_decoder(seq)
            if decode is None:
                # Not begun by the code (yet): its type is not known, so it is
                # offered its signals once it is (`Runs.wake` after replay).
                continue
            for ordinal, sig in enumerate(state.signals):
                if (
                    sig.name == name
                    and ordinal not in state.consumed
                    and not driver.signal_taken(ordinal)
                ):
                    try:
                        decode(sig.payload)
                    except PayloadError as e:
                        self._set_aside(state, ordinal, seq, e)
                        continue
                    state.consumed.add(ordinal)
                    del state.waits[seq]
                    timers.disarm(state.id, seq)
                    driver.complete(seq, SignalMatched(ordinal, sig.payload))
                    break

    def _set_aside(self, state: RunState, ordinal: int, seq: int, error: PayloadError) -> None:
        """Logs signal ``ordinal`` set aside by wait ``seq`` (once per signal in this process)."""
        if not state.set_aside_once(ordinal):
            return
        log.warning(
            "run %r set aside signal %r #%d: its payload does not fit the type of the wait "
            "at #%d, which goes on waiting for one that does (%s)",
            state.id,
            state.signals[ordinal].name,
            ordinal,
            seq,
            error,
        )

    async def signal_here(
        self, id: str, name: str, payload: bytes, dedup: int, by: bytes | None
    ) -> None:
        """Records signal ``name`` for run ``id``; returns once it is durable.

        Raises:
            fusee.RunFinished: The run has ended (or its end is being recorded).
        """
        self._check_open()
        state = await self._target_or_queued(
            id, lambda: self._parts.queues.signal_queued(id, name, payload, dedup, by)
        )
        if isinstance(state, _Held):
            return
        if state is None or state.driver.end is not None:
            raise await self._finished(id, state, f"signal '{name}'")
        if dedup and dedup in state.dedups:
            # Acknowledged as the first was: once it is durable (everything
            # appended so far is, then).
            await self._committer.durable(state.driver.machine.gate)
            return
        sig = Signal(state.run, name, dedup, payload, by)
        state.add_signal(sig)
        state.driver.append_signal(sig)
        lsn = state.driver.machine.gate
        self.match(state)
        if state.driver.signals_due():
            # No wait took it: the code's signal handlers get it now.
            state.driver.turn()
        await self._committer.durable(lsn)

    async def _target(self, id: str) -> RunState | None:
        """The run a message to ``id`` goes to: its loaded run, past a continue-as-new.

        A run ending in continue-as-new is not the end of its id: a message
        then waits for the next run (started once the end is durable).
        """
        delay = _ADMITTED_POLL_S
        continued = False
        while True:
            state = await self._runs.wake(id)
            if state is None:
                row = await self._store.get(id)
                if row is None or row.status != RunStatus.CONTINUED:
                    return None
                # Its next run is not started yet (its start was lost with a
                # crash, or its shard moved): on its shard's owner, the
                # message starts it, as recovery would; elsewhere it waits
                # for the owner's recovery.
                if self._owns(id) and not continued:
                    continued = True
                    await self._continue_run(row)
                    if self._runs.loaded(id) is not None:
                        continue
                await asyncio.sleep(delay)
                delay = min(delay * 2, _ADMITTED_POLL_MAX_S)
                continue
            end = state.driver.end
            if end is None or end.status is not Status.CONTINUED:
                return state
            await self._committer.durable(state.driver.machine.gate)
            self._check_open()

    async def _target_or_queued(
        self, id: str, to_queued: Callable[[], Awaitable[bool]]
    ) -> RunState | _Held | None:
        """`_target`, or `_HELD` once ``to_queued()`` applied the message to queued ``id``.

        A run its queue admitted has no journal until its start is written:
        the message waits for it (a moment on its owner; after a crash there,
        until the shard's next owner starts it).
        """
        delay = _ADMITTED_POLL_S
        while True:
            try:
                return await self._target(id)
            except RunQueued:
                if await to_queued():
                    return _HELD
            await asyncio.sleep(delay)
            delay = min(delay * 2, _ADMITTED_POLL_MAX_S)

    async def _finished(self, id: str, state: RunState | None, what: str) -> RunFinished:
        """The error for ``what`` sent to run ``id``, which has ended."""
        if state is None:
            state = self._runs.ending.get(id)
        if state is not None:
            status = str(state.row_status)
        else:
            row = await self._store.get(id)
            status = str(row.status) if row is not None else "ended"
        return RunFinished(id, status, what)

    # --- the outbox: what a run's durable records make it owe other runs ---------------------

    def owe(self, state: RunState, rec: Child | Send, lsn: int = 0) -> None:
        """Puts ``rec``'s message in ``state``'s outbox; it goes once ``lsn`` is durable.

        ``lsn`` 0: re-derived from the journal (durable already), it goes now.

        The live reaction to the record (`EngineHost`) and recovery's
        re-derivation from the journal (`Runs.rebuild`) both come here, so
        the outbox is one thing, made one way. A child's start is marked as
        under way at once: a send or cancel to the child, in the same outbox,
        is applied after it (`_after_start`), never before.
        """
        state.outbox.add(rec.seq)
        if isinstance(rec, Child):
            state.child_starting(rec.id)
            self._committer.on_durable(lsn, lambda: self._spawn(self.start_child(state, rec)))
        else:
            before, sent = state.sending_to(rec.target)
            self._committer.on_durable(
                lsn, lambda: self._spawn(self.send(state, rec, before, sent, not lsn))
            )

    def owe_cancel(self, state: RunState, seq: int, child: str) -> None:
        """Puts the cancel of attached child ``child`` (started at ``seq``) in ``state``'s outbox.

        It goes once the records so far are durable. The code drops the
        child again whenever it replays (a recovery re-derives it), and the
        child counts a second cancel as none.
        """
        state.dropped_children.add(seq)
        state.outbox.add(cancel_key(seq))
        self._committer.on_durable(
            state.driver.machine.gate,
            lambda: self._spawn(self.cancel_child(state, seq, child)),
        )

    async def _after_start(self, state: RunState, id: str) -> None:
        """Returns once no start of child ``id`` is in ``state``'s outbox."""
        while state.starting is not None and (started := state.starting.get(id)) is not None:
            await started.wait()

    async def send(
        self,
        sender: RunState,
        rec: Send,
        before: asyncio.Event | None,
        sent: asyncio.Event,
        again: bool,
    ) -> None:
        """A ``ctx.send`` of ``sender``, once its record is durable (the outbox's delivery).

        Deduplicated by the sender's position, so a send delivered again after
        a crash counts once at its target. Applied after the start of its
        target, if that is in the same outbox, and after ``before`` (the
        sender's previous send to the same target); sets ``sent`` once done.
        ``again``: re-derived from the journal (it may have been applied).
        """
        key = dedup_key(f"{sender.id}/{sender.run}/{rec.seq}")
        held = False
        try:
            await self._after_start(sender, rec.target)
            if before is not None:
                await before.wait()
            at_ms = sender.driver.send_delays.get(rec.seq)
            if at_ms is not None and at_ms > self._clock.now_ms():
                # A delayed send stays in the outbox until its recorded time
                # (a crash meanwhile: recovery owes it again), with no task
                # waiting for it (an idle engine is idle); the sender's later
                # sends to the target go meanwhile.
                held = True

                def again_then() -> None:
                    if not self._closed():
                        self._spawn(self.send(sender, rec, None, asyncio.Event(), again))

                self._clock.call_at(at_ms, again_then)
                return
            try:
                if rec.name == CANCEL_SEND:
                    # A second delivery (after a crash) finds it cancelled: a no-op.
                    await self._parts.router.cancel(rec.target, str(_codec.decode(rec.payload)))
                else:
                    await self._parts.router.signal(
                        rec.target, rec.name, rec.payload, key, _codec.encode(sender.id)
                    )
            except (NotFound, FuseeError) as e:
                # Applied again from the journal (`Runs.rebuild`), a send may
                # have reached its target before that ended: no warning then.
                # A cancel of a run that ended first has nothing left to do.
                ended = isinstance(e, RunFinished)
                log.log(
                    logging.DEBUG
                    if again and ended
                    else logging.INFO
                    if ended and rec.name == CANCEL_SEND
                    else logging.WARNING,
                    "run %r sent signal %r to %r, which was not delivered: %s",
                    sender.id,
                    rec.name,
                    rec.target,
                    e,
                )
        finally:
            sent.set()
            if sender.sending is not None and sender.sending.get(rec.target) is sent:
                del sender.sending[rec.target]
        # Not in a `finally`: a delivery cut short by the engine's close or
        # crash stays in the outbox, and recovery delivers it again.
        if not held:
            self._outbox_done(sender, rec.seq)

    # --- children ----------------------------------------------------------------------------

    async def start_child(self, parent: RunState, rec: Child) -> None:
        """Starts child ``rec`` of ``parent`` (or finds it started), once ``rec`` is durable."""
        link = Parent(parent.id, parent.run, rec.seq)
        try:
            await self.start_child_of(
                link,
                rec,
                dropped=rec.seq in parent.dropped_children,
                queued=parent.driver.child_queues.get(rec.seq),
                not_before_ms=parent.driver.child_delays.get(rec.seq, 0),
                trace=parent.telemetry.traceparent() if parent.telemetry is not None else None,
            )
        finally:
            starting = parent.starting
            started = starting.pop(rec.id, None) if starting is not None else None
            if started is not None:
                started.set()
        # Only once the child's start is durable (a start cut short by a
        # close or crash stays in the outbox, for recovery to redo).
        self._outbox_done(parent, rec.seq)

    async def start_child_of(
        self,
        link: Parent,
        rec: Child,
        *,
        dropped: bool = False,
        queued: tuple[str, str | None] | None = None,
        trace: bytes | None = None,
        not_before_ms: int = 0,
    ) -> None:
        """Starts child ``rec`` of the run ``link`` names (or finds it started).

        ``dropped``: the parent cancelled it before its start was durable,
        so it starts only if it had started already. ``queued``: the queue
        and key it starts through, if any. ``trace``: the parent's
        ``traceparent``, for the child's run span. A child of a shard
        another worker holds is started by that worker, once (the command's
        id is the parent's position).
        """
        if not self._owns(rec.id):
            fields = {
                "workflow": rec.wtype,
                "input": rec.input,
                "parent": [link.id, link.run, link.seq],
                "flags": rec.flags,
                "deadline_ms": rec.deadline_ms,
                "dropped": dropped,
                "queued": list(queued) if queued is not None else None,
                "trace": trace,
                "not_before_ms": not_before_ms,
            }
            command_id = f"child/{link.id}/{link.run}/{link.seq}"
            await self._remote.call("start", rec.id, fields, command_id=command_id)
            if not rec.flags & DETACHED:
                # Asked again by a later life of the parent (its recovery):
                # the command, answered then, is not applied again, so the
                # end of a child that ended meanwhile is read here. (An end
                # delivered to an earlier life that did not record it is
                # delivered again; a second delivery changes nothing.)
                found = await self._store.get(rec.id)
                if found is not None and found.status in _ENDED:
                    journal = await self._store.load(rec.id, found.run)
                    if _parent_of(journal) == link:
                        self._child_ended(link, rec, found, journal)
            return
        runs = self._runs
        # A load under way (a message to the id) may yet find no run.
        await runs.loading_settled(rec.id)
        row = await self._store.get(rec.id) if runs.loaded(rec.id) is None else None
        loaded = runs.loaded(rec.id)
        if row is not None and row.status == RunStatus.QUEUED and (queued or not_before_ms):
            return  # queued by this start before a crash
        if loaded is not None or row is not None:
            entries: list[tuple[int, bytes]] = []
            if loaded is not None:
                # Checked from memory: a child started a moment ago (by the
                # parent's previous life, say) may not be in the store yet.
                # Its start is acknowledged (a command answered, an outbox
                # entry done) only once it is: a crash would lose it, and
                # nothing would start it again.
                await self._committer.durable(loaded.start_lsn)
                parent_of = loaded.parent
            else:
                assert row is not None
                entries = await self._store.load(rec.id, row.run)
                parent_of = _parent_of(entries)
            if parent_of != link:
                runs.fire(
                    link.id,
                    link.run,
                    rec.seq,
                    ChildCompleted(
                        _FAILED,
                        _codec.encode(
                            ["AlreadyExists", f"run id '{rec.id}' is taken by another run"]
                        ),
                    ),
                )
                return
            if row is not None and row.status in _ENDED and not rec.flags & DETACHED:
                self._child_ended(link, rec, row, entries)
            return
        if dropped:
            # Cancelled before its start was durable: it never starts.
            return
        wf = self._workflows.get(rec.wtype)
        if wf is None:
            runs.fire(
                link.id,
                link.run,
                rec.seq,
                ChildCompleted(
                    _FAILED,
                    _codec.encode(
                        ["UnknownWorkflow", unknown_workflow(rec.wtype, self._workflows)]
                    ),
                ),
            )
            return
        if queued is not None or not_before_ms:
            name, key = queued if queued is not None else (None, None)
            try:
                await self._parts.queues.start_child(
                    wf, rec, link, name, key, trace=trace, not_before_ms=not_before_ms
                )
            except UnknownQueue as e:
                runs.fire(
                    link.id,
                    link.run,
                    rec.seq,
                    ChildCompleted(_FAILED, _codec.encode(["UnknownQueue", str(e)])),
                )
            return
        lsn = self._create_run(
            wf,
            rec.id,
            rec.input,
            parent=link,
            policy=rec.flags,
            run=1,
            trace=trace,
            deadline_ms=rec.deadline_ms,
        )
        try:
            await self._committer.durable(lsn)
        except StaleLease:
            if self._owns(rec.id):
                raise
            # Its shard moved to another worker meanwhile, and nothing of the
            # start was written: that worker starts it.
            await self.start_child_of(
                link,
                rec,
                dropped=dropped,
                queued=queued,
                trace=trace,
                not_before_ms=not_before_ms,
            )

    def _child_ended(
        self, link: Parent, rec: Child, row: RunRow, entries: list[tuple[int, bytes]]
    ) -> None:
        done = end_record(rec.id, row.run, entries)
        if done is not None:
            self._runs.fire(link.id, link.run, rec.seq, ChildCompleted(done.status, done.payload))

    async def cancel_child(self, parent: RunState, seq: int, child: str) -> None:
        """Cancels attached child ``child`` of ``parent``, whose wait the code dropped."""
        await self._after_start(parent, child)
        state = self._runs.loaded(child)
        if state is not None:
            parent_of = state.parent.id if state.parent is not None else None
        else:
            row = await self._store.get(child)
            parent_of = row.parent if row is not None else None
        if parent_of == parent.id:
            # Else not started (it never will be), or not this parent's.
            with contextlib.suppress(RunFinished, NotFound):
                await self._parts.router.cancel(
                    child, f"its parent '{parent.id}' stopped waiting for it"
                )
        # Not in a `finally`, as a send's: a cancel cut short stays owed.
        self._outbox_done(parent, cancel_key(seq))

    # --- queries and updates -----------------------------------------------------------------

    async def query_here(self, id: str, name: str, arg: bytes) -> Any:
        """Asks run ``id``'s query handler (a finished run is replayed to ask it)."""
        self._check_open()
        state = await self._runs.wake(id)
        if state is not None and state.driver.end is None:
            return _codec.decode(state.driver.query(name, arg))
        row = await self._store.get(id)
        assert row is not None
        entries = await self._store.load(id, row.run)
        records = through_end(decode_journal(id, row.run, entries))
        replay = RunDriver(ReplayHost(), self._workflow_of(row.workflow), records, entries[-1][0])
        try:
            replay.start()
            return _codec.decode(replay.query(name, arg))
        finally:
            replay.close()

    async def update_here(self, id: str, name: str, update_id: str | None, payload: bytes) -> Any:
        """`Router.update` for run ``id``, which this engine holds (same answers and errors)."""
        self._check_open()
        state = await self._target(id)
        if state is None or state.driver.end is not None:
            if update_id is not None:
                outcome = await self._recorded_outcome(id, update_id)
                if outcome is not None:
                    return _update_result(name, id, outcome)
            raise await self._finished(id, state, f"update '{name}'")
        if update_id is not None:
            outcome = self._outcome_of(state, update_id)
            if outcome is not None:
                # Answered as the first was: once its outcome is durable
                # (everything appended so far is, then), never before, or a
                # crash could lose what the repeat acknowledged.
                await self._committer.durable(state.driver.machine.gate)
                return _update_result(name, id, outcome, _result_decoder(state, name))
            first = state.update_waiters.get(update_id)
            if first is not None:
                outcome = await asyncio.shield(first)
                return _update_result(name, id, outcome, _result_decoder(state, name))
        self._tokens += 1
        token = self._tokens
        fut: asyncio.Future[tuple[Status, bytes]] = self._loop.create_future()

        def answered(status: Status, out: bytes) -> None:
            lsn = state.driver.machine.gate
            self._committer.on_durable(lsn, lambda: _settle(fut, (status, out)))

        # The run keeps its callers' futures: its end (or the engine's close)
        # answers them, and it does not park while one waits.
        state.updates.add(fut)
        if update_id is not None:
            state.update_waiters[update_id] = fut
        try:
            state.driver.offer_update(
                token, name, update_id or f"{id}/update/{token}", payload, answered
            )
            outcome = await fut
        finally:
            state.updates.discard(fut)
            if update_id is not None and state.update_waiters.get(update_id) is fut:
                del state.update_waiters[update_id]
        return _update_result(name, id, outcome, _result_decoder(state, name))

    def _outcome_of(self, state: RunState, update_id: str) -> tuple[Status, bytes] | None:
        ordinal = state.update_ids.get(update_id)
        if ordinal is None:
            # Taken by an earlier run of the id, before a continue-as-new.
            return state.carried_updates.get(update_id)
        return state.update_outcomes.get(ordinal)

    async def _recorded_outcome(self, id: str, update_id: str) -> tuple[Status, bytes] | None:
        """The outcome the journal of ended run ``id`` recorded for update ``update_id``."""
        row = await self._store.get(id)
        if row is None:
            return None
        records = decode_journal(id, row.run, await self._store.load(id, row.run))
        ordinal = None
        count = 0
        for rec in records:
            if isinstance(rec, Start):
                carried = dict((u, (s, p)) for u, s, p in carried_of(rec.meta)[1])
                if update_id in carried:
                    return carried[update_id]
            elif isinstance(rec, Update):
                if rec.id == update_id:
                    ordinal = count
                count += 1
            elif isinstance(rec, UpdateDone) and rec.ordinal == ordinal:
                return rec.status, rec.payload
        return None

    # --- cancel, resume, complete ------------------------------------------------------------

    async def cancel_here(self, id: str, reason: str) -> None:
        """Cancels run ``id``; returns once the request is durable."""
        self._check_open()
        state = await self._target_or_queued(
            id, lambda: self._parts.queues.cancel_queued(id, reason)
        )
        if isinstance(state, _Held):
            return
        if state is None or state.driver.end is not None:
            raise await self._finished(id, state, "cancel")
        if not state.mark_cancelled():
            # A second cancel is a no-op: compensation runs to its end.
            return
        state.driver.request_cancel(_codec.encode(reason))
        await self._committer.durable(state.driver.machine.gate)

    async def resume_here(self, id: str) -> None:
        """Gives run ``id``'s paused steps a fresh retry budget."""
        self._check_open()
        state = await self._runs.wake(id)
        if state is None:
            return
        if state.driver.bug is not None:
            # Paused by a bug in its code: replayed on the code there is now.
            await self._runs.reload(state)
            return
        for rec in state.driver.machine.resume(None):
            state.driver.append(rec)
        state.resumed.set()
        self._host.turned(state.driver)
        await self._committer.durable(state.driver.machine.gate)

    async def complete_here(self, token: str, value: Any = None) -> None:
        """Resolves the ``ctx.await_completion`` that handed out ``token``."""
        self._check_open()
        parsed = CompletionToken.parse(token)
        state = await self._runs.wake(parsed.id)
        if state is None or state.run != parsed.run:
            return
        data = _codec.encode(value, name="the completion's value")
        if state.driver.complete_async(parsed.seq, parsed.attempt, _OK, data):
            await self._committer.durable(state.driver.machine.gate)

    def release_updates(self, why: str = "the engine closed before the update's answer") -> None:
        """Answers every waiting update caller (the engine closes, or its store failed)."""
        closed = _codec.encode(["EngineClosed", why])
        for state in self._runs.all():
            for fut in list(state.updates):
                _settle(fut, (Status.CANCELLED, closed))

    def release_updates_of(self, state: RunState) -> None:
        """Tells the update callers of ``state``'s run that it moved to another worker.

        Each caller's update goes on there (`Router.routed`), under its id, so it is
        applied once.
        """
        shard = self._runs.shard_index(state.id)
        for fut in list(state.updates):
            if not fut.done():
                fut.set_exception(StaleLease([shard]))


# A child's row in these says it has ended (a continue-as-new is not its end).
_ENDED: Final = FINISHED_STATUSES - {RunStatus.CONTINUED}


def _parent_of(entries: list[tuple[int, bytes]]) -> Parent | None:
    """The parent a run's `Start` (its first record) names."""
    first = decode(entries[0][1]) if entries else None
    return first.parent if isinstance(first, Start) else None


def _result_decoder(state: RunState, name: str) -> Callable[[bytes], Any]:
    """How update ``name``'s result decodes: to its handler's declared type, if any."""
    return state.driver.handlers.update_result_decoder(name) or _codec.decode


def _update_result(
    name: str,
    id: str,
    outcome: tuple[Status, bytes],
    decode: Callable[[bytes], Any] = _codec.decode,
) -> Any:
    """What `fusee.Run.update` returns (or raises) for a recorded or answered outcome."""
    status, out = outcome
    if status is _OK:
        return decode(out)
    v = _codec.decode(out)
    if isinstance(v, list) and len(v) == 3 and v[0] == UPDATE_REJECTED:
        if v[1] == "PayloadError":
            raise PayloadError(str(v[2]))
        raise UpdateRejected(name, id, str(v[1]), str(v[2]))
    t, m = error_pair(out)
    if status is Status.CANCELLED:
        raise FuseeError(f"update '{name}' of run '{id}' got no answer: {m}")
    raise UpdateFailed(name, id, t, m)


def _settle(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)
