"""The per-run journal machine: fusee-core's ``RunMachine``, ported.

Workflow code is deterministic between journal operations. Every operation
the code starts (``step``, ``sleep``, ``wait_for``, ``child``, ``now``, ...)
takes the next sequence number, so an operation's identity is the order in
which the code *called* it. Results come back as **deliveries**, and the
journal records deliveries in the order they were handed to the code.
Replay hands recorded results back in exactly that order, one at a time,
letting the code run until it is quiescent in between. Live completions that
arrive while replay is still in progress are held until the recorded ones
are all delivered. Live execution uses the same one-at-a-time rule, so a
parallel branch can never observe a different interleaving after a crash.

Accepted updates are deliveries too: an update's handler starts at the
update's place in the journal, so its operations take the same sequence
numbers on every run.

One departure from the reference: a run whose end (`Done`) is recorded is
never beyond its journal, so ``patched`` after its last operation answers
with the branch the run took (the reference answers as if patched).

The rule: the machine does no I/O and reads no clock. It tells the host
which records to append and when a step function may run (``gate``: once
the log is durable through that LSN); the host does the rest.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Final, TypeAlias, assert_never

from fusee._codegen import fast_init
from fusee.errors import DeterminismError
from fusee.record import (
    DETACHED,
    PAUSED,
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
    StepTime,
    StreamEnd,
    Timer,
    Update,
    UpdateDone,
    Value,
    Wait,
    Waited,
    WaitOutcome,
    stream,
    value_kind,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

__all__ = [
    "Arm",
    "AsyncCompleted",
    "AwaitStart",
    "CancelAll",
    "ChildCompleted",
    "Completion",
    "Deliver",
    "DeliverLive",
    "DeliverUpdate",
    "Idle",
    "LiveCompleted",
    "LiveRecord",
    "LiveStep",
    "Next",
    "OpKind",
    "Outcome",
    "RunMachine",
    "SignalMatched",
    "Stalled",
    "StartInfo",
    "StepCompleted",
    "StepStart",
    "StreamOpen",
    "TimerFired",
    "WaitTimedOut",
]


class OpKind(enum.Enum):
    """The kinds of journal operations workflow code can start.

    Example:
        >>> OpKind.AWAIT.label
        'awaitCompletion'
    """

    STEP = "step"
    SLEEP = "sleep"
    WAIT = "wait"
    CHILD = "child"
    VALUE = "value"
    SEND = "send"
    AWAIT = "awaitCompletion"
    """A step completed from outside (``ctx.await_completion``)."""
    UPDATE_DONE = "update result"
    """An update handler returned."""
    ATTRIBUTES = "setAttributes"
    EVENT = "setEvent"
    """An event's value was set (``ctx.set_event``); its name is the key."""

    # Members are singletons: hashed by identity, in C (Enum's own __hash__ is
    # Python code, run for every set lookup of a kind on the hot path).
    __hash__ = object.__hash__

    @property
    def label(self) -> str:
        """The word error messages use for this kind."""
        return self.value


# Enum members read through the class cost a descriptor call each time on
# Python 3.11; these run on every operation.
_STEP: Final = OpKind.STEP
_SLEEP: Final = OpKind.SLEEP
_WAIT: Final = OpKind.WAIT
_CHILD: Final = OpKind.CHILD
_VALUE: Final = OpKind.VALUE
_SEND: Final = OpKind.SEND
_AWAIT: Final = OpKind.AWAIT
_UPDATE_DONE: Final = OpKind.UPDATE_DONE
_ATTRIBUTES: Final = OpKind.ATTRIBUTES
_EVENT: Final = OpKind.EVENT
_OK: Final = Status.OK
_CANCELLED: Final = Status.CANCELLED
_TIMED_OUT: Final = Status.TIMED_OUT
_UNNAMED_KINDS: Final = frozenset({_VALUE, _UPDATE_DONE, _ATTRIBUTES})
_PARKABLE_KINDS: Final = frozenset({_SLEEP, _WAIT, _CHILD})
_STEP_KINDS: Final = frozenset({_STEP, _AWAIT})
_U64_MAX: Final = 2**64 - 1


# --- values the machine hands out ----------------------------------------------


@fast_init
@dataclass(frozen=True, slots=True)
class Outcome:
    """What an operation resolves to.

    Example:
        >>> Outcome.ok(b"x")
        Outcome(status=<Status.OK: 0>, payload=b'x')
    """

    status: Status
    payload: bytes

    @staticmethod
    def ok(payload: bytes) -> Outcome:
        """A successful outcome carrying ``payload``."""
        return Outcome(_OK, payload)

    @staticmethod
    def empty(status: Status) -> Outcome:
        """An outcome with ``status`` and no payload."""
        return Outcome(status, b"")


# Live completions reported by the host (the reference's `Completion` enum).


@fast_init
@dataclass(frozen=True, slots=True)
class StepCompleted:
    """A step's function returned or failed for good.

    Example:
        >>> StepCompleted(Status.OK, b"1").status
        <Status.OK: 0>
    """

    status: Status
    payload: bytes


@dataclass(frozen=True, slots=True)
class TimerFired:
    """A sleep's timer fired.

    Example:
        >>> TimerFired() == TimerFired()
        True
    """


@fast_init
@dataclass(frozen=True, slots=True)
class SignalMatched:
    """A wait got the run's signal number ``ordinal``.

    Example:
        >>> SignalMatched(0, b"yes").ordinal
        0
    """

    ordinal: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class WaitTimedOut:
    """A wait's deadline passed.

    Example:
        >>> WaitTimedOut() == WaitTimedOut()
        True
    """


@fast_init
@dataclass(frozen=True, slots=True)
class ChildCompleted:
    """A child run ended.

    Example:
        >>> ChildCompleted(Status.FAILED, b"boom").status
        <Status.FAILED: 1>
    """

    status: Status
    payload: bytes


@fast_init
@dataclass(frozen=True, slots=True)
class AsyncCompleted:
    """An async completion got its result for the token of ``attempt``.

    Example:
        >>> AsyncCompleted(2, Status.OK, b"yes").attempt
        2
    """

    attempt: int
    status: Status
    payload: bytes


Completion: TypeAlias = (
    StepCompleted | TimerFired | SignalMatched | WaitTimedOut | ChildCompleted | AsyncCompleted
)
"""A live completion reported by the host to `RunMachine.complete`."""

_FIRED: Final = TimerFired()
_WAIT_TIMED_OUT: Final = WaitTimedOut()


@dataclass(frozen=True, slots=True)
class StepStart:
    """What the host must do after the code starts a step.

    ``attempt == 0`` is ``REPLAY``: the result is recorded; wait for its
    delivery and do not run the function. Otherwise run the function (as
    attempt ``attempt`` of the current retry budget) once the run's journal
    is durable through the gate and the clock has reached ``not_before_ms``
    (`fusee.record.PAUSED`: not before a resume).

    Example:
        >>> StepStart.run(1, 0).is_replay
        False
        >>> StepStart.REPLAY.is_replay
        True
    """

    REPLAY: ClassVar[StepStart]

    attempt: int
    not_before_ms: int

    @staticmethod
    def run(attempt: int, not_before_ms: int) -> StepStart:
        """Run the function: attempt ``attempt``, not before ``not_before_ms``."""
        return StepStart(attempt, not_before_ms)

    @property
    def is_replay(self) -> bool:
        """Whether the result is recorded (do not run the function)."""
        return self.attempt == 0


StepStart.REPLAY = StepStart(0, 0)
_REPLAY_STEP: Final = StepStart.REPLAY
_FIRST_RUN: Final = StepStart(1, 0)


@dataclass(frozen=True, slots=True)
class AwaitStart:
    """What the host must do after the code starts an async completion.

    ``mode`` is ``"replay"`` (the result is recorded; wait for it),
    ``"waiting"`` (the token of ``attempt`` was already handed out; wait) or
    ``"run"`` (run the function that hands the token out, as for a step).

    Example:
        >>> AwaitStart.waiting(2)
        AwaitStart(mode='waiting', attempt=2, not_before_ms=0)
    """

    REPLAY: ClassVar[AwaitStart]

    mode: str
    attempt: int = 0
    not_before_ms: int = 0

    @staticmethod
    def waiting(attempt: int) -> AwaitStart:
        """The token for ``attempt`` is out: wait for its completion."""
        return AwaitStart("waiting", attempt)

    @staticmethod
    def run(attempt: int, not_before_ms: int) -> AwaitStart:
        """Run the token function as attempt ``attempt``."""
        return AwaitStart("run", attempt, not_before_ms)


AwaitStart.REPLAY = AwaitStart("replay")


@dataclass(frozen=True, slots=True)
class Arm:
    """What the host must do after the code starts a sleep, wait or child.

    ``mode`` is ``"replay"`` (recorded result; wait for its delivery),
    ``"armed"`` (set up in an earlier life of this run; wait for completion)
    or ``"append"`` (append ``record``; the shard arms the timer, wait or
    child from it).

    Example:
        >>> Arm.ARMED.record is None
        True
    """

    REPLAY: ClassVar[Arm]
    ARMED: ClassVar[Arm]

    mode: str
    record: Record | None = None

    @staticmethod
    def append(record: Record) -> Arm:
        """Append ``record``; the host arms the operation from it."""
        return Arm("append", record)


Arm.REPLAY = Arm("replay")
Arm.ARMED = Arm("armed")


@fast_init
@dataclass(frozen=True, slots=True)
class LiveStep:
    """The record of a live step's result, less what its outcome holds.

    Example:
        >>> LiveStep("charge", 1).record(1, 0, Outcome.ok(b"x")).name
        'charge'
    """

    name: str
    attempt: int

    def record(self, run: int, seq: int, outcome: Outcome, time: StepTime | None = None) -> Record:
        """The `Step` record to append. ``time``: when the step ran (dev profile)."""
        return Step(run, seq, self.name, self.attempt, outcome.status, outcome.payload, time)


@fast_init
@dataclass(frozen=True, slots=True)
class LiveCompleted:
    """The record of an async completion's result, less what its outcome holds.

    Example:
        >>> LiveCompleted(2).record(1, 0, Outcome.ok(b"x")).attempt
        2
    """

    attempt: int

    def record(self, run: int, seq: int, outcome: Outcome, time: StepTime | None = None) -> Record:
        """The `Completed` record to append (``time`` is unused: it has none)."""
        return Completed(run, seq, self.attempt, outcome.status, outcome.payload)


LiveRecord: TypeAlias = LiveStep | LiveCompleted
"""The record of a `DeliverLive`."""


# Deliveries returned by `RunMachine.next` (the reference's `Next` enum).


@fast_init
@dataclass(frozen=True, slots=True)
class Deliver:
    """Resolve operation ``seq``. If ``record`` is set, append it first.

    A set ``record`` marks a live delivery: the record is how the journal
    remembers it.

    Example:
        >>> Deliver(0, Outcome.ok(b""), None).record is None
        True
    """

    seq: int
    outcome: Outcome
    record: Record | None


@fast_init
@dataclass(frozen=True, slots=True)
class DeliverLive:
    """A live step's or async completion's result.

    Append ``record.record(run, seq, outcome)`` first, then resolve ``seq``
    with ``outcome``.

    Example:
        >>> d = DeliverLive(0, Outcome.ok(b"1"), LiveStep("a", 1))
        >>> d.record.record(7, d.seq, d.outcome).run
        7
    """

    seq: int
    outcome: Outcome
    record: LiveRecord


@dataclass(frozen=True, slots=True)
class CancelAll:
    """Cancellation reached the code.

    Resolve every listed operation with `Status.CANCELLED` and ``reason``;
    append ``record`` first when set.

    Example:
        >>> CancelAll((0, 1), b"stop", None).seqs
        (0, 1)
    """

    seqs: tuple[int, ...]
    reason: bytes
    record: Record | None


@dataclass(frozen=True, slots=True)
class DeliverUpdate:
    """An update reached its turn: start its handler now.

    - ``live is None``: the update is recorded (replay, or delivered with
      the start). Start the handler; nothing is appended.
    - ``live`` is a token: a new request. Run the validator now, then call
      `RunMachine.accept_update` (and append its record) or drop it.

    Example:
        >>> DeliverUpdate(0, "bump", "u-1", b"", None).live is None
        True
    """

    ordinal: int
    name: str
    id: str
    payload: bytes
    live: int | None


@dataclass(frozen=True, slots=True)
class Stalled:
    """Replay waits for the code to start the operation the journal delivers next.

    If the code is quiescent and nothing live is pending, this is a
    determinism error (`RunMachine.stall_error`).

    Example:
        >>> Stalled() == Stalled()
        True
    """


@dataclass(frozen=True, slots=True)
class Idle:
    """Nothing to deliver.

    Example:
        >>> RunMachine.fresh(Start(1, "wf", "t"), 1).next()
        Idle()
    """


STALLED: Final = Stalled()
IDLE: Final = Idle()

Next: TypeAlias = Deliver | DeliverLive | CancelAll | DeliverUpdate | Stalled | Idle
"""What `RunMachine.next` hands out."""


@dataclass(frozen=True, slots=True)
class StreamOpen:
    """What `RunMachine.stream_open` tells the writer.

    Attributes:
        recorded: Chunks earlier attempts of the opening step recorded (0 for
            workflow code): the prefix a step that runs again continues after.
        closed: The stream is complete; appends from the opening step are
            dropped (it completed the stream in an earlier attempt) or refused.

    Example:
        >>> StreamOpen(0, False).closed
        False
    """

    recorded: int
    closed: bool


@fast_init
@dataclass(frozen=True, slots=True)
class StartInfo:
    """Identity and input of a run, from its `Start` record.

    Example:
        >>> RunMachine.fresh(Start(1, "order-1", "checkout"), 1).info().wtype
        'checkout'
    """

    run: int
    id: str
    wtype: str
    version: int
    codec: int
    started_ms: int
    deadline_ms: int
    policy: int
    input: bytes
    trace: bytes | None
    """The W3C ``traceparent`` the run was started under, if any."""


# --- internal state --------------------------------------------------------------


class _Entry:
    """An operation as the machine knows it: what the journal recorded, or what is pending.

    Class-level defaults and no __slots__: replay makes one of these per
    journal position, and setting two fields instead of a dozen is most of
    what it costs per delivery.
    """

    kind: OpKind
    name: str
    attempt = 0
    """Last failed attempt (steps); the token's attempt (async completions);
    the value kind (values)."""
    live = False
    """Pending, resolved by live work (not by the journal)."""
    waiting = False
    """Waiting on something outside the run (an async completion whose
    token was handed out): the run may be parked."""
    queued = False
    """A live completion for it is queued, not yet delivered."""
    paused = False
    """A step whose retries ran out, waiting for a resume: the run may be parked."""


class _Recorded(_Entry):
    """What the loaded journal says about one position.

    When the code starts the operation and its result is recorded, this
    same object is its pending entry: replayed operations are never
    changed through it, so nothing is allocated for them.
    """

    retry_at_ms = 0
    base = 0
    """Attempts made before the step's last resume: its retry budget counts from here."""
    marked = False
    """A begin marker (timer, wait, child, awaiting) or value exists."""
    value: bytes | None = None
    delivered = False
    """A final delivery for this seq exists in the replay queue."""

    def __init__(self, kind: OpKind, name: str, delivered: bool = False) -> None:
        self.kind = kind
        self.name = name
        if delivered:
            self.delivered = True


class _DeliveredStep(_Recorded):
    """A step recorded with its result: most of any journal, built the cheapest way.

    Made with ``__new__`` and only its name set (no ``__init__`` call): the
    rest comes from the class until something changes it.
    """

    kind = OpKind.STEP
    delivered = True


_new_delivered_step = _DeliveredStep.__new__


class _Pending(_Entry):
    """An operation the code started whose result live work will bring."""

    def __init__(self, kind: OpKind, name: str, attempt: int, live: bool) -> None:
        self.kind = kind
        self.name = name
        self.attempt = attempt
        self.live = live


class _FreshStep(_Pending):
    """A step the code just started with no journal entry: made without ``__init__``.

    Its kind, first attempt and liveness come from the class until something
    changes them (as with `_DeliveredStep`): one is made per live step.
    """

    kind = OpKind.STEP
    attempt = 1
    live = True


_new_fresh_step = _FreshStep.__new__


# Who writes a stream in this life of the run (not journaled: workflow code
# opens its streams again as it replays, and a step when it runs again).
# A step's position (>= 0) means that step.
_NO_OWNER: Final = -1
_WORKFLOW_OWNER: Final = -2


class _Stream:
    """One of the run's streams, as its journal and this life's code made it."""

    __slots__ = ("by_step", "closed", "len", "name", "owner", "replay_left")

    def __init__(self, name: str) -> None:
        self.name = name
        # Chunks recorded or appended so far: the next chunk's offset.
        self.len = 0
        # Completed, and by whom (stream.WORKFLOW or a step's position).
        self.closed: int | None = None
        # Chunks of workflow code the journal holds that this life's code
        # has not appended again yet: replay matches the code's appends to
        # them in order and appends nothing.
        self.replay_left = 0
        # Chunks per writing step.
        self.by_step: dict[int, int] = {}
        self.owner = _NO_OWNER


# Replay and live queue items: one is made per delivery, so they are plain
# slotted classes (a frozen dataclass's __init__ costs twice as much), and
# `next` tells them apart by class.


class _RecordedResult:
    """Replay: the journal delivers operation ``seq``'s result here.

    Its status and payload, not an `Outcome`: the `Outcome` is made at its
    delivery, so a loaded journal keeps one object less per result.
    """

    __slots__ = ("payload", "seq", "status")

    def __init__(self, seq: int, status: Status, payload: bytes) -> None:
        self.seq = seq
        self.status = status
        self.payload = payload


class _RecordedCancel:
    """Replay: the journal delivers a cancellation here."""

    __slots__ = ("reason",)

    def __init__(self, reason: bytes) -> None:
        self.reason = reason


class _RecordedUpdate:
    """Replay: the journal starts update ``ordinal``'s handler here."""

    __slots__ = ("id", "name", "ordinal", "payload")

    def __init__(self, ordinal: int, name: str, id: str, payload: bytes) -> None:
        self.ordinal = ordinal
        self.name = name
        self.id = id
        self.payload = payload


class _LiveResult:
    """Live: operation ``seq``'s completion, waiting for its turn."""

    __slots__ = ("completion", "seq")

    def __init__(self, seq: int, completion: Completion) -> None:
        self.seq = seq
        self.completion = completion


class _CancelRequest:
    """Live: a cancellation request, waiting for its turn (``by``: who asked)."""

    __slots__ = ("by", "reason")

    def __init__(self, reason: bytes, by: bytes | None) -> None:
        self.reason = reason
        self.by = by


class _UpdateOffer:
    """Live: a new update request (``token``: the host's), waiting for its turn."""

    __slots__ = ("id", "name", "payload", "token")

    def __init__(self, token: int, name: str, id: str, payload: bytes) -> None:
        self.token = token
        self.name = name
        self.id = id
        self.payload = payload


_ReplayItem: TypeAlias = _RecordedResult | _RecordedCancel | _RecordedUpdate
_LiveItem: TypeAlias = _LiveResult | _CancelRequest | _UpdateOffer

INTERNED_NAMES: Final = 256
"""Distinct operation names a run keeps shared (a parked run's memory)."""


def _mismatch(seq: int, rec: _Recorded, kind: OpKind, name: str) -> DeterminismError:
    return DeterminismError(
        seq,
        f"the journal recorded {rec.kind.label} '{rec.name}' here "
        f"but the code called {kind.label} '{name}'",
    )


def _compatible(recorded: _Recorded, kind: OpKind) -> bool:
    # A step's failed attempts are recorded before anything tells whether
    # the operation was a plain step or an async completion.
    return recorded.kind is kind or (
        recorded.kind is _STEP and kind is _AWAIT and not recorded.delivered and not recorded.marked
    )


def _written_by(name: str, seq: int) -> RuntimeError:
    return RuntimeError(f"stream '{name}' is written by the step at journal position {seq}")


class RunMachine:
    """One run's journal machine.

    Build it from the run's journal (`RunMachine(journal, gate)`) or from a
    new run's start record (`RunMachine.fresh`); the code's calls take
    sequence numbers, the host reports completions, and `next` hands out
    one delivery at a time.

    Attributes:
        gate: LSN of the run's most recent record. A step function may run
            only once the log is durable through it.

    Example:
        >>> m = RunMachine.fresh(Start(1, "order-1", "checkout"), 1)
        >>> seq, start = m.begin_step("charge")
        >>> m.complete(seq, StepCompleted(Status.OK, b"ok"))
        True
        >>> m.next().outcome
        Outcome(status=<Status.OK: 0>, payload=b'ok')
    """

    def __init__(self, journal: Sequence[Record], gate: int) -> None:
        """Builds a machine from a run's journal.

        Args:
            journal: The run's records in log order, the first being `Start`.
            gate: The LSN of the last record.

        Raises:
            DeterminismError: The journal does not begin with a start
                record, holds a second one, or contradicts itself.
        """
        start = journal[0] if journal else None
        if not isinstance(start, Start):
            raise DeterminismError(None, "journal does not begin with a start record")
        # Positional, in field order: one is made for every run, and
        # keywords cost a match by name each.
        self._info = StartInfo(
            start.run,
            start.id,
            start.wtype,
            start.version,
            start.codec,
            start.started_ms,
            start.deadline_ms,
            start.policy,
            start.input,
            start.meta.trace if start.meta is not None else None,
        )
        self._names: dict[str, str] = {}
        self._last_name: str | None = None
        self._last_live_step: LiveStep | None = None
        # Every operation's idempotency key starts so (asked once per step).
        self._key_prefix = f"{start.id}/{start.run}/"
        self._next_seq = 0
        self._recorded: dict[int, _Recorded] = {}
        # Highest sequence number the loaded journal mentions (-1: none).
        self._max_recorded = -1
        self._replay: deque[_ReplayItem] = deque()
        self._pending: dict[int, _Entry] = {}
        # Whether a step was ever paused in this run: until then `is_paused`
        # answers without looking at every pending and recorded operation
        # (the engine asks after each turn: quadratic with 500 in flight).
        self._ever_paused = False
        self._live: deque[_LiveItem] = deque()
        # Completions that arrived before the code started their operation
        # (a timer that fired, or a signal that matched, while replay had
        # not yet reached it).
        self._early: dict[int, Completion] = {}
        self._signals: list[bytes] = []
        # Latest recorded heartbeat progress per step.
        self._progress: dict[int, bytes] = {}
        # (position, patch id) markers from the journal.
        self._patches: set[tuple[int, str]] = set()
        # Updates accepted so far (the next one's ordinal).
        self._updates = 0
        # Waits the code dropped, as recorded.
        self._abandoned: set[int] = set()
        self._cancel_queued = False
        self._last_cancel_position: int | None = None
        self._done: tuple[Status, bytes] | None = None
        # The run's streams, in the order they first appeared.
        self._streams: list[_Stream] = []
        self.gate = gate
        if start.update is not None:
            u = start.update
            self._replay.append(_RecordedUpdate(0, u.name, u.id, u.payload))
            self._updates = 1
        recorded, replay, load = self._recorded, self._replay.append, self._load
        for i in range(1, len(journal)):
            rec = journal[i]
            if type(rec) is Step and rec.seq not in recorded:
                # Most of any journal: a step delivered at a fresh position,
                # with nothing to check it against, built without `_load`'s
                # dispatch (a third of a replayed delivery's cost).
                seq = rec.seq
                r: _Recorded = _new_delivered_step(_DeliveredStep)
                r.name = rec.name
                recorded[seq] = r
                if seq > self._max_recorded:
                    self._max_recorded = seq
                replay(_RecordedResult(seq, rec.status, rec.payload))
            else:
                load(rec)

    @classmethod
    def fresh(cls, start: Start, lsn: int) -> RunMachine:
        """A fresh run: its journal is just the `Start` record at ``lsn``.

        Example:
            >>> RunMachine.fresh(Start(1, "wf", "t"), 1).next_seq()
            0
        """
        return cls((start,), lsn)

    # --- loading -------------------------------------------------------------

    def _mark(self, seq: int, kind: OpKind, name: str) -> _Recorded:
        if seq > self._max_recorded:
            self._max_recorded = seq
        entry = self._recorded.get(seq)
        if entry is None:
            entry = self._recorded[seq] = _Recorded(kind, name)
            return entry
        if entry.kind is _STEP and kind is _AWAIT and not entry.delivered and not entry.marked:
            # Attempts came first; the operation turned out to be an async
            # completion.
            entry.kind = _AWAIT
        if not _compatible(entry, kind) or (name and entry.name != name):
            raise DeterminismError(
                seq,
                f"journal is inconsistent: {entry.kind.label} '{entry.name}' "
                f"and {kind.label} '{name}' share a position",
            )
        if name and not entry.name:
            entry.name = name
        return entry

    def _load(self, rec: Record) -> None:
        match rec:
            case Step():
                # At a position recorded before (its attempts): checked
                # against them. `__init__` takes the rest itself.
                self._mark(rec.seq, _STEP, rec.name).delivered = True
                self._replay.append(_RecordedResult(rec.seq, rec.status, rec.payload))
            case Attempt():
                r = self._mark(rec.seq, _STEP, rec.name)
                r.attempt = rec.attempt
                r.retry_at_ms = rec.retry_at_ms
                if rec.retry_at_ms == PAUSED:
                    self._ever_paused = True
            case Resume():
                r = self._mark(rec.seq, _STEP, "")
                r.retry_at_ms = 0
                r.base = rec.attempt
            case Timer():
                self._mark(rec.seq, _SLEEP, rec.name).marked = True
            case Fired():
                self._mark(rec.seq, _SLEEP, "").delivered = True
                self._replay.append(_RecordedResult(rec.seq, _OK, b""))
            case Signal():
                self._signals.append(rec.payload)
            case Wait():
                self._mark(rec.seq, _WAIT, rec.name).marked = True
            case Waited():
                self._load_waited(rec)
            case Value():
                r = self._mark(rec.seq, _VALUE, "")
                r.marked = True
                r.value = rec.value
                r.attempt = rec.kind
            case Child():
                self._mark(rec.seq, _CHILD, rec.wtype).marked = True
            case ChildDone():
                self._mark(rec.seq, _CHILD, "").delivered = True
                self._replay.append(_RecordedResult(rec.seq, rec.status, rec.payload))
            case Send():
                r = self._mark(rec.seq, _SEND, rec.name)
                r.marked = True
                r.value = b""
            case Cancel():
                self._replay.append(_RecordedCancel(rec.reason))
            case Done():
                self._done = (rec.status, rec.payload)
            case Update():
                ordinal = self._updates
                self._updates += 1
                self._replay.append(_RecordedUpdate(ordinal, rec.name, rec.id, rec.payload))
            case UpdateDone():
                r = self._mark(rec.seq, _UPDATE_DONE, "")
                r.marked = True
                r.value = rec.ordinal.to_bytes(8, "little")
            case Heartbeat():
                self._progress[rec.seq] = rec.payload
            case Awaiting():
                r = self._mark(rec.seq, _AWAIT, rec.name)
                r.marked = True
                r.attempt = rec.attempt
            case Completed():
                self._mark(rec.seq, _AWAIT, "").delivered = True
                self._replay.append(_RecordedResult(rec.seq, rec.status, rec.payload))
            case Patch():
                self._patches.add((rec.at, rec.id))
            case Handled():
                # A marker for readers: the driver hands signals to handlers itself.
                pass
            case Attributes():
                r = self._mark(rec.seq, _ATTRIBUTES, "")
                r.marked = True
                r.value = b""
            case Event():
                r = self._mark(rec.seq, _EVENT, rec.key)
                r.marked = True
                r.value = b""
            case Chunk():
                st = self._stream_state(rec.stream)
                st.len = max(st.len, rec.offset + 1)
                if rec.seq == stream.WORKFLOW:
                    st.replay_left += 1
                else:
                    st.by_step[rec.seq] = st.by_step.get(rec.seq, 0) + 1
            case StreamEnd():
                st = self._stream_state(rec.stream)
                if st.closed is None:
                    st.closed = rec.seq
            case Start():
                raise DeterminismError(None, "journal holds a second start record")
            case _:
                assert_never(rec)

    def _load_waited(self, rec: Waited) -> None:
        outcome = rec.outcome
        if outcome.is_abandoned:
            self._mark(rec.seq, _WAIT, "")
            self._abandoned.add(rec.seq)
            return
        self._mark(rec.seq, _WAIT, "").delivered = True
        if outcome.is_signal:
            if outcome.ordinal >= len(self._signals):
                raise DeterminismError(rec.seq, "wait consumed a signal the journal does not hold")
            result = _RecordedResult(rec.seq, _OK, self._signals[outcome.ordinal])
        else:
            result = _RecordedResult(rec.seq, _TIMED_OUT, b"")
        self._replay.append(result)

    # --- queries --------------------------------------------------------------

    def info(self) -> StartInfo:
        """Identity and input of the run."""
        return self._info

    def run(self) -> int:
        """The run number (distinct across runs that reuse a workflow id)."""
        return self._info.run

    def recorded_done(self) -> tuple[Status, bytes] | None:
        """The recorded result, if the journal already holds `Done`."""
        return self._done

    def is_replaying(self) -> bool:
        """Whether recorded deliveries remain to be handed to the code."""
        return bool(self._replay)

    def is_past_journal(self) -> bool:
        """Whether the code runs past all its journal recorded (doing things for the first time).

        No recorded delivery is left to hand over, no recorded operation is
        left to begin, and the run's end is not recorded. ``ctx.logger``
        logs only then, so a line logs once per run.
        """
        return not self._replay and self._beyond_journal()

    def pending_len(self) -> int:
        """Operations started and not yet resolved."""
        return len(self._pending)

    def delivers_only(self, seq: int) -> bool:
        """The next delivery is ``seq``'s live result and nothing could come before or with it.

        Nothing left to replay, no cancellation, no other completion or
        update queued, no other operation pending, and the step's result is
        what its completion queued.
        """
        if self._replay or self._cancel_queued or len(self._pending) != 1 or len(self._live) != 1:
            return False
        front = self._live[0]
        if (
            type(front) is not _LiveResult
            or front.seq != seq
            or type(front.completion) is not StepCompleted
        ):
            return False
        p = self._pending.get(seq)
        return p is not None and p.live and p.kind is _STEP

    def take_live_step(self, seq: int) -> LiveStep | None:
        """A live step's result taken at once, when nothing else could be delivered first.

        When it is the only delivery the run could take next (nothing left
        to replay, no cancellation, no other operation pending, nothing
        queued, no stream of the step to end), the step's pending entry goes
        as `next` would remove it on delivering the completion, and the
        record to append comes back. None changes nothing: queue the
        completion with `complete` instead.

        Example:
            >>> m = RunMachine.fresh(Start(1, "wf", "t"), 1)
            >>> seq, _ = m.begin_step("a")
            >>> m.take_live_step(seq)
            LiveStep(name='a', attempt=1)
        """
        if self._replay or self._cancel_queued or len(self._pending) != 1 or self._live:
            return None
        if self._streams and self.owns_streams(seq):
            return None
        p = self._pending.get(seq)
        if p is None or not p.live or p.kind is not _STEP or p.queued:
            return None
        del self._pending[seq]
        return self._live_step(p)

    def _live_step(self, p: _Entry) -> LiveStep:
        # Values, so one serves every step of a chain that shares a name (its
        # interned string) and an attempt: most live steps allocate none.
        live = self._last_live_step
        if live is None or live.name is not p.name or live.attempt != p.attempt:
            live = self._last_live_step = LiveStep(p.name, p.attempt)
        return live

    def has_live_pending(self) -> bool:
        """True while some started operation will be resolved by live work."""
        if self._live:
            return True
        # Not any() over a generator: the generator costs more than the usual
        # one-entry scan (asked at the end of every turn of a replaying run).
        for p in self._pending.values():  # noqa: SIM110
            if p.live:
                return True
        return False

    def is_idle(self) -> bool:
        """Nothing is pending, queued or left to replay."""
        return not self._replay and not self._live and not self._pending

    def is_suspended(self) -> bool:
        """Every pending operation waits on time, a signal, a child or outside.

        Nothing is queued for delivery and replay is done: the run can be
        parked.
        """
        if self._replay or self._live or not self._pending:
            return False
        # A loop, not all() over a generator: asked after every turn, and
        # usually answered by the first entry (a live step).
        for p in self._pending.values():
            kind = p.kind
            if not (kind in _PARKABLE_KINDS or (kind is _AWAIT and p.waiting) or p.paused):
                return False
        return True

    def next_seq(self) -> int:
        """The sequence number the code's next operation will take."""
        return self._next_seq

    def journal_size(self) -> int:
        """Journal operations the code has started so far.

        Deterministic, so code may decide on it (for example, when to
        continue as new).
        """
        return self._next_seq

    def key(self, seq: int) -> str:
        """The idempotency key for operation ``seq``: ``"{id}/{run}/{seq}"``.

        Stable across retries and recovery, distinct across runs that reuse
        a workflow id.

        Example:
            >>> RunMachine.fresh(Start(7, "order-1", "t"), 1).key(3)
            'order-1/7/3'
        """
        return f"{self._key_prefix}{seq}"

    def pending_name(self, seq: int) -> str | None:
        """The name of a started, unresolved operation (a running step), for logs."""
        p = self._pending.get(seq)
        return p.name if p is not None else None

    def pending_kind(self, seq: int) -> OpKind | None:
        """The kind of a started, unresolved operation."""
        p = self._pending.get(seq)
        return p.kind if p is not None else None

    def is_live_pending(self, seq: int) -> bool:
        """Whether ``seq`` is pending a live result."""
        p = self._pending.get(seq)
        return p is not None and p.live

    # --- starting operations ----------------------------------------------------

    def _begin(self, kind: OpKind, name: str) -> tuple[int, _Recorded | None]:
        # Every operation starts here: it takes the next sequence number, and
        # what the journal recorded there must be the same operation.
        seq = self._next_seq
        self._next_seq = seq + 1
        # Live code (nothing recorded to replay) has nothing to check.
        if not self._recorded:
            return seq, None
        r = self._recorded.get(seq)
        if r is not None and (
            not _compatible(r, kind) or (kind not in _UNNAMED_KINDS and r.name != name)
        ):
            raise _mismatch(seq, r, kind, name)
        return seq, r

    def _intern(self, name: str) -> str:
        # Names the run's operations share one string each, so a parked
        # run's journal holds one copy of "charge", not one per step.
        last = self._last_name
        if last == name:
            return last
        n = self._names.get(name)
        if n is None:
            n = name
            if len(self._names) < INTERNED_NAMES:
                self._names[n] = n
        self._last_name = n
        return n

    def _register(self, seq: int, kind: OpKind, name: str, attempt: int, live: bool) -> _Entry:
        # The operation the code started is pending until its delivery.
        if not live:
            # Replayed: its recorded entry serves (see _Recorded).
            p: _Entry = self._recorded[seq]
        elif kind is _STEP and attempt == 1:
            # One per live step: made without __init__ (see _FreshStep).
            p = _new_fresh_step(_FreshStep)
            p.name = self._intern(name)
        else:
            p = _Pending(kind, self._intern(name), attempt, True)
        self._pending[seq] = p
        if self._early:
            # A timer that fired, or a signal that matched, before replay
            # reached its operation: its turn is now.
            c = self._early.pop(seq, None)
            if c is not None:
                self.complete(seq, c)
        return p

    def begin_step(self, name: str) -> tuple[int, StepStart]:
        """The code starts step ``name``.

        Returns:
            Its sequence number, and whether to run its function.

        Raises:
            DeterminismError: The journal recorded another operation here.

        Example:
            >>> m = RunMachine.fresh(Start(1, "wf", "t"), 1)
            >>> m.begin_step("charge")
            (0, StepStart(attempt=1, not_before_ms=0))
        """
        seq, r = self._begin(_STEP, name)
        if r is None:
            self._register(seq, _STEP, name, 1, True)
            return seq, _FIRST_RUN
        if r.delivered:
            self._register(seq, _STEP, name, 0, False)
            return seq, _REPLAY_STEP
        p = self._register(seq, _STEP, name, r.attempt + 1, True)
        if r.retry_at_ms == PAUSED:
            p.paused = self._ever_paused = True
        # The journal numbers a step's attempts across resumes; the code
        # counts them from its last resume, which its retry budget does.
        return seq, StepStart(r.attempt + 1 - r.base, r.retry_at_ms)

    def begin_await(self, name: str) -> tuple[int, AwaitStart]:
        """The code starts async completion ``name``: a step whose result comes from outside.

        The function that hands out the token runs as a step does.

        Example:
            >>> m = RunMachine.fresh(Start(1, "wf", "t"), 1)
            >>> m.begin_await("approval")
            (0, AwaitStart(mode='run', attempt=1, not_before_ms=0))
        """
        seq, r = self._begin(_AWAIT, name)
        if r is None:
            start = AwaitStart.run(1, 0)
        elif r.delivered:
            start = AwaitStart.REPLAY
        elif r.marked and r.kind is _AWAIT:
            start = AwaitStart.waiting(r.attempt)
        else:
            start = AwaitStart.run(r.attempt + 1, r.retry_at_ms)
        p = self._register(seq, _AWAIT, name, start.attempt, start.mode != "replay")
        p.waiting = start.mode == "waiting"
        return seq, start

    def awaiting(self, seq: int) -> Awaiting | None:
        """The token function of async completion ``seq`` returned: its token is out.

        Returns:
            The `Awaiting` record to append, or None if ``seq`` is not a
            live async completion waiting for its token.
        """
        p = self._pending.get(seq)
        if p is None or not p.live or p.kind is not _AWAIT or p.waiting:
            return None
        p.waiting = True
        return Awaiting(self._info.run, seq, p.name, p.attempt)

    def await_attempt(self, seq: int) -> int | None:
        """The attempt an async completion's current token names, if ``seq`` waits for one."""
        p = self._pending.get(seq)
        if p is not None and p.kind is _AWAIT and p.live:
            return p.attempt
        return None

    def step_retry(self, seq: int, retry_at_ms: int, error: bytes) -> Attempt | None:
        """A step attempt failed and will be retried at ``retry_at_ms`` (`PAUSED`: after a resume).

        Returns:
            The `Attempt` record to append now; the shard arms the retry
            timer from it. None if ``seq`` is not a live step.
        """
        p = self._pending.get(seq)
        if p is None or not p.live:
            return None
        rec = Attempt(self._info.run, seq, p.name, p.attempt, retry_at_ms, error)
        p.attempt += 1
        p.waiting = False
        if retry_at_ms == PAUSED:
            p.paused = self._ever_paused = True
        else:
            p.paused = False
        return rec

    def step_paused(self, seq: int) -> bool:
        """Whether step ``seq`` is paused (its retries ran out and no resume has come)."""
        p = self._pending.get(seq)
        return p is not None and p.paused

    def step_pending(self, seq: int) -> bool:
        """Whether step ``seq`` still waits for its function to run (not resolved)."""
        p = self._pending.get(seq)
        return p is not None and p.live and not p.queued

    def is_paused(self) -> bool:
        """Whether any of the run's steps is paused, whether or not the code reached it."""
        if not self._ever_paused:
            return False
        return any(p.paused for p in self._pending.values()) or any(
            True for _ in self._recorded_paused()
        )

    def _recorded_paused(self) -> Iterable[tuple[int, _Recorded]]:
        # Recorded steps the code has not reached yet that are paused.
        pending = self._pending
        return (
            (seq, r)
            for seq, r in self._recorded.items()
            if r.kind is _STEP
            and r.retry_at_ms == PAUSED
            and not r.delivered
            and seq not in pending
        )

    def resume(self, by: bytes | None = None) -> list[Resume]:
        """Resumes every paused step: each runs its next attempt at once, with a fresh budget.

        Args:
            by: Who asked (audit), recorded on each `Resume`.

        Returns:
            The `Resume` records to append, in step order (none if nothing
            was paused).
        """
        seqs = [(seq, p.attempt - 1) for seq, p in self._pending.items() if p.paused]
        waiting = [(seq, r.attempt) for seq, r in self._recorded_paused()]
        for seq, _ in seqs:
            self._pending[seq].paused = False
        for seq, attempt in waiting:
            r = self._recorded[seq]
            r.retry_at_ms = 0
            r.base = attempt
        seqs.extend(waiting)
        seqs.sort()
        run = self._info.run
        return [Resume(run, seq, attempt, by) for seq, attempt in seqs]

    def heartbeat(self, seq: int, payload: bytes) -> Heartbeat | None:
        """A running step reported progress.

        Returns:
            The `Heartbeat` record (the host coalesces: only the latest per
            step is appended), or None if ``seq`` is not a live step.
        """
        p = self._pending.get(seq)
        if p is None or not p.live or p.kind not in _STEP_KINDS:
            return None
        self._progress[seq] = payload
        return Heartbeat(self._info.run, seq, p.attempt, payload)

    def progress(self, seq: int) -> bytes | None:
        """The latest progress step ``seq`` reported, in this life or a recorded earlier one."""
        return self._progress.get(seq)

    # --- streams ----------------------------------------------------------------

    def _stream_state(self, name: str) -> _Stream:
        for st in self._streams:
            if st.name == name:
                return st
        st = _Stream(self._intern(name))
        self._streams.append(st)
        return st

    def _stream_step(self, seq: int, what: str) -> int:
        # The attempt of the live step at `seq` (a step, or an async
        # completion whose function is running).
        p = self._pending.get(seq)
        if p is not None and p.live and p.kind in _STEP_KINDS and not p.waiting:
            return p.attempt
        raise RuntimeError(f"{what} is called from a step that is no longer running")

    def stream_of_workflow(self, name: str) -> bool:
        """Whether workflow code writes stream ``name`` (a step may append to it too).

        A read, not in the reference's API: a step's writer asks it so that
        leaving the stream does not complete it for the workflow
        (`stream_close` from a step completes any stream it may write).

        Example:
            >>> from fusee.record import Start
            >>> m = RunMachine.fresh(Start(run=1, id="a", wtype="wf"), 1)
            >>> _ = m.stream_open("events", None)
            >>> m.stream_of_workflow("events"), m.stream_of_workflow("other")
            (True, False)
        """
        return any(st.name == name and st.owner == _WORKFLOW_OWNER for st in self._streams)

    def stream_open(self, name: str, step: int | None) -> StreamOpen:
        """Workflow code (``step=None``) or the step at ``step`` opens stream ``name``.

        A stream belongs to whoever opens it first in this life: workflow
        code, whose steps may append to it as well, or one step, whose final
        result completes it.

        Raises:
            RuntimeError: Another step writes the stream, or the step is no
                longer running.
        """
        if step is not None:
            self._stream_step(step, "ctx.stream")
        st = self._stream_state(name)
        if step is None:
            if st.owner >= 0:
                raise _written_by(name, st.owner)
            st.owner = _WORKFLOW_OWNER
        else:
            if st.owner >= 0 and st.owner != step:
                raise _written_by(name, st.owner)
            if st.owner == _NO_OWNER and st.closed is None:
                st.owner = step
        recorded = st.by_step.get(step, 0) if step is not None else 0
        return StreamOpen(recorded, st.closed is not None)

    def stream_append(self, name: str, step: int | None, payload: bytes) -> Chunk | None:
        """Appends a chunk to stream ``name`` from workflow code or a step.

        Returns:
            The `Chunk` record to append, or None when there is nothing to
            append: workflow code replaying an append its journal holds, or
            a step whose earlier attempt completed the stream.

        Raises:
            RuntimeError: The stream is closed or written by another step.
        """
        attempt = self._stream_step(step, "stream append") if step is not None else 0
        st = self._stream_state(name)
        if step is None:
            if st.replay_left > 0:
                st.replay_left -= 1
                return None
            if st.owner >= 0:
                raise _written_by(name, st.owner)
            seq = stream.WORKFLOW
        else:
            if st.closed == step:
                return None
            if st.owner >= 0 and st.owner != step:
                raise _written_by(name, st.owner)
            seq = step
        if st.closed is not None:
            raise RuntimeError(f"stream '{name}' is closed")
        if seq == stream.WORKFLOW:
            st.owner = _WORKFLOW_OWNER
        else:
            if st.owner == _NO_OWNER:
                st.owner = seq
            st.by_step[seq] = st.by_step.get(seq, 0) + 1
        offset = st.len
        st.len += 1
        return Chunk(self._info.run, seq, attempt, st.name, offset, payload)

    def stream_close(self, name: str, step: int | None) -> StreamEnd | None:
        """Completes stream ``name`` from workflow code or a step.

        Returns:
            The `StreamEnd` record to append, or None if the stream is
            complete already (replay included).
        """
        if step is not None:
            self._stream_step(step, "stream close")
        st = self._stream_state(name)
        if st.closed is not None:
            return None
        if st.owner >= 0 and (step is None or st.owner != step):
            raise _written_by(name, st.owner)
        seq = step if step is not None else stream.WORKFLOW
        st.closed = seq
        if st.owner == seq:
            st.owner = _NO_OWNER
        return StreamEnd(self._info.run, seq, st.name, st.len, _OK)

    def stream_ends(self, seq: int, status: Status) -> list[StreamEnd]:
        """The step at ``seq`` got its final result: the streams it opened are complete.

        Returns:
            The `StreamEnd` records of the ones it did not close, to append
            just before the result's record.
        """
        out: list[StreamEnd] = []
        for st in self._streams:
            if st.owner != seq:
                continue
            st.owner = _NO_OWNER
            if st.closed is None:
                st.closed = seq
                out.append(StreamEnd(self._info.run, seq, st.name, st.len, status))
        return out

    def owns_streams(self, seq: int) -> bool:
        """Whether some stream belongs to the step at ``seq`` in this life."""
        return any(st.owner == seq for st in self._streams)

    def stream_len(self, name: str) -> int | None:
        """Chunks of stream ``name`` the journal and this life hold so far."""
        for st in self._streams:
            if st.name == name:
                return st.len
        return None

    # --- sleeps, waits, children ------------------------------------------------

    def begin_sleep(self, name: str, fire_at_ms: int) -> tuple[int, Arm]:
        """The code starts a durable sleep until ``fire_at_ms``.

        Example:
            >>> m = RunMachine.fresh(Start(1, "wf", "t"), 1)
            >>> m.begin_sleep("cool-off", 60_000)[1].record
            Timer(run=1, seq=0, name='cool-off', fire_at_ms=60000)
        """
        seq, r = self._begin(_SLEEP, name)
        if r is not None and r.delivered:
            arm = Arm.REPLAY
        elif r is not None and r.marked:
            arm = Arm.ARMED
        else:
            arm = Arm("append", Timer(self._info.run, seq, self._intern(name), fire_at_ms))
        self._register(seq, _SLEEP, name, 0, arm is not Arm.REPLAY)
        return seq, arm

    def begin_wait(self, name: str, deadline_ms: int) -> tuple[int, Arm]:
        """The code starts waiting for signal ``name`` until ``deadline_ms`` (0: forever).

        Example:
            >>> m = RunMachine.fresh(Start(1, "wf", "t"), 1)
            >>> m.begin_wait("review", 0)[1].mode
            'append'
        """
        seq, r = self._begin(_WAIT, name)
        if r is not None and r.delivered:
            arm = Arm.REPLAY
        elif r is not None and r.marked:
            arm = Arm.ARMED
        else:
            arm = Arm("append", Wait(self._info.run, seq, self._intern(name), deadline_ms))
        self._register(seq, _WAIT, name, 0, arm is not Arm.REPLAY)
        return seq, arm

    def begin_child(
        self, wtype: str, id: str, flags: int, deadline_ms: int, input: bytes
    ) -> tuple[int, Arm]:
        """The code starts child run ``id`` of workflow type ``wtype``.

        A detached child (`fusee.record.DETACHED` in ``flags``) resolves at
        once with nothing: it is not pending.

        Example:
            >>> m = RunMachine.fresh(Start(1, "wf", "t"), 1)
            >>> m.begin_child("ship", "ship-1", 0, 0, b"")[1].record.id
            'ship-1'
        """
        seq, r = self._begin(_CHILD, wtype)
        if r is not None and r.delivered:
            arm = Arm.REPLAY
        elif r is not None and r.marked:
            arm = Arm.ARMED
        else:
            arm = Arm("append", Child(self._info.run, seq, wtype, id, flags, deadline_ms, input))
        if flags & DETACHED:
            return seq, arm
        self._register(seq, _CHILD, wtype, 0, arm is not Arm.REPLAY)
        return seq, arm

    # --- values, sends, attributes, patches, updates ---------------------------------

    def value(self, kind: int, make: Callable[[], bytes]) -> tuple[int, bytes, Value | None]:
        """A recorded nondeterministic value: the recorded one on replay, else ``make()``'s.

        Returns:
            Its sequence number, the value, and the `Value` record to append
            (None on replay).

        Raises:
            DeterminismError: The journal recorded another operation or
                value kind here.

        Example:
            >>> m = RunMachine.fresh(Start(1, "wf", "t"), 1)
            >>> m.value(value_kind.RANDOM, lambda: b"\\x07")[1]
            b'\\x07'
        """
        seq, r = self._begin(_VALUE, "")
        if r is not None:
            if r.attempt != kind:
                raise DeterminismError(
                    seq,
                    f"the journal recorded value kind {r.attempt} here "
                    f"but the code asked for kind {kind}",
                )
            return seq, r.value if r.value is not None else b"", None
        value = make()
        return seq, value, Value(self._info.run, seq, kind, value)

    def now(self, now_ms: int) -> tuple[int, Value | None]:
        """``ctx.now()``: Unix milliseconds, recorded as 8 little-endian bytes.

        Example:
            >>> RunMachine.fresh(Start(1, "wf", "t"), 1).now(1234)[0]
            1234
        """
        _, v, rec = self.value(value_kind.NOW, lambda: now_ms.to_bytes(8, "little"))
        return (int.from_bytes(v, "little") if len(v) == 8 else 0), rec

    def send(self, target: str, name: str, payload: bytes) -> tuple[int, Send | None]:
        """Sends signal ``name`` to run ``target`` once this record is durable.

        Returns:
            Its sequence number and the `Send` record (None on replay).
        """
        seq, r = self._begin(_SEND, name)
        if r is not None:
            return seq, None
        return seq, Send(self._info.run, seq, target, name, payload)

    def set_attributes(self, payload: bytes) -> tuple[int, Attributes | None]:
        """Records search attributes (an encoded mapping).

        Returns:
            Its sequence number and the `Attributes` record (None on replay).
        """
        seq, r = self._begin(_ATTRIBUTES, "")
        if r is not None:
            return seq, None
        return seq, Attributes(self._info.run, seq, payload)

    def set_event(self, key: str, payload: bytes) -> tuple[int, Event | None]:
        """Records event ``key``'s new value (an encoded payload).

        Returns:
            Its sequence number and the `Event` record (None on replay).

        Raises:
            DeterminismError: The journal recorded another operation, or
                another key, here.

        Example:
            >>> m = RunMachine.fresh(Start(1, "wf", "t"), 1)
            >>> m.set_event("progress", b"\\x28")[1].key
            'progress'
        """
        seq, r = self._begin(_EVENT, key)
        if r is not None:
            return seq, None
        return seq, Event(self._info.run, seq, key, payload)

    def _beyond_journal(self) -> bool:
        # Whether the code at this point is past everything its journal
        # recorded (it is running new code, not replaying old decisions). A
        # run whose end is recorded never is: code after its last operation
        # ran before that end, with the decisions the journal holds (the
        # reference forgets this, and a query of a finished pre-patch run
        # answered as if patched).
        return self._done is None and self._max_recorded < self._next_seq

    def patched(self, id: str) -> tuple[bool, Patch | None]:
        """``ctx.patched(id)``: whether the code takes patch ``id``'s new branch here.

        True for new runs and for running ones the first time their code
        reaches this point after the patch was deployed; false while
        replaying a journal that passed this point before, and anywhere in a
        run whose end is recorded. Takes no position.

        Returns:
            The decision, and the `Patch` marker to append when it is new.
        """
        at = self._next_seq
        key = (at, id)
        if key in self._patches:
            return True, None
        if self._beyond_journal():
            self._patches.add(key)
            return True, Patch(self._info.run, at, id)
        return False, None

    def update_done(
        self, ordinal: int, status: Status, payload: bytes
    ) -> tuple[int, UpdateDone | None]:
        """The handler for update ``ordinal`` returned.

        Returns:
            Its sequence number and the `UpdateDone` record (None on replay).

        Raises:
            DeterminismError: The journal recorded another update's result here.
        """
        seq, r = self._begin(_UPDATE_DONE, "")
        if r is not None:
            recorded = (
                int.from_bytes(r.value, "little")
                if r.value is not None and len(r.value) == 8
                else None
            )
            if recorded != ordinal:
                raise DeterminismError(
                    seq,
                    f"the journal recorded the result of update "
                    f"#{recorded if recorded is not None else _U64_MAX} here "
                    f"but the code returned update #{ordinal}",
                )
            return seq, None
        return seq, UpdateDone(self._info.run, seq, ordinal, status, payload, b"")

    def offer_update(self, token: int, name: str, id: str, payload: bytes) -> None:
        """Queues a new update request; it reaches the code at its turn."""
        self._live.append(_UpdateOffer(token, name, id, payload))

    def accept_update(self, name: str, id: str, payload: bytes) -> tuple[int, Update]:
        """The validator accepted a live update delivered by `next`.

        Returns:
            Its ordinal and the `Update` record, to append before starting
            the handler.
        """
        ordinal = self._updates
        self._updates += 1
        return ordinal, Update(self._info.run, name, id, payload, None)

    def take_offered_updates(self) -> list[int]:
        """Update requests still queued, removed (their callers are told the run ended)."""
        tokens: list[int] = []
        kept: deque[_LiveItem] = deque()
        for item in self._live:
            if type(item) is _UpdateOffer:
                tokens.append(item.token)
            else:
                kept.append(item)
        self._live = kept
        return tokens

    # --- completions, cancellation, deliveries -------------------------------------

    def complete(self, seq: int, completion: Completion) -> bool:
        """Reports a live completion.

        Ignored for operations that are not pending live (dropped, already
        resolved or replayed).

        Returns:
            Whether the completion was taken now.
        """
        if seq >= self._next_seq:
            # The code has not started this operation yet (replay is
            # behind); hold the completion until it does.
            self._early[seq] = completion
            return False
        p = self._pending.get(seq)
        if p is None or not p.live:
            return False
        if type(completion) is AsyncCompleted and (
            p.kind is not _AWAIT or p.attempt != completion.attempt
        ):
            return False
        if p.queued:
            return False
        p.queued = True
        self._live.append(_LiveResult(seq, completion))
        return True

    def cancellation_covers_current_operations(self) -> bool:
        """A repeated cancel request at the same code position has nothing new to cancel.

        A compensation step takes another sequence number and can be
        cancelled by a later request.
        """
        return not self._pending and self._last_cancel_position == self._next_seq

    def request_cancel(self, reason: bytes) -> None:
        """Queues cancellation; it reaches the code at its turn, like any delivery.

        So replay cancels exactly the same operations.
        """
        self.request_cancel_by(reason, None)

    def request_cancel_by(self, reason: bytes, by: bytes | None) -> None:
        """`request_cancel`, recording who asked on the `Cancel` record (audit)."""
        if not self._cancel_queued and not self.cancellation_covers_current_operations():
            self._cancel_queued = True
            self._live.append(_CancelRequest(reason, by))

    def forget(self, seq: int) -> Waited | None:
        """The code dropped the operation's future; its result will never be delivered.

        For example the losing side of a race.

        Returns:
            For a wait, the `Waited` (abandoned) record to append, so the
            shard stops offering signals to it (None on replay: it is
            recorded).
        """
        p = self._pending.get(seq)
        if p is None or not p.live:
            return None
        del self._pending[seq]
        if p.kind is not _WAIT or seq in self._abandoned:
            return None
        self._abandoned.add(seq)
        return Waited(self._info.run, seq, WaitOutcome.ABANDONED)

    def next(self) -> Next:
        """The next delivery, if one may be made now.

        Call only when the code is quiescent; resolve the result, let the
        code run, then call again.
        """
        if self._replay:
            return self._next_replay()
        live = self._live
        while live:
            item = live.popleft()
            match item:
                case _LiveResult():
                    seq = item.seq
                    p = self._pending.get(seq)
                    if p is None or not p.live:
                        # Dropped, or its operation was cancelled meanwhile.
                        continue
                    del self._pending[seq]
                    return self._deliver_completion(seq, p, item.completion)
                case _CancelRequest():
                    self._cancel_queued = False
                    self._last_cancel_position = self._next_seq
                    return CancelAll(
                        self._drain_pending(),
                        item.reason,
                        Cancel(self._info.run, item.reason, item.by),
                    )
                case _UpdateOffer():
                    return DeliverUpdate(
                        self._updates, item.name, item.id, item.payload, item.token
                    )
                case _:
                    assert_never(item)
        return IDLE

    def _next_replay(self) -> Next:
        front = self._replay[0]
        match front:
            case _RecordedResult():
                p = self._pending.get(front.seq)
                if p is None or p.live:
                    # The code has not started the operation yet.
                    return STALLED
                del self._pending[front.seq]
                self._replay.popleft()
                return Deliver(front.seq, Outcome(front.status, front.payload), None)
            case _RecordedCancel():
                self._replay.popleft()
                self._last_cancel_position = self._next_seq
                return CancelAll(self._drain_pending(), front.reason, None)
            case _RecordedUpdate():
                self._replay.popleft()
                return DeliverUpdate(front.ordinal, front.name, front.id, front.payload, None)
            case _:
                assert_never(front)

    def _deliver_completion(self, seq: int, p: _Entry, c: Completion) -> Next:
        run = self._info.run
        match c:
            case StepCompleted():
                record: LiveRecord = (
                    LiveCompleted(p.attempt) if p.kind is _AWAIT else self._live_step(p)
                )
                return DeliverLive(seq, Outcome(c.status, c.payload), record)
            case TimerFired():
                return Deliver(seq, Outcome(_OK, b""), Fired(run, seq))
            case SignalMatched():
                outcome = WaitOutcome.signal(c.ordinal)
                return Deliver(seq, Outcome(_OK, c.payload), Waited(run, seq, outcome))
            case WaitTimedOut():
                return Deliver(
                    seq, Outcome(_TIMED_OUT, b""), Waited(run, seq, WaitOutcome.TIMED_OUT)
                )
            case ChildCompleted():
                return Deliver(
                    seq, Outcome(c.status, c.payload), ChildDone(run, seq, c.status, c.payload)
                )
            case AsyncCompleted():
                return DeliverLive(seq, Outcome(c.status, c.payload), LiveCompleted(c.attempt))
            case _:
                assert_never(c)

    def _drain_pending(self) -> tuple[int, ...]:
        seqs = tuple(sorted(self._pending))
        self._pending.clear()
        return seqs

    def stall_error(self) -> DeterminismError | None:
        """Explains a stall the host has confirmed.

        The code is quiescent, no live work is pending, and the journal
        still has deliveries: the code is waiting without having started the
        operation the journal delivers next.
        """
        if self.has_live_pending() or not self._replay:
            return None
        front = self._replay[0]
        if type(front) is not _RecordedResult:
            return None
        seq = front.seq
        r = self._recorded.get(seq)
        what = f"{r.kind.label} '{r.name}'" if r is not None else "an operation"
        return DeterminismError(
            seq,
            f"the journal delivers {what} next, but the code is waiting without having started it",
        )

    def check_end(self) -> None:
        """Checks that the code may end here: its journal has nothing left to deliver.

        Raises:
            DeterminismError: The journal still holds deliveries.
        """
        # Older journals can contain repeated cancels between the delivery
        # that settled the workflow's last future and the return of its code.
        if self.cancellation_covers_current_operations() and all(
            type(item) is _RecordedCancel for item in self._replay
        ):
            return
        if self._replay:
            front = self._replay[0]
            seq = front.seq if type(front) is _RecordedResult else None
            raise DeterminismError(
                seq,
                f"the workflow returned but its journal holds {len(self._replay)} more deliveries",
            )

    def finish(self, status: Status, payload: bytes, finished_ms: int) -> Done:
        """The code returned (or raised): produces the `Done` record.

        Raises:
            DeterminismError: The journal still holds deliveries.
        """
        self.check_end()
        return Done(self._info.run, status, finished_ms, payload, None)
