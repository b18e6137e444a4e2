"""RunDriver: one run = its journal machine, its workflow loop and its coroutine.

The driver runs the workflow code until it is quiescent, takes one delivery
from the machine, resolves one future (appending the delivery's record
first), and repeats. It hands its host the effects (records to append, steps
to run, the run's end) and takes completions back.

The rule: results reach workflow code only as deliveries, one at a time, in
journal order, and always decoded from their recorded bytes, so live code
and replayed code see the same values in the same order.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from fusee import _codec
from fusee._definitions import KnownSignals, update
from fusee._loop import WorkflowLoop
from fusee._runtime import CURRENT_UPDATE, ContinueAsNew, Handlers, StepCall, UpdateInfo
from fusee.context import Ctx, begin_sleep
from fusee.errors import (
    Cancelled,
    ChildFailed,
    DeterminismError,
    Failure,
    PayloadError,
    QueryFailed,
    StepFailed,
)
from fusee.machine import (
    AsyncCompleted,
    CancelAll,
    Completion,
    Deliver,
    DeliverLive,
    DeliverUpdate,
    Outcome,
    RunMachine,
    StepCompleted,
)
from fusee.record import (
    Cancel,
    ChildDone,
    Completed,
    Done,
    Fired,
    Handled,
    Record,
    Signal,
    Start,
    Status,
    Step,
    Timer,
    Update,
    Waited,
)

if TYPE_CHECKING:
    from fusee._definitions import UpdateDef, WorkflowDef

__all__ = ["ReplayHost", "RunDriver", "RunHost", "is_bug"]

_OK = Status.OK
_FAILED = Status.FAILED
_CANCELLED = Status.CANCELLED
_TIMED_OUT = Status.TIMED_OUT
_CONTINUED = Status.CONTINUED

# The files of fusee itself: a determinism error names the first frame of a
# call stack outside them, the user's line.
_FUSEE_DIR = __file__.rsplit("/", 1)[0]

log = logging.getLogger("fusee.driver")

# The records the machine replays as deliveries (with a `Waited` that is not
# an abandonment): a signal reaches the code's handlers once the code has
# taken as many deliveries as its journal holds before the signal.
_DELIVERIES = frozenset((Step, Fired, ChildDone, Completed, Cancel, Update))

# A live signal that arrived while the code still replayed: its place is
# once the replay is done.
_AFTER_REPLAY = -1


class RunHost(Protocol):
    """What a driver needs from whoever hosts its run (the engine).

    Records are the host's instructions: it arms a timer from a `Timer`, a
    wait from a `Wait`, starts a child from a `Child`, sends a signal from a
    `Send`, sets a retry from an `Attempt`, ends the run from a `Done`.
    """

    def now_ms(self) -> int:
        """The wall clock, in Unix milliseconds (live values and deadlines only)."""
        ...

    def append(self, driver: RunDriver, record: Record) -> int:
        """Appends ``record`` to the run's journal; returns its LSN."""
        ...

    def append_step(
        self, driver: RunDriver, seq: int, name: str, attempt: int, status: Status, payload: bytes
    ) -> int:
        """Appends the `Step` of a live step's result, as `append` would; returns its LSN.

        The host need not make the record: most only encode it
        (`fusee.record.encode_step`).
        """

    def run_step(self, driver: RunDriver, call: StepCall) -> None:
        """Runs a step's function once the run's gate is durable and its time has come."""
        ...

    def stuck(self, driver: RunDriver, error: DeterminismError) -> None:
        """The code diverged from its journal: the run stops, nothing recorded changes."""
        ...

    def turned(self, driver: RunDriver) -> None:
        """A turn ended: the code is quiescent and has taken every delivery it could."""
        ...

    def child_dropped(self, driver: RunDriver, seq: int, child: str) -> None:
        """The code stopped waiting for attached child ``child`` (cancelled, or dropped).

        Live and on replay alike, so the host can cancel the child (once its
        parent's journal is durable) whenever the parent is loaded again.
        """
        ...


class ReplayHost:
    """A host that replays a journal alone: nothing runs, nothing is stored.

    For strict replay (the dev profile), queries of finished runs and
    ``fusee replay``: the code meets its journal, and a divergence shows as
    the driver's ``error``.

    Example:
        >>> from fusee.record import Start
        >>> import fusee
        >>> @fusee.workflow("w")
        ... async def w(ctx) -> int:
        ...     return 1
        >>> d = RunDriver(ReplayHost(), w, [Start(1, "w-1", "w")], 1)
        >>> d.start()
        >>> d.end.status
        <Status.OK: 0>
    """

    def __init__(self) -> None:
        self._lsn = 1 << 62

    def now_ms(self) -> int:
        return 0

    def append(self, driver: RunDriver, record: Record) -> int:
        self._lsn += 1
        return self._lsn

    def append_step(
        self, driver: RunDriver, seq: int, name: str, attempt: int, status: Status, payload: bytes
    ) -> int:
        self._lsn += 1
        return self._lsn

    def run_step(self, driver: RunDriver, call: StepCall) -> None:
        return None

    def stuck(self, driver: RunDriver, error: DeterminismError) -> None:
        return None

    def turned(self, driver: RunDriver) -> None:
        return None

    def child_dropped(self, driver: RunDriver, seq: int, child: str) -> None:
        return None


class _JournalFuture(asyncio.Future[Any]):
    """A journal operation's future: cancelling it forgets the operation at once.

    Overriding ``cancel`` costs nothing per delivery, where a done callback
    would cost a loop callback for every operation.
    """

    __slots__ = ("_drop",)

    _drop: tuple[RunDriver, int]

    def cancel(self, msg: Any | None = None) -> bool:
        if not super().cancel(msg=msg):
            return False
        driver, seq = self._drop
        driver.dropped(seq)
        return True


class _Op(NamedTuple):
    """A journal operation the code waits for (a tuple: one is made per operation)."""

    future: asyncio.Future[Any]
    kind: str  # "step", "await", "sleep", "wait", "child"
    name: str
    decode: Callable[[bytes], Any] | None = None
    extra: Any = None


@dataclass(slots=True, eq=False)
class _UpdateCall:
    """An update handler started at its delivery, and its caller's token."""

    ordinal: int
    token: int | None
    name: str
    id: str


@dataclass(slots=True)
class RunEnd:
    """How a run ended, as its `Done` record says."""

    status: Status
    payload: bytes


def user_location(frame: Any = None) -> str | None:
    """``file:line`` of the innermost frame outside fusee and asyncio, or None."""
    f = frame if frame is not None else sys._getframe(1)
    while f is not None:
        filename = f.f_code.co_filename
        if not filename.startswith(_FUSEE_DIR) and "/asyncio/" not in filename:
            return f"{filename}:{f.f_lineno}"
        f = f.f_back
    return None


class RunDriver:
    """One run: its machine, its workflow loop and its coroutine.

    The host creates a driver from the run's journal, calls `start`, and
    afterwards reports completions (`step_done`, `complete`, ...) and calls
    `turn` to let the code take them.

    Example:
        See ``fusee.engine``, the host that drives these.
    """

    # Slots: a driver's fields are read on every delivery. CPython 3.11 keeps
    # an object's 30th field on in a dict, where each read is a lookup; a
    # slot stays one load, however many fields the driver grows.
    __slots__ = (
        "__weakref__",  # a test host watches that a finished run leaves memory
        "_delivered",
        "_handler_error",
        "_known",
        "_loop_timers",
        "_marked",
        "_ops",
        "_signal_at",
        "_signals",
        "_signals_reached",
        "_timer_at_ms",
        "_turning",
        "_waited",
        "bug",
        "child_delays",
        "child_queues",
        "end",
        "error",
        "handlers",
        "host",
        "host_data",
        "id",
        "loop",
        "machine",
        "main",
        "on_bug",
        "run",
        "send_delays",
        "signals_handled",
        "signals_taken",
        "start_record",
        "strict",
        "turn_started",
        "update_waiters",
        "watch",
        "workflow",
    )

    def __init__(
        self,
        host: RunHost,
        workflow: WorkflowDef[Any, Any],
        journal: list[Record],
        gate: int,
        *,
        strict: bool = False,
    ) -> None:
        self.host = host
        self.workflow = workflow
        self.machine = RunMachine(journal, gate)
        start = journal[0]
        assert isinstance(start, Start)
        self.start_record = start
        self.id = start.id
        self.run = start.run
        self.strict = strict
        # Children started with ``ctx.child(..., queue=)``: their queue and
        # key by position. Set by the code's call, live and on replay alike,
        # so a recovered run's child start finds it too.
        self.child_queues: dict[int, tuple[str, str | None]] = {}
        # Children started with ``ctx.child(..., delay=)``: when each may
        # start, from a recorded time, set by the code's call as above.
        self.child_delays: dict[int, int] = {}
        # Sends made with ``ctx.send(..., delay=)``: when each goes, likewise.
        self.send_delays: dict[int, int] = {}
        # Time of the run's timers as its journal recorded them: loop time
        # moves to a timer's time when it fires, on replay as live.
        self._timer_at_ms: dict[int, int] = {
            r.seq: r.fire_at_ms for r in journal if isinstance(r, Timer)
        }
        self.loop = WorkflowLoop(self, name=self.id, start_time=start.started_ms / 1000)
        self._ops: dict[int, _Op] = {}
        # Keyed by id(): timer handles compare (and hash) by value.
        self._loop_timers: dict[int, int] = {}
        self.handlers = Handlers()
        # The run's signals by ordinal, and for each the deliveries the code
        # had taken when it reached the journal (`_AFTER_REPLAY`: see there).
        self._signals: list[Signal] = []
        self._signal_at: list[int] = []
        self._delivered = 0
        # Signals whose `Handled` marker the journal holds: not marked again.
        self._marked: set[int] = set()
        delivered = 1 if start.update is not None else 0
        for i in range(1, len(journal)):
            rec = journal[i]
            t = type(rec)
            if t is Signal:
                assert isinstance(rec, Signal)
                self._signals.append(rec)
                self._signal_at.append(delivered)
            elif t in _DELIVERIES:
                delivered += 1
            elif t is Waited:
                assert isinstance(rec, Waited)
                if not rec.outcome.is_abandoned:
                    delivered += 1
            elif t is Handled:
                assert isinstance(rec, Handled)
                self._marked.add(rec.ordinal)
        # Signals the code has reached (handed to handlers at arrival), those
        # a handler got, and those the dynamic handler took (no wait does).
        self._signals_reached = 0
        self.signals_handled: set[int] = set()
        self.signals_taken: set[int] = set()
        # Names the code has begun a wait for, and those the workflow's
        # module defines: the dynamic handler leaves their signals to waits.
        self._waited: set[str] = set()
        self._known: frozenset[str] | None = None
        self._handler_error: BaseException | None = None
        self.update_waiters: dict[int, Callable[[Status, bytes], None]] = {}
        self.main: asyncio.Task[Any] | None = None
        self.end: RunEnd | None = None
        self.error: DeterminismError | None = None
        # A bug that escaped the code (its traceback) pauses the run instead
        # of failing it when the host gives this callback (`on_error="pause"`):
        # it hears of the pause; nothing is recorded.
        self.on_bug: Callable[[RunDriver, str], None] | None = None
        self.bug: str | None = None
        # The host's own state for this run, so it finds it without a lookup.
        self.host_data: Any = None
        self._turning = False
        # When the current turn began (time.monotonic), for the watchdog; and
        # the watchdog, once it aims at this run's turns (`Watchdog.turn_ended`).
        self.turn_started: float | None = None
        self.watch: Any = None

    # --- life ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Starts the workflow coroutine and runs its first turn."""
        # Held by the code alone, not by the driver: a run that ends holds
        # no cycle through it.
        ctx = Ctx(self)
        wf = self.workflow
        try:
            args: tuple[Any, ...] = (
                (ctx, wf.decode_input(self.start_record.input)) if wf.takes_input else (ctx,)
            )
        except PayloadError as e:
            args = ()
            error: BaseException = e

            async def fail() -> None:
                raise error

            self.main = self.loop.create_task(fail(), name=f"{self.id}-main")
        else:
            context = None
            if CURRENT_UPDATE.get() is not None:
                # Started from inside an update handler's turn (a strict
                # replay at a park): the run's main code is in no update.
                context = contextvars.copy_context()
                context.run(CURRENT_UPDATE.set, None)
            self.main = self.loop.create_task(wf.fn(*args), name=f"{self.id}-main", context=context)
        self.turn()

    def close(self) -> None:
        """Ends the run's code without running it further (parking, engine shutdown)."""
        if not self.loop.is_closed():
            self.loop.shutdown()
        # Nothing is delivered to a closed run. Its pending futures refer to
        # the driver, and its ended main task to the code's frames, which
        # hold its `Ctx`: dropped, so that no cycle keeps a parked run alive.
        self._ops.clear()
        self.main = None

    @property
    def finished(self) -> bool:
        """Whether the run has ended (its `Done` is recorded or appended)."""
        return self.end is not None

    # --- the driver loop -------------------------------------------------------------------------

    def turn(self) -> None:
        """Runs the code to quiescence and hands it deliveries until none can be made."""
        if self._turning or self.error is not None or self.end is not None or self.bug:
            return
        self._turning = True
        self.turn_started = time.monotonic()
        m = self.machine
        loop = self.loop
        main = self.main
        assert main is not None
        token = loop.enter()
        # One call for the whole turn (not a helper per turn): it runs for
        # every delivered step.
        try:
            while True:
                loop.run_ready()
                if self.error is not None:
                    self._stop()
                    break
                if self._handler_error is not None:
                    self._handler_failed(self._handler_error)
                    break
                if main.done():
                    self._finish(main)
                    break
                if self._signals_reached < len(self._signals) and self.signals_due():
                    # Handed over before the next delivery (the handlers'
                    # tasks run first), as where the signal is recorded.
                    self._reach_signals()
                    continue
                n = m.next()
                t = type(n)
                if t is DeliverLive:
                    assert isinstance(n, DeliverLive)
                    self._delivered += 1
                    self._deliver_live(
                        n.seq, n.outcome, n.record.record(self.run, n.seq, n.outcome)
                    )
                elif t is Deliver:
                    assert isinstance(n, Deliver)
                    self._delivered += 1
                    if n.record is not None:
                        self._append(n.record)
                    self._resolve(n.seq, n.outcome.status, n.outcome.payload)
                elif t is CancelAll:
                    assert isinstance(n, CancelAll)
                    self._delivered += 1
                    if n.record is not None:
                        self._append(n.record)
                    reason = _reason_text(n.reason)
                    for seq in n.seqs:
                        self._cancel_op(seq, reason)
                    self._cancel_asyncio_waits(reason)
                elif t is DeliverUpdate:
                    assert isinstance(n, DeliverUpdate)
                    self._start_update(n)
                else:
                    if m.is_replaying() and not m.has_live_pending():
                        err = m.stall_error()
                        if err is not None:
                            self._diverged(err, self._waiting_location())
                            self._stop()
                    break
        finally:
            loop.leave(token)
            self._turning = False
            self.turn_started = None
            if self.watch is not None:
                self.watch.turn_ended(self)
        self.host.turned(self)

    def _deliver_live(self, seq: int, outcome: Outcome, record: Record) -> None:
        for end in self.machine.stream_ends(seq, outcome.status):
            self._append(end)
        self._append(record)
        self._resolve(seq, outcome.status, outcome.payload)

    def _finish(self, main: asyncio.Task[Any]) -> None:
        status, payload = self._main_outcome(main)
        if status is None:
            return
        self._end(status, payload, main.exception() if status is _FAILED else None)

    def _handler_failed(self, exc: BaseException) -> None:
        """A signal handler raised: the run ends as if its main code had raised ``exc``."""
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self._end(_FAILED, _codec.encode([type(exc).__name__, str(exc), tb]), exc)

    def _end(self, status: Status, payload: bytes, exc: BaseException | None) -> None:
        m = self.machine
        recorded = m.recorded_done()
        if (
            status is _FAILED
            and self.on_bug is not None
            and recorded is None
            and exc is not None
            and is_bug(exc)
        ):
            # Nothing is recorded: a resume replays the journal on the code
            # deployed since, which may go on where this raised.
            self.bug = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            self.on_bug(self, self.bug)
            return
        try:
            m.check_end()
        except DeterminismError as e:
            self._diverged(e, self.workflow.location)
            self._stop()
            return
        if recorded is not None:
            # Replayed to its end: the journal already says how it ended.
            self.end = RunEnd(recorded[0], recorded[1])
            return
        done = m.finish(status, payload, self.host.now_ms())
        self.end = RunEnd(status, payload)
        for token in m.take_offered_updates():
            waiter = self.update_waiters.pop(token, None)
            if waiter is not None:
                waiter(_CANCELLED, _codec.encode("the run ended before the update was handled"))
        self._append(done)

    def _main_outcome(self, main: asyncio.Task[Any]) -> tuple[Status | None, bytes]:
        if main.cancelled():
            # A coroutine that lets a Cancelled out marks its task cancelled;
            # the reason survives only on the exception result() raises.
            try:
                main.result()
            except asyncio.CancelledError as e:
                return _CANCELLED, _codec.encode(_reason_text_of(e))
        exc = main.exception()
        if exc is None:
            try:
                return _OK, _codec.encode(main.result(), name="the workflow's result")
            except PayloadError as e:
                exc = e
        if isinstance(exc, ContinueAsNew):
            return _CONTINUED, exc.input
        if isinstance(exc, DeterminismError):
            # Raised by a ctx call and let through by the code: already stuck.
            return None, b""
        if isinstance(exc, asyncio.CancelledError):
            return _CANCELLED, _codec.encode(_reason_text_of(exc))
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return _FAILED, _codec.encode([type(exc).__name__, str(exc), tb])

    def _stop(self) -> None:
        assert self.error is not None
        main = self.main
        if main is not None and main.done() and not main.cancelled():
            # The code let the DeterminismError out: it is the run's error,
            # reported once by `stuck`, not an exception nobody retrieved.
            main.exception()
        self.host.stuck(self, self.error)

    def _diverged(self, error: DeterminismError, location: str | None) -> DeterminismError:
        if error.location is None and location is not None:
            error = DeterminismError(error.seq, error.message, location=location)
        if self.error is None:
            self.error = error
        return error

    def diverged_at_call(self, error: DeterminismError) -> DeterminismError:
        """A ctx call found the code off its journal: remember it, stop the run after the turn."""
        return self._diverged(error, user_location())

    def _waiting_location(self) -> str | None:
        for task in sorted(self.loop.tasks, key=lambda t: t.get_name()):
            for frame in reversed(task.get_stack()):
                loc = user_location(frame)
                if loc is not None:
                    return loc
        return self.workflow.location

    # --- appending -------------------------------------------------------------------------------

    def _append(self, record: Record) -> None:
        if self.end is not None and type(record) is not Done:
            # Nothing follows a run's end in its journal: a late heartbeat,
            # a stream chunk or a step's result after the `Done` is dropped.
            return
        self.machine.gate = self.host.append(self, record)

    def append(self, record: Record | None) -> None:
        """Appends a record the code's call produced (None: nothing to append).

        Code unwinding while its run shuts down (parked, or the engine stops)
        records nothing: what its ``finally`` blocks and context managers do
        then (a stream's close, say) is not the run's history, which goes on
        in its next life from the journal as it is.
        """
        if (
            record is not None
            and (self.end is None or type(record) is Done)
            and not self.loop.is_shutting_down()
        ):
            self.machine.gate = self.host.append(self, record)

    # --- operations ------------------------------------------------------------------------------

    def register(
        self,
        seq: int,
        kind: str,
        name: str,
        decode: Callable[[bytes], Any] | None,
        extra: Any = None,
    ) -> asyncio.Future[Any]:
        """A future for operation ``seq``, resolved by its delivery."""
        fut = _JournalFuture(loop=self.loop)
        fut._drop = (self, seq)
        self._ops[seq] = _Op(fut, kind, name, decode, extra)
        return fut

    def wait_decoder(self, seq: int) -> Callable[[bytes], Any] | None:
        """The decoder of wait ``seq``'s signal type; None if the code has not begun that wait.

        The host asks it before it hands a signal to the wait: a payload it
        refuses is set aside, and the wait goes on.
        """
        op = self._ops.get(seq)
        return op.decode if op is not None and op.kind == "wait" else None

    def dropped(self, seq: int) -> None:
        """The code cancelled operation ``seq``'s future: its result will never be delivered.

        The loser of a race, or a task that was cancelled while it awaited.
        """
        if self.loop.is_shutting_down():
            # The run is parked or the engine stops: nothing is dropped, the
            # journal stays as it is for the next life.
            return
        op = self._ops.pop(seq, None)
        if op is not None:
            self.append(self.machine.forget(seq))
            if op.kind == "child":
                self.host.child_dropped(self, seq, op.extra)

    def _resolve(self, seq: int, status: Status, payload: bytes) -> None:
        op = self._ops.pop(seq, None)
        if op is None or op.future.done():
            return
        fut = op.future
        if status is _OK:
            decode = op.decode
            if decode is not None:
                # The common case: a step's or signal's value.
                try:
                    fut.set_result(decode(payload))
                except PayloadError as e:
                    fut.set_exception(e)
                return
            if op.kind == "sleep":
                fire_at = self._timer_at_ms.get(seq)
                if fire_at is not None:
                    self.loop.advance_to(fire_at / 1000)
            fut.set_result(None)
            return
        if status is _TIMED_OUT:
            fut.set_result(None)
            return
        if status is _CANCELLED:
            fut.set_exception(Cancelled(_reason_text(payload)))
            return
        if op.kind == "child":
            fut.set_exception(ChildFailed(str(op.extra), _child_cause(status, payload)))
            return
        err_type, message = _error_of(payload)
        fut.set_exception(StepFailed(op.name, err_type, message))

    def _cancel_asyncio_waits(self, reason: str) -> None:
        """Cancellation reaches the run's tasks that await only asyncio objects.

        A task awaiting an `asyncio.Event`, a `Condition`, a `Queue` or a
        bare future gets `fusee.Cancelled` where it awaits, as a task awaiting
        an operation does; tasks awaiting operations, other tasks or gathers
        hear of it through those. Done at the cancellation's delivery, so
        replay cancels the same tasks at the same point.
        """
        plain = asyncio.Future
        for task in self.loop.tasks:
            waiter = getattr(task, "_fut_waiter", None)
            if waiter is not None and type(waiter) is plain and not waiter.done():
                self.loop.throw(task, Cancelled(reason))

    def _cancel_op(self, seq: int, reason: str) -> None:
        op = self._ops.pop(seq, None)
        if op is not None and not op.future.done():
            op.future.set_exception(Cancelled(reason))
            if op.kind == "child":
                self.host.child_dropped(self, seq, op.extra)

    def now_ms(self) -> int:
        """The host's wall clock (`Runtime`)."""
        return self.host.now_ms()

    def run_step(self, call: StepCall) -> None:
        """Hands a step to the host (`Runtime`)."""
        self.host.run_step(self, call)

    def timer_set(self, seq: int, fire_at_ms: int) -> None:
        """Operation ``seq`` is a timer (`Runtime`): loop time moves to it when it fires."""
        self._timer_at_ms[seq] = fire_at_ms

    # --- loop timers (TimerHost) -----------------------------------------------------------------

    def timer_started(self, handle: asyncio.TimerHandle) -> None:
        """A loop timer (``asyncio.sleep``, ``asyncio.timeout``): a durable sleep."""
        delay = handle.when() - self.loop.time()
        if delay <= 0:
            # Deterministic already: no wall clock decides when it runs.
            self.loop.fire_timer(handle)
            return
        seq, fut = begin_sleep(self, "asyncio.sleep", delay)
        self._loop_timers[id(handle)] = seq
        fut.add_done_callback(functools.partial(self._loop_timer_done, handle))

    def _loop_timer_done(self, handle: asyncio.TimerHandle, fut: asyncio.Future[Any]) -> None:
        self._loop_timers.pop(id(handle), None)
        if fut.cancelled():
            return
        exc = fut.exception()
        if exc is None:
            # Loop time moves to the handle's own time, not the wall clock's.
            self.loop.fire_timer(handle)
            return
        # A cancellation reached the timer: a task sleeping on it gets the
        # cancellation; a timeout's timer just never fires.
        args = handle._args
        if args and isinstance(args[0], asyncio.Future) and not args[0].done():
            args[0].set_exception(exc)
        handle.cancel()

    def timer_cancelled(self, handle: asyncio.TimerHandle) -> None:
        """The code cancelled a loop timer: its durable sleep is dropped."""
        seq = self._loop_timers.pop(id(handle), None)
        if seq is None:
            return
        op = self._ops.get(seq)
        if op is not None and not op.future.done():
            op.future.cancel()

    # --- completions from the host ---------------------------------------------------------------

    def step_done(self, seq: int, status: Status, payload: bytes) -> None:
        """A step's function ended for good; the code takes the result in this turn."""
        if self.end is not None:
            return
        m = self.machine
        live = m.take_live_step(seq)
        if live is not None:
            # The lone live step's result: nothing could be delivered before
            # it, so it skips the queue; and it owns no stream to end
            # (`take_live_step`), so its record is all there is to append.
            m.gate = self.host.append_step(self, seq, live.name, live.attempt, status, payload)
            self._delivered += 1
            self._resolve(seq, status, payload)
        elif not m.complete(seq, StepCompleted(status, payload)):
            return
        self.turn()

    def complete(self, seq: int, completion: Completion) -> bool:
        """Reports a completion (timer, signal, child, async completion) and runs a turn."""
        taken = self.machine.complete(seq, completion)
        if taken:
            self.turn()
        return taken

    def complete_async(self, seq: int, attempt: int, status: Status, payload: bytes) -> bool:
        """``engine.complete(token, value)`` for this run's async completion ``seq``."""
        return self.complete(seq, AsyncCompleted(attempt, status, payload))

    def request_cancel(self, reason: bytes, by: bytes | None = None) -> None:
        """Queues cancellation; it reaches the code at its turn."""
        self.machine.request_cancel_by(reason, by)
        self.turn()

    def offer_update(
        self,
        token: int,
        name: str,
        id: str,
        payload: bytes,
        waiter: Callable[[Status, bytes], None],
    ) -> None:
        """Queues an update request; ``waiter`` hears its result (or rejection)."""
        self.update_waiters[token] = waiter
        self.machine.offer_update(token, name, id, payload)
        self.turn()

    # --- updates and queries ---------------------------------------------------------------------

    def _start_update(self, n: DeliverUpdate) -> None:
        entry = self.handlers.updates.get(n.name)
        if entry is None and self.handlers.dynamic_update is not None:
            entry = _dynamic_update(n.name, *self.handlers.dynamic_update)
        if n.live is not None:
            waiter = self.update_waiters.get(n.live)
            if entry is None:
                self.update_waiters.pop(n.live, None)
                if waiter is not None:
                    waiter(
                        _FAILED,
                        _rejection(
                            "UnknownUpdate",
                            f"the workflow has no handler for update '{n.name}'; register one "
                            "with ctx.on_update(...) before the update is sent",
                        ),
                    )
                return
            udef, _, validator = entry
            try:
                try:
                    arg = udef.decode(n.payload)
                except PayloadError as e:
                    # Refused as a door refuses it (its caller gets a
                    # PayloadError): the run never sees it.
                    raise PayloadError(
                        f"the payload of update '{n.name}' does not fit the type its handler "
                        f"takes, so nothing was recorded: {e}"
                    ) from None
                if validator is not None:
                    validator(arg)
            except Exception as e:
                self.update_waiters.pop(n.live, None)
                if waiter is not None:
                    waiter(_FAILED, _rejection(type(e).__name__, str(e)))
                return
            ordinal, record = self.machine.accept_update(n.name, n.id, n.payload)
            self._append(record)
            self._delivered += 1
        else:
            self._delivered += 1
            ordinal = n.ordinal
            if entry is None:
                self._diverged(
                    DeterminismError(
                        None,
                        f"the journal delivers update '{n.name}' #{ordinal} here "
                        "but the code has registered no handler for it",
                    ),
                    self._waiting_location(),
                )
                return
        udef, handler, _ = entry
        call = _UpdateCall(ordinal, n.live, n.name, n.id)
        self.loop.create_task(
            self._run_update(call, udef, handler, n.payload), name=f"{self.id}-update-{ordinal}"
        )

    async def _run_update(
        self, call: _UpdateCall, udef: UpdateDef[Any], handler: Callable[[Any], Any], payload: bytes
    ) -> None:
        # This task's own context: the handler's `ctx.current_update()`.
        CURRENT_UPDATE.set(UpdateInfo(call.id, call.name))
        try:
            result = handler(udef.decode(payload))
            if asyncio.iscoroutine(result):
                result = await result
            status, out = _OK, _codec.encode(result, name=f"the result of update '{call.name}'")
        except asyncio.CancelledError as e:
            # An operation inside the handler was cancelled (the run's
            # shutdown is RunEvicted, not this): the update failed, and its
            # caller hears so instead of waiting forever.
            status, out = _FAILED, _codec.encode([type(e).__name__, _reason_text_of(e)])
        except Exception as e:
            status, out = _FAILED, _codec.encode([type(e).__name__, str(e)])
        try:
            _, record = self.machine.update_done(call.ordinal, status, out)
        except DeterminismError as e:
            raise self.diverged_at_call(e) from None
        self.append(record)
        if call.token is not None:
            waiter = self.update_waiters.pop(call.token, None)
            if waiter is not None:
                waiter(status, out)

    def query(self, name: str, payload: bytes) -> bytes:
        """Answers query ``name`` from the code's handler (which must not change the run).

        Raises:
            QueryFailed: The handler raised, or the code registered none for ``name``.
        """
        handler = self.handlers.queries.get(name)
        if handler is None and self.handlers.dynamic_query is not None:
            handler = functools.partial(self.handlers.dynamic_query, name)
        if handler is None:
            raise QueryFailed(
                name,
                self.id,
                "UnknownQuery",
                "the run has no handler for it; register one with ctx.on_query(...) "
                "before the query is asked",
            )
        try:
            answer = handler(_codec.decode(payload))
        except Exception as e:
            raise QueryFailed(name, self.id, type(e).__name__, str(e)) from e
        return _codec.encode(answer, name=f"the answer to query '{name}'")

    # --- signals ---------------------------------------------------------------------------------

    def append_signal(self, signal: Signal) -> None:
        """Appends signal ``signal`` that arrived for the run (`append`); its handlers get it.

        The host calls `turn` after it has offered the signal to the run's
        waits, if `signals_due` says a handler may be owed it.
        """
        self.append(signal)
        # Listed even when the run's end or shutdown kept it from the journal,
        # as the host lists it: ordinals stay the host's (`signal_taken`).
        self._signals.append(signal)
        self._signal_at.append(_AFTER_REPLAY if self.machine.is_replaying() else self._delivered)

    def signals_due(self) -> bool:
        """Whether a signal the code has not reached is now at its place in the journal."""
        i = self._signals_reached
        if i >= len(self._signals):
            return False
        at = self._signal_at[i]
        if at == _AFTER_REPLAY:
            if self.machine.is_replaying():
                return False
            # The first look after the replay's last delivery (the turn looks
            # after each): the place a replay of the journal finds it at.
            at = self._signal_at[i] = self._delivered
        return at <= self._delivered

    def signal_taken(self, ordinal: int) -> bool:
        """Whether the dynamic handler took signal ``ordinal``, so no wait may have it."""
        return ordinal in self.signals_taken

    def wait_begun(self, name: str) -> None:
        """The code began a wait for signal ``name`` (`Runtime`)."""
        self._waited.add(name)

    def signal_handler_set(self, name: str | None) -> None:
        """A handler for ``name`` (None: dynamic) is set (`Runtime`): it gets what it missed."""
        for i in range(self._signals_reached):
            if i in self.signals_handled:
                continue
            sig_name = self._signals[i].name
            if name is None:
                if sig_name not in self.handlers.signals and self._dynamic_takes(sig_name):
                    self._call_dynamic(i)
            elif sig_name == name:
                self._call_named(i)

    def _reach_signals(self) -> None:
        while self._signals_reached < len(self._signals) and self.signals_due():
            i = self._signals_reached
            self._signals_reached = i + 1
            name = self._signals[i].name
            if name in self.handlers.signals:
                self._call_named(i)
            elif self.handlers.dynamic_signal is not None and self._dynamic_takes(name):
                self._call_dynamic(i)

    def _dynamic_takes(self, name: str) -> bool:
        if name in self._waited:
            return False
        known = self._known
        if known is None:
            known = self._known = frozenset(KnownSignals.of_workflows([self.workflow]).names())
        return name not in known

    def _handled(self, ordinal: int) -> None:
        """Signal ``ordinal`` goes to a handler: its `Handled` marker, unless journaled already.

        Appended on replay too when the journal lacks it (a crash came
        before it was durable), so readers without the code see it heard.
        """
        self.signals_handled.add(ordinal)
        if ordinal not in self._marked:
            self._marked.add(ordinal)
            self.append(Handled(self.start_record.run, ordinal))

    def _call_named(self, ordinal: int) -> None:
        sig = self._signals[ordinal]
        decode, handler = self.handlers.signals[sig.name]
        self._handled(ordinal)
        try:
            value = decode(sig.payload)
        except PayloadError as e:
            self._left_out(ordinal, e)
            return
        self._start_handler(ordinal, handler, (value,))

    def _call_dynamic(self, ordinal: int) -> None:
        sig = self._signals[ordinal]
        handler = self.handlers.dynamic_signal
        assert handler is not None
        self._handled(ordinal)
        self.signals_taken.add(ordinal)
        try:
            value = _codec.decode(sig.payload)
        except PayloadError as e:
            self._left_out(ordinal, e)
            return
        self._start_handler(ordinal, handler, (sig.name, value))

    def _left_out(self, ordinal: int, error: PayloadError) -> None:
        if not self.machine.is_replaying():
            log.warning(
                "run %r left out signal %r #%d: its payload does not fit its handler's type (%s)",
                self.id,
                self._signals[ordinal].name,
                ordinal,
                error,
            )

    def _start_handler(
        self, ordinal: int, handler: Callable[..., Any], args: tuple[Any, ...]
    ) -> None:
        context = None
        if CURRENT_UPDATE.get() is not None:
            # Set from inside an update handler: the signal's handler is in
            # no update.
            context = contextvars.copy_context()
            context.run(CURRENT_UPDATE.set, None)
        self.loop.create_task(
            self._run_signal_handler(handler, args),
            name=f"{self.id}-signal-{ordinal}",
            context=context,
        )

    async def _run_signal_handler(self, handler: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            result = handler(*args)
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            # The run's cancellation (or shutdown) reached the handler: the
            # run's main code decides how the run ends.
            return
        except ContinueAsNew:
            error: BaseException = RuntimeError(
                "ctx.continue_as_new was called in a signal handler; "
                "call it from the workflow function"
            )
        except Exception as e:
            error = e
        else:
            return
        if self._handler_error is None:
            self._handler_error = error

    # --- streams ---------------------------------------------------------------------------------


# The first item of a refused update's recorded error: its validator (or a
# missing handler) refused it and nothing was recorded.
UPDATE_REJECTED = "UpdateRejected"


def _dynamic_update(
    name: str,
    handler: Callable[[str, Any], Any],
    validator: Callable[[str, Any], Any] | None,
) -> tuple[UpdateDef[Any], Callable[[Any], Any], Callable[[Any], Any] | None]:
    """A dynamic update handler's entry for update ``name``: plain values, the name passed first."""
    return (
        update(name),
        functools.partial(handler, name),
        functools.partial(validator, name) if validator is not None else None,
    )


def is_bug(exc: BaseException) -> bool:
    """Whether ``exc``, escaping workflow code, is a bug rather than a failure it means.

    A step's or child's failure, or a `fusee.Failure` the code raises, is the
    run's failure; anything else (a ``KeyError``, a ``TypeError``) is a bug
    that a fix may get past.

    Example:
        >>> from fusee.errors import Failure
        >>> is_bug(KeyError("sku")), is_bug(Failure("card declined"))
        (True, False)
    """
    return not isinstance(exc, StepFailed | ChildFailed | Failure | asyncio.CancelledError)


def _rejection(type: str, message: str) -> bytes:
    return _codec.encode([UPDATE_REJECTED, type, message])


def _reason_text(payload: bytes) -> str:
    try:
        v = _codec.decode(payload)
    except PayloadError:
        return payload.decode("utf-8", "replace")
    return v if isinstance(v, str) else repr(v)


def _reason_text_of(exc: BaseException) -> str:
    return str(exc.args[0]) if exc.args else "cancelled"


def _error_of(payload: bytes) -> tuple[str, str]:
    try:
        v = _codec.decode(payload)
    except PayloadError:
        return "Error", payload.decode("utf-8", "replace")
    if isinstance(v, list | tuple) and len(v) >= 2:
        return str(v[0]), str(v[1])
    return "Error", str(v)


def _child_cause(status: Status, payload: bytes) -> str:
    if status is _FAILED:
        t, m = _error_of(payload)
        return f"workflow failed: {t}: {m}"
    return f"ended with status {status.name.lower()}"


def error_payload(exc: BaseException) -> bytes:
    """The recorded form of a step's or handler's error: ``[type, message]``."""
    return _codec.encode([type(exc).__name__, str(exc)])
