"""Durations as the public API takes them: ``"1h30m"``, seconds, or a timedelta.

Timeouts, sleeps, retry intervals and ``park_after`` all pass through
`parse_duration` (seconds, a float) or `duration_ms` (whole milliseconds,
rounded up). The rule: a duration is never negative, never NaN or infinite,
and never rounded down, so a durable timer never fires early.

The string form is a sequence of ``<number><unit>`` parts, units from largest
to smallest, each at most once: ``d`` (days), ``h``, ``m``, ``s``, ``ms``, and
``us`` (also ``µs``, with a micro sign or a Greek mu). A number is digits
with an optional fraction (``1.5s``).
Whitespace is allowed around the string and between parts (``"1h 30m"``), not
inside a part (``"5 m"`` is refused, so ``"5 minutes"`` cannot half-parse).
Units are lowercase. A string without a unit is refused: ``"10"`` could
mean seconds or milliseconds.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from fractions import Fraction
from typing import Any, Final

__all__ = ["deadline_after", "duration_ms", "format_ms", "not_before", "parse_duration"]

_ACCEPTED: Final = (
    "use a number of seconds, a timedelta, or a string like "
    "'500ms', '10s', '5m', '2h', '1d', '1h30m'"
)

# Seconds per unit, largest first: the order parts must come in.
_UNITS: Final[dict[str, Fraction]] = {
    "d": Fraction(86_400),
    "h": Fraction(3_600),
    "m": Fraction(60),
    "s": Fraction(1),
    "ms": Fraction(1, 1_000),
    "us": Fraction(1, 1_000_000),
    "µs": Fraction(1, 1_000_000),
    "\u03bcs": Fraction(1, 1_000_000),  # Greek mu, which keyboards also type
}

# The units `format_ms` writes, largest first, in milliseconds.
_MS_PARTS: Final = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1))

# "ms" before "m" and "s", so "500ms" is not read as 500 minutes and an "s".
_PART: Final = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)(ms|us|µs|\u03bcs|d|h|m|s)")


def _error(value: object, why: str = "") -> ValueError:
    text = f"invalid duration {value!r}: {_ACCEPTED}"
    return ValueError(f"{text} ({why})" if why else text)


def _parse_string(text: str) -> Fraction:
    total = Fraction(0)
    previous: Fraction | None = None
    pos = 0
    end = len(text.rstrip())
    if end == 0:
        raise _error(text, "it is empty")
    while pos < end:
        match = _PART.match(text, pos)
        if match is None:
            raise _error(text)
        number, unit = match.groups()
        per = _UNITS[unit]
        if previous is not None and per >= previous:
            raise _error(text, "units go from largest to smallest, each at most once")
        previous = per
        # Fraction of the decimal text: 1.1s is exactly 1100 ms, not a float
        # a hair above it that duration_ms would round up to 1101.
        try:
            total += Fraction(number) * per
        except ValueError:  # more digits than int() converts (sys.int_info)
            raise _error(text, "the number is too long") from None
        pos = match.end()
    return total


def _parse_exact(value: str | int | float | dt.timedelta) -> Fraction:
    """Seconds as an exact fraction; the one place the rules live."""
    if isinstance(value, bool):
        raise _error(value, "a bool is not a duration")
    if isinstance(value, str):
        return _parse_string(value)
    if isinstance(value, dt.timedelta):
        seconds = Fraction(value.days * 86_400 + value.seconds) + Fraction(
            value.microseconds, 1_000_000
        )
        if seconds < 0:
            raise _error(value, "it is negative")
        return seconds
    if isinstance(value, int):
        if value < 0:
            raise _error(value, "it is negative")
        return Fraction(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise _error(value, "it is not finite")
        if value < 0:
            raise _error(value, "it is negative")
        # The shortest repr: 0.1 means a tenth, not the binary float's value.
        return Fraction(repr(float(value)))
    raise TypeError(f"invalid duration {value!r} of type {type(value).__name__}: {_ACCEPTED}")


def parse_duration(value: str | int | float | dt.timedelta) -> float:
    """Parses a duration to seconds.

    Args:
        value: A string of ``<number><unit>`` parts (units ``d``, ``h``,
            ``m``, ``s``, ``ms``, ``us``, largest first, each once: ``"1h30m"``,
            ``"1.5s"``, ``"1h 30m"``), a number of seconds, or a timedelta.

    Returns:
        The duration in seconds (zero or more, finite).

    Raises:
        ValueError: A negative, NaN or infinite value, a bool, or a string
            that is not a duration (empty, an unknown unit, units out of
            order or repeated, no unit). The message shows the input and the
            accepted forms.
        TypeError: A value of another type (None, a list, ...).

    Example:
        >>> parse_duration("1h30m")
        5400.0
        >>> parse_duration("500ms")
        0.5
        >>> parse_duration(dt.timedelta(minutes=2))
        120.0
    """
    try:
        return float(_parse_exact(value))
    except OverflowError:
        raise _error(value, "it is too large") from None


def duration_ms(value: str | int | float | dt.timedelta) -> int:
    """Parses a duration to whole milliseconds, rounded up.

    Rounded up so that a timer set from it never fires early: ``"1us"`` is
    1 ms, not 0.

    Args:
        value: As for `parse_duration`.

    Returns:
        The duration in milliseconds.

    Raises:
        ValueError: As for `parse_duration`.
        TypeError: As for `parse_duration`.

    Example:
        >>> duration_ms("1m30s")
        90000
        >>> duration_ms(0.0001)
        1
        >>> duration_ms("1.1s")
        1100
    """
    return math.ceil(_parse_exact(value) * 1_000)


def format_ms(ms: int) -> str:
    """Whole milliseconds as the string form a person writes (`parse_duration` reads it back).

    Args:
        ms: A duration in milliseconds (zero or more).

    Returns:
        Its parts from days down to milliseconds, the zero ones left out:
        ``"1h"``, ``"1h30m"``, ``"1s500ms"``; ``"0s"`` for zero.

    Raises:
        ValueError: ``ms`` is negative.

    Example:
        >>> format_ms(3_600_000)
        '1h'
        >>> format_ms(90_500)
        '1m30s500ms'
        >>> duration_ms(format_ms(5_400_000))
        5400000
    """
    if ms < 0:
        raise _error(ms, "it is negative")
    parts: list[str] = []
    for unit, per in _MS_PARTS:
        count, ms = divmod(ms, per)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def deadline_after(now_ms: int, timeout: Any) -> int:
    """The deadline ``timeout`` after ``now_ms`` (0: no deadline, for None).

    Raises:
        ValueError: ``timeout`` is not a positive duration.

    Example:
        >>> deadline_after(1_000, "2s"), deadline_after(1_000, None)
        (3000, 0)
    """
    if timeout is None:
        return 0
    ms = duration_ms(timeout)
    if ms <= 0:
        raise ValueError(
            f"a run's timeout must be a positive duration ('30s', '1h', seconds), not {timeout!r}"
        )
    return now_ms + ms


def not_before(now_ms: int, delay: Any, start_at: dt.datetime | None) -> int:
    """When a delayed start may begin: ``delay`` after ``now_ms``, or at ``start_at`` (0: now).

    A naive ``start_at`` is local time, as ``datetime.timestamp`` reads it.

    Raises:
        ValueError: Both are given, or ``delay`` is not a positive duration.
        TypeError: ``start_at`` is not a ``datetime``.

    Example:
        >>> import datetime
        >>> at = dt.datetime(2030, 1, 1, tzinfo=datetime.UTC)
        >>> not_before(0, "10m", None), not_before(0, None, at), not_before(0, None, None)
        (600000, 1893456000000, 0)
    """
    if delay is not None and start_at is not None:
        raise ValueError("give a start's delay or its start_at, not both")
    if start_at is not None:
        if not isinstance(start_at, dt.datetime):
            raise TypeError(f"start_at must be a dt.datetime, not {start_at!r}")
        return max(1, round(start_at.timestamp() * 1000))
    if delay is None:
        return 0
    ms = duration_ms(delay)
    if ms <= 0:
        raise ValueError(
            f"a start's delay must be a positive duration ('10m', seconds), not {delay!r}"
        )
    return now_ms + ms
