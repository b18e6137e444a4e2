"""The payload codec: values to msgpack bytes, and bytes back to the annotated type.

Workflow inputs, step results, signal and update payloads and workflow results
are journaled as the bytes `encode` returns. The rule a reader must not break:
a result is always decoded from its recorded bytes (`decode`, `decoder_for`),
live too, so live code and replayed code see equal values; and every failure
is a `fusee.errors.PayloadError`, never a msgpack, pydantic or msgspec error.

The wire format is msgpack (``use_bin_type=True``). The types msgpack lacks
travel as ext types, so they come back as the same Python type even when the
hint is ``typing.Any``. These codes are on disk: never renumber one.

======  ======================  ================================================
code    type                    ext payload
======  ======================  ================================================
1       int beyond 64 bits      two's-complement big-endian bytes
2       datetime.datetime       ISO 8601 text; the UTC offset is kept, a zone
                                name is not (it comes back as a fixed offset)
3       datetime.date           ISO 8601 text
4       datetime.time           ISO 8601 text (offset kept, as for datetime)
5       datetime.timedelta      days, seconds, microseconds: 3 big-endian int32
6       uuid.UUID               its 16 bytes
7       decimal.Decimal         its ``str()`` (sign, exponent and NaN kept)
======  ======================  ================================================

Everything else is plain msgpack and takes its shape from the hint on the way
back. Without a hint (``typing.Any``) the plain shape is what you get:
dataclasses, TypedDicts, pydantic models and msgspec structs come back as
dicts of their fields, tuples, NamedTuples, sets and frozensets as lists
(sets sorted when their items sort, so equal sets journal as equal bytes),
and enum members as their values. A dict key that was a tuple comes back as
a tuple, whatever the hint, since a list cannot be a key.

A Union tries first the members whose wire shape the value has (an int for
``float | int``; a map whose keys are exactly a dataclass's fields), then the
others, in the order written.

Converting to a dataclass is done by msgspec (in C) wherever it gives the
value the hand-written conversion gives (`_with_msgspec`); the hand-written
conversion stays the reference, and runs wherever msgspec refuses a value.

A dataclass whose fields hold what their annotations say (scalars, UUIDs,
datetimes, dates, times, Decimals, nested such dataclasses and lists of
them) is written by msgspec instead, in the typed form: a header that names
where its UUIDs, datetimes and the like sit, then msgspec's own msgpack, which
msgspec's decoder of the hint reads in one pass (see "The typed form" below).
It decodes, with any hint or none, to what the plain form of the same value
decodes to; bytes in the plain form, all journals written before it among
them, decode as they always did.

Decoding to a type is strict where a wrong value would pass silently (``True``
is not an ``int``, ``1.0`` is not an ``int``) and lenient where nothing is
lost (an ``int`` is accepted for ``float``; a missing dataclass field with a
default takes the default, and a recorded field the class no longer has is
ignored, so a dataclass can gain and lose fields while old journals replay).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import keyword
import struct
import sys
import threading
import types
import typing
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar, Union

import msgpack

from fusee.errors import PayloadError

if TYPE_CHECKING:
    import msgspec
    import pydantic

__all__ = ["Ext", "decode", "decoder_for", "encode", "structured_kind", "structured_part"]


class Ext(enum.IntEnum):
    """The msgpack ext type codes of the payload format (see the module docstring).

    Example:
        >>> int(Ext.UUID)
        6
    """

    BIG_INT = 1
    DATETIME = 2
    DATE = 3
    TIME = 4
    TIMEDELTA = 5
    UUID = 6
    DECIMAL = 7


_WHAT_TO_DO: Final = (
    "return a dataclass, pydantic model, msgspec struct or plain data "
    "(None, bool, int, float, str, bytes, list, tuple, dict, set, enum, "
    "datetime, date, time, timedelta, UUID, Decimal) instead"
)

# ---------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------

_INT64_MIN: Final = -(2**63)
_UINT64_MAX: Final = 2**64 - 1
_TIMEDELTA: Final = struct.Struct(">iii")
_ExtType = msgpack.ExtType
# ExtType is a namedtuple whose Python __new__ checks its arguments; ours
# are right by construction, and tuple.__new__ builds the same object in C.
_new_tuple = tuple.__new__
_BIG_INT: Final = Ext.BIG_INT.value
_DATETIME: Final = Ext.DATETIME.value
_DATE: Final = Ext.DATE.value
_TIME: Final = Ext.TIME.value
_TIMEDELTA_CODE: Final = Ext.TIMEDELTA.value
_UUID: Final = Ext.UUID.value
_DECIMAL: Final = Ext.DECIMAL.value


def _big_int(o: int) -> msgpack.ExtType:
    n = int(o)
    # bit_length() leaves out the sign bit two's complement needs.
    data = n.to_bytes(n.bit_length() // 8 + 1, "big", signed=True)
    return _new_tuple(_ExtType, (_BIG_INT, data))


def _datetime(o: dt.datetime) -> msgpack.ExtType:
    return _new_tuple(_ExtType, (_DATETIME, o.isoformat().encode("ascii")))


def _date(o: dt.date) -> msgpack.ExtType:
    return _new_tuple(_ExtType, (_DATE, o.isoformat().encode("ascii")))


def _time(o: dt.time) -> msgpack.ExtType:
    return _new_tuple(_ExtType, (_TIME, o.isoformat().encode("ascii")))


def _timedelta(o: dt.timedelta) -> msgpack.ExtType:
    data = _TIMEDELTA.pack(o.days, o.seconds, o.microseconds)
    return _new_tuple(_ExtType, (_TIMEDELTA_CODE, data))


def _uuid(o: uuid.UUID) -> msgpack.ExtType:
    # o.int, not the o.bytes property: one Python call less, the same bytes.
    return _new_tuple(_ExtType, (_UUID, o.int.to_bytes(16, "big")))


def _decimal(o: decimal.Decimal) -> msgpack.ExtType:
    return _new_tuple(_ExtType, (_DECIMAL, str(o).encode("ascii")))


def _set_items(o: set[Any] | frozenset[Any]) -> list[Any]:
    # Sorted when the items allow it: a set of str iterates in a per-process
    # (hash-seeded) order, and equal values should journal as equal bytes.
    try:
        return sorted(o)
    except TypeError:
        return list(o)


# Exact types first: one dict lookup for the common cases. Subclasses are
# handled by the isinstance chain in `_default_other`.
_ENCODERS: Final[dict[type, Callable[[Any], object]]] = {
    int: _big_int,
    dt.datetime: _datetime,
    dt.date: _date,
    dt.time: _time,
    dt.timedelta: _timedelta,
    uuid.UUID: _uuid,
    decimal.Decimal: _decimal,
    set: _set_items,
    frozenset: _set_items,
}

_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _dataclass_field_names(cls: type) -> tuple[str, ...] | None:
    try:
        return _FIELD_NAMES[cls]
    except KeyError:
        pass
    if not dataclasses.is_dataclass(cls):
        return None
    names = tuple(f.name for f in dataclasses.fields(cls))
    _FIELD_NAMES[cls] = names
    return names


def _fields_encoder(names: tuple[str, ...]) -> Callable[[Any], dict[str, Any]]:
    """The map of a dataclass's fields, in declaration order.

    Written out as one expression per class, as `dataclasses` writes
    ``__init__``: ``lambda o: {'sku': o.sku, 'qty': o.qty}`` takes a third of
    the time of a loop over the names. The names are a class's field names;
    one that is not an identifier gets the loop.
    """
    if not all(n.isidentifier() and not keyword.iskeyword(n) for n in names):
        return lambda o: {n: getattr(o, n) for n in names}
    items = ", ".join(f"{n!r}: o.{n}" for n in names)
    encode_fields: Callable[[Any], dict[str, Any]] = eval(f"lambda o: {{{items}}}")
    return encode_fields


# The types msgspec.to_builtins must leave alone so that they travel as our
# ext types (msgspec would turn them into strings, and bytes into base64).
_MSGSPEC_BUILTIN_TYPES: Final = (
    bytes,
    bytearray,
    memoryview,
    dt.datetime,
    dt.date,
    dt.time,
    dt.timedelta,
    uuid.UUID,
    decimal.Decimal,
)


def _is_packable(v: object) -> bool:
    """Whether msgpack packs ``v`` without calling `_default`."""
    if v is None or isinstance(
        v, bool | float | str | bytes | bytearray | memoryview | list | tuple | dict
    ):
        return True
    return type(v) is int and _INT64_MIN <= v <= _UINT64_MAX


def _default(o: object) -> object:
    """The msgpack ``default`` hook: turns a value msgpack cannot pack into one it can."""
    encode_one = _ENCODERS.get(type(o))
    if encode_one is not None:
        return encode_one(o)
    return _default_other(o)


def _default_other(o: object) -> object:
    cls = type(o)
    if isinstance(o, enum.Enum):
        # msgpack calls `default` once per value: a value that is itself not
        # packable (an enum of dates) must be converted here.
        value = o.value
        return value if _is_packable(value) else _default(value)
    names = _dataclass_field_names(cls)
    if names is not None:
        # Every field, init=False ones too, so the hint-less dict is complete.
        # Kept by exact class, so the next one of this class is one lookup
        # and one call in `_default`.
        encode_fields = _fields_encoder(names)
        _ENCODERS[cls] = encode_fields
        return encode_fields(o)
    if "pydantic" in sys.modules:
        import pydantic

        if isinstance(o, pydantic.BaseModel):
            # Kept by exact class, as a dataclass's encoder is.
            _ENCODERS[cls] = _dump_model
            return _dump_model(o)
    if "msgspec" in sys.modules:
        import msgspec

        if isinstance(o, msgspec.Struct):
            return msgspec.to_builtins(o, builtin_types=_MSGSPEC_BUILTIN_TYPES, enc_hook=_default)
    if isinstance(o, int):
        return _big_int(o)
    if isinstance(o, dt.datetime):
        return _datetime(o)
    if isinstance(o, dt.date):
        return _date(o)
    if isinstance(o, dt.time):
        return _time(o)
    if isinstance(o, dt.timedelta):
        return _timedelta(o)
    if isinstance(o, uuid.UUID):
        return _uuid(o)
    if isinstance(o, decimal.Decimal):
        return _decimal(o)
    if isinstance(o, set | frozenset):
        return _set_items(o)
    raise PayloadError(f"{_qualified_name(cls)} is not a payload type; {_WHAT_TO_DO}")


def _dump_model(o: pydantic.BaseModel) -> object:
    # by_alias: model_validate reads aliases by default. round_trip: leaves
    # out computed fields, which validation would refuse.
    dumped = o.model_dump(mode="python", by_alias=True, round_trip=True)
    return dumped if _is_packable(dumped) else _default(dumped)


_local = threading.local()
_SCALARS_PACKED: Final = frozenset({type(None), bool, float, str, bytes})
_pack_scalar = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def encode(value: object, *, name: str = "value") -> bytes:
    """Encodes a payload to msgpack bytes.

    Args:
        value: The payload: plain data, a dataclass, TypedDict, NamedTuple,
            enum member, pydantic model, msgspec struct, datetime, date, time,
            timedelta, UUID or Decimal, nested as you like.
        name: What to call the value in an error message (a parameter name).

    Returns:
        The bytes to journal; `decode` reads them back.

    Raises:
        PayloadError: The value (or a part of it, named by its path) is of a
            type the codec cannot encode.

    Example:
        >>> encode([1, "a", None])
        b'\\x93\\x01\\xa1a\\xc0'
    """
    t = type(value)
    if t in _SCALARS_PACKED or (t is int and _INT64_MIN <= value <= _UINT64_MAX):  # type: ignore[operator]
        # A lone scalar never calls `_default`: the shared packer runs in one
        # C call under the GIL, which no other thread can enter.
        try:
            return _pack_scalar(value)
        except Exception as e:
            raise _encode_error(value, name, e) from e
    typed = _TYPED_ENCODERS.get(t, _NOT_BUILT)
    if typed is _NOT_BUILT:
        typed = _typed_encoder(t)
    if typed is not None:
        data = typed(value)  # type: ignore[operator]
        if data is not None:
            return data  # type: ignore[no-any-return]
    # One Packer per thread: steps encode results on worker threads, and
    # `_default` runs Python code in the middle of a pack, where another
    # thread could otherwise take the GIL and write into the same buffer.
    # Taken out while in use so a re-entrant call gets its own.
    packer: msgpack.Packer | None = getattr(_local, "packer", None)
    if packer is None:
        packer = msgpack.Packer(default=_default, use_bin_type=True, autoreset=True)
    else:
        _local.packer = None
    try:
        data = packer.pack(value)
    except Exception as e:
        raise _encode_error(value, name, e) from e
    finally:
        _local.packer = packer
    assert data is not None  # autoreset=True: pack returns the bytes
    return data


def _encode_error(value: object, name: str, error: Exception) -> PayloadError:
    found = _locate_unencodable(value, name, set())
    if found is None:
        return PayloadError(f"cannot encode {name}: {type(error).__name__}: {error}; {_WHAT_TO_DO}")
    path, reason = found
    return PayloadError(f"cannot encode {path}: {reason}")


def _locate_unencodable(v: object, path: str, active: set[int]) -> tuple[str, str] | None:
    """Finds the first part of ``v`` that cannot be encoded, for the error message.

    Walks the value as the encoder does; slow, and only run after a failure.
    """
    if v is None or isinstance(v, bool | int | float | bytes | bytearray | memoryview):
        return None
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return path, "a str with lone surrogates is not valid UTF-8; remove or replace them"
        return None
    if id(v) in active:
        return path, f"the {type(v).__name__} contains itself; payloads must be trees"
    if len(active) > 200:
        return path, "the value is nested too deeply; flatten it"
    active.add(id(v))
    try:
        if isinstance(v, dict):
            return _locate_in_map(v, path, active, attrs=False)
        if isinstance(v, list | tuple):
            return _locate_in_items(v, path, active)
        try:
            converted = _default(v)
        except PayloadError:
            return path, f"{_qualified_name(type(v))} is not a payload type; {_WHAT_TO_DO}"
        except Exception as e:
            return path, f"converting {_qualified_name(type(v))} failed: {type(e).__name__}: {e}"
        if isinstance(converted, dict):
            return _locate_in_map(converted, path, active, attrs=True)
        if isinstance(converted, list | tuple) and not isinstance(converted, msgpack.ExtType):
            return _locate_in_items(converted, path, active)
        return None
    finally:
        active.discard(id(v))


def _locate_in_map(
    m: dict[Any, Any], path: str, active: set[int], *, attrs: bool
) -> tuple[str, str] | None:
    for k, x in m.items():
        found = _locate_unencodable(k, f"{path}[key {_short_repr(k)}]", active)
        if found is not None:
            return found
        inner = f"{path}.{k}" if attrs and isinstance(k, str) else f"{path}[{_short_repr(k)}]"
        found = _locate_unencodable(x, inner, active)
        if found is not None:
            return found
    return None


def _locate_in_items(
    items: list[Any] | tuple[Any, ...], path: str, active: set[int]
) -> tuple[str, str] | None:
    for i, x in enumerate(items):
        found = _locate_unencodable(x, f"{path}[{i}]", active)
        if found is not None:
            return found
    return None


# ---------------------------------------------------------------------------
# Decoding: bytes to plain values
# ---------------------------------------------------------------------------


def _decode_big_int(data: bytes) -> int:
    return int.from_bytes(data, "big", signed=True)


def _decode_datetime(data: bytes) -> dt.datetime:
    text = data.decode("ascii")
    value = dt.datetime.fromisoformat(text)
    if text[-6:-5] in _SIGNS:
        # An offset of whole minutes (``+02:00``): fromisoformat read it all.
        return value
    offset = _fine_offset(text, 19)
    return value if offset is None else value.replace(tzinfo=dt.timezone(offset))


_SIGNS: Final = ("+", "-")


def _fine_offset(text: str, start: int) -> dt.timedelta | None:
    """An ISO offset with seconds or microseconds, which 3.11's ``fromisoformat`` drops.

    ``start`` is where the offset may begin (after the seconds). None when
    the text has no such offset (``fromisoformat`` read it right).
    """
    at = max(text.rfind("+", start), text.rfind("-", start))
    if at < 0 or text.count(":", at) < 2:
        return None
    sign = -1 if text[at] == "-" else 1
    hours, minutes, rest = text[at + 1 :].split(":", 2)
    seconds, _, fraction = rest.partition(".")
    micros = int(fraction.ljust(6, "0")) if fraction else 0
    delta = dt.timedelta(
        hours=int(hours), minutes=int(minutes), seconds=int(seconds), microseconds=micros
    )
    return sign * delta


def _decode_date(data: bytes) -> dt.date:
    return dt.date.fromisoformat(data.decode("ascii"))


def _decode_time(data: bytes) -> dt.time:
    text = data.decode("ascii")
    value = dt.time.fromisoformat(text)
    offset = _fine_offset(text, 8)
    return value if offset is None else value.replace(tzinfo=dt.timezone(offset))


def _decode_timedelta(data: bytes) -> dt.timedelta:
    days, seconds, microseconds = _TIMEDELTA.unpack(data)
    return dt.timedelta(days=days, seconds=seconds, microseconds=microseconds)


def _decode_uuid(data: bytes) -> uuid.UUID:
    if len(data) != 16:
        return uuid.UUID(bytes=data)  # raises the ValueError that says why
    # What UUID's pickle support does (__setstate__): its __init__ is
    # Python code that checks four other ways to make one.
    value = _new_uuid(_UUID_CLASS)
    _set_attribute(value, "int", int.from_bytes(data, "big"))
    _set_attribute(value, "is_safe", _SAFE_UNKNOWN)
    return value


_UUID_CLASS: Final = uuid.UUID
_new_uuid = object.__new__
_set_attribute = object.__setattr__
_SAFE_UNKNOWN: Final = uuid.SafeUUID.unknown


def _decode_decimal(data: bytes) -> decimal.Decimal:
    return decimal.Decimal(data.decode("ascii"))


_EXT_DECODERS: Final[dict[int, Callable[[bytes], object]]] = {
    Ext.BIG_INT.value: _decode_big_int,
    Ext.DATETIME.value: _decode_datetime,
    Ext.DATE.value: _decode_date,
    Ext.TIME.value: _decode_time,
    Ext.TIMEDELTA.value: _decode_timedelta,
    Ext.UUID.value: _decode_uuid,
    Ext.DECIMAL.value: _decode_decimal,
}


def _ext_hook(code: int, data: bytes) -> object:
    try:
        decode_ext = _EXT_DECODERS[code]
    except KeyError:
        raise ValueError(f"unknown ext type code {code}") from None
    return decode_ext(data)


class _FrozenDict(dict[Any, Any]):
    """A map decoded where Python needs a hashable value: inside a dict key."""

    __slots__ = ()

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))


def _thaw(v: Any) -> Any:
    # Back to lists and dicts everywhere but in dict keys, which must stay
    # hashable (a tuple key comes back as a tuple).
    t = type(v)
    if t is tuple:
        return [_thaw(x) for x in v]
    if t is _FrozenDict:
        return {k: _thaw(x) for k, x in v.items()}
    return v


def _unpack_fallback(data: object, name: str, error: Exception) -> Any:
    """Decodes what the fast path refused, or raises the PayloadError for it."""
    if isinstance(data, bytes | bytearray | memoryview) and data[:1] == _TYPED_MARK:
        return _typed_plain(bytes(data), name)
    if not isinstance(data, bytes | bytearray | memoryview):
        raise PayloadError(
            f"{name}: expected the bytes of an encoded payload, got {type(data).__name__}"
        ) from error
    if isinstance(error, TypeError):
        # A dict key that is an array or a map (a tuple or frozen dataclass
        # key) is unhashable as a list or dict: decode them frozen instead.
        # Only here, so the common case pays nothing.
        try:
            frozen = msgpack.unpackb(
                data,
                ext_hook=_ext_hook,
                strict_map_key=False,
                use_list=False,
                object_pairs_hook=_FrozenDict,
            )
        except Exception:
            pass
        else:
            return _thaw(frozen)
    detail = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    raise PayloadError(
        f"{name}: the bytes do not decode as a payload ({detail}); "
        "they were not written by fusee's payload codec, or are damaged"
    ) from error


def _unpack(data: bytes, name: str) -> Any:
    try:
        return msgpack.unpackb(data, ext_hook=_ext_hook, strict_map_key=False)
    except Exception as e:
        return _unpack_fallback(data, name, e)


# ---------------------------------------------------------------------------
# Decoding: plain values to the annotated type
# ---------------------------------------------------------------------------

_Convert = Callable[[Any], Any]


class _Mismatch(Exception):
    """A decoded value does not fit the hint; internal, becomes a PayloadError.

    The path is collected while the exception unwinds (innermost segment
    first), so a successful decode never builds one.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.path: list[str] = []


def _never(v: object) -> bool:
    return False


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    """How to turn a decoded plain value into one type.

    Attributes:
        name: The type as a message names it (``list[int]``).
        convert: Checks and converts a decoded value; raises `_Mismatch`.
            None when the decoded value is the result as it is (``Any``).
        exact: Whether a decoded value is this type's own wire shape; a
            Union tries the members that say yes first.
        fast: A type such that a decoded value of exactly that type is
            already the result, so the hot path can skip ``convert``.
        hint: The type itself (set on the plans `_plan_for` returns).
        typed: msgspec's decoder of ``hint`` for each header of the typed
            form, or None where the header does not fit the hint.
    """

    name: str
    convert: _Convert | None = None
    exact: Callable[[Any], bool] = _never
    fast: type | None = None
    hint: object = Any
    typed: dict[bytes, Callable[[Any], Any] | None] = dataclasses.field(
        default_factory=dict, compare=False
    )


_ANY: Final = _Plan("Any")


def _same(v: Any) -> Any:
    return v


def _run(plan: _Plan) -> _Convert:
    return plan.convert if plan.convert is not None else _same


def _expected(name: str, v: object) -> _Mismatch:
    return _Mismatch(f"expected {name}, got {_describe(v)}")


def _describe(v: object) -> str:
    if v is None:
        return "None"
    t = type(v)
    if isinstance(v, list | tuple):
        return f"{t.__name__} of {len(v)} items"
    if isinstance(v, dict):
        return f"dict with keys {_short_repr(list(v)[:5])}"
    return f"{_qualified_name(t)} {_short_repr(v)}"


def _short_repr(v: object, limit: int = 40) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _qualified_name(cls: type) -> str:
    if cls.__module__ in ("builtins", "__main__"):
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def _type_name(hint: object) -> str:
    """Names a type the way it is written in code: ``dict[str, list[int]] | None``."""
    if hint is type(None) or hint is None:
        return "None"
    if hint is Ellipsis:
        return "..."
    if hint is Any:
        return "Any"
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Union or origin is types.UnionType:
        return " | ".join(_type_name(a) for a in args)
    if origin is Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if origin is not None and args:
        return f"{_type_name(origin)}[{', '.join(_type_name(a) for a in args)}]"
    if origin is tuple and not args:
        return "tuple" if hint is _BARE_TUPLE else "tuple[()]"
    if isinstance(hint, type):
        return hint.__qualname__
    if isinstance(hint, TypeVar):
        return hint.__name__
    return repr(hint).replace("typing.", "")


def _item_error(convert: _Convert, items: list[Any] | tuple[Any, ...]) -> _Mismatch:
    # Run again, one by one, to learn which item failed: conversions are
    # pure, and only a failed decode pays for this.
    for i, x in enumerate(items):
        try:
            convert(x)
        except _Mismatch as e:
            e.path.append(f"[{i}]")
            return e
    return _Mismatch("an item failed to convert, then converted")


def _freeze(v: Any) -> Any:
    if isinstance(v, list | tuple):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return _FrozenDict((k, _freeze(x)) for k, x in v.items())
    return v


def _scalar_plan(cls: type, name: str) -> _Plan:
    def convert(v: Any) -> Any:
        if type(v) is cls:
            return v
        raise _expected(name, v)

    return _Plan(name, convert, lambda v: type(v) is cls, cls)


def _float_convert(v: Any) -> Any:
    t = type(v)
    if t is float:
        return v
    if t is int:
        try:
            return float(v)
        except OverflowError:
            raise _Mismatch(f"expected float, got an int too large for a float: {v}") from None
    raise _expected("float", v)


def _bytearray_convert(v: Any) -> Any:
    if type(v) is bytes:
        return bytearray(v)
    raise _expected("bytearray", v)


_SCALARS: Final[dict[object, _Plan]] = {
    **{
        cls: _scalar_plan(cls, cls.__name__)
        for cls in (
            bool,
            int,
            str,
            bytes,
            dt.datetime,
            dt.date,
            dt.time,
            dt.timedelta,
            uuid.UUID,
            decimal.Decimal,
        )
    },
    type(None): _scalar_plan(type(None), "None"),
    float: _Plan("float", _float_convert, lambda v: type(v) is float, float),
    bytearray: _Plan("bytearray", _bytearray_convert, lambda v: type(v) is bytes),
}
_SCALARS[None] = _SCALARS[type(None)]

_LIST_ORIGINS: Final = frozenset(
    {
        list,
        typing.get_origin(typing.Sequence[int]),
        typing.get_origin(typing.MutableSequence[int]),
        typing.get_origin(typing.Collection[int]),
        typing.get_origin(typing.Iterable[int]),
    }
)
_SET_ORIGINS: Final = frozenset(
    {set, typing.get_origin(typing.AbstractSet[int]), typing.get_origin(typing.MutableSet[int])}
)
_DICT_ORIGINS: Final = frozenset(
    {
        dict,
        typing.get_origin(typing.Mapping[int, int]),
        typing.get_origin(typing.MutableMapping[int, int]),
    }
)

_TypeAliasType: Final = getattr(typing, "TypeAliasType", None)
# `typing.Tuple` without arguments means tuple[Any, ...], but get_args()
# gives it the same () as tuple[()], the empty tuple.
_BARE_TUPLE: Final[object] = typing.Tuple  # noqa: UP006


# TypedDict key qualifiers, by name: typing_extensions has its own objects.
_KEY_MARKERS: Final = frozenset({"Required", "NotRequired", "ReadOnly"})


def _unwrap(hint: object) -> object:
    """Strips what does not change the wire shape: Annotated, NewType, aliases, Required."""
    while True:
        origin = typing.get_origin(hint)
        if origin is typing.Annotated or getattr(origin, "_name", None) in _KEY_MARKERS:
            hint = typing.get_args(hint)[0]
        elif isinstance(hint, typing.NewType):
            hint = hint.__supertype__
        elif _TypeAliasType is not None and isinstance(hint, _TypeAliasType):
            hint = hint.__value__
        else:
            return hint


def _substitute(hint: object, bindings: dict[Any, Any]) -> object:
    """Replaces a generic class's type variables in one of its field hints."""
    if not bindings:
        return hint
    if isinstance(hint, TypeVar):
        return bindings.get(hint, hint)
    params = getattr(hint, "__parameters__", ())
    if params and typing.get_origin(hint) is not None:
        return hint[tuple(bindings.get(p, p) for p in params)]  # type: ignore[index]
    return hint


class _Builder:
    """Builds the `_Plan` of one hint; the memo closes recursive types."""

    def __init__(self) -> None:
        self.memo: dict[object, _Plan] = {}

    def plan(self, hint: object) -> _Plan:
        hint = _unwrap(hint)
        if hint is Any or hint is object:
            return _ANY
        try:
            scalar = _SCALARS.get(hint)
        except TypeError:  # an unhashable hint: not a scalar
            scalar = None
        if scalar is not None:
            return scalar
        key = _cache_key(hint)
        if key is not None and key in self.memo:
            return self.memo[key]
        built = self._build(hint, key)
        if key is not None:
            self.memo[key] = built
        return built

    def _build(self, hint: object, key: object) -> _Plan:
        if isinstance(hint, str | typing.ForwardRef):
            raise PayloadError(
                f"cannot decode payloads to the unresolved annotation {hint!r}: resolve it "
                "first (typing.get_type_hints), or define the type at module level"
            )
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if origin is Union or origin is types.UnionType:
            return self._union(hint, args)
        if origin is Literal:
            return _literal_plan(hint, args)
        if isinstance(hint, TypeVar):
            if hint.__bound__ is not None:
                return self.plan(hint.__bound__)
            if hint.__constraints__:
                return self.plan(Union[hint.__constraints__])  # noqa: UP007
            return _ANY
        cls = origin if origin is not None else hint
        if cls in _LIST_ORIGINS:
            return self._collection(hint, list, args[0] if args else Any)
        if cls is tuple:
            return self._tuple(hint, args)
        if cls in _SET_ORIGINS:
            return self._collection(hint, set, args[0] if args else Any)
        if cls is frozenset:
            return self._collection(hint, frozenset, args[0] if args else Any)
        if cls in _DICT_ORIGINS:
            return self._dict(hint, *(args if args else (Any, Any)))
        if isinstance(cls, type):
            if issubclass(cls, enum.Enum):
                return _enum_plan(cls)
            pydantic_model = _pydantic_model(cls)
            if pydantic_model is not None:
                return _pydantic_plan(pydantic_model)
            struct = _msgspec_struct(cls)
            if struct is not None:
                return _msgspec_plan(hint, struct)
            bindings = _bindings(cls, args)
            if dataclasses.is_dataclass(cls):
                return self._with_recursion(
                    key, _type_name(hint), lambda: self._dataclass(cls, hint, bindings)
                )
            if _is_typeddict(cls):
                return self._with_recursion(
                    key, _type_name(hint), lambda: self._typeddict(cls, hint, bindings)
                )
            if issubclass(cls, tuple) and hasattr(cls, "_fields"):
                return self._with_recursion(
                    key, _type_name(hint), lambda: self._namedtuple(cls, hint, bindings)
                )
        raise PayloadError(
            f"cannot decode payloads to {_type_name(hint)}: it is not a supported payload type; "
            "annotate with a dataclass, pydantic model, msgspec struct, TypedDict, NamedTuple, "
            "enum, or plain data types (int, str, list[X], dict[K, V], X | None, ...)"
        )

    def _with_recursion(self, key: object, name: str, build: Callable[[], _Plan]) -> _Plan:
        # A class may contain itself (a tree node's children): its fields'
        # plans are built against a forwarding plan, filled in afterwards.
        cell: list[_Plan] = []

        def forward(v: Any) -> Any:
            return _run(cell[0])(v)

        def forward_exact(v: Any) -> bool:
            return cell[0].exact(v)

        if key is not None:
            self.memo[key] = _Plan(name, forward, forward_exact)
        built = build()
        cell.append(built)
        return built

    def _union(self, hint: object, args: tuple[Any, ...]) -> _Plan:
        name = _type_name(hint)
        members = [self.plan(a) for a in args]
        if any(m is _ANY for m in members):
            return _ANY
        none = _SCALARS[None]
        if len(members) == 2 and (members[0] is none or members[1] is none):
            # Optional[X]: the common case, without the general search; its
            # errors keep their inner path.
            inner = members[0] if members[1] is none else members[1]
            inner_convert = _run(inner)

            def convert_optional(v: Any) -> Any:
                return None if v is None else inner_convert(v)

            return _Plan(name, convert_optional, lambda v: v is None or inner.exact(v))

        def convert(v: Any) -> Any:
            exact = [m.exact(v) for m in members]
            failures: list[_Mismatch] = []
            for m, is_exact in zip(members, exact, strict=True):
                if is_exact:
                    try:
                        return _run(m)(v)
                    except _Mismatch as e:
                        failures.append(e)
            for m, is_exact in zip(members, exact, strict=True):
                if not is_exact:
                    try:
                        return _run(m)(v)
                    except _Mismatch:
                        pass
            if len(failures) == 1:
                # One member has this shape: its error says more than ours.
                raise failures[0]
            raise _expected(name, v)

        return _Plan(name, convert, lambda v: any(m.exact(v) for m in members))

    def _collection(self, hint: object, make: type, item_hint: object) -> _Plan:
        name = _type_name(hint)
        item = self.plan(item_hint)
        item_convert = item.convert
        if item_convert is None and make is list:

            def convert_list(v: Any) -> Any:
                t = type(v)
                if t is list:
                    return v
                if t is tuple:
                    return list(v)
                raise _expected(name, v)

            return _Plan(name, convert_list, lambda v: type(v) is list, list)
        if item_convert is None:

            def convert_any_items(v: Any) -> Any:
                if type(v) is not list and type(v) is not tuple:
                    raise _expected(name, v)
                try:
                    return make(v)
                except TypeError:
                    # A set of tuples: the items came back as lists.
                    return make(_freeze(x) for x in v)

            return _Plan(name, convert_any_items, lambda v: type(v) is list)
        ic = item_convert
        fast = item.fast

        def convert(v: Any) -> Any:
            t = type(v)
            if t is not list and t is not tuple:
                raise _expected(name, v)
            # Items that already are their type (list[int] of ints) need no
            # call each: a type check is several times cheaper.
            for x in v:
                if type(x) is not fast:
                    break
            else:
                return v if t is make else make(v)
            try:
                items = [ic(x) for x in v]
            except _Mismatch:
                raise _item_error(ic, v) from None
            if make is list:
                return items
            try:
                return make(items)
            except TypeError as e:
                raise _Mismatch(f"expected {name}, but its items are not hashable: {e}") from None

        return _Plan(name, convert, lambda v: type(v) is list)

    def _tuple(self, hint: object, args: tuple[Any, ...]) -> _Plan:
        name = _type_name(hint)
        bare = hint is tuple or hint is _BARE_TUPLE
        if bare or (len(args) == 2 and args[1] is Ellipsis):
            item = self.plan(Any if bare else args[0])
            ic = _run(item)

            def convert_variadic(v: Any) -> Any:
                if type(v) is not list and type(v) is not tuple:
                    raise _expected(name, v)
                try:
                    return tuple([ic(x) for x in v])
                except _Mismatch:
                    raise _item_error(ic, v) from None

            return _Plan(name, convert_variadic, lambda v: type(v) is list)
        converts = [_run(self.plan(a)) for a in args]
        size = len(converts)

        def convert_fixed(v: Any) -> Any:
            if (type(v) is not list and type(v) is not tuple) or len(v) != size:
                raise _Mismatch(f"expected {name} ({size} items), got {_describe(v)}")
            out = []
            for i, (c, x) in enumerate(zip(converts, v, strict=True)):
                try:
                    out.append(c(x))
                except _Mismatch as e:
                    e.path.append(f"[{i}]")
                    raise
            return tuple(out)

        return _Plan(name, convert_fixed, lambda v: type(v) is list and len(v) == size)

    def _dict(self, hint: object, key_hint: object, value_hint: object) -> _Plan:
        name = _type_name(hint)
        key_plan = self.plan(key_hint)
        value_plan = self.plan(value_hint)
        if key_plan.convert is None and value_plan.convert is None:

            def convert_plain(v: Any) -> Any:
                if isinstance(v, dict):
                    return v
                raise _expected(name, v)

            return _Plan(name, convert_plain, lambda v: type(v) is dict, dict)
        kc = _run(key_plan)
        vc = _run(value_plan)

        def convert(v: Any) -> Any:
            if not isinstance(v, dict):
                raise _expected(name, v)
            try:
                return {kc(k): vc(x) for k, x in v.items()}
            except _Mismatch:
                raise _entry_error(kc, vc, v) from None

        return _Plan(name, convert, lambda v: type(v) is dict)

    def _dataclass(self, cls: type, hint: object, bindings: dict[Any, Any]) -> _Plan:
        name = _type_name(hint)
        hints = _field_hints(cls, bindings)
        specs: list[tuple[str, _Convert | None, type | None, str | None]] = []
        names: set[str] = set()
        required: set[str] = set()
        for f in dataclasses.fields(cls):
            names.add(f.name)
            if not f.init:
                continue  # rebuilt by the class (a default, __post_init__)
            plan = self.plan(hints.get(f.name, Any))
            has_default = (
                f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            )
            if not has_default:
                required.add(f.name)
            specs.append((f.name, plan.convert, plan.fast, None if has_default else plan.name))
        all_names = frozenset(names)
        required_names = frozenset(required)

        def convert(v: Any) -> Any:
            if not isinstance(v, dict):
                raise _expected(f"{name} (a map of its fields)", v)
            kwargs: dict[str, Any] = {}
            for field_name, field_convert, fast, required_type in specs:
                try:
                    x = v[field_name]
                except KeyError:
                    if required_type is None:
                        continue
                    e = _Mismatch(
                        f"expected {required_type}, got nothing: a required field of {name}"
                    )
                    e.path.append(f".{field_name}")
                    raise e from None
                if field_convert is None or type(x) is fast:
                    kwargs[field_name] = x
                    continue
                try:
                    kwargs[field_name] = field_convert(x)
                except _Mismatch as e:
                    e.path.append(f".{field_name}")
                    raise
            try:
                return cls(**kwargs)
            except Exception as e:
                raise _refused(name, e) from None

        def exact(v: Any) -> bool:
            return type(v) is dict and required_names <= v.keys() and v.keys() <= all_names

        return _Plan(name, convert, exact)

    def _typeddict(self, cls: type, hint: object, bindings: dict[Any, Any]) -> _Plan:
        name = _type_name(hint)
        hints = _field_hints(cls, bindings, include_extras=True)
        required_keys = _required_keys(cls, hints)
        fields = [(k, _run(self.plan(h))) for k, h in hints.items()]
        all_keys = frozenset(hints)

        def convert(v: Any) -> Any:
            if not isinstance(v, dict):
                raise _expected(f"{name} (a map of its keys)", v)
            # Unknown keys are kept: a TypedDict is a dict, and dropping
            # recorded data silently would be worse than carrying it.
            out = dict(v)
            for k, c in fields:
                if k not in v:
                    if k in required_keys:
                        e = _Mismatch(f"a required key of {name} is missing")
                        e.path.append(f"[{k!r}]")
                        raise e
                    continue
                try:
                    out[k] = c(v[k])
                except _Mismatch as e:
                    e.path.append(f"[{k!r}]")
                    raise
            return out

        def exact(v: Any) -> bool:
            return type(v) is dict and required_keys <= v.keys() and v.keys() <= all_keys

        return _Plan(name, convert, exact)

    def _namedtuple(self, cls: type, hint: object, bindings: dict[Any, Any]) -> _Plan:
        name = _type_name(hint)
        field_names: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]
        defaults: dict[str, Any] = cls._field_defaults  # type: ignore[attr-defined]
        hints = _field_hints(cls, bindings)
        converts = [_run(self.plan(hints.get(n, Any))) for n in field_names]
        size = len(field_names)
        least = size - len(defaults)

        def convert(v: Any) -> Any:
            if (type(v) is not list and type(v) is not tuple) or not least <= len(v) <= size:
                raise _Mismatch(
                    f"expected {name} ({least}..{size} items), got {_describe(v)}"
                    if least != size
                    else f"expected {name} ({size} items), got {_describe(v)}"
                )
            out = []
            for field_name, c, x in zip(field_names, converts, v, strict=False):
                try:
                    out.append(c(x))
                except _Mismatch as e:
                    e.path.append(f".{field_name}")
                    raise
            try:
                return cls(*out)
            except Exception as e:
                raise _refused(name, e) from None

        return _Plan(name, convert, lambda v: type(v) is list and least <= len(v) <= size)


def _entry_error(kc: _Convert, vc: _Convert, m: dict[Any, Any]) -> _Mismatch:
    for k, x in m.items():
        try:
            kc(k)
        except _Mismatch as e:
            e.path.append(f"[key {_short_repr(k)}]")
            return e
        try:
            vc(x)
        except _Mismatch as e:
            e.path.append(f"[{_short_repr(k)}]")
            return e
    return _Mismatch("an entry failed to convert, then converted")


def _refused(name: str, error: Exception) -> _Mismatch:
    # A __post_init__ or __new__ that validates: the recorded value no longer
    # passes the class's own checks.
    return _Mismatch(f"{name}(...) refused the recorded fields: {type(error).__name__}: {error}")


def _cache_key(hint: object) -> object:
    """A key that tells apart hints Python calls equal but we do not.

    ``int | str == str | int``, but a Union tries its members in order.
    None for an unhashable hint: it is built every time.
    """
    try:
        hash(hint)
    except TypeError:
        return None
    if isinstance(hint, type):
        return hint
    return (hint, repr(hint))


def _bindings(cls: type, args: tuple[Any, ...]) -> dict[Any, Any]:
    params: tuple[Any, ...] = getattr(cls, "__parameters__", ())
    if not args or len(params) != len(args):
        return {}
    return dict(zip(params, args, strict=True))


def _field_hints(
    cls: type, bindings: dict[Any, Any], *, include_extras: bool = False
) -> dict[str, Any]:
    try:
        hints = typing.get_type_hints(cls, include_extras=include_extras)
    except Exception as e:
        raise PayloadError(
            f"cannot read the type hints of {cls.__qualname__} ({type(e).__name__}: {e}); "
            "define the class and the types its fields name at module level"
        ) from e
    return {k: _substitute(h, bindings) for k, h in hints.items()}


def _required_keys(cls: type, hints: dict[str, Any]) -> frozenset[str]:
    # With `from __future__ import annotations` a TypedDict cannot see
    # NotRequired[...] in its string annotations, and lists every key in
    # __required_keys__ (fixed in later Pythons). The evaluated hints can.
    required = set(getattr(cls, "__required_keys__", ()))
    for key, hint in hints.items():
        marker = _required_marker(hint)
        if marker is not None:
            (required.add if marker else required.discard)(key)
    return frozenset(required)


def _required_marker(hint: object) -> bool | None:
    """True for Required[X], False for NotRequired[X], None for neither."""
    while typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    name = getattr(typing.get_origin(hint), "_name", None)
    if name == "Required":
        return True
    if name == "NotRequired":
        return False
    if name == "ReadOnly":
        return _required_marker(typing.get_args(hint)[0])
    return None


def _is_typeddict(cls: type) -> bool:
    # typing_extensions.TypedDict (which pydantic requires before Python
    # 3.12) is a class of its own that typing.is_typeddict does not know.
    return typing.is_typeddict(cls) or (
        issubclass(cls, dict) and hasattr(cls, "__required_keys__") and hasattr(cls, "__total__")
    )


def _literal_plan(hint: object, values: tuple[Any, ...]) -> _Plan:
    name = _type_name(hint)
    # (wire value, its type, the result): an enum literal is stored by value.
    choices = [
        (lit.value, type(lit.value), lit) if isinstance(lit, enum.Enum) else (lit, type(lit), lit)
        for lit in values
    ]

    def convert(v: Any) -> Any:
        t = type(v)
        for wire, wire_type, result in choices:
            if t is wire_type and v == wire:
                return result
        raise _expected(name, v)

    def exact(v: Any) -> bool:
        t = type(v)
        return any(t is wire_type and v == wire for wire, wire_type, _ in choices)

    return _Plan(name, convert, exact)


def _enum_plan(cls: type[enum.Enum]) -> _Plan:
    name = cls.__qualname__
    members = list(cls)
    value_types = {type(m.value) for m in members}
    if issubclass(cls, int):
        value_types.add(int)
    if issubclass(cls, str):
        value_types.add(str)
    tuple_values = tuple in value_types
    choices = ", ".join(_short_repr(m.value, 20) for m in members[:10])
    if len(members) > 10:
        choices += ", ..."
    message = f"expected {name} (one of {choices})"

    def convert(v: Any) -> Any:
        t = type(v)
        if t is list and tuple_values:
            v, t = tuple(v), tuple
        # Lookup is by equality: without the type check True would be 1 and
        # 1.0 would be 1.
        if t in value_types:
            try:
                return cls(v)
            except ValueError:
                pass
        raise _Mismatch(f"{message}, got {_describe(v)}")

    return _Plan(name, convert, lambda v: type(v) in value_types)


def _pydantic_model(cls: type) -> type[pydantic.BaseModel] | None:
    # No pydantic in sys.modules means no pydantic class exists to check.
    if "pydantic" not in sys.modules:
        return None
    import pydantic

    if issubclass(cls, pydantic.BaseModel):
        return cls
    return None


def _pydantic_plan(cls: type[pydantic.BaseModel]) -> _Plan:
    import pydantic

    name = cls.__qualname__

    def convert(v: Any) -> Any:
        try:
            return cls.model_validate(v)
        except pydantic.ValidationError as e:
            errors = e.errors(include_url=False)
            first = errors[0]
            mismatch = _Mismatch(
                f"{first['msg']} (pydantic, {len(errors)} errors in all)"
                if len(errors) > 1
                else f"{first['msg']} (pydantic)"
            )
            for part in reversed(first["loc"]):
                mismatch.path.append(f"[{part}]" if isinstance(part, int) else f".{part}")
            raise mismatch from None
        except Exception as e:
            raise _Mismatch(f"{name}.model_validate raised {type(e).__name__}: {e}") from None

    return _Plan(name, convert, lambda v: type(v) is dict)


def structured_kind(value: object) -> str | None:
    """What kind of typed record ``value`` is, if decoding it with no hint loses its type.

    A dataclass instance, a pydantic model or a msgspec struct comes back as
    a dict of its fields unless the decoder is told its type. Only ``value``
    itself is looked at; `structured_part` looks inside containers too.

    Example:
        >>> import dataclasses
        >>> @dataclasses.dataclass
        ... class P:
        ...     x: int
        >>> structured_kind(P(1)), structured_kind({"x": 1})
        ('dataclass', None)
    """
    cls = type(value)
    if cls in _PLAIN_TYPES:
        return None
    if dataclasses.is_dataclass(cls):
        return "dataclass"
    if _pydantic_model(cls) is not None:
        return "pydantic model"
    if _msgspec_struct(cls) is not None:
        return "msgspec struct"
    return None


def structured_part(value: object) -> tuple[str, str, object, str] | None:
    """The first typed record in ``value`` or in the lists, tuples and dicts it holds.

    Returns:
        ``(kind, path, record, hint)``: the path as ``[0]['key']`` (empty for
        ``value`` itself) and a type that would keep the record, such as
        ``list[Item]``; or None when decoding ``value`` with no hint loses
        no type.

    Example:
        >>> import dataclasses
        >>> @dataclasses.dataclass
        ... class P:
        ...     x: int
        >>> structured_part({"a": [1, P(2)]})
        ('dataclass', "['a'][1]", P(x=2), 'dict[str, list[P]]')
    """
    if type(value) in _SCALAR_TYPES:
        return None
    found = _structured_in(value, _STRUCTURED_DEPTH)
    if found is None:
        return None
    kind, record, parts = found
    path, hint = "", type(record).__qualname__
    for segment, container in parts:
        path = segment + path
        hint = container.format(hint)
    return kind, path, record, hint


# How deep `structured_part` looks (msgpack refuses deeper values anyway).
_STRUCTURED_DEPTH: Final = 100


def _structured_in(v: object, depth: int) -> tuple[str, object, list[tuple[str, str]]] | None:
    # The path is built on the way out, and only for a record found: the
    # scalars that make up most values cost one set lookup each.
    cls = type(v)
    if cls in _SCALAR_TYPES or depth == 0:
        return None
    scalars = _SCALAR_TYPES
    if cls is list or cls is tuple:
        items: Any = v
        for i, item in enumerate(items):
            if type(item) not in scalars:
                found = _structured_in(item, depth - 1)
                if found is not None:
                    found[2].append((f"[{i}]", "list[{}]" if cls is list else "tuple[{}, ...]"))
                    return found
        return None
    if cls is dict:
        entries: Any = v
        for k, item in entries.items():
            if type(item) not in scalars:
                found = _structured_in(item, depth - 1)
                if found is not None:
                    key_hint = type(k).__qualname__.replace("{", "{{").replace("}", "}}")
                    found[2].append((f"[{k!r}]", f"dict[{key_hint}, {{}}]"))
                    return found
        return None
    kind = structured_kind(v)
    return None if kind is None else (kind, v, [])


_SCALAR_TYPES: Final = frozenset({type(None), bool, int, float, str, bytes})
_PLAIN_TYPES: Final = frozenset({type(None), bool, int, float, str, bytes, list, dict, tuple})


def _msgspec_struct(cls: type) -> type[msgspec.Struct] | None:
    if "msgspec" not in sys.modules:
        return None
    import msgspec

    if issubclass(cls, msgspec.Struct):
        return cls
    return None


def _msgspec_plan(hint: object, cls: type[msgspec.Struct]) -> _Plan:
    import msgspec

    name = _type_name(hint)
    shape = list if cls.__struct_config__.array_like else dict

    def convert(v: Any) -> Any:
        try:
            return msgspec.convert(v, hint)
        except msgspec.ValidationError as e:
            message, _, where = str(e).partition(" - at `$")
            mismatch = _Mismatch(f"{message} (msgspec)")
            if where:
                mismatch.path.append(where.rstrip("`"))
            raise mismatch from None
        except Exception as e:
            raise _Mismatch(f"msgspec.convert to {name} raised {type(e).__name__}: {e}") from None

    return _Plan(name, convert, lambda v: type(v) is shape)


_PLANS: dict[object, _Plan] = {}
# By identity, for `decode` called again and again with one hint object:
# building `_cache_key` (a repr) costs more than the decode. Holding the hint
# keeps its id from being reused; cleared when full, as fresh `list[int]`
# objects would otherwise pile up.
_RECENT: dict[int, tuple[object, _Plan]] = {}
_RECENT_MAX: Final = 1024


def _plan_for(hint: object) -> _Plan:
    recent = _RECENT.get(id(hint))
    if recent is not None and recent[0] is hint:
        return recent[1]
    plan = _plan_by_key(hint)
    if len(_RECENT) >= _RECENT_MAX:
        _RECENT.clear()
    _RECENT[id(hint)] = (hint, plan)
    return plan


def _plan_by_key(hint: object) -> _Plan:
    key = _cache_key(hint)
    if key is None:
        return dataclasses.replace(_with_msgspec(hint, _Builder().plan(hint)), hint=hint, typed={})
    try:
        return _PLANS[key]
    except KeyError:
        pass
    plan = dataclasses.replace(_with_msgspec(hint, _Builder().plan(hint)), hint=hint, typed={})
    _PLANS[key] = plan
    return plan


# ---------------------------------------------------------------------------
# Decoding with msgspec: the same conversion, in C
# ---------------------------------------------------------------------------

# The types a decoded value already holds as themselves: msgspec.convert must
# neither parse them from a str (a UUID from its text) nor from base64.
_CONVERT_BUILTINS: Final = (
    bytes,
    bytearray,
    dt.datetime,
    dt.date,
    dt.time,
    dt.timedelta,
    uuid.UUID,
    decimal.Decimal,
)
# Hints that msgspec.convert (strict, with the builtins above) turns every
# decoded value into exactly what the hand-written plan does, or refuses.
_CONVERT_SCALARS: Final = frozenset(
    {
        bool,
        int,
        float,
        str,
        bytes,
        type(None),
        None,
        dt.datetime,
        dt.date,
        dt.time,
        dt.timedelta,
        uuid.UUID,
        decimal.Decimal,
    }
)
# What a set's items may be: hashable as decoded.
_CONVERT_KEYS: Final = frozenset({bool, int, float, str, bytes, uuid.UUID, decimal.Decimal})


def _with_msgspec(hint: object, plan: _Plan) -> _Plan:
    """``plan`` with its conversion done by msgspec where that gives the same value.

    msgspec.convert builds a dataclass several times faster than the
    hand-written plan. It is taken only for hints whose every part it
    converts exactly as the plan does (`_converts_exactly`), and only where
    it pays: hints that hold a dataclass. Where msgspec refuses a value, the
    plan runs: it raises the error with the path in the value, or accepts
    what msgspec would not (so msgspec can only make a decode faster).
    """
    if plan.convert is None or _converts_exactly(hint, set()) is not True:
        return plan
    import msgspec
    import msgspec.inspect

    try:
        msgspec.inspect.type_info(hint)
    except Exception:
        return plan  # a type msgspec cannot convert to
    convert_by_msgspec = msgspec.convert
    builtins = _CONVERT_BUILTINS
    by_plan = plan.convert

    def convert(v: Any) -> Any:
        try:
            return convert_by_msgspec(v, hint, strict=True, builtin_types=builtins)
        except Exception:
            return by_plan(v)

    return dataclasses.replace(plan, convert=convert)


def _converts_exactly(hint: object, seen: set[int]) -> bool | None:
    """Whether msgspec converts to ``hint`` as the plan does: True if it does and
    ``hint`` holds a dataclass, False if it does and holds none, None if it does not.

    msgspec and the plan part ways on init=False fields (msgspec sets them
    from the map), on unions of several dataclasses (msgspec refuses them),
    TypedDicts (msgspec drops unknown keys), Annotated constraints (msgspec
    enforces them), and on a class built other than by its dataclass
    ``__init__`` (msgspec sets the fields directly); all of those, and all
    that is not listed here, keep the plan.
    """
    try:
        if hint in _CONVERT_SCALARS or hint is Any:
            return False
    except TypeError:  # unhashable
        return None
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Union or origin is types.UnionType:
        if len(args) != 2 or type(None) not in args:
            return None
        (inner,) = (a for a in args if a is not type(None))
        return _converts_exactly(inner, seen)
    if origin is list and len(args) == 1:
        return _converts_exactly(args[0], seen)
    if origin is dict and len(args) == 2:
        if args[0] is not str and args[0] is not int:
            return None
        return _converts_exactly(args[1], seen)
    if origin in (set, frozenset) and len(args) == 1:
        return False if args[0] in _CONVERT_KEYS else None
    if origin is tuple and args and args != ((),):
        items = args[:1] if len(args) == 2 and args[1] is Ellipsis else args
        found = [_converts_exactly(a, seen) for a in items]
        if None in found:
            return None
        return any(found)
    if origin is not None or not isinstance(hint, type):
        return None
    if issubclass(hint, enum.Enum):
        values = {type(m.value) for m in hint}
        plain = issubclass(hint, int | str) or values in ({int}, {str})
        return False if plain and not issubclass(hint, enum.Flag) and values <= {int, str} else None
    fields = _plain_dataclass_fields(hint)
    if fields is None:
        return None
    if id(hint) in seen:
        return True  # checked, or being checked (a recursive class)
    seen.add(id(hint))
    try:
        field_hints = typing.get_type_hints(hint)
    except Exception:
        return None
    for f in fields:
        if _converts_exactly(field_hints.get(f.name, Any), seen) is None:
            return None
    return True


def _plain_dataclass_fields(cls: type) -> tuple[dataclasses.Field[Any], ...] | None:
    """The fields of a dataclass made only by its generated ``__init__``, all init fields."""
    if getattr(cls, "__parameters__", None) or not dataclasses.is_dataclass(cls):
        return None
    fields = dataclasses.fields(cls)
    init = getattr(cls.__init__, "__code__", None)
    plain = (
        # ClassVar and InitVar pseudo-fields are in __dataclass_fields__ only.
        len(fields) == len(cls.__dataclass_fields__)
        and all(f.init for f in fields)
        # dataclasses writes __init__ with exec: a user's __init__ has a file.
        and init is not None
        and init.co_filename == "<string>"
        and cls.__new__ is object.__new__
        and (cls.__setattr__ is object.__setattr__ or cls.__dataclass_params__.frozen)  # type: ignore[attr-defined]
    )
    return fields if plain else None


# ---------------------------------------------------------------------------
# The typed form: a dataclass written by msgspec
# ---------------------------------------------------------------------------
#
# A dataclass whose fields hold, as their annotations say, plain scalars,
# UUIDs, datetimes, dates, times, Decimals, nested such dataclasses and lists
# of them is written by msgspec (in C) and read back by msgspec's decoder of
# the hint in one pass. msgspec writes the types msgpack lacks as text, and
# reading text into a UUID field is only right where the text was a UUID; so
# where such a value sits, the payload says so in a header:
#
#     0xc1  n  <n bytes: msgpack [[ext code, key, key, ...], ...]>  <body>
#
# 0xc1 is the one byte msgpack never writes, so a payload starting with it is
# in this form, and every payload before it (and every other value) is plain
# msgpack as described in the module docstring. A key is a field name, or
# nil for every item of a list. Without a hint, or with one the header does
# not fit exactly (`_typed_decoder`), the body is decoded plain and the
# values the header names are made their own type again, so every decode
# gives what the plain msgpack form of the same value gives. A dataclass
# with no such field needs no header: msgspec writes it byte for byte as the
# plain form does.

_TYPED_MARK: Final = b"\xc1"
# The types the header names, by the ext code of their plain form.
_TAGGED: Final[dict[object, int]] = {
    uuid.UUID: _UUID,
    dt.datetime: _DATETIME,
    dt.date: _DATE,
    dt.time: _TIME,
    decimal.Decimal: _DECIMAL,
}
_UNTAGGED: Final[dict[object, str]] = {
    bool: "bool",
    int: "int",
    float: "float",
    str: "str",
    bytes: "bytes",
}
_FROM_TEXT: Final[dict[int, Callable[[str], object]]] = {
    _UUID: uuid.UUID,
    _DATETIME: dt.datetime.fromisoformat,
    _DATE: dt.date.fromisoformat,
    _TIME: dt.time.fromisoformat,
    _DECIMAL: decimal.Decimal,
}
_TYPED_DEPTH: Final = 8
_NOT_BUILT: Final = object()
_TYPED_ENCODERS: dict[type, Callable[[Any], bytes | None] | None] = {}
_TAGS: dict[bytes, tuple[tuple[int, tuple[str | None, ...]], ...]] = {}


def _whole_minutes(offset: dt.timedelta | None) -> bool:
    # msgspec writes an offset as hours and minutes, and drops the rest.
    return offset is None or not (offset.seconds % 60 or offset.microseconds)


def _typed_encoder(cls: type) -> Callable[[Any], bytes | None] | None:
    """The typed form's encoder of ``cls``'s instances, or None if it has none."""
    try:
        return _TYPED_ENCODERS[cls]
    except KeyError:
        pass
    try:
        encoder = _build_typed_encoder(cls)
    except Exception:
        encoder = None  # a class whose hints do not resolve, and the like
    _TYPED_ENCODERS[cls] = encoder
    return encoder


class _Checks:
    """The generated source of a check that a value holds its annotated types exactly.

    The check returns 0 where the typed form cannot take the value, 1 where
    msgspec's msgpack writes it as it is, and 2 where it must go through
    `msgspec.to_builtins` first: msgspec's msgpack writes an aware datetime
    as a timestamp, which keeps the offset only when it is UTC; to_builtins
    writes RFC 3339 text, which keeps any offset of whole minutes.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.env: dict[str, Any] = {
            "_whole_minutes": _whole_minutes,
            "_utc": dt.UTC,
            "type": type,
            "list": list,
            **{name: cls for cls, name in _UNTAGGED.items()},
        }
        self.tags: list[tuple[int, tuple[str | None, ...]]] = []
        self.count = 0
        self.active: set[type] = set()

    def name(self, value: object) -> str:
        name = f"_t{len(self.env)}"
        self.env[name] = value
        return name

    def var(self) -> str:
        self.count += 1
        return f"v{self.count}"

    def add(self, hint: object, var: str, path: tuple[str | None, ...], pad: str) -> bool:
        """Writes the check of ``var`` against ``hint``; False if the form cannot take it."""
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if origin is Union or origin is types.UnionType:
            if len(args) != 2 or type(None) not in args:
                return False
            (inner,) = (a for a in args if a is not type(None))
            self.lines.append(f"{pad}if {var} is not None:")
            return self.add(inner, var, path, pad + "    ")
        if origin is list:
            if len(args) != 1:
                return False
            item = self.var()
            self.lines.append(f"{pad}if type({var}) is not list: return 0")
            self.lines.append(f"{pad}for {item} in {var}:")
            return self.add(args[0], item, (*path, None), pad + "    ")
        if origin is not None or not isinstance(hint, type):
            return False
        if hint in _UNTAGGED:
            self.lines.append(f"{pad}if type({var}) is not {_UNTAGGED[hint]}: return 0")
            return True
        code = _TAGGED.get(hint)
        if code is None:
            return self.add_dataclass(hint, var, path, pad)
        self.lines.append(f"{pad}if type({var}) is not {self.name(hint)}: return 0")
        if hint is dt.datetime:
            self.lines += [
                f"{pad}if {var}.tzinfo is not None and {var}.tzinfo is not _utc:",
                f"{pad}    if not _whole_minutes({var}.utcoffset()): return 0",
                f"{pad}    form = 2",
            ]
        elif hint is dt.time:
            self.lines.append(
                f"{pad}if {var}.tzinfo is not None and not _whole_minutes({var}.utcoffset()):"
                " return 0"
            )
        self.tags.append((code, path))
        return True

    def add_dataclass(self, cls: type, var: str, path: tuple[str | None, ...], pad: str) -> bool:
        fields = _plain_dataclass_fields(cls)
        if fields is None or cls in self.active or len(path) > _TYPED_DEPTH:
            return False
        if not all(f.name.isidentifier() and not keyword.iskeyword(f.name) for f in fields):
            return False
        hints = typing.get_type_hints(cls)
        self.active.add(cls)
        if path:  # the root is looked up by its exact class
            self.lines.append(f"{pad}if type({var}) is not {self.name(cls)}: return 0")
        for f in fields:
            field_var = self.var()
            self.lines.append(f"{pad}{field_var} = {var}.{f.name}")
            if not self.add(hints.get(f.name, Any), field_var, (*path, f.name), pad):
                return False
        self.active.discard(cls)
        return True


def _build_typed_encoder(cls: type) -> Callable[[Any], bytes | None] | None:
    checks = _Checks()
    if not checks.add_dataclass(cls, "o", (), "    "):
        return None
    # The names as parameter defaults: a local is read faster than a global.
    params = ", ".join(f"{n}={n}" for n in checks.env)
    body = "\n".join(checks.lines)
    source = f"def check(o, *, {params}):\n    form = 1\n{body}\n    return form\n"
    exec(source, checks.env)
    check: Callable[[Any], int] = checks.env["check"]
    import msgspec

    encode_body = msgspec.msgpack.Encoder().encode
    tags = checks.tags
    if not tags:

        def encode_plain(o: Any) -> bytes | None:
            # The bytes of the plain form: no value in it needs an ext code.
            if not check(o):
                return None
            try:
                return encode_body(o)
            except Exception:
                return None  # an int beyond 64 bits

        return encode_plain
    header_tags = msgpack.packb([[code, *path] for code, path in tags], use_bin_type=True)
    if len(header_tags) > 255:
        return None
    header = _TYPED_MARK + bytes([len(header_tags)]) + header_tags
    _TAGS[header_tags] = tuple(tags)
    to_builtins = msgspec.to_builtins
    keep: Final = (bytes,)

    def encode_typed(o: Any) -> bytes | None:
        form = check(o)
        if not form:
            return None
        try:
            if form == 1:
                return header + encode_body(o)
            return header + encode_body(to_builtins(o, builtin_types=keep))
        except Exception:
            return None  # an int beyond 64 bits

    return encode_typed


def _typed_parts(data: bytes) -> tuple[bytes, memoryview]:
    """The header's tags and the body of a payload in the typed form."""
    end = 2 + data[1]
    if len(data) <= end:
        raise ValueError("the payload ends in its header")
    return bytes(data[2:end]), memoryview(data)[end:]


def _tags_of(header: bytes) -> tuple[tuple[int, tuple[str | None, ...]], ...]:
    try:
        return _TAGS[header]
    except KeyError:
        pass
    tags = tuple(
        (code, tuple(path))
        for code, *path in msgpack.unpackb(header, raw=False, strict_map_key=False)
    )
    for code, path in tags:
        if code not in _FROM_TEXT or not path:
            raise ValueError(f"a typed payload's header names ext code {code} at {path}")
    if len(_TAGS) < 4096:
        _TAGS[header] = tags
    return tags


def _restore(node: Any, path: tuple[str | None, ...], from_text: Callable[[str], object]) -> None:
    """Makes the text values at ``path`` in ``node`` their own type again."""
    key, rest = path[0], path[1:]
    if key is None:
        if rest:
            for item in node:
                if item is not None:
                    _restore(item, rest, from_text)
        else:
            for i, item in enumerate(node):
                if type(item) is str:
                    node[i] = from_text(item)
        return
    if key not in node:
        return  # a field the header names and the body lacks: nothing to restore
    item = node[key]
    if rest:
        if item is not None:
            _restore(item, rest, from_text)
    elif type(item) is str:
        # Not a str: a UTC datetime, which msgspec writes as a timestamp and
        # reads back as a datetime itself.
        node[key] = from_text(item)


def _typed_plain(data: bytes, name: str) -> Any:
    """A typed-form payload decoded to its plain shape (as `_unpack` gives the plain form)."""
    import msgspec

    try:
        header, body = _typed_parts(data)
        tags = _tags_of(header)
        value = msgspec.msgpack.decode(body)
        for code, path in tags:
            _restore(value, path, _FROM_TEXT[code])
    except Exception as e:
        detail = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        raise PayloadError(
            f"{name}: the bytes do not decode as a payload ({detail}); "
            "they were not written by fusee's payload codec, or are damaged"
        ) from e
    return value


def _typed_decoder(
    hint: object, tags: tuple[tuple[int, tuple[str | None, ...]], ...]
) -> Callable[[Any], Any] | None:
    """msgspec's decoder of ``hint`` where it reads a body with ``tags`` as the plan does.

    That is where msgspec converts ``hint`` as the plan does
    (`_converts_exactly`) and the hint's UUIDs, datetimes, dates, times and
    Decimals sit exactly where the header says the body holds them: msgspec
    reads such a type from text, which the plan accepts only from its own
    ext value.
    """
    if _converts_exactly(hint, set()) is None:
        return None
    found: list[tuple[int, tuple[str | None, ...]]] = []
    if not _tagged_paths(hint, (), found, set()):
        return None
    if sorted(found, key=repr) != sorted(tags, key=repr):
        return None
    import msgspec

    try:
        return msgspec.msgpack.Decoder(hint).decode
    except Exception:
        return None


def _tagged_paths(
    hint: object,
    path: tuple[str | None, ...],
    found: list[tuple[int, tuple[str | None, ...]]],
    active: set[int],
) -> bool:
    """Collects where ``hint`` holds a type the header names; False if one is out of reach."""
    try:
        code = _TAGGED.get(hint)
    except TypeError:
        return False
    if code is not None:
        found.append((code, path))
        return True
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Union or origin is types.UnionType:
        return all(_tagged_paths(a, path, found, active) for a in args)
    if origin is list:
        return _tagged_paths(args[0], (*path, None), found, active)
    if origin is not None:
        # dicts, sets and tuples: fine as long as nothing in them is named.
        inner: list[tuple[int, tuple[str | None, ...]]] = []
        ok = all(_tagged_paths(a, path, inner, active) for a in args if a is not Ellipsis)
        return ok and not inner
    if not isinstance(hint, type) or not dataclasses.is_dataclass(hint):
        return True
    if id(hint) in active:
        # A recursive class holding a named type cannot be listed by path.
        return True
    active.add(id(hint))
    try:
        hints = typing.get_type_hints(hint)
        before = len(found)
        ok = all(
            _tagged_paths(hints.get(f.name, Any), (*path, f.name), found, active)
            for f in dataclasses.fields(hint)
        )
    finally:
        active.discard(id(hint))
    if ok and len(path) > _TYPED_DEPTH and len(found) > before:
        return False
    return ok


def _decode_typed_form(data: bytes, plan: _Plan, name: str) -> Any:
    """Decodes a payload in the typed form to ``plan``'s type."""
    try:
        header, body = _typed_parts(data)
    except Exception:
        header, body = b"", memoryview(b"")
    typed = plan.typed
    decoder = typed.get(header, _NOT_BUILT)
    if decoder is _NOT_BUILT:
        try:
            decoder = _typed_decoder(plan.hint, _tags_of(header))
        except Exception:
            decoder = None
        if len(typed) < 64:
            typed[header] = decoder
    if decoder is not None:
        try:
            return decoder(body)  # type: ignore[operator]
        except Exception:
            pass  # the plan decides, and names what is wrong
    return _converted(_typed_plain(data, name), plan, name)


def _converted(value: Any, plan: _Plan, name: str) -> Any:
    """``value``, as unpacked, made what ``plan``'s hint says (a `PayloadError` if it cannot be)."""
    convert = plan.convert
    if convert is None or type(value) is plan.fast:
        return value
    try:
        return convert(value)
    except _Mismatch as e:
        raise _decode_error(e, name, plan) from None


def _decode_error(mismatch: _Mismatch, name: str, plan: _Plan) -> PayloadError:
    path = name + "".join(reversed(mismatch.path))
    return PayloadError(
        f"{path}: {mismatch.message} (decoding to {plan.name}; fix the annotation, "
        "or the code that produced the value)"
    )


def decode(data: bytes, hint: object = Any, *, name: str = "value") -> Any:
    """Decodes payload bytes, then converts the value to the annotated type.

    For many payloads of one type, `decoder_for` does the type work once.

    Args:
        data: Bytes `encode` returned.
        hint: The annotated type. ``typing.Any`` (the default) converts
            nothing: dataclasses and models come back as dicts, tuples and
            sets as lists, enum members as their values; datetimes, UUIDs,
            Decimals and big ints still come back as themselves.
        name: What to call the value in an error message (a parameter name).

    Returns:
        The value, of type ``hint``.

    Raises:
        PayloadError: The bytes do not decode, the value does not fit the
            hint (the message names the path inside the value, such as
            ``order.items[2].sku``), or the hint is not a payload type.

    Example:
        >>> decode(encode((1, 2)), tuple[int, ...])
        (1, 2)
        >>> decode(encode((1, 2)))
        [1, 2]
    """
    plan = _plan_for(hint)
    if type(data) is bytes and data[:1] == _TYPED_MARK:
        return _decode_typed_form(data, plan, name)
    return _converted(_unpack(data, name), plan, name)


def decoder_for(hint: object = Any, *, name: str = "value") -> Callable[[bytes], Any]:
    """Returns a function that decodes payload bytes to ``hint``, prepared once.

    Call it once per signature and keep the function: decoding a plain value
    then costs little more than msgpack itself.

    Args:
        hint: The annotated type (see `decode`).
        name: What to call the value in an error message (a parameter name).

    Returns:
        ``decode(data)``, which behaves as ``decode(data, hint, name=name)``.

    Raises:
        PayloadError: ``hint`` is not a payload type (raised here, not at the
            first decode).

    Example:
        >>> import dataclasses
        >>> @dataclasses.dataclass
        ... class Point:
        ...     x: int
        ...     y: int
        >>> decode_point = decoder_for(Point)
        >>> decode_point(encode(Point(1, 2)))
        Point(x=1, y=2)
    """
    plan = _plan_for(hint)
    convert = plan.convert
    fast = plan.fast
    unpackb = msgpack.unpackb
    ext_hook = _ext_hook

    if convert is None:

        def decode_any(data: bytes) -> Any:
            try:
                return unpackb(data, ext_hook=ext_hook, strict_map_key=False)
            except Exception as e:
                return _unpack_fallback(data, name, e)

        return decode_any

    mark = _TYPED_MARK

    def decode_typed(data: bytes) -> Any:
        if type(data) is bytes and data[:1] == mark:
            return _decode_typed_form(data, plan, name)
        try:
            value = unpackb(data, ext_hook=ext_hook, strict_map_key=False)
        except Exception as e:
            value = _unpack_fallback(data, name, e)
        if type(value) is fast:
            return value
        try:
            return convert(value)
        except _Mismatch as e:
            raise _decode_error(e, name, plan) from None

    return decode_typed
