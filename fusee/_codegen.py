"""Code generated at import: fast ``__init__`` methods and the journal records' codec.

Why generate code: records, outcomes and deliveries are built once or more
per journal operation, every journal entry is encoded, and every replay
decodes its journal again, so microseconds per record are the engine's
throughput. Generic code pays for its generality on each call (a loop over
fields, an attribute lookup per field, ``object.__setattr__`` through a
frozen class); code written for one class does not. So each function is
written here once per class at import, from the class's own fields and
annotations (with ``exec``, as `dataclasses` itself does), and the code
cannot drift from the classes.

The rule: generated source reads like hand-written code, and stays
readable: `GENERATED` keeps it by its pseudo file name, and tracebacks and
debuggers show its lines. No I/O, no clock.
"""

from __future__ import annotations

import dataclasses
import linecache
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar, cast

from fusee.errors import CorruptRecord

__all__ = ["GENERATED", "Wire", "decoder", "encoder", "fast_init", "record_fields", "replacer"]

T = TypeVar("T")

GENERATED: Final[dict[str, str]] = {}
"""Source of every generated function, by its pseudo file name."""


def _compile(
    filename: str, source: str, names: dict[str, Any], module: str, fn: str = "_fn"
) -> Callable[..., Any]:
    """Compiles ``source``, which defines function ``fn``, and returns it.

    As `dataclasses` does, ``fn`` is made inside a factory whose parameters
    are ``names`` (the helpers it calls, bound as closure cells), and its
    globals are those of ``module`` (the module of the class it is written
    for): `typing.get_type_hints` resolves its annotations, and no helper
    leaks into a module's namespace.
    """
    body = "".join(f"    {line}" if line.strip() else line for line in source.splitlines(True))
    source = f"def _factory({', '.join(names)}):\n{body}    return {fn}\n"
    factory: dict[str, Any] = {}
    exec(compile(source, filename, "exec"), sys.modules[module].__dict__, factory)
    # Registered so that tracebacks and debuggers show the generated lines.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    GENERATED[filename] = source
    made: Callable[..., Any] = factory["_factory"](**names)
    return made


def _setter(cls: type, name: str) -> Callable[[object, object], None]:
    # The slot's own descriptor: what object.__setattr__ ends up calling,
    # without the attribute lookup and the frozen class's __setattr__.
    setter: Callable[[object, object], None] = cls.__dict__[name].__set__
    return setter


# --- fast __init__ and replace --------------------------------------------------------

# The default of a parameter whose field has a default_factory.
_NO_VALUE: Any = object()


def fast_init(cls: type[T]) -> type[T]:
    """Replaces a frozen slotted dataclass's ``__init__`` with a faster one.

    The ``__init__`` that ``dataclasses`` writes for a frozen class sets each
    field through ``object.__setattr__``; setting the slot descriptors
    directly costs about half as much (bench/NOTES.md has the figures).
    Only ``__init__`` changes: ``__setattr__`` still raises
    ``FrozenInstanceError``, and ``__eq__``, ``__hash__``, ``__repr__``,
    ``fields()`` and ``replace()`` are the dataclass's own. The new
    ``__init__`` keeps the original's annotations and resolves them in the
    class's module, so ``typing.get_type_hints`` still works on it.

    Args:
        cls: A dataclass made with ``frozen=True, slots=True`` with no
            ``init=False`` field and no ``InitVar``; ``__post_init__`` is
            called last, as the dataclass's own ``__init__`` calls it.

    Returns:
        ``cls``, changed in place.

    Example:
        >>> @fast_init
        ... @dataclasses.dataclass(frozen=True, slots=True)
        ... class P:
        ...     x: int
        ...     y: int = 0
        >>> P(1)
        P(x=1, y=0)
    """
    names: dict[str, Any] = {}
    params: list[str] = []
    # Keyword-only fields (``kw_only=True``, or after ``KW_ONLY``) follow a
    # ``*``, as in the dataclass's own ``__init__``: they may not be passed
    # by position, and one without a default may follow one with.
    keyword_params: list[str] = []
    lines: list[str] = []
    for f in dataclasses.fields(cast(Any, cls)):
        if not f.init:
            raise TypeError(f"fast_init does not support field {f.name!r} of {cls.__name__}")
        names[f"_set_{f.name}"] = _setter(cls, f.name)
        into = keyword_params if f.kw_only is True else params
        if f.default_factory is not dataclasses.MISSING:
            # As the dataclass's own: the factory is called when no value is given.
            names["_no_value"] = _NO_VALUE
            names[f"_factory_{f.name}"] = f.default_factory
            into.append(f"{f.name}=_no_value")
            lines.append(f"    if {f.name} is _no_value:\n        {f.name} = _factory_{f.name}()\n")
        elif f.default is dataclasses.MISSING:
            into.append(f.name)
        else:
            names[f"_default_{f.name}"] = f.default
            into.append(f"{f.name}=_default_{f.name}")
        lines.append(f"    _set_{f.name}(self, {f.name})\n")
    if keyword_params:
        params += ["*", *keyword_params]
    if hasattr(cls, "__post_init__"):
        lines.append("    self.__post_init__()\n")
    source = f"def __init__(self, {', '.join(params)}):\n" + ("".join(lines) or "    pass\n")
    filename = f"<fusee fast __init__ of {cls.__module__}.{cls.__qualname__}>"
    init = _compile(filename, source, names, cls.__module__, "__init__")
    original = cls.__dict__["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__annotations__ = dict(original.__annotations__)
    init.__doc__ = original.__doc__
    type.__setattr__(cls, "__init__", init)
    return cls


def replacer(cls: type[T]) -> Callable[..., T]:
    """A faster `dataclasses.replace` for one frozen slotted dataclass.

    ``dataclasses.replace`` looks up the class's fields and reads each one
    by name on every call, then calls ``__init__`` with keywords; the
    function written here copies each field's slot directly and sets only
    the changed ones, a fraction of the cost (bench/NOTES.md). No
    ``__init__`` runs, so the class must have none of its own and no
    ``__post_init__``; an unknown field is a `TypeError`, as with
    ``replace``.

    Example:
        >>> @dataclasses.dataclass(frozen=True, slots=True)
        ... class P:
        ...     x: int
        ...     y: int = 0
        >>> replacer(P)(P(1, 2), y=5)
        P(x=1, y=5)
    """
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"replacer does not support {cls.__name__}: it has a __post_init__")
    names: dict[str, Any] = {"_new": object.__new__, "_cls": cls, "_same": _NO_VALUE}
    params: list[str] = []
    lines: list[str] = []
    for f in dataclasses.fields(cast(Any, cls)):
        names[f"_set_{f.name}"] = _setter(cls, f.name)
        params.append(f"{f.name}=_same")
        lines.append(f"    _set_{f.name}(new, self.{f.name} if {f.name} is _same else {f.name})\n")
    source = (
        f"def replace(self, *, {', '.join(params)}):\n    new = _new(_cls)\n"
        + "".join(lines)
        + "    return new\n"
    )
    filename = f"<fusee replace of {cls.__module__}.{cls.__qualname__}>"
    return _compile(filename, source, names, cls.__module__, "replace")


# --- the journal records' codec -------------------------------------------------------


@dataclass(frozen=True)
class Wire:
    """What the record module's wire format gives the codec written here.

    Example:
        >>> Wire({}, {}, (), print, print, print, 1, ()).version
        1
    """

    nested: Mapping[str, type]
    """The values records carry inside a field, by class name; on the wire,
    an array of their fields in declaration order."""
    max_value: Mapping[tuple[type, str], tuple[int, str]]
    """Field values narrower than their type: (class, field) -> (largest
    value, what to call a value above it)."""
    statuses: tuple[Any, ...]
    """The status of each wire code, indexed by the code."""
    pack: Callable[[Any], bytes]
    """Packs a tuple of fields to msgpack."""
    pack_header: Callable[..., bytes]
    """Packs (version, CRC, tag) to a record's header."""
    crc32: Callable[..., int]
    """``zlib.crc32``."""
    version: int
    """The format version a record's header carries."""
    tag_crcs: Sequence[int]
    """The CRC-32 of each kind tag's byte: a record's CRC starts from it."""
    oldest_fields: Mapping[type, int] = dataclasses.field(default_factory=dict)
    """Nested values that gained fields after they were first written: class ->
    how many fields its oldest form has. A shorter array on the wire (an older
    journal's) decodes with the missing trailing fields at their defaults."""


# Names the generated code uses besides its own `_`-names: a field (a local
# there) must not shadow them.
_RESERVED: Final = frozenset({"self", "type", "len", "int", "str", "bytes", "tuple", "isinstance"})


def record_fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    """A record class's fields, refused if the code written here could not handle them.

    Raises:
        TypeError: A field's name starts with ``_`` or is a name the code
            uses, a field has no plain default, or the class has a
            ``__post_init__``.

    Example:
        >>> @dataclasses.dataclass
        ... class Bad:
        ...     len: int
        >>> record_fields(Bad)
        Traceback (most recent call last):
        TypeError: Bad.len: a record field name cannot be 'len'
    """
    fields = dataclasses.fields(cast(Any, cls))
    for f in fields:
        if f.name.startswith("_") or f.name in _RESERVED:
            raise TypeError(f"{cls.__name__}.{f.name}: a record field name cannot be {f.name!r}")
        if f.default_factory is not dataclasses.MISSING or not f.init:
            raise TypeError(f"{cls.__name__}.{f.name}: a record field takes a plain default")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: a record has no __post_init__")
    return fields


# Decoders. One function per kind takes the msgpack array (a tuple) and
# returns the record, checking each value as strictly as the wire allows:
# `type(v) is int` and not isinstance (a bool must not pass for an int), ints
# non-negative, statuses in range, nested values as arrays of the right
# length. A bad value raises ValueError naming its field (the record module
# adds the kind); a wrong field count raises CorruptRecord. The record is
# made with object.__new__ and its slots' setters, as the fast __init__
# does, without the call through the class. For `Step`, the source reads:
#
#     def _fn(_fields):
#         if type(_fields) is not tuple or len(_fields) != 7:
#             raise _wrong_count(_fields)
#         run, seq, name, attempt, status, payload, time = _fields
#         if type(run) is not int or run < 0:
#             raise _not_uint('run', run)
#         ...
#         if type(status) is not int or status < 0 or status > 4:
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


def _check(
    var: str, path: str, annotation: str, wire: Wire, names: dict[str, Any], indent: str
) -> list[str]:
    """Lines that check local ``var`` against a field's annotation (and convert it).

    Args:
        var: The local holding the decoded msgpack value.
        path: The field's name in messages (``time.started_ms`` when nested).
        annotation: The field's annotation, as written in the class.
        wire: The wire format.
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
        top = len(wire.statuses) - 1
        return [
            f"{i}if type({var}) is not int or {var} < 0 or {var} > {top}:",
            f"{i}    raise _not_status({path!r}, {var})",
            f"{i}{var} = _STATUSES[{var}]",
        ]
    name, optional = annotation.removesuffix(" | None"), annotation.endswith(" | None")
    if name not in wire.nested:
        raise TypeError(f"field {path}: no wire encoding for a field of type {annotation!r}")
    cls = wire.nested[name]
    fields = record_fields(cls)
    locals_ = [f"{var}__{f.name}" for f in fields]
    lines = []
    if optional:
        lines.append(f"{i}if {var} is not None:")
        i += "    "
    oldest = wire.oldest_fields.get(cls, len(fields))
    if oldest < len(fields):
        # Only a short array takes this branch: the current form costs no more.
        names[f"_tail_{name}"] = tuple(f.default for f in fields[oldest:])
        lines += [
            f"{i}if type({var}) is tuple and {oldest} <= len({var}) < {len(fields)}:",
            f"{i}    {var} = {var} + _tail_{name}[len({var}) - {oldest}:]",
        ]
    lines += [
        f"{i}if type({var}) is not tuple or len({var}) != {len(fields)}:",
        f"{i}    raise _not_nested({path!r}, {name}, {len(fields)}, {var})",
        f"{i}({', '.join(locals_)},) = {var}"
        if len(fields) == 1
        else f"{i}{', '.join(locals_)} = {var}",
    ]
    for f, local in zip(fields, locals_, strict=True):
        lines += _check(local, f"{path}.{f.name}", str(f.type), wire, names, i)
        if (cls, f.name) in wire.max_value:
            top, what = wire.max_value[cls, f.name]
            lines += [f"{i}if {local} > {top}:", f"{i}    raise _above({what!r}, {local})"]
    names[name] = cls
    lines.append(f"{i}{var} = _new({name})")
    for f, local in zip(fields, locals_, strict=True):
        names[f"_set_{name}_{f.name}"] = _setter(cls, f.name)
        lines.append(f"{i}_set_{name}_{f.name}({var}, {local})")
    return lines


def decoder(cls: type, wire: Wire) -> Callable[[Any], Any]:
    """Writes the function that checks a kind's msgpack array and builds its record.

    Example:
        >>> @dataclasses.dataclass(frozen=True, slots=True)
        ... class Fired:
        ...     run: int
        ...     seq: int
        >>> wire = Wire({}, {}, (), print, print, print, 1, [0] * 256)
        >>> decoder(Fired, wire)((1, 2))
        Fired(run=1, seq=2)
        >>> decoder(Fired, wire)((1, -2))
        Traceback (most recent call last):
        ValueError: field seq: expected a non-negative int, got -2
    """
    fields = record_fields(cls)
    name = cls.__name__
    names: dict[str, Any] = {
        name: cls,
        "_new": object.__new__,
        "_STATUSES": wire.statuses,
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
        lines += _check(f.name, f.name, str(f.type), wire, names, "    ")
    lines.append(f"    _record = _new({name})")
    for f in fields:
        names[f"_set_{name}_{f.name}"] = _setter(cls, f.name)
        lines.append(f"    _set_{name}_{f.name}(_record, {f.name})")
    lines.append("    return _record")
    source = "\n".join(lines) + "\n"
    return _compile(f"<fusee.record decode {name}>", source, names, cls.__module__)


# Encoders. One function per kind packs the record's fields, nested values as
# tuples, and frames them. Generated code reads slots faster than an
# attrgetter. For `Step`, the source reads:
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


def encoder(cls: type, tag: int, wire: Wire, *, by_fields: bool = False) -> Callable[..., bytes]:
    """Writes the function that encodes a record of kind ``cls`` (wire tag ``tag``).

    With ``by_fields`` the function takes the record's fields, in order, in
    place of a record: the same bytes with no record made.

    Example:
        >>> import msgpack, struct, zlib
        >>> @dataclasses.dataclass(frozen=True, slots=True)
        ... class Fired:
        ...     run: int
        ...     seq: int
        >>> header = struct.Struct("<BIB").pack
        >>> wire = Wire({}, {}, (), msgpack.packb, header, zlib.crc32, 1, [0] * 256)
        >>> encoder(Fired, 6, wire)(Fired(1, 2))[5:]
        b'\\x06\\x92\\x01\\x02'
    """
    fields = record_fields(cls)
    names: dict[str, Any] = {
        "_cannot_hold": _cannot_hold,
        "_pack": wire.pack,
        "_pack_header": wire.pack_header,
        "_crc32": wire.crc32,
    }
    if by_fields:
        lines = [f"def _fn({', '.join(f.name for f in fields)}):"]
        read = "{}"
    else:
        lines = ["def _fn(_record):"]
        read = "_record.{}"
    values = []
    for f in fields:
        annotation = str(f.type)
        name = annotation.removesuffix(" | None")
        if name not in wire.nested:
            values.append(read.format(f.name))
            continue
        values.append(f.name)
        names[name] = wire.nested[name]
        inner = [f"{f.name}.{g.name}" for g in record_fields(wire.nested[name])]
        i = "    "
        if not by_fields:
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
        f"    return _pack_header({wire.version}, _crc32(_packed, {wire.tag_crcs[tag]}), {tag})"
        " + _packed",
    ]
    source = "\n".join(lines) + "\n"
    what = "fields of " if by_fields else ""
    return _compile(f"<fusee.record encode {what}{cls.__name__}>", source, names, cls.__module__)
