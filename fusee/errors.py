"""The exceptions fusee raises, as one tree.

```
FuseeError
├── DeterminismError      replayed code differs from its journal
│                         (position, recorded, called, file:line)
├── StepFailed            a step failed for good (name, error type, message)
├── WorkflowFailed        run.result() of a run that raised (type, message, traceback)
├── ChildFailed           a child run failed (id, cause)
├── NotFound              no run with that id
├── AlreadyExists         a run with that id exists (see fusee.IdPolicy)
├── UnknownWorkflow       a workflow name the engine was not given
├── UnknownQueue          a queue name the engine was not given
├── RunFinished           a signal, update or cancel sent to a run that has ended
├── RunNotFinished        a delete of a run that has not ended (cancel it first)
├── RunQueued             a query, update, resume or fork of a run its queue has
│                         not admitted yet (it has no journal, no code running)
├── RunPaused             TestEngine: the awaited run paused (step, attempts,
│                         last error) and only a resume moves it on
├── UpdateRejected        the update's validator refused it (nothing recorded)
├── UpdateFailed          the update's handler raised (type, message)
├── QueryFailed           the query's handler raised (type, message)
├── PayloadError          a value the codec cannot encode, or bytes it cannot
│   │                     decode to the annotated type; a payload the codec
│   │                     chain cannot decode (missing key, damage, missing blob)
│   └── PayloadTooLarge   a payload over the engine's max_payload (nothing recorded)
├── StoreError            storage unusable (newer format, locked, full)
│   ├── CorruptRecord     a journal record that does not decode
│   └── StaleLease        a write under a shard lease no longer held
├── WatchdogError         workflow code that did not yield
└── NondeterministicCall  workflow code called what replay cannot repeat
                          (threads, sockets, executors): do it in ctx.step
Cancelled(asyncio.CancelledError)   an operation or run cancelled
Failure(Exception)                  raised by a step: fail now, no retry
```

Every message says what happened and what to do about it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

__all__ = [
    "AlreadyExists",
    "Cancelled",
    "ChildFailed",
    "CorruptRecord",
    "DeterminismError",
    "Failure",
    "FuseeError",
    "NondeterministicCall",
    "NotFound",
    "PayloadError",
    "PayloadTooLarge",
    "QueryFailed",
    "RunFinished",
    "RunNotFinished",
    "RunPaused",
    "RunQueued",
    "StaleLease",
    "StepFailed",
    "StoreError",
    "UnknownQueue",
    "UnknownWorkflow",
    "UpdateFailed",
    "UpdateRejected",
    "WatchdogError",
    "WorkflowFailed",
]


class FuseeError(Exception):
    """The base of every error fusee raises (except `Cancelled` and `Failure`).

    Example:
        >>> try:
        ...     raise NotFound("no run 'order-9'")
        ... except FuseeError as e:
        ...     print(e)
        no run 'order-9'
    """


class DeterminismError(FuseeError):
    """Replayed workflow code differs from what its journal recorded.

    Attributes:
        seq: The journal position (operation sequence number) where the code
            and the journal part, or None when no position applies.
        message: What the journal recorded and what the code did.
        location: ``file:line`` of the call in the user's code, when known.

    Example:
        >>> e = DeterminismError(3, "the journal recorded step 'a' here", location="app.py:12")
        >>> str(e)
        "determinism error at journal position 3: the journal recorded step 'a' here (at app.py:12)"
    """

    def __init__(self, seq: int | None, message: str, *, location: str | None = None) -> None:
        self.seq = seq
        self.message = message
        self.location = location
        super().__init__(self._text())

    def _text(self) -> str:
        where = (
            f"determinism error at journal position {self.seq}"
            if self.seq is not None
            else "determinism error"
        )
        text = f"{where}: {self.message}"
        if self.location is not None:
            text += f" (at {self.location})"
        return text

    def __str__(self) -> str:
        return self._text()

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_determinism, (self.seq, self.message, self.location))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DeterminismError):
            return NotImplemented
        return (self.seq, self.message, self.location) == (
            other.seq,
            other.message,
            other.location,
        )

    def __hash__(self) -> int:
        return hash((self.seq, self.message, self.location))


def _rebuild_determinism(seq: int | None, message: str, location: str | None) -> DeterminismError:
    return DeterminismError(seq, message, location=location)


class StepFailed(FuseeError):
    """A step failed for good: not retryable, or raised `fusee.Failure`.

    Example:
        >>> e = StepFailed("charge", "CardDeclined", "insufficient funds")
        >>> (e.step, e.type)
        ('charge', 'CardDeclined')
    """

    def __init__(self, step: str, type: str, message: str) -> None:
        self.step = step
        self.type = type
        self.message = message
        super().__init__(f"step '{step}' failed: {type}: {message}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.step, self.type, self.message))


class WorkflowFailed(FuseeError):
    """The workflow raised; `run.result()` raises this with the cause's text.

    Example:
        >>> WorkflowFailed("ValueError", "bad order", "").type
        'ValueError'
    """

    def __init__(self, type: str, message: str, traceback: str = "") -> None:
        self.type = type
        self.message = message
        self.traceback = traceback
        super().__init__(f"workflow failed: {type}: {message}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.type, self.message, self.traceback))


class ChildFailed(FuseeError):
    """A child run failed; ``cause`` says how.

    Example:
        >>> ChildFailed("ship-1", "workflow failed: KeyError: 'sku'").id
        'ship-1'
    """

    def __init__(self, id: str, cause: str) -> None:
        self.id = id
        self.cause = cause
        super().__init__(f"child run '{id}' failed: {cause}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.id, self.cause))


class NotFound(FuseeError):
    """No run has that id in this store.

    Example:
        >>> raise NotFound("no run 'x'; check the id with `fusee list`")
        Traceback (most recent call last):
        fusee.errors.NotFound: no run 'x'; check the id with `fusee list`
    """


class AlreadyExists(FuseeError):
    """A run with that id exists; pass ``id_policy=fusee.IdPolicy.ATTACH`` to reuse it.

    Example:
        >>> issubclass(AlreadyExists, FuseeError)
        True
    """


class UnknownWorkflow(FuseeError):
    """A workflow name that was not passed to ``Engine.open(..., workflows=[...])``.

    Example:
        >>> issubclass(UnknownWorkflow, FuseeError)
        True
    """


class UnknownQueue(FuseeError):
    """A queue name that was not passed to ``Engine.open(..., queues=[...])``.

    Example:
        >>> issubclass(UnknownQueue, FuseeError)
        True
    """


class RunFinished(FuseeError):
    """A signal, update or cancel was sent to a run that has ended; nothing was recorded.

    Example:
        >>> e = RunFinished("order-1", "completed", "signal 'approval'")
        >>> (e.id, e.status)
        ('order-1', 'completed')
    """

    def __init__(self, id: str, status: str, what: str) -> None:
        self.id = id
        self.status = status
        self.what = what
        super().__init__(
            f"run '{id}' has finished ({status}); {what} was not delivered: "
            "messages go to runs that have not ended (start a new run to go on)"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.id, self.status, self.what))


class RunNotFinished(FuseeError):
    """A delete of a run that has not ended; nothing was deleted.

    Example:
        >>> e = RunNotFinished("order-1", "running")
        >>> (e.id, e.status)
        ('order-1', 'running')
    """

    def __init__(self, id: str, status: str) -> None:
        self.id = id
        self.status = status
        super().__init__(
            f"run '{id}' has not finished ({status}); only a finished run can be deleted: "
            f"cancel it first (run.cancel() or `fusee cancel {id}`), then delete it"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.id, self.status))


class RunPaused(FuseeError):
    """In `fusee.testing.TestEngine`, the run a test awaits paused: only a resume moves it on.

    A step ran out of attempts (`fusee.Retry`'s ``on_exhausted="pause"``);
    outside tests the run waits for ``run.resume()`` (or ``fusee resume``). The test host
    raises this from ``execute()`` and ``result()`` instead of waiting
    forever, unless it was opened with ``TestEngine(..., on_pause="wait")``.

    Attributes:
        id: The run's id.
        step: The paused step's name.
        attempts: How many attempts it made.
        error: Its last attempt's error, as ``"Type: message"``.

    Example:
        >>> e = RunPaused("order-1", "charge", 3, "TimeoutError: gateway")
        >>> (e.step, e.attempts)
        ('charge', 3)
    """

    def __init__(self, id: str, step: str, attempts: int, error: str) -> None:
        self.id = id
        self.step = step
        self.attempts = attempts
        self.error = error
        super().__init__(
            f"run '{id}' paused: step '{step}' failed {attempts} attempt(s), the last with "
            f"{error}; fix the cause and call run.resume() in the test, or open "
            'TestEngine(..., on_pause="wait") to wait for a resume'
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.id, self.step, self.attempts, self.error))


class RunQueued(FuseeError):
    """A query, update, resume or fork of a run its queue has not admitted yet.

    A queued run has no journal and none of its code runs until it is
    admitted: signal or cancel it meanwhile (a signal is held for it), or
    wait until ``describe()`` says it runs.

    Example:
        >>> RunQueued("mail-1").id
        'mail-1'
    """

    def __init__(self, id: str) -> None:
        self.id = id
        super().__init__(
            f"run '{id}' is queued and none of its code runs until its queue admits it; "
            "signal or cancel it meanwhile, or wait until describe() says it runs "
            "(`fusee queues` shows the queues)"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.id,))


class _HandlerError(FuseeError):
    """A query's or update's handler (or validator) raised: its type and message."""

    _verb = ""

    def __init__(self, name: str, id: str, type: str, message: str) -> None:
        self.name = name
        self.id = id
        self.type = type
        self.message = message
        super().__init__(f"{self._verb.format(name=name, id=id)}: {type}: {message}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.name, self.id, self.type, self.message))


class UpdateRejected(_HandlerError):
    """The update's validator refused it; nothing was recorded and the run goes on.

    Example:
        >>> UpdateRejected("bump", "c-1", "ValueError", "must be positive").type
        'ValueError'
    """

    _verb = "update '{name}' of run '{id}' was rejected by its validator"


class UpdateFailed(_HandlerError):
    """The update's handler raised (or was cancelled); the failure is recorded.

    Example:
        >>> str(UpdateFailed("bump", "c-1", "KeyError", "'x'"))
        "update 'bump' of run 'c-1' failed: KeyError: 'x'"
    """

    _verb = "update '{name}' of run '{id}' failed"


class QueryFailed(_HandlerError):
    """The query's handler raised; the run is not affected.

    Example:
        >>> QueryFailed("status", "c-1", "ZeroDivisionError", "division by zero").name
        'status'
    """

    _verb = "query '{name}' of run '{id}' failed"


class PayloadError(FuseeError):
    """A value the codec cannot encode, or bytes it cannot decode to the type.

    Example:
        >>> issubclass(PayloadError, FuseeError)
        True
    """


class PayloadTooLarge(PayloadError):
    """A payload is larger than the engine's ``max_payload``; nothing was recorded.

    At a door (start, signal, update, complete) the call raises it; at a
    step's end the step fails with it, and its value never reaches the journal.

    Attributes:
        size: The payload's size in bytes.
        limit: The limit it went over, in bytes.

    Example:
        >>> e = PayloadTooLarge("the input of run 'r-1'", 5_000_000, 4_194_304)
        >>> (e.size, e.limit, isinstance(e, PayloadError))
        (5000000, 4194304, True)
    """

    def __init__(self, what: str, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(
            f"{what} is {size:,} bytes, over the limit of {limit:,} bytes (max_payload); "
            "nothing was recorded: keep large values outside the run (a file, an object "
            "store) and pass a reference, or raise Engine.open(..., max_payload=)"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (_too_large, (str(self), self.size, self.limit))


def _too_large(message: str, size: int, limit: int) -> PayloadTooLarge:
    e = PayloadTooLarge.__new__(PayloadTooLarge)
    e.size, e.limit = size, limit
    Exception.__init__(e, message)
    return e


class StoreError(FuseeError):
    """Storage is unusable: a newer format, locked, full or damaged.

    Example:
        >>> issubclass(CorruptRecord, StoreError)
        True
    """


class CorruptRecord(StoreError):
    """Bytes that should hold a journal record do not decode to one.

    Example:
        >>> from fusee import record
        >>> try:
        ...     record.decode(b"\\x01garbage")
        ... except CorruptRecord as e:
        ...     print("refused")
        refused
    """


class StaleLease(StoreError):
    """A write under a shard lease that another worker has taken over since.

    Nothing of the write is stored. The worker no longer owns those shards:
    it drops their runs at once (their new owner recovers them).

    Attributes:
        shards: The shards whose lease epoch no longer matched, sorted.

    Example:
        >>> e = StaleLease([7, 3])
        >>> (e.shards, str(e))  # doctest: +NORMALIZE_WHITESPACE
        ((3, 7), 'this worker no longer holds shards 3, 7 (another worker took their
        leases over, or they were released); nothing was written: drop the runs of those shards')
    """

    def __init__(self, shards: Iterable[int]) -> None:
        self.shards: tuple[int, ...] = tuple(sorted(shards))
        names = ", ".join(str(s) for s in self.shards)
        super().__init__(
            f"this worker no longer holds shards {names} (another worker took their "
            "leases over, or they were released); nothing was written: drop the runs of "
            "those shards"
        )


class WatchdogError(FuseeError):
    """Workflow code ran without yielding for longer than the watchdog allows.

    The watchdog raises it inside that code (its message carries the stack
    it saw), so the run fails with it and the other runs go on; code blocked
    inside a C call gets it only when the call returns.

    Example:
        >>> issubclass(WatchdogError, FuseeError)
        True
    """


class Cancelled(asyncio.CancelledError):
    """An operation or the run was cancelled; code may catch it to compensate.

    Example:
        >>> import asyncio
        >>> isinstance(Cancelled("stop"), asyncio.CancelledError)
        True
    """


class Failure(Exception):
    """Raised by a step to fail at once, with no retry.

    The workflow's ``await`` of that step raises `StepFailed`.

    Example:
        >>> def charge() -> None:
        ...     raise Failure("card declined")
    """


class NondeterministicCall(FuseeError, RuntimeError):
    """Workflow code called something replay cannot repeat.

    Threads, sockets, executors, subprocesses and futures of other event
    loops cannot be replayed from a journal; move the call into a step
    (``await ctx.step("name", fn)``), whose result is recorded.

    Example:
        >>> issubclass(NondeterministicCall, RuntimeError)
        True
    """
