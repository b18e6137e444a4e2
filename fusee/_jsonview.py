"""Recorded values as JSON: what the CLI and the web UI show of payloads, values and signals.

The rule: showing never fails: what JSON cannot hold becomes text, and
bytes the codec refuses come back as their repr.
"""

from __future__ import annotations

import datetime
import decimal
import math
import uuid
from typing import Any, Final

from fusee import _codec
from fusee.errors import PayloadError
from fusee.record import Handled, Record, Signal, Value, Wait, Waited, value_kind

__all__ = ["VALUE_KINDS", "SignalMarks", "iso", "jsonable", "payload", "recorded_value"]

VALUE_KINDS: Final = {
    value_kind.CUSTOM: "custom",
    value_kind.NOW: "now",
    value_kind.RANDOM: "random",
    value_kind.UUID: "uuid",
}
"""The names of recorded values (`ctx.now`, `ctx.random`, `ctx.uuid4`, ...), by kind."""


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data; what JSON cannot hold becomes text.

    Example:
        >>> jsonable({"at": datetime.date(2024, 5, 1), "n": (1, 2.5), 3: float("nan")})
        {'at': '2024-05-01', 'n': [1, 2.5], '3': 'nan'}
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    return repr(value)


def payload(data: bytes | None) -> Any:
    """A recorded payload, decoded and made JSON; bytes the codec refuses, as their repr.

    Example:
        >>> payload(_codec.encode({"total": 42}))
        {'total': 42}
        >>> payload(b"")
    """
    if not data:
        return None
    try:
        return jsonable(_codec.decode(data))
    except PayloadError:
        return repr(data)


def iso(ms: int | None) -> str | None:
    """A Unix time in milliseconds as ISO 8601 text in UTC (None stays None).

    Example:
        >>> iso(0)
        '1970-01-01T00:00:00+00:00'
    """
    if ms is None:
        return None
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat()


def recorded_value(rec: Value) -> Any:
    """What a `Value` record holds, as the workflow saw it (a time, a float, a UUID).

    Example:
        >>> recorded_value(Value(1, 0, value_kind.NOW, (0).to_bytes(8, "little")))
        '1970-01-01T00:00:00+00:00'
    """
    data = rec.value
    if rec.kind == value_kind.NOW and len(data) == 8:
        return iso(int.from_bytes(data, "little"))
    if rec.kind == value_kind.RANDOM and len(data) == 8:
        return (int.from_bytes(data, "little") >> 11) / float(1 << 53)
    if rec.kind == value_kind.UUID and len(data) == 16:
        return str(uuid.UUID(bytes=data))
    return payload(data)


class SignalMarks:
    """Which of a run's signals its waits set aside, read from its journal record by record.

    A wait takes the oldest signal of its name whose payload fits its type,
    and sets aside one that does not (`fusee.engine._messages`); no record
    says so. A reader without the workflow's code sees it all the same: a
    signal is set aside when a wait of its name was open while it was there
    and it is not consumed. A later wait that takes it (its type fits)
    clears the mark. A signal a handler of the code got (``ctx.on_signal``:
    its `Handled` marker) is heard, never set aside.

    Example:
        >>> from fusee.record import WaitOutcome
        >>> marks = SignalMarks()
        >>> marks.add(Wait(1, 0, "approval", 0))
        []
        >>> marks.add(Signal(1, "approval", 0, b"\\xa3yes"))
        [0]
        >>> marks.add(Signal(1, "approval", 0, b"\\xc3"))
        [1]
        >>> marks.add(Waited(1, 0, WaitOutcome.signal(1)))
        [1]
        >>> [marks.is_set_aside(k) for k in (0, 1)]
        [True, False]
        >>> marks.add(Handled(1, 0)), marks.is_handled(0), marks.is_set_aside(0)
        ([0], True, False)
    """

    __slots__ = ("_consumed", "_handled", "_names", "_offered", "_open")

    def __init__(self) -> None:
        self._names: list[str] = []
        # Open waits: their names by position.
        self._open: dict[int, str] = {}
        # Signals an open wait was offered, and those a wait took, by ordinal.
        self._offered: set[int] = set()
        self._consumed: set[int] = set()
        self._handled: set[int] = set()

    def add(self, rec: Record) -> list[int]:
        """Folds in ``rec`` (in log order); returns the ordinals whose mark may have changed."""
        if isinstance(rec, Signal):
            ordinal = len(self._names)
            self._names.append(rec.name)
            if rec.name in self._open.values():
                self._offered.add(ordinal)
                return [ordinal]
            return []
        if isinstance(rec, Wait):
            self._open[rec.seq] = rec.name
            offered = [
                k
                for k, name in enumerate(self._names)
                if name == rec.name and k not in self._consumed and k not in self._offered
            ]
            self._offered.update(offered)
            return offered
        if isinstance(rec, Waited):
            self._open.pop(rec.seq, None)
            if rec.outcome.is_signal:
                self._consumed.add(rec.outcome.ordinal)
                return [rec.outcome.ordinal]
        elif isinstance(rec, Handled):
            self._handled.add(rec.ordinal)
            return [rec.ordinal]
        return []

    def is_set_aside(self, ordinal: int) -> bool:
        """Whether signal ``ordinal`` is set aside (a wait refused it; none took it)."""
        return (
            ordinal in self._offered
            and ordinal not in self._consumed
            and ordinal not in self._handled
        )

    def is_handled(self, ordinal: int) -> bool:
        """Whether a handler of the code got signal ``ordinal`` (``ctx.on_signal``)."""
        return ordinal in self._handled
