"""Event keys: ``ctx.set_event`` in the workflow, ``run.get_event`` outside.

An event is a run's latest value for a key, journaled as an `Event` record
and readable from outside while the run goes on (a progress bar, a status
on a web page). A key is a plain string or, typed like a signal, an
`EventDef` made by `fusee.event`.

The rule: the key written in the journal is the string name; the type
only checks values when they are set and decodes them when they are read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

from fusee._codec import decoder_for
from fusee._definitions import checked

__all__ = ["EventDef", "event", "event_key"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class EventDef(Generic[T]):
    """A typed event key: its name and value type.

    Make one with `fusee.event`.

    Example:
        >>> progress = event("progress", int)
        >>> (progress.name, progress.decode(progress.encode_checked(40)))
        ('progress', 40)
    """

    name: str
    type: Any = Any
    decode: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"an event needs a non-empty name, got {self.name!r}")
        object.__setattr__(self, "decode", decoder_for(self.type))

    def encode_checked(self, value: object) -> bytes:
        """The value's bytes, once they are known to decode to the event's type.

        Raises:
            fusee.PayloadError: ``value`` does not fit the type (nothing is recorded).
        """
        return checked(value, self.decode, f"the value of event '{self.name}'", self.type)


@overload
def event(name: str, type: type[T]) -> EventDef[T]: ...
@overload
def event(name: str, type: Any = ...) -> EventDef[Any]: ...


def event(name: str, type: Any = Any) -> EventDef[Any]:
    """Defines a typed event key: ``ctx.set_event(key, v)`` inside, ``run.get_event(key)`` outside.

    Args:
        name: The key, as recorded in journals.
        type: The value's type; values are checked against it when set and
            decoded to it when read.

    Example:
        >>> progress = event("progress", int)
    """
    return EventDef(name, type)


def event_key(key: object) -> EventDef[Any]:
    """``key`` as an `EventDef`: a string is an untyped key.

    Raises:
        ValueError: ``key`` is an empty string.
        TypeError: ``key`` is neither a string nor an `EventDef`.

    Example:
        >>> event_key("progress").name
        'progress'
    """
    if isinstance(key, EventDef):
        return key
    if isinstance(key, str):
        return EventDef(key)
    raise TypeError(f"an event key is a str or a fusee.event(...), not {key!r}")
