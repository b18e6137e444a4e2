"""The inbox's wire format: a command's (or an answer's) fields, and errors, as bytes.

A `fusee.store.Command` and its `fusee.store.Answer` carry msgpack maps of
plain values; an error travels as its type's name, its message and its plain
attributes, and comes back as the same fusee type.

The rule: both sides (a `Remote` that posts, the engine's inbox that answers)
use these functions only, so the format is written in one place.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import Any, Final

import msgpack

from fusee import errors as _errors
from fusee.errors import FuseeError, PayloadError
from fusee.machine import ChildCompleted
from fusee.store import Answer, Command

__all__ = [
    "answer_fields",
    "decode_error",
    "decode_payload",
    "deliver_command",
    "encode_error",
    "encode_payload",
]

# The errors a poster raises again by type: fusee's tree.
_ERROR_TYPES: Final[Mapping[str, type[BaseException]]] = {
    name: value
    for name in _errors.__all__
    if isinstance(value := getattr(_errors, name), type) and issubclass(value, BaseException)
}


def encode_payload(values: Mapping[str, Any]) -> bytes:
    """A command's (or an answer's) fields as bytes: msgpack of plain values.

    Example:
        >>> decode_payload(encode_payload({"name": "go", "payload": b"\\xc3"}))
        {'name': 'go', 'payload': b'\\xc3'}
    """
    return msgpack.packb(dict(values), use_bin_type=True)


def decode_payload(data: bytes) -> dict[str, Any]:
    """The fields `encode_payload` wrote.

    Raises:
        fusee.PayloadError: The bytes are not such fields.

    Example:
        >>> decode_payload(b"")
        {}
    """
    if not data:
        return {}
    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise PayloadError(f"a command's payload does not decode: {e}") from None
    if not isinstance(value, dict):
        raise PayloadError(f"a command's payload is not a map: {value!r}")
    return value


def encode_error(error: BaseException) -> bytes:
    """An error as an answer carries it: its type's name, its message, its plain attributes.

    Example:
        >>> from fusee.errors import NotFound
        >>> decode_error(encode_error(NotFound("no run 'x'")))
        NotFound("no run 'x'")
    """
    attrs = {
        key: value
        for key, value in vars(error).items()
        if not key.startswith("_")
        and (
            isinstance(value, str | int | float | bool | None)
            or (isinstance(value, tuple) and all(isinstance(v, int | str) for v in value))
        )
    }
    return encode_payload({"type": type(error).__name__, "message": str(error), "attrs": attrs})


def decode_error(data: bytes) -> BaseException:
    """The error `encode_error` wrote, of the same fusee type when it is one of fusee's.

    An error of another type (a `ValueError`, or a user's) comes back as
    `fusee.FuseeError` naming it; a `ValueError` and a `TypeError` as
    themselves.

    Example:
        >>> decode_error(encode_error(KeyError("sku")))
        FuseeError("KeyError: 'sku'")
    """
    fields = decode_payload(data)
    name = str(fields.get("type", "FuseeError"))
    message = str(fields.get("message", ""))
    cls = _ERROR_TYPES.get(name) or {"ValueError": ValueError, "TypeError": TypeError}.get(name)
    if cls is None:
        return FuseeError(f"{name}: {message}")
    error = cls.__new__(cls)
    BaseException.__init__(error, message)
    attrs = fields.get("attrs")
    if isinstance(attrs, dict):
        for key, value in attrs.items():
            with contextlib.suppress(AttributeError, TypeError):
                setattr(error, str(key), tuple(value) if isinstance(value, list) else value)
    return error


def answer_fields(answer: Answer) -> dict[str, Any]:
    """An answer's fields; raises the error of a command that failed, with its type.

    Example:
        >>> answer_fields(Answer(True, encode_payload({"message": "ok"}), 0))
        {'message': 'ok'}
    """
    fields = decode_payload(answer.payload)
    if not answer.ok:
        raise decode_error(bytes(fields.get("error") or b""))
    return fields


def deliver_command(id: str, run: int, seq: int, completion: ChildCompleted) -> Command:
    """The ``deliver`` command taking a child's end to parent ``id`` (run ``run``, op ``seq``).

    Its id is the parent's position, so posting it again stores it once.

    Example:
        >>> from fusee.record import Status
        >>> deliver_command("p", 1, 3, ChildCompleted(Status.OK, b"")).id
        'deliver/p/1/3'
    """
    fields = {
        "run": run,
        "seq": seq,
        "status": int(completion.status),
        "payload": completion.payload,
    }
    payload = encode_payload(fields)
    now_ms = time.time_ns() // 1_000_000
    return Command(f"deliver/{id}/{run}/{seq}", "deliver", id, payload, None, now_ms)
