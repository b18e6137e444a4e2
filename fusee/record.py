"""Journal records: the vocabulary of the journal and its binary encoding.

A run's journal is a sequence of these records in log order. Records are
values (frozen, slotted dataclasses); `encode` and `decode` turn them into
bytes and back. The rule: bytes that are not a record this version can read
raise `fusee.errors.CorruptRecord`; they never decode into a wrong record.

Wire format (version 1)::

    byte 0      format version (1)
    bytes 1-4   CRC-32 of bytes 5.. (little-endian)
    byte 5      kind tag (`Kind`)
    bytes 6..   msgpack array of the record's fields, in declaration order

The CRC makes a torn or flipped record fail loudly instead of replaying a
different result; the version byte lets a later format still read this one.
No I/O, no clock.
"""

from __future__ import annotations

import dataclasses
import enum
import linecache
import struct
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeAlias, get_args

import msgpack

from fusee._frozen import fast_init
from fusee.errors import CorruptRecord

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "DETACHED",
    "FORMAT_VERSION",
    "PAUSED",
    "Attempt",
    "Attributes",
    "Awaiting",
    "Cancel",
    "Child",
    "ChildDone",
    "Chunk",
    "Completed",
    "Done",
    "Fired",
    "Heartbeat",
    "Kind",
    "Meta",
    "Parent",
    "Patch",
    "Record",
    "Resume",
    "Send",
    "Signal",
    "Start",
    "Status",
    "Step",
    "StepTime",
    "StreamEnd",
    "Timer",
    "Update",
    "UpdateDone",
    "UpdateRequest",
    "Value",
    "Wait",
    "WaitOutcome",
    "Waited",
    "decode",
    "encode",
    "policy",
    "stream",
    "value_kind",
]

FORMAT_VERSION: Final = 1
"""The record format this module writes (and the newest it reads)."""

PAUSED: Final = 2**64 - 1
"""``retry_at_ms`` of an `Attempt` whose retries ran out: the step waits for a resume."""


class stream:  # a namespace, spelled as the reference's module
    """Constants of streams.

    Example:
        >>> stream.WORKFLOW
        4294967295
    """

    WORKFLOW: Final = 2**32 - 1
    """The ``seq`` of a chunk or end written by workflow code (not a step)."""


class value_kind:  # a namespace, spelled as the reference's module
    """Kinds of recorded nondeterministic values (`Value.kind`).

    Example:
        >>> value_kind.NOW
        1
    """

    CUSTOM: Final = 0
    NOW: Final = 1
    RANDOM: Final = 2
    UUID: Final = 3


class policy:  # a namespace, spelled as the reference's module
    """Child policy flags (`Child.flags`).

    Example:
        >>> policy.DETACHED
        1
    """

    DETACHED: Final = 1
    """The child outlives its parent and its result is not delivered."""


DETACHED: Final = policy.DETACHED


class Status(enum.IntEnum):
    """How an operation or run ended.

    Example:
        >>> Status(2)
        <Status.CANCELLED: 2>
    """

    OK = 0
    FAILED = 1
    CANCELLED = 2
    TIMED_OUT = 3
    CONTINUED = 4
    """A run that continued as new (its `Done` payload is the next run's input)."""


class Kind(enum.IntEnum):
    """The wire tag of each record kind. Append only: tags are forever.

    Example:
        >>> Kind.STEP
        <Kind.STEP: 2>
    """

    START = 1
    STEP = 2
    ATTEMPT = 3
    RESUME = 4
    TIMER = 5
    FIRED = 6
    SIGNAL = 7
    WAIT = 8
    WAITED = 9
    VALUE = 10
    CHILD = 11
    CHILD_DONE = 12
    SEND = 13
    CANCEL = 14
    DONE = 15
    UPDATE = 16
    UPDATE_DONE = 17
    HEARTBEAT = 18
    AWAITING = 19
    COMPLETED = 20
    PATCH = 21
    ATTRIBUTES = 22
    CHUNK = 23
    STREAM_END = 24


# --- values carried inside records -------------------------------------------


@dataclass(frozen=True, slots=True)
class WaitOutcome:
    """How a wait ended: a signal (with its ordinal), a timeout, or abandoned.

    Example:
        >>> WaitOutcome.signal(0).ordinal
        0
        >>> WaitOutcome.TIMED_OUT.is_signal
        False
    """

    SIGNAL: ClassVar[int] = 0
    TIMED_OUT_KIND: ClassVar[int] = 1
    ABANDONED_KIND: ClassVar[int] = 2
    TIMED_OUT: ClassVar[WaitOutcome]
    ABANDONED: ClassVar[WaitOutcome]

    kind: int
    ordinal: int = 0

    @staticmethod
    def signal(ordinal: int) -> WaitOutcome:
        """The wait consumed the run's signal number ``ordinal`` (0-based)."""
        return WaitOutcome(WaitOutcome.SIGNAL, ordinal)

    @property
    def is_signal(self) -> bool:
        """Whether a signal ended the wait."""
        return self.kind == WaitOutcome.SIGNAL

    @property
    def is_abandoned(self) -> bool:
        """Whether the code dropped the wait (the losing side of a race)."""
        return self.kind == WaitOutcome.ABANDONED_KIND


WaitOutcome.TIMED_OUT = WaitOutcome(WaitOutcome.TIMED_OUT_KIND)
WaitOutcome.ABANDONED = WaitOutcome(WaitOutcome.ABANDONED_KIND)


@dataclass(frozen=True, slots=True)
class Parent:
    """The run and operation that started a child run.

    Example:
        >>> Parent("order-1", 7, 3).seq
        3
    """

    id: str
    run: int
    seq: int


@dataclass(frozen=True, slots=True)
class UpdateRequest:
    """An update delivered together with a run's start (update-with-start).

    Example:
        >>> UpdateRequest("bump", "u-1", b"\\x03").name
        'bump'
    """

    name: str
    id: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class Meta:
    """Start metadata: the W3C ``traceparent`` the run was started under.

    Example:
        >>> Meta(trace=None).trace is None
        True
    """

    trace: bytes | None = None


@dataclass(frozen=True, slots=True)
class StepTime:
    """When a step ran (kept under the dev profile only).

    Example:
        >>> StepTime(started_ms=1000, elapsed_us=250).elapsed_us
        250
    """

    started_ms: int
    elapsed_us: int


# --- the records ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start:
    """A run began: its identity, type and input. Always a journal's first record.

    Example:
        >>> Start(run=1, id="order-1", wtype="checkout", input=b"\\xc0").wtype
        'checkout'
    """

    run: int
    id: str
    wtype: str
    version: int = 1
    codec: int = 0
    started_ms: int = 0
    deadline_ms: int = 0
    policy: int = 0
    parent: Parent | None = None
    update: UpdateRequest | None = None
    input: bytes = b""
    meta: Meta | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """A step's final result, delivered at this point of the journal.

    Example:
        >>> Step(1, 0, "charge", 1, Status.OK, b"\\x01").name
        'charge'
    """

    run: int
    seq: int
    name: str
    attempt: int
    status: Status
    payload: bytes
    time: StepTime | None = None


@dataclass(frozen=True, slots=True)
class Attempt:
    """A step attempt failed; the next runs at ``retry_at_ms`` (`PAUSED`: after a resume).

    Example:
        >>> Attempt(1, 0, "charge", 1, 500, b"timeout").retry_at_ms
        500
    """

    run: int
    seq: int
    name: str
    attempt: int
    retry_at_ms: int
    error: bytes


@dataclass(frozen=True, slots=True)
class Resume:
    """A paused step got a fresh retry budget after ``attempt`` attempts.

    Example:
        >>> Resume(1, 0, 5, None).attempt
        5
    """

    run: int
    seq: int
    attempt: int
    by: bytes | None = None


@dataclass(frozen=True, slots=True)
class Timer:
    """A durable timer was set to fire at ``fire_at_ms``.

    Example:
        >>> Timer(1, 2, "cool-off", 60_000).fire_at_ms
        60000
    """

    run: int
    seq: int
    name: str
    fire_at_ms: int


@dataclass(frozen=True, slots=True)
class Fired:
    """The timer at ``seq`` fired and was delivered.

    Example:
        >>> Fired(1, 2).seq
        2
    """

    run: int
    seq: int


@dataclass(frozen=True, slots=True)
class Signal:
    """A signal arrived at the run (ordinals count these records from 0).

    Example:
        >>> Signal(1, "review", 0, b"\\xc3").name
        'review'
    """

    run: int
    name: str
    dedup: int
    payload: bytes
    by: bytes | None = None


@dataclass(frozen=True, slots=True)
class Wait:
    """The code began waiting for signal ``name`` until ``deadline_ms`` (0: forever).

    Example:
        >>> Wait(1, 3, "review", 0).deadline_ms
        0
    """

    run: int
    seq: int
    name: str
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class Waited:
    """The wait at ``seq`` ended (a signal, a timeout) or was abandoned.

    Example:
        >>> Waited(1, 3, WaitOutcome.signal(0)).outcome.is_signal
        True
    """

    run: int
    seq: int
    outcome: WaitOutcome


@dataclass(frozen=True, slots=True)
class Value:
    """A recorded nondeterministic value (now, random, uuid, custom).

    Example:
        >>> Value(1, 0, value_kind.NOW, b"\\x00" * 8).kind
        1
    """

    run: int
    seq: int
    kind: int
    value: bytes


@dataclass(frozen=True, slots=True)
class Child:
    """The code started child run ``id`` of type ``wtype``.

    Example:
        >>> Child(1, 4, "ship", "ship-1", 0, 0, b"").id
        'ship-1'
    """

    run: int
    seq: int
    wtype: str
    id: str
    flags: int
    deadline_ms: int
    input: bytes


@dataclass(frozen=True, slots=True)
class ChildDone:
    """The child started at ``seq`` ended, delivered here.

    Example:
        >>> ChildDone(1, 4, Status.OK, b"").status
        <Status.OK: 0>
    """

    run: int
    seq: int
    status: Status
    payload: bytes


@dataclass(frozen=True, slots=True)
class Send:
    """The code sent signal ``name`` to run ``target``.

    Example:
        >>> Send(1, 5, "other", "go", b"").target
        'other'
    """

    run: int
    seq: int
    target: str
    name: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class Cancel:
    """Cancellation reached the code at this point of the journal.

    Example:
        >>> Cancel(1, b"stop").reason
        b'stop'
    """

    run: int
    reason: bytes
    by: bytes | None = None


@dataclass(frozen=True, slots=True)
class Done:
    """The run ended with ``status`` and its result or error ``payload``.

    Example:
        >>> Done(1, Status.OK, 99, b"").finished_ms
        99
    """

    run: int
    status: Status
    finished_ms: int
    payload: bytes
    by: bytes | None = None


@dataclass(frozen=True, slots=True)
class Update:
    """An update was accepted and its handler starts at this point.

    Example:
        >>> Update(1, "bump", "u-1", b"\\x03").id
        'u-1'
    """

    run: int
    name: str
    id: str
    payload: bytes
    caller: bytes | None = None


@dataclass(frozen=True, slots=True)
class UpdateDone:
    """The handler of update ``ordinal`` returned.

    Example:
        >>> UpdateDone(1, 6, 0, Status.OK, b"", b"").ordinal
        0
    """

    run: int
    seq: int
    ordinal: int
    status: Status
    payload: bytes
    state: bytes = b""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A running step reported progress.

    Example:
        >>> Heartbeat(1, 0, 1, b"page-7").payload
        b'page-7'
    """

    run: int
    seq: int
    attempt: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Awaiting:
    """The token of async completion ``seq``'s ``attempt`` was handed out.

    Example:
        >>> Awaiting(1, 0, "approval", 1).attempt
        1
    """

    run: int
    seq: int
    name: str
    attempt: int


@dataclass(frozen=True, slots=True)
class Completed:
    """An async completion's result for ``attempt``, delivered here.

    Example:
        >>> Completed(1, 0, 1, Status.OK, b"yes").payload
        b'yes'
    """

    run: int
    seq: int
    attempt: int
    status: Status
    payload: bytes


@dataclass(frozen=True, slots=True)
class Patch:
    """Code at position ``at`` took patch ``id``'s new branch.

    Example:
        >>> Patch(1, 2, "fix-tax").id
        'fix-tax'
    """

    run: int
    at: int
    id: str


@dataclass(frozen=True, slots=True)
class Attributes:
    """The code set search attributes (an encoded mapping).

    Example:
        >>> Attributes(1, 0, b"\\x80").seq
        0
    """

    run: int
    seq: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Chunk:
    """A chunk of stream ``stream`` at ``offset``, written by step ``seq`` (or the workflow).

    Example:
        >>> Chunk(1, stream.WORKFLOW, 0, "tokens", 0, b"hi").offset
        0
    """

    run: int
    seq: int
    attempt: int
    stream: str
    offset: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """Stream ``stream`` is complete after ``chunks`` chunks.

    Example:
        >>> StreamEnd(1, stream.WORKFLOW, "tokens", 3, Status.OK).chunks
        3
    """

    run: int
    seq: int
    stream: str
    chunks: int
    status: Status


Record: TypeAlias = (
    Start
    | Step
    | Attempt
    | Resume
    | Timer
    | Fired
    | Signal
    | Wait
    | Waited
    | Value
    | Child
    | ChildDone
    | Send
    | Cancel
    | Done
    | Update
    | UpdateDone
    | Heartbeat
    | Awaiting
    | Completed
    | Patch
    | Attributes
    | Chunk
    | StreamEnd
)
"""Any journal record."""


# --- encoding ------------------------------------------------------------------
#
# Why this section generates code: records are the hot path. Every journal
# entry is built, encoded and appended, and every replay decodes the journal
# again, so microseconds per record are the engine's throughput. The code
# below is generated once per kind at import (with `exec`, as `dataclasses`
# itself does), from the classes' own fields and annotations, so the schema
# cannot drift from the classes. The source reads like hand-written code;
# `_GENERATED` keeps it, and tracebacks show it.

_KIND_OF: Final[dict[type, Kind]] = {
    Start: Kind.START,
    Step: Kind.STEP,
    Attempt: Kind.ATTEMPT,
    Resume: Kind.RESUME,
    Timer: Kind.TIMER,
    Fired: Kind.FIRED,
    Signal: Kind.SIGNAL,
    Wait: Kind.WAIT,
    Waited: Kind.WAITED,
    Value: Kind.VALUE,
    Child: Kind.CHILD,
    ChildDone: Kind.CHILD_DONE,
    Send: Kind.SEND,
    Cancel: Kind.CANCEL,
    Done: Kind.DONE,
    Update: Kind.UPDATE,
    UpdateDone: Kind.UPDATE_DONE,
    Heartbeat: Kind.HEARTBEAT,
    Awaiting: Kind.AWAITING,
    Completed: Kind.COMPLETED,
    Patch: Kind.PATCH,
    Attributes: Kind.ATTRIBUTES,
    Chunk: Kind.CHUNK,
    StreamEnd: Kind.STREAM_END,
}
assert set(_KIND_OF) == set(get_args(Record)), "every record kind needs a tag"
assert sorted(_KIND_OF.values()) == sorted(Kind), "every tag needs a record kind"

# The values records carry inside a field; on the wire, an array of their
# fields in declaration order.
_NESTED: Final[dict[str, type]] = {
    cls.__name__: cls for cls in (WaitOutcome, Parent, UpdateRequest, Meta, StepTime)
}

# Field values narrower than their type: (class, field) -> (largest value,
# what to call a value above it).
_MAX_VALUE: Final[dict[tuple[type, str], tuple[int, str]]] = {
    (WaitOutcome, "kind"): (WaitOutcome.ABANDONED_KIND, "wait outcome kind"),
}

# Indexed by wire code: `Status(v)` costs about twenty times a tuple index.
_STATUSES: Final = tuple(Status)
assert [s.value for s in _STATUSES] == list(range(len(_STATUSES))), "status codes are 0..n-1"

# Source of every generated function, by its pseudo file name.
_GENERATED: Final[dict[str, str]] = {}


def _compile(filename: str, source: str, names: dict[str, Any]) -> Callable[..., Any]:
    """Compiles ``source``, which defines ``_fn``, and returns ``_fn``.

    As `dataclasses` does, ``_fn`` is made inside a factory whose parameters
    are ``names`` (the helpers it calls, bound as closure cells), and its
    globals are this module's: `typing.get_type_hints` resolves its
    annotations, and no helper leaks into the module.
    """
    body = "".join(f"    {line}" if line.strip() else line for line in source.splitlines(True))
    source = f"def _factory({', '.join(names)}):\n{body}    return _fn\n"
    factory: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), globals(), factory)
    # Registered so that tracebacks and debuggers show the generated lines.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    _GENERATED[filename] = source
    return factory["_factory"](**names)  # type: ignore[no-any-return]


# Names the generated code uses besides its own `_`-names: a field (a local
# there) must not shadow them.
_RESERVED: Final = frozenset({"self", "type", "len", "int", "str", "bytes", "tuple", "isinstance"})


def _fields_of(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    fields = dataclasses.fields(cls)
    for f in fields:
        if f.name.startswith("_") or f.name in _RESERVED:
            raise TypeError(f"{cls.__name__}.{f.name}: a record field name cannot be {f.name!r}")
        if f.default_factory is not dataclasses.MISSING or not f.init:
            raise TypeError(f"{cls.__name__}.{f.name}: a record field takes a plain default")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: a record has no __post_init__")
    return fields


def _setter(cls: type, name: str) -> Callable[[object, object], None]:
    # The slot's own descriptor: what object.__setattr__ ends up calling,
    # without the attribute lookup and the frozen class's __setattr__.
    return cls.__dict__[name].__set__  # type: ignore[no-any-return]


# --- framing -------------------------------------------------------------------

_HEADER: Final = struct.Struct("<BIB")
"""Version, CRC-32 (little-endian), kind tag: the first `_HEADER_LEN` bytes."""
_HEADER_LEN: Final = _HEADER.size
_pack_header = _HEADER.pack
_unpack_header = _HEADER.unpack_from
_crc32 = zlib.crc32
_unpackb = msgpack.unpackb
_packer = msgpack.Packer(use_bin_type=True, autoreset=True)
_pack = _packer.pack

# The CRC covers the tag byte and then the fields. Starting each kind's CRC
# from its tag's lets encode and decode checksum the fields where they lie,
# without joining or slicing the tag onto them.
_TAG_CRCS: Final = tuple(_crc32(bytes([tag])) for tag in range(256))

# Records up to this size are sliced (a copy costs less than a memoryview);
# larger ones are read in place through a memoryview.
_COPY_MAX: Final = 1024


# --- fast __init__ ---------------------------------------------------------------


# The fast __init__ (see fusee._frozen): every record is built on the hot path.
for _cls in (*_NESTED.values(), *_KIND_OF):
    _fields_of(_cls)
    fast_init(_cls)
del _cls


# --- decoders --------------------------------------------------------------------
#
# One function per kind takes the msgpack array (a tuple) and returns the
# record, checking each value as strictly as the wire allows: `type(v) is
# int` and not isinstance (a bool must not pass for an int), ints
# non-negative, statuses 0..3, nested values as arrays of the right length.
# A bad value raises ValueError naming its field (`decode` adds the kind);
# a wrong field count raises CorruptRecord. The record is made with
# object.__new__ and its slots' setters, as the fast __init__ does, without
# the call through the class. For `Step`, the source reads:
#
#     def _fn(_fields):
#         if type(_fields) is not tuple or len(_fields) != 7:
#             raise _wrong_count(_fields)
#         run, seq, name, attempt, status, payload, time = _fields
#         if type(run) is not int or run < 0:
#             raise _not_uint('run', run)
#         ...
#         if type(status) is not int or status < 0 or status > 3:
#             raise _not_status('status', status)
#         status = _STATUSES[status]
#         ...
#         if time is not None:
#             if type(time) is not tuple or len(time) != 2:
#                 raise _not_nested('time', StepTime, 2, time)
#             time__started_ms, time__elapsed_us = time
#             ...
#             time = _new(StepTime)
#             _set_StepTime_started_ms(time, time__started_ms)
#             ...
#         _record = _new(Step)
#         _set_Step_run(_record, run)
#         ...
#         return _record


def _not_uint(path: str, v: object) -> ValueError:
    if type(v) is int:
        return ValueError(f"field {path}: expected a non-negative int, got {v}")
    return ValueError(f"field {path}: expected int, got {type(v).__name__}")


def _not_type(path: str, t: type, v: object) -> ValueError:
    return ValueError(f"field {path}: expected {t.__name__}, got {type(v).__name__}")


def _show(v: object) -> str:
    # A payload can be megabytes; a message needs its start.
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def _not_status(path: str, v: object) -> ValueError:
    return ValueError(f"field {path}: expected a status code, got {_show(v)}")


def _not_nested(path: str, cls: type, n: int, v: object) -> ValueError:
    return ValueError(f"field {path}: expected {cls.__name__} as {n} fields, got {_show(v)}")


def _above(what: str, v: int) -> ValueError:
    return ValueError(f"unknown {what} {v}")


def _wrong_count_of(cls: type, n: int) -> Callable[[object], CorruptRecord]:
    def wrong_count(fields: object) -> CorruptRecord:
        has = len(fields) if type(fields) is tuple else type(fields).__name__
        return CorruptRecord(
            f"journal record of kind {cls.__name__} should have {n} fields, has {has}"
        )

    return wrong_count


def _check(var: str, path: str, annotation: str, names: dict[str, Any], indent: str) -> list[str]:
    """Lines that check local ``var`` against a field's annotation (and convert it).

    Args:
        var: The local holding the decoded msgpack value.
        path: The field's name in messages (``time.started_ms`` when nested).
        annotation: The field's annotation, as written in the class.
        names: The helpers the generated function calls, by name; nested
            classes and their setters are added to it.
        indent: The indentation of the lines.

    Returns:
        The source lines; afterwards ``var`` holds the field's value.
    """
    i = indent
    if annotation == "int":
        return [
            f"{i}if type({var}) is not int or {var} < 0:",
            f"{i}    raise _not_uint({path!r}, {var})",
        ]
    if annotation in ("str", "bytes"):
        return [
            f"{i}if type({var}) is not {annotation}:",
            f"{i}    raise _not_type({path!r}, {annotation}, {var})",
        ]
    if annotation == "bytes | None":
        return [
            f"{i}if {var} is not None and type({var}) is not bytes:",
            f"{i}    raise _not_type({path!r}, bytes, {var})",
        ]
    if annotation == "Status":
        top = len(_STATUSES) - 1
        return [
            f"{i}if type({var}) is not int or {var} < 0 or {var} > {top}:",
            f"{i}    raise _not_status({path!r}, {var})",
            f"{i}{var} = _STATUSES[{var}]",
        ]
    name, optional = annotation.removesuffix(" | None"), annotation.endswith(" | None")
    if name not in _NESTED:
        raise TypeError(f"field {path}: no wire encoding for a field of type {annotation!r}")
    cls = _NESTED[name]
    fields = _fields_of(cls)
    locals_ = [f"{var}__{f.name}" for f in fields]
    lines = []
    if optional:
        lines.append(f"{i}if {var} is not None:")
        i += "    "
    lines += [
        f"{i}if type({var}) is not tuple or len({var}) != {len(fields)}:",
        f"{i}    raise _not_nested({path!r}, {name}, {len(fields)}, {var})",
        f"{i}({', '.join(locals_)},) = {var}"
        if len(fields) == 1
        else f"{i}{', '.join(locals_)} = {var}",
    ]
    for f, local in zip(fields, locals_, strict=True):
        lines += _check(local, f"{path}.{f.name}", str(f.type), names, i)
        if (cls, f.name) in _MAX_VALUE:
            top, what = _MAX_VALUE[cls, f.name]
            lines += [f"{i}if {local} > {top}:", f"{i}    raise _above({what!r}, {local})"]
    names[name] = cls
    lines.append(f"{i}{var} = _new({name})")
    for f, local in zip(fields, locals_, strict=True):
        names[f"_set_{name}_{f.name}"] = _setter(cls, f.name)
        lines.append(f"{i}_set_{name}_{f.name}({var}, {local})")
    return lines


def _make_decoder(cls: type) -> Callable[[Any], Record]:
    """Generates the function that checks a kind's msgpack array and builds the record."""
    fields = _fields_of(cls)
    name = cls.__name__
    names: dict[str, Any] = {
        name: cls,
        "_new": object.__new__,
        "_STATUSES": _STATUSES,
        "_wrong_count": _wrong_count_of(cls, len(fields)),
        "_not_uint": _not_uint,
        "_not_type": _not_type,
        "_not_status": _not_status,
        "_not_nested": _not_nested,
        "_above": _above,
    }
    lines = [
        "def _fn(_fields):",
        f"    if type(_fields) is not tuple or len(_fields) != {len(fields)}:",
        "        raise _wrong_count(_fields)",
        f"    {', '.join(f.name for f in fields)} = _fields",
    ]
    for f in fields:
        lines += _check(f.name, f.name, str(f.type), names, "    ")
    lines.append(f"    _record = _new({name})")
    for f in fields:
        names[f"_set_{name}_{f.name}"] = _setter(cls, f.name)
        lines.append(f"    _set_{name}_{f.name}(_record, {f.name})")
    lines.append("    return _record")
    return _compile(f"<fusee.record decode {name}>", "\n".join(lines) + "\n", names)


# --- encoders --------------------------------------------------------------------
#
# One function per kind packs the record's fields, nested values as tuples,
# and frames them. Generated code reads slots faster than an attrgetter.
# The packer never calls back into Python (no `default=`), so one shared
# packer is safe across threads: under the GIL, no other pack can run in
# the middle of one. For `Step`, the source reads:
#
#     def _fn(_record):
#         time = _record.time
#         if time is not None:
#             if not isinstance(time, StepTime):
#                 raise _cannot_hold('time', StepTime, time)
#             time = (time.started_ms, time.elapsed_us)
#         _packed = _pack((_record.run, _record.seq, ..., _record.payload, time))
#         return _pack_header(1, _crc32(_packed, 1007455905), 2) + _packed


def _cannot_hold(field: str, expected: type, v: object) -> TypeError:
    return TypeError(f"field {field} holds {type(v).__name__}, expected {expected.__name__}")


def _make_encoder(cls: type, tag: int) -> Callable[[Any], bytes]:
    """Generates the function that encodes a record of kind ``cls``."""
    fields = _fields_of(cls)
    names: dict[str, Any] = {
        "_cannot_hold": _cannot_hold,
        "_pack": _pack,
        "_pack_header": _pack_header,
        "_crc32": _crc32,
    }
    lines = ["def _fn(_record):"]
    values = []
    for f in fields:
        annotation = str(f.type)
        name = annotation.removesuffix(" | None")
        if name not in _NESTED:
            values.append(f"_record.{f.name}")
            continue
        values.append(f.name)
        names[name] = _NESTED[name]
        inner = [f"{f.name}.{g.name}" for g in _fields_of(_NESTED[name])]
        i = "    "
        lines.append(f"{i}{f.name} = _record.{f.name}")
        if annotation.endswith(" | None"):
            lines.append(f"{i}if {f.name} is not None:")
            i += "    "
        lines += [
            f"{i}if not isinstance({f.name}, {name}):",
            f"{i}    raise _cannot_hold({f.name!r}, {name}, {f.name})",
            f"{i}{f.name} = ({', '.join(inner)}{',' if len(inner) == 1 else ''})",
        ]
    lines += [
        f"    _packed = _pack(({', '.join(values)}{',' if len(values) == 1 else ''}))",
        f"    return _pack_header({FORMAT_VERSION}, _crc32(_packed, {_TAG_CRCS[tag]}), {tag})"
        " + _packed",
    ]
    return _compile(f"<fusee.record encode {cls.__name__}>", "\n".join(lines) + "\n", names)


_ENCODERS: Final[dict[type, Callable[[Any], bytes]]] = {
    cls: _make_encoder(cls, kind.value) for cls, kind in _KIND_OF.items()
}
# Per tag (index): the decoder, or None for a tag no kind has.
_DECODERS: Final[tuple[Callable[[Any], Record] | None, ...]] = tuple(
    _make_decoder(cls) if cls is not None else None
    for cls in ({kind.value: c for c, kind in _KIND_OF.items()}.get(tag) for tag in range(256))
)
_KIND_NAMES: Final = {kind.value: cls.__name__ for cls, kind in _KIND_OF.items()}


def encode(record: Record) -> bytes:
    """Encodes a record to its wire bytes.

    Args:
        record: Any journal record.

    Returns:
        The record's bytes in the current format (`FORMAT_VERSION`).

    Raises:
        TypeError: ``record`` is not a journal record, or a field holds a
            value of the wrong type.

    Example:
        >>> decode(encode(Fired(run=1, seq=2)))
        Fired(run=1, seq=2)
    """
    try:
        encoder = _ENCODERS[type(record)]
    except KeyError:
        raise TypeError(f"not a journal record: {type(record).__name__}") from None
    try:
        return encoder(record)
    except TypeError as e:
        raise TypeError(f"a {type(record).__name__} record cannot be encoded: {e}") from e


def decode(data: bytes) -> Record:
    """Decodes a record from its wire bytes.

    Args:
        data: Bytes `encode` produced (in this or an earlier format).

    Returns:
        The record.

    Raises:
        CorruptRecord: ``data`` is truncated, damaged, from a newer format, or
            not a record; the message says which.

    Example:
        >>> decode(encode(Cancel(run=1, reason=b"stop")))
        Cancel(run=1, reason=b'stop', by=None)
    """
    size = len(data)
    if size < _HEADER_LEN:
        raise CorruptRecord(
            f"journal record is truncated: {size} bytes, a record has at least {_HEADER_LEN}"
        )
    version, crc, tag = _unpack_header(data)
    if version != FORMAT_VERSION:
        if version > FORMAT_VERSION:
            raise CorruptRecord(
                f"journal record has format version {version}, newer than this fusee reads "
                f"(up to {FORMAT_VERSION}); upgrade fusee to read this journal"
            )
        raise CorruptRecord(f"journal record has an unknown format version {version}")
    fields = data[_HEADER_LEN:] if size <= _COPY_MAX else memoryview(data)[_HEADER_LEN:]
    if _crc32(fields, _TAG_CRCS[tag]) != crc:
        raise CorruptRecord(
            "journal record is damaged: its checksum does not match its contents "
            f"({size} bytes, kind tag {tag})"
        )
    decoder: Callable[[Any], Record] | None = _DECODERS[tag]
    if decoder is None:
        raise CorruptRecord(f"journal record has an unknown kind tag {tag}")
    try:
        values = _unpackb(fields, use_list=False, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several unrelated types
        raise CorruptRecord(
            f"journal record of kind {_KIND_NAMES[tag]} does not decode: {e}"
        ) from None
    try:
        return decoder(values)
    except ValueError as e:
        raise CorruptRecord(
            f"journal record of kind {_KIND_NAMES[tag]} is malformed: {e}"
        ) from None
