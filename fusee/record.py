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

import enum
import struct
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeAlias, get_args

import msgpack

from fusee._codegen import Wire, decoder, encoder, fast_init, record_fields
from fusee.errors import CorruptRecord

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "CANCEL_SEND",
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
    "Event",
    "Fired",
    "Handled",
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
    "encode_step",
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
    EVENT = 25
    HANDLED = 26


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
    """Start metadata: the W3C ``traceparent`` the run was started under, what
    a run continued as new carries from the runs before it, and the tick of
    the schedule that started it (Unix ms; 0: none).

    ``carried`` (empty for a first run) holds the dedup ids of the signals and
    the ids and outcomes of the updates the earlier runs took, bounded (see
    ``fusee.engine._carry``), so that a message resent after a continue-as-new
    still counts once. A `Meta` written before a field existed decodes with it
    empty.

    Example:
        >>> Meta(trace=None).trace is None, Meta().carried
        (True, b'')
    """

    trace: bytes | None = None
    carried: bytes = b""
    scheduled_ms: int = 0


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


CANCEL_SEND = "fusee:cancel"
"""A `Send` of this name is a cancel of its target (``ctx.cancel``); its payload is the reason.

A send, so that it leaves through the sender's outbox exactly once across
crashes, as a signal does; ``ctx.send`` refuses a signal of this name.
"""


@dataclass(frozen=True, slots=True)
class Send:
    """The code sent signal ``name`` to run ``target`` (a cancel: `CANCEL_SEND`).

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


@dataclass(frozen=True, slots=True)
class Event:
    """The code set event ``key`` of its run to ``payload`` (``ctx.set_event``).

    Example:
        >>> Event(1, 0, "progress", b"\\x28").key
        'progress'
    """

    run: int
    seq: int
    key: str
    payload: bytes


@dataclass(frozen=True, slots=True)
class Handled:
    """Signal ``ordinal`` of the run went to a handler of its code (``ctx.on_signal``).

    A marker, as `Patch` is: it takes no position, and no replay waits for
    it. It tells readers without the code (``fusee show``, the UI, a
    continue-as-new finished at recovery) that the signal was heard.

    Example:
        >>> Handled(1, 2).ordinal
        2
    """

    run: int
    ordinal: int


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
    | Event
    | Handled
)
"""Any journal record."""


# --- encoding ------------------------------------------------------------------
#
# Each kind's encoder and decoder is written for it at import by
# `fusee._codegen`, from the classes' own fields and annotations (why: see
# there); this section gives it the wire format.

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
    Event: Kind.EVENT,
    Handled: Kind.HANDLED,
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

# --- framing -------------------------------------------------------------------

_HEADER: Final = struct.Struct("<BIB")
"""Version, CRC-32 (little-endian), kind tag: the first `_HEADER_LEN` bytes."""
_HEADER_LEN: Final = _HEADER.size
_pack_header = _HEADER.pack
_unpack_header = _HEADER.unpack_from
_crc32 = zlib.crc32
_unpackb = msgpack.unpackb
# The packer never calls back into Python (no `default=`), so one shared
# packer is safe across threads: under the GIL, no other pack can run in the
# middle of one.
_packer = msgpack.Packer(use_bin_type=True, autoreset=True)
_pack = _packer.pack

# The CRC covers the tag byte and then the fields. Starting each kind's CRC
# from its tag's lets encode and decode checksum the fields where they lie,
# without joining or slicing the tag onto them.
_TAG_CRCS: Final = tuple(_crc32(bytes([tag])) for tag in range(256))

# Records up to this size are sliced (a copy costs less than a memoryview);
# larger ones are read in place through a memoryview.
_COPY_MAX: Final = 1024


_WIRE: Final = Wire(
    nested=_NESTED,
    max_value=_MAX_VALUE,
    statuses=_STATUSES,
    pack=_pack,
    pack_header=_pack_header,
    crc32=_crc32,
    version=FORMAT_VERSION,
    tag_crcs=_TAG_CRCS,
    # `Meta.carried` and `Meta.scheduled_ms` came after `Meta.trace`: journals
    # written before them hold one or two fields.
    oldest_fields={Meta: 1},
)

# The fast __init__ (see fusee._codegen): every record is built on the hot path.
for _cls in (*_NESTED.values(), *_KIND_OF):
    record_fields(_cls)
    fast_init(_cls)
del _cls

_ENCODERS: Final[dict[type, Callable[[Any], bytes]]] = {
    cls: encoder(cls, kind.value, _WIRE) for cls, kind in _KIND_OF.items()
}
# Per tag (index): the decoder, or None for a tag no kind has.
_DECODERS: Final[tuple[Callable[[Any], Record] | None, ...]] = tuple(
    decoder(cls, _WIRE) if cls is not None else None
    for cls in ({kind.value: c for c, kind in _KIND_OF.items()}.get(tag) for tag in range(256))
)
_KIND_NAMES: Final = {kind.value: cls.__name__ for cls, kind in _KIND_OF.items()}


_ENCODE_STEP: Final = encoder(Step, _KIND_OF[Step].value, _WIRE, by_fields=True)


def encode_step(
    run: int, seq: int, name: str, attempt: int, status: Status, payload: bytes
) -> bytes:
    """Encodes the `Step` of these fields (and no time), with no `Step` made.

    A live step's result is encoded once and kept by nobody: making the
    record only to encode it costs as much as its encoding.

    Example:
        >>> encode_step(1, 0, "charge", 1, Status.OK, b"x") == encode(
        ...     Step(1, 0, "charge", 1, Status.OK, b"x"))
        True
    """
    return _ENCODE_STEP(run, seq, name, attempt, status, payload, None)


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
