"""Tests of `fusee.record`: every kind round-trips, and bad bytes never decode.

The rule under test is the module's: bytes that are not a record this version
can read raise `CorruptRecord`, never a wrong record and never a bare msgpack
exception. Malformed records are framed with a correct checksum (computed as
`encode` does) so that what refuses them is the schema, not the CRC.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
import re
import sys
import threading
import typing
import zlib
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusee.errors import CorruptRecord
from fusee.record import (
    FORMAT_VERSION,
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
    Kind,
    Meta,
    Parent,
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
    UpdateRequest,
    Value,
    Wait,
    Waited,
    WaitOutcome,
    decode,
    encode,
    stream,
    value_kind,
)

U64_MAX = 2**64 - 1

# Hypothesis settings: enough examples to find a schema hole, few enough that
# the whole file stays within seconds; no deadline, the machine is noisy.
QUICK = settings(max_examples=60, deadline=None)
THOROUGH = settings(max_examples=300, deadline=None)


# --- strategies, one per kind ----------------------------------------------------

u64 = st.integers(min_value=0, max_value=U64_MAX)
text = st.text(max_size=24)
blob = st.binary(max_size=96)
optional_blob = st.none() | blob
statuses = st.sampled_from(Status)


def values_of(cls: type[Any], **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Builds ``cls`` from one strategy per field, and insists on all of them.

    A field added to a record (even one with a default) without a strategy
    here fails at collection instead of silently round-tripping its default.
    """
    names = [f.name for f in dataclasses.fields(cls)]
    assert list(fields) == names, f"{cls.__name__}: strategies for {list(fields)}, fields {names}"
    return st.builds(cls, **fields)


parents = values_of(Parent, id=text, run=u64, seq=u64)
update_requests = values_of(UpdateRequest, name=text, id=text, payload=blob)
metas = values_of(Meta, trace=optional_blob, carried=blob, scheduled_ms=u64)
step_times = values_of(StepTime, started_ms=u64, elapsed_us=u64)
wait_outcomes = values_of(
    WaitOutcome,
    kind=st.sampled_from(
        [WaitOutcome.SIGNAL, WaitOutcome.TIMED_OUT_KIND, WaitOutcome.ABANDONED_KIND]
    ),
    ordinal=u64,
)

RECORDS: dict[type[Any], st.SearchStrategy[Any]] = {
    Start: values_of(
        Start,
        run=u64,
        id=text,
        wtype=text,
        version=u64,
        codec=u64,
        started_ms=u64,
        deadline_ms=u64,
        policy=u64,
        parent=st.none() | parents,
        update=st.none() | update_requests,
        input=blob,
        meta=st.none() | metas,
    ),
    Step: values_of(
        Step,
        run=u64,
        seq=u64,
        name=text,
        attempt=u64,
        status=statuses,
        payload=blob,
        time=st.none() | step_times,
    ),
    Attempt: values_of(
        Attempt,
        run=u64,
        seq=u64,
        name=text,
        attempt=u64,
        retry_at_ms=u64 | st.just(PAUSED),
        error=blob,
    ),
    Resume: values_of(Resume, run=u64, seq=u64, attempt=u64, by=optional_blob),
    Timer: values_of(Timer, run=u64, seq=u64, name=text, fire_at_ms=u64),
    Fired: values_of(Fired, run=u64, seq=u64),
    Signal: values_of(Signal, run=u64, name=text, dedup=u64, payload=blob, by=optional_blob),
    Wait: values_of(Wait, run=u64, seq=u64, name=text, deadline_ms=u64),
    Waited: values_of(Waited, run=u64, seq=u64, outcome=wait_outcomes),
    Value: values_of(
        Value,
        run=u64,
        seq=u64,
        kind=st.sampled_from(
            [value_kind.CUSTOM, value_kind.NOW, value_kind.RANDOM, value_kind.UUID]
        )
        | u64,
        value=blob,
    ),
    Child: values_of(
        Child,
        run=u64,
        seq=u64,
        wtype=text,
        id=text,
        flags=u64,
        deadline_ms=u64,
        input=blob,
    ),
    ChildDone: values_of(ChildDone, run=u64, seq=u64, status=statuses, payload=blob),
    Send: values_of(Send, run=u64, seq=u64, target=text, name=text, payload=blob),
    Cancel: values_of(Cancel, run=u64, reason=blob, by=optional_blob),
    Done: values_of(
        Done, run=u64, status=statuses, finished_ms=u64, payload=blob, by=optional_blob
    ),
    Update: values_of(Update, run=u64, name=text, id=text, payload=blob, caller=optional_blob),
    UpdateDone: values_of(
        UpdateDone,
        run=u64,
        seq=u64,
        ordinal=u64,
        status=statuses,
        payload=blob,
        state=blob,
    ),
    Heartbeat: values_of(Heartbeat, run=u64, seq=u64, attempt=u64, payload=blob),
    Awaiting: values_of(Awaiting, run=u64, seq=u64, name=text, attempt=u64),
    Completed: values_of(Completed, run=u64, seq=u64, attempt=u64, status=statuses, payload=blob),
    Patch: values_of(Patch, run=u64, at=u64, id=text),
    Attributes: values_of(Attributes, run=u64, seq=u64, payload=blob),
    Chunk: values_of(
        Chunk,
        run=u64,
        seq=u64 | st.just(stream.WORKFLOW),
        attempt=u64,
        stream=text,
        offset=u64,
        payload=blob,
    ),
    StreamEnd: values_of(StreamEnd, run=u64, seq=u64, stream=text, chunks=u64, status=statuses),
    Event: values_of(Event, run=u64, seq=u64, key=text, payload=blob),
    Handled: values_of(Handled, run=u64, ordinal=u64),
}

any_record = st.one_of(*RECORDS.values())

# One hand-written record per kind, every optional and nested field filled:
# deterministic inputs for the tests that do not need hypothesis.
SAMPLES: list[Any] = [
    Start(
        run=1,
        id="order-1",
        wtype="checkout",
        version=2,
        codec=1,
        started_ms=1_700_000_000_000,
        deadline_ms=U64_MAX,
        policy=1,
        parent=Parent("root", 3, 9),
        update=UpdateRequest("bump", "u-1", b"\x03"),
        input=b"\xc0",
        meta=Meta(b"00-abc-def-01", b"\x92\x90\x90"),
    ),
    Step(1, 0, "charge", 1, Status.FAILED, b"\x01", StepTime(1000, 250)),
    Attempt(1, 0, "charge", 3, PAUSED, b"timeout"),
    Resume(1, 0, 5, b"ops"),
    Timer(1, 2, "cool-off", 60_000),
    Fired(1, 2),
    Signal(1, "review", 7, b"\xc3", b"alice"),
    Wait(1, 3, "review", 0),
    Waited(1, 3, WaitOutcome.signal(4)),
    Value(1, 4, value_kind.UUID, bytes(16)),
    Child(1, 5, "ship", "ship-1", 1, 99, b"\x90"),
    ChildDone(1, 5, Status.CANCELLED, b"why"),
    Send(1, 6, "other", "go", b""),
    Cancel(1, b"stop", b"bob"),
    Done(1, Status.TIMED_OUT, 99, b"late", b"timer"),
    Update(1, "bump", "u-1", b"\x03", b"caller"),
    UpdateDone(1, 7, 0, Status.OK, b"ok", b"state"),
    Heartbeat(1, 0, 1, b"page-7"),
    Awaiting(1, 8, "approval", 1),
    Completed(1, 8, 1, Status.OK, b"yes"),
    Patch(1, 9, "fix-tax"),
    Attributes(1, 10, b"\x80"),
    Chunk(1, stream.WORKFLOW, 0, "tokens", 12, b"hi"),
    StreamEnd(1, stream.WORKFLOW, "tokens", 3, Status.OK),
    Event(1, 11, "progress", b"\x28"),
    Handled(1, 4),
]

NESTED: list[Any] = [
    Parent("root", 3, 9),
    UpdateRequest("bump", "u-1", b"\x03"),
    Meta(b"trace", b"carried"),
    StepTime(1000, 250),
    WaitOutcome(WaitOutcome.ABANDONED_KIND, 2),
]


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def by_kind(values: list[Any]) -> list[Any]:
    return [pytest.param(v, id=snake(type(v).__name__)) for v in values]


KIND_STRATEGIES = [pytest.param(s, id=snake(cls.__name__)) for cls, s in RECORDS.items()]


# --- helpers ----------------------------------------------------------------------


def frame(tag: int, body: bytes, version: int = FORMAT_VERSION) -> bytes:
    """Wire bytes of ``body`` under ``tag``, with the checksum `encode` would write."""
    covered = bytes([tag]) + body
    return bytes([version]) + zlib.crc32(covered).to_bytes(4, "little") + covered


def frame_fields(kind: Kind, fields: Any) -> bytes:
    """Wire bytes of a record of ``kind`` whose msgpack array is ``fields``."""
    return frame(kind, msgpack.packb(fields, use_bin_type=True))


def wire_fields(record: Any) -> tuple[Any, ...]:
    """The msgpack array a record's encoding carries (nested values as tuples)."""
    fields = msgpack.unpackb(encode(record)[6:], use_list=False, raw=False)
    assert type(fields) is tuple
    return fields


def decode_or_error(wire: bytes) -> Record | CorruptRecord:
    """The decoded record, or the `CorruptRecord` that refused it."""
    try:
        return decode(wire)
    except CorruptRecord as e:
        return e


def is_u64(v: object) -> bool:
    return type(v) is int and 0 <= v <= U64_MAX


def is_nested(cls: type[Any], v: object) -> bool:
    return type(v) is cls and well_typed(v)


# What each declared field type admits, written from the annotations and not
# from the decoder, so the oracle is independent of the code under test.
FIELD_TYPES: dict[str, typing.Callable[[object], bool]] = {
    "int": is_u64,
    "str": lambda v: type(v) is str,
    "bytes": lambda v: type(v) is bytes,
    "bytes | None": lambda v: v is None or type(v) is bytes,
    "Status": lambda v: type(v) is Status,
    "Parent | None": lambda v: v is None or is_nested(Parent, v),
    "UpdateRequest | None": lambda v: v is None or is_nested(UpdateRequest, v),
    "Meta | None": lambda v: v is None or is_nested(Meta, v),
    "StepTime | None": lambda v: v is None or is_nested(StepTime, v),
    "WaitOutcome": lambda v: is_nested(WaitOutcome, v),
}


def well_typed(value: Any) -> bool:
    """Whether every field of ``value`` holds what its annotation declares."""
    ok = all(FIELD_TYPES[str(f.type)](getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, WaitOutcome):
        ok = ok and value.kind <= WaitOutcome.ABANDONED_KIND
    return ok


def tag_of(cls: type[Any]) -> Kind:
    return Kind[snake(cls.__name__).upper()]


CLASS_OF_KIND = {tag_of(cls): cls for cls in RECORDS}


# --- coverage of the union ----------------------------------------------------------


def test_every_record_kind_has_a_strategy_and_a_sample() -> None:
    kinds = set(typing.get_args(Record))
    assert set(RECORDS) == kinds
    assert {type(s) for s in SAMPLES} == kinds
    assert len(SAMPLES) == len(kinds)


def test_every_kind_tag_is_used_by_exactly_one_record_class() -> None:
    tags = [encode(s)[5] for s in SAMPLES]
    assert sorted(tags) == sorted(k.value for k in Kind)
    assert all(encode(s)[5] == tag_of(type(s)) for s in SAMPLES)


def test_every_field_annotation_is_known_to_the_oracle() -> None:
    for value in [*SAMPLES, *NESTED]:
        for f in dataclasses.fields(value):
            assert str(f.type) in FIELD_TYPES, (type(value).__name__, f.name, f.type)
        assert well_typed(value)


# --- round trips ---------------------------------------------------------------------


@pytest.mark.parametrize("records", KIND_STRATEGIES)
@QUICK
@given(data=st.data())
def test_every_kind_round_trips(records: st.SearchStrategy[Any], data: st.DataObject) -> None:
    record = data.draw(records)
    wire = encode(record)
    decoded = decode(wire)
    assert decoded == record
    assert type(decoded) is type(record)
    # Equality cannot tell Status.OK from 0, nor a bool from an int.
    assert well_typed(decoded)
    assert encode(decoded) == wire


@pytest.mark.parametrize("record", by_kind(SAMPLES))
def test_decoded_status_fields_are_status_members(record: Any) -> None:
    decoded = decode(encode(record))
    for f in dataclasses.fields(decoded):
        if f.type == "Status":
            assert type(getattr(decoded, f.name)) is Status


def test_wire_header_is_version_checksum_tag_then_fields() -> None:
    wire = encode(Fired(run=1, seq=2))
    assert wire == bytes([1]) + zlib.crc32(b"\x06\x92\x01\x02").to_bytes(4, "little") + (
        b"\x06\x92\x01\x02"
    )


def test_nested_values_travel_as_positional_arrays() -> None:
    start, step = SAMPLES[0], SAMPLES[1]
    assert wire_fields(start)[8:] == (
        ("root", 3, 9),
        ("bump", "u-1", b"\x03"),
        b"\xc0",
        (b"00-abc-def-01", b"\x92\x90\x90", 0),
    )
    assert wire_fields(step)[6] == (1000, 250)
    assert wire_fields(Waited(1, 3, WaitOutcome.TIMED_OUT))[2] == (1, 0)


# --- bad bytes ------------------------------------------------------------------------


@THOROUGH
@given(st.binary(max_size=80))
def test_random_bytes_never_decode_silently(data: bytes) -> None:
    try:
        record = decode(data)
    except CorruptRecord:
        return
    assert encode(record) == data


@THOROUGH
@given(st.binary(max_size=80))
def test_random_bytes_after_a_current_version_byte_never_decode_silently(data: bytes) -> None:
    wire = bytes([FORMAT_VERSION]) + data
    try:
        record = decode(wire)
    except CorruptRecord:
        return
    assert encode(record) == wire


@THOROUGH
@given(tag=st.integers(0, 255), body=st.binary(max_size=64))
def test_garbage_under_a_valid_checksum_is_refused_or_well_typed(tag: int, body: bytes) -> None:
    try:
        record = decode(frame(tag, body))
    except CorruptRecord:
        return
    assert tag_of(type(record)) == tag
    assert well_typed(record)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=U64_MAX)
    | st.floats()
    | text
    | blob,
    lambda inner: st.lists(inner, max_size=8).map(tuple) | st.dictionaries(text, inner, max_size=3),
    max_leaves=16,
)


@THOROUGH
@given(kind=st.sampled_from(Kind), fields=msgpack_values)
def test_arbitrary_msgpack_under_a_kind_tag_is_refused_or_well_typed(
    kind: Kind, fields: Any
) -> None:
    result = decode_or_error(frame_fields(kind, fields))
    if isinstance(result, CorruptRecord):
        assert f"kind {CLASS_OF_KIND[kind].__name__} " in str(result)
    else:
        assert tag_of(type(result)) == kind
        assert well_typed(result)


@THOROUGH
@given(record=any_record, data=st.data())
def test_one_field_replaced_by_any_value_is_refused_or_well_typed(
    record: Any, data: st.DataObject
) -> None:
    fields = list(wire_fields(record))
    i = data.draw(st.integers(0, len(fields) - 1), label="field")
    fields[i] = data.draw(msgpack_values, label="value")
    kind = tag_of(type(record))
    result = decode_or_error(frame_fields(kind, tuple(fields)))
    if isinstance(result, CorruptRecord):
        assert f"kind {type(record).__name__} " in str(result)
    else:
        assert type(result) is type(record)
        assert well_typed(result)


@QUICK
@given(any_record)
def test_every_truncation_is_refused(record: Any) -> None:
    wire = encode(record)
    for n in range(len(wire)):
        with pytest.raises(CorruptRecord):
            decode(wire[:n])


@QUICK
@given(any_record)
def test_every_single_bit_flip_is_refused(record: Any) -> None:
    wire = encode(record)
    for i in range(len(wire)):
        for bit in range(8):
            damaged = bytearray(wire)
            damaged[i] ^= 1 << bit
            with pytest.raises(CorruptRecord):
                decode(bytes(damaged))


@pytest.mark.parametrize("record", by_kind(SAMPLES))
def test_trailing_bytes_after_the_fields_are_refused(record: Any) -> None:
    wire = encode(record)
    with pytest.raises(CorruptRecord, match=f"kind {type(record).__name__} does not decode"):
        decode(frame(wire[5], wire[6:] + b"\x00"))


@pytest.mark.parametrize("version", [FORMAT_VERSION + 1, 255])
def test_a_newer_format_version_asks_for_an_upgrade(version: int) -> None:
    wire = bytearray(encode(Fired(1, 2)))
    wire[0] = version
    with pytest.raises(CorruptRecord, match=f"format version {version}.*upgrade fusee"):
        decode(bytes(wire))


def test_format_version_zero_is_refused() -> None:
    with pytest.raises(CorruptRecord, match="unknown format version 0"):
        decode(frame(Kind.FIRED, msgpack.packb((1, 2)), version=0))


def test_a_damaged_checksum_is_refused_as_damage() -> None:
    wire = bytearray(encode(Fired(1, 2)))
    wire[1] ^= 0xFF
    with pytest.raises(CorruptRecord, match="checksum does not match"):
        decode(bytes(wire))


@pytest.mark.parametrize("tag", [0, len(Kind) + 1, 200, 255])
def test_an_unknown_kind_tag_is_refused(tag: int) -> None:
    with pytest.raises(CorruptRecord, match=f"unknown kind tag {tag}"):
        decode(frame(tag, msgpack.packb((1, 2))))


@pytest.mark.parametrize(
    ("fields", "count"),
    [
        pytest.param((1,), "1", id="too-few"),
        pytest.param((1, 2, 3), "3", id="too-many"),
        pytest.param((), "0", id="empty"),
        pytest.param({"run": 1, "seq": 2}, "dict", id="map"),
        pytest.param(7, "int", id="scalar"),
        pytest.param(None, "NoneType", id="nil"),
    ],
)
def test_a_wrong_field_count_is_refused_naming_the_kind(fields: Any, count: str) -> None:
    with pytest.raises(CorruptRecord, match=f"kind Fired should have 2 fields, has {count}$"):
        decode(frame_fields(Kind.FIRED, fields))


def test_every_kind_refuses_one_field_too_many_and_too_few() -> None:
    for record in SAMPLES:
        fields = wire_fields(record)
        name = type(record).__name__
        for wrong in ((*fields, 0), fields[:-1]):
            with pytest.raises(CorruptRecord, match=f"kind {name} should have {len(fields)} "):
                decode(frame_fields(tag_of(type(record)), wrong))


START_FIELDS = wire_fields(SAMPLES[0])
STEP_FIELDS = wire_fields(SAMPLES[1])


def replaced(fields: tuple[Any, ...], i: int, value: Any) -> tuple[Any, ...]:
    return (*fields[:i], value, *fields[i + 1 :])


@pytest.mark.parametrize(
    ("kind", "fields", "message"),
    [
        pytest.param(Kind.FIRED, (True, 2), "expected int, got bool", id="bool-for-int"),
        pytest.param(Kind.FIRED, (1, False), "expected int, got bool", id="false-for-int"),
        pytest.param(Kind.FIRED, (-1, 2), "non-negative int, got -1", id="negative-int"),
        pytest.param(Kind.FIRED, (-(2**63), 2), "non-negative int", id="most-negative-int"),
        pytest.param(Kind.FIRED, (1.0, 2), "expected int, got float", id="float-for-int"),
        pytest.param(Kind.FIRED, ("1", 2), "expected int, got str", id="str-for-int"),
        pytest.param(Kind.FIRED, (None, 2), "expected int, got NoneType", id="nil-for-int"),
        pytest.param(Kind.CANCEL, (1, "stop", None), "expected bytes, got str", id="str-for-bytes"),
        pytest.param(Kind.PATCH, (1, 2, b"fix"), "expected str, got bytes", id="bytes-for-str"),
        pytest.param(Kind.PATCH, (1, 2, None), "expected str, got NoneType", id="nil-for-str"),
        pytest.param(Kind.RESUME, (1, 0, 5, "me"), "expected bytes, got str", id="str-for-opt"),
        pytest.param(Kind.RESUME, (1, 0, 5, 0), "expected bytes, got int", id="int-for-opt"),
        pytest.param(Kind.DONE, (1, 5, 0, b"", None), "status code, got 5", id="status-5"),
        pytest.param(Kind.DONE, (1, -1, 0, b"", None), "status code, got -1", id="status-neg"),
        pytest.param(Kind.DONE, (1, True, 0, b"", None), "status code, got True", id="status-bool"),
        pytest.param(Kind.DONE, (1, "OK", 0, b"", None), "status code, got 'OK'", id="status-str"),
        pytest.param(Kind.DONE, (1, None, 0, b"", None), "status code, got None", id="status-nil"),
        pytest.param(Kind.STEP, replaced(STEP_FIELDS, 6, (1,)), "StepTime as 2", id="short-nested"),
        pytest.param(
            Kind.STEP, replaced(STEP_FIELDS, 6, (1, 2, 3)), "StepTime as 2", id="long-nested"
        ),
        pytest.param(
            Kind.STEP, replaced(STEP_FIELDS, 6, (1, "2")), "expected int, got str", id="bad-nested"
        ),
        pytest.param(
            Kind.STEP, replaced(STEP_FIELDS, 6, {"a": 1}), "StepTime as 2", id="map-for-nested"
        ),
        pytest.param(Kind.STEP, replaced(STEP_FIELDS, 6, 5), "StepTime as 2", id="int-for-nested"),
        pytest.param(
            Kind.START, replaced(START_FIELDS, 8, b"root"), "Parent as 3", id="bytes-for-parent"
        ),
        pytest.param(
            Kind.START,
            replaced(START_FIELDS, 9, ("bump", "u-1", "payload")),
            "expected bytes, got str",
            id="bad-update-request",
        ),
        pytest.param(
            Kind.START, replaced(START_FIELDS, 11, ("trace",)), "expected bytes", id="bad-meta"
        ),
        pytest.param(Kind.START, replaced(START_FIELDS, 11, ()), "Meta as 3", id="empty-meta"),
        pytest.param(
            Kind.START, replaced(START_FIELDS, 11, (None, b"", 0, b"")), "Meta as 3", id="long-meta"
        ),
        pytest.param(Kind.WAITED, (1, 3, (3, 0)), "wait outcome kind 3", id="outcome-kind"),
        pytest.param(Kind.WAITED, (1, 3, None), "WaitOutcome as 2", id="nil-outcome"),
        pytest.param(Kind.WAITED, (1, 3, (True, 0)), "got bool", id="bool-outcome"),
    ],
)
def test_a_wrong_field_type_is_refused_naming_the_kind(
    kind: Kind, fields: tuple[Any, ...], message: str
) -> None:
    name = CLASS_OF_KIND[kind].__name__
    with pytest.raises(CorruptRecord, match=f"kind {name} is malformed: .*{re.escape(message)}"):
        decode(frame_fields(kind, fields))


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\x92\x01", id="short-array"),
        pytest.param(b"\xc1", id="reserved-byte"),
        pytest.param(b"\x92\x01\xa2\xff\xfe", id="bad-utf8"),
        pytest.param(b"\x92\x01\xdb\xff\xff\xff\xff", id="huge-str-length"),
        pytest.param(b"\x92\x81\x01\x02\x02", id="int-map-key"),
        pytest.param(b"\x92\x01\xd4\x05\x00", id="ext-type"),
        pytest.param(b"\x92\x01\xd6\xff\x00\x00\x00\x00", id="timestamp"),
        pytest.param(b"\x91" * 5000 + b"\xc0", id="deep-nesting"),
    ],
)
def test_bodies_msgpack_cannot_read_are_refused_naming_the_kind(body: bytes) -> None:
    with pytest.raises(CorruptRecord, match="kind Fired "):
        decode(frame(Kind.FIRED, body))


@pytest.mark.parametrize("n", range(6))
def test_a_record_shorter_than_its_header_is_refused(n: int) -> None:
    with pytest.raises(CorruptRecord, match="truncated"):
        decode(b"\x01" * n)


# --- encode ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(object(), id="object"),
        pytest.param(None, id="none"),
        pytest.param((1, 2), id="tuple"),
        pytest.param(b"\x01\x00", id="bytes"),
        pytest.param(Parent("a", 1, 2), id="nested-value"),
        pytest.param(Kind.STEP, id="kind"),
    ],
)
def test_encoding_a_non_record_raises_type_error(value: Any) -> None:
    with pytest.raises(TypeError, match="not a journal record"):
        encode(value)


@pytest.mark.parametrize(
    "record",
    [
        pytest.param(Step(1, 0, "a", 1, Status.OK, b"", object()), id="object-for-nested"),  # type: ignore[arg-type]
        pytest.param(Step(1, 0, "a", 1, Status.OK, b"", (1, 2)), id="tuple-for-nested"),  # type: ignore[arg-type]
        pytest.param(Waited(1, 2, 0), id="int-for-nested"),  # type: ignore[arg-type]
        pytest.param(Step(1, 0, "a", 1, Status.OK, Parent("a", 1, 2)), id="nested-for-bytes"),  # type: ignore[arg-type]
        pytest.param(Fired(1, object()), id="object-for-int"),  # type: ignore[arg-type]
    ],
)
def test_encoding_a_field_of_the_wrong_type_raises_type_error(record: Any) -> None:
    # Each of these would otherwise be written as bytes that decode to a
    # different record, or to none.
    with pytest.raises(TypeError, match=f"a {type(record).__name__} record cannot be encoded"):
        encode(record)


def test_encoding_from_many_threads_at_once_keeps_records_whole() -> None:
    # Nested values once went through a packer callback, where another thread
    # could pack into the same buffer. A tiny switch interval makes threads
    # trade places inside nearly every encode.
    records = [
        Step(i, i, "s" * (i % 40), 1, Status.OK, bytes(i % 300), StepTime(i, i)) for i in range(300)
    ] + [Start(run=i, id="a", wtype="w", parent=Parent("p", i, i), meta=Meta()) for i in range(300)]
    failures: list[object] = []

    def encode_all() -> None:
        try:
            for _ in range(2):
                failures.extend(r for r in records if decode(encode(r)) != r)
        except Exception as e:  # reported below: a thread's exception is otherwise lost
            failures.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=encode_all) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert failures == []


@QUICK
@given(record=any_record, payload=st.binary(min_size=1000, max_size=4000))
def test_large_records_round_trip_and_refuse_damage(record: Any, payload: bytes) -> None:
    # Past a size, decode reads in place through a memoryview instead of a copy.
    blobs = [f.name for f in dataclasses.fields(record) if f.type == "bytes"]
    if blobs:
        record = dataclasses.replace(record, **{blobs[-1]: payload})
    wire = encode(record)
    assert decode(wire) == record
    for n in (len(wire) - 1, len(wire) // 2, 7):
        with pytest.raises(CorruptRecord):
            decode(wire[:n])
    damaged = bytearray(wire)
    damaged[-1] ^= 0x10
    with pytest.raises(CorruptRecord, match="checksum"):
        decode(bytes(damaged))


# --- records are values: the constructor keeps dataclass behaviour -------------------


def expected_repr(value: Any) -> str:
    inner = ", ".join(f"{f.name}={getattr(value, f.name)!r}" for f in dataclasses.fields(value))
    return f"{type(value).__qualname__}({inner})"


@pytest.mark.parametrize("value", by_kind(SAMPLES + NESTED))
def test_records_construct_like_dataclasses(value: Any) -> None:
    cls = type(value)
    fields = dataclasses.fields(value)
    args = [getattr(value, f.name) for f in fields]
    assert cls(*args) == value
    assert cls(**{f.name: getattr(value, f.name) for f in fields}) == value
    assert cls(*args[:1], **{f.name: getattr(value, f.name) for f in fields[1:]}) == value
    assert repr(value) == expected_repr(value)
    assert hash(value) == hash(cls(*args))
    assert not hasattr(value, "__dict__")
    assert copy.copy(value) == value
    assert copy.deepcopy(value) == value
    assert pickle.loads(pickle.dumps(value)) == value


@pytest.mark.parametrize("value", by_kind(SAMPLES + NESTED))
def test_records_are_frozen(value: Any) -> None:
    name = dataclasses.fields(value)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, name, getattr(value, name))
    with pytest.raises(dataclasses.FrozenInstanceError):
        delattr(value, name)


@pytest.mark.parametrize("value", by_kind(SAMPLES + NESTED))
def test_records_replace_one_field(value: Any) -> None:
    last = dataclasses.fields(value)[-1].name
    changed = dataclasses.replace(value, **{last: None})
    assert getattr(changed, last) is None
    assert dataclasses.replace(changed, **{last: getattr(value, last)}) == value
    assert changed != value


@pytest.mark.parametrize("value", by_kind(SAMPLES + NESTED))
def test_records_refuse_wrong_arguments(value: Any) -> None:
    cls = type(value)
    fields = dataclasses.fields(value)
    args = [getattr(value, f.name) for f in fields]
    required = [f for f in fields if f.default is dataclasses.MISSING]
    with pytest.raises(TypeError):
        cls(*args, 0)
    with pytest.raises(TypeError):
        cls(*args, not_a_field=0)
    with pytest.raises(TypeError):
        cls(*args, **{fields[0].name: args[0]})
    if required:
        with pytest.raises(TypeError, match=required[-1].name):
            cls(*args[: len(required) - 1])


@pytest.mark.parametrize("value", by_kind(SAMPLES + NESTED))
def test_records_signature_and_defaults_match_their_fields(value: Any) -> None:
    cls = type(value)
    fields = dataclasses.fields(value)
    params = list(inspect.signature(cls).parameters.values())
    assert [p.name for p in params] == [f.name for f in fields]
    assert [p.default for p in params] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default for f in fields
    ]
    # Tools that build values from type hints (hypothesis, pydantic) read them here.
    hints = typing.get_type_hints(cls)
    assert typing.get_type_hints(cls.__init__) == {
        **{f.name: hints[f.name] for f in fields},
        "return": type(None),
    }
    required = [getattr(value, f.name) for f in fields if f.default is dataclasses.MISSING]
    minimal = cls(*required)
    for f in fields:
        if f.default is not dataclasses.MISSING:
            assert getattr(minimal, f.name) == f.default


def test_record_defaults_are_the_documented_ones() -> None:
    start = Start(run=1, id="order-1", wtype="checkout")
    assert (start.version, start.codec, start.started_ms, start.input, start.meta) == (
        1,
        0,
        0,
        b"",
        None,
    )
    assert Step(1, 0, "charge", 1, Status.OK, b"").time is None
    assert UpdateDone(1, 6, 0, Status.OK, b"").state == b""
    assert (Meta().trace, Meta().carried) == (None, b"")
    assert WaitOutcome(WaitOutcome.SIGNAL).ordinal == 0


def test_a_meta_written_before_it_carried_anything_decodes_with_nothing_carried() -> None:
    # The form journals written before `Meta.carried` existed hold.
    old = frame_fields(Kind.START, replaced(START_FIELDS, 11, (b"00-abc-def-01",)))
    start = decode(old)
    assert isinstance(start, Start)
    assert start.meta == Meta(b"00-abc-def-01", b"")


def test_a_meta_written_before_it_had_a_schedule_tick_decodes_with_none() -> None:
    # The form journals written before `Meta.scheduled_ms` existed hold.
    old = frame_fields(Kind.START, replaced(START_FIELDS, 11, (b"00-abc-def-01", b"c")))
    start = decode(old)
    assert isinstance(start, Start)
    assert start.meta == Meta(b"00-abc-def-01", b"c", 0)


def test_records_match_positionally() -> None:
    match decode(encode(Step(1, 0, "charge", 2, Status.OK, b"\x01"))):
        case Step(_, _, name, attempt, Status.OK):
            assert (name, attempt) == ("charge", 2)
        case _:
            pytest.fail("a decoded Step did not match its positional pattern")


def test_wait_outcome_constants_survive_the_wire() -> None:
    for outcome in (WaitOutcome.TIMED_OUT, WaitOutcome.ABANDONED, WaitOutcome.signal(3)):
        decoded = decode(encode(Waited(1, 2, outcome))).outcome  # type: ignore[union-attr]
        assert decoded == outcome
        assert decoded.is_signal == outcome.is_signal
        assert decoded.is_abandoned == outcome.is_abandoned
