"""`fusee.Schedule`: a workflow started at each tick of a cron expression or an interval.

A schedule is a plain value, checked when it is made; the engine's ticker
(`fusee.engine._schedules`) starts its runs. Its ticks are instants in
Unix milliseconds, computed the same way by every worker:

- ``cron=`` is read by cronsim in the time zone ``tz`` (an IANA name, via
  `zoneinfo`), following its daylight saving time. A time a spring-forward
  day skips (02:30 in Europe/Paris on the last Sunday of March) ticks once
  at the first valid time after it (03:00); a time a fall-back day repeats
  ticks once, at its first occurrence, for a job at a fixed hour and
  minute. A job whose minute or hour field is a range or step
  (``*/30 * * * *``) ticks on both passes of the repeated hour, since each
  is a distinct instant. This is cronsim's behaviour (Debian cron's).
- ``every=`` ticks at the multiples of the interval since the Unix epoch
  (``every="1h"`` ticks on the hour, UTC), so workers agree without talking.

A tick's run has the id ``"{name}-{tick}"``, the tick in UTC as ISO 8601 to
the second: ``nightly-2026-12-01T02:00:00+00:00`` (`run_id`).

The rule: the ticks of a schedule depend on its definition alone, never on
when or where they are computed.
"""

from __future__ import annotations

import datetime
import re
import zoneinfo
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import cronsim

from fusee._definitions import WorkflowDef, checked
from fusee._durations import duration_ms, format_ms

__all__ = [
    "OVERLAPS",
    "Overlap",
    "Schedule",
    "manual_run_id",
    "parse_spec",
    "run_id",
    "spec_text",
]

Overlap = Literal["skip", "buffer_one", "allow", "cancel_other"]

OVERLAPS: Final = ("skip", "buffer_one", "allow", "cancel_other")
"""What a tick does while the schedule's previous run still runs:

- ``skip``: nothing (the tick is dropped);
- ``buffer_one``: its run starts once the previous one ends (one tick is
  kept; later ones while it waits are dropped);
- ``allow``: its run starts at once, beside the previous one;
- ``cancel_other``: the previous run is cancelled and its run starts.
"""

_UTC: Final = datetime.UTC


def _iso(ms: int, timespec: str) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, _UTC).isoformat(timespec=timespec)


def _next_cron(cron: str, zone: datetime.tzinfo, after_ms: int) -> int:
    start = datetime.datetime.fromtimestamp(after_ms / 1000, _UTC).astimezone(zone)
    tick = next(cronsim.CronSim(cron, start))
    return int(tick.timestamp() * 1000)


# A stored spec's durations: "every 3600000ms", "catch_up 0ms".
_SPEC_MS: Final = re.compile(r"\b([0-9]+)ms\b")


def spec_text(spec: str) -> str:
    """A stored `Schedule.spec` as people read it: its durations as ``1h``, not ``3600000ms``.

    Example:
        >>> spec_text("every 3600000ms; overlap skip; catch_up 0ms")
        'every 1h; overlap skip; catch_up 0s'
    """
    return _SPEC_MS.sub(lambda m: format_ms(int(m.group(1))), spec)


def parse_spec(spec: str) -> dict[str, Any]:
    """A stored `Schedule.spec` read back: the keyword arguments of the `Schedule` it came from.

    Raises:
        ValueError: Text `Schedule.spec` does not write.

    Example:
        >>> parse_spec("cron 0 2 * * * Europe/Paris; overlap skip; catch_up 0ms")
        {'cron': '0 2 * * *', 'tz': 'Europe/Paris', 'overlap': 'skip', 'catch_up': 0.0}
        >>> parse_spec("every 60000ms; overlap allow; catch_up 3600000ms; queue emails")
        {'every': 60.0, 'overlap': 'allow', 'catch_up': 3600.0, 'queue': 'emails'}
    """
    what, *rest = (part.strip() for part in spec.split(";"))
    out: dict[str, Any] = {}
    every = re.fullmatch(r"every ([0-9]+)ms", what)
    cron = re.fullmatch(r"cron (.+) (\S+)", what)
    if every is not None:
        out["every"] = int(every.group(1)) / 1000
    elif cron is not None:
        out["cron"], out["tz"] = cron.group(1), cron.group(2)
    else:
        raise ValueError(f"{spec!r} is not a schedule's spec")
    for part in rest:
        key, _, value = part.partition(" ")
        if key == "overlap":
            out["overlap"] = value
        elif key == "catch_up" and (ms := re.fullmatch(r"([0-9]+)ms", value)):
            out["catch_up"] = int(ms.group(1)) / 1000
        elif key == "queue" and value:
            out["queue"] = value
        else:
            raise ValueError(f"{spec!r} is not a schedule's spec (at {part!r})")
    return out


def run_id(name: str, tick_ms: int) -> str:
    """The id of the run that schedule ``name`` starts at ``tick_ms``.

    Example:
        >>> run_id("nightly", 1_764_554_400_000)
        'nightly-2025-12-01T02:00:00+00:00'
    """
    return f"{name}-{_iso(tick_ms, 'seconds')}"


def manual_run_id(name: str, now_ms: int) -> str:
    """The id of a run that a trigger of schedule ``name`` starts at ``now_ms``.

    Example:
        >>> manual_run_id("nightly", 1_764_554_400_123)
        'nightly-manual-2025-12-01T02:00:00.123+00:00'
    """
    return f"{name}-manual-{_iso(now_ms, 'milliseconds')}"


@dataclass(frozen=True, slots=True)
class Schedule:
    """A workflow started at each tick of a cron expression or an interval.

    Pass it to ``Engine.open(..., schedules=[...])`` (or `fusee.testing.TestEngine`).

    Args:
        name: The schedule's name: its runs' ids start with it, and its
            state (paused, the last tick) is kept in the store under it.
        workflow: The workflow each tick starts.
        cron: A cron expression (five fields, read by cronsim), in ``tz``.
        every: Or an interval (``"15m"``, seconds, a ``timedelta``).
        tz: The IANA time zone of ``cron`` (``"Europe/Paris"``); ``"UTC"``
            by default.
        input: The input of every run it starts.
        overlap: ``"skip"`` (default), ``"buffer_one"``, ``"allow"`` or
            ``"cancel_other"`` (see `OVERLAPS`).
        catch_up: After downtime, the ticks missed within this long before
            now are started, in order; older ones are skipped. ``"0s"`` (the
            default) starts none but a tick that fires up to ten seconds late.
        queue: A `fusee.Queue` of the engine (or its name): each run starts
            on it, ``queued`` until the queue admits it.

    Raises:
        ValueError: Neither or both of ``cron`` and ``every``, a cron
            expression cronsim does not read, an unknown time zone or
            overlap policy, or an interval under a second.
        TypeError: ``workflow`` is not a `fusee.WorkflowDef`.
        fusee.PayloadError: ``input`` does not fit the workflow's input type.

    Example:
        >>> import fusee
        >>> @fusee.workflow("report")
        ... async def report(ctx: fusee.Ctx) -> None: ...
        >>> nightly = Schedule("nightly", report, cron="0 2 * * *", tz="Europe/Paris")
        >>> nightly.spec
        'cron 0 2 * * * Europe/Paris; overlap skip; catch_up 0ms'
    """

    name: str
    workflow: WorkflowDef[Any, Any]
    cron: str | None = None
    every: Any = None
    tz: str = "UTC"
    input: Any = None
    overlap: Overlap = "skip"
    catch_up: Any = "0s"
    queue: Any = None
    every_ms: int = field(init=False, repr=False, compare=False)
    catch_up_ms: int = field(init=False, repr=False, compare=False)
    input_data: bytes = field(init=False, repr=False, compare=False)
    zone: datetime.tzinfo = field(init=False, repr=False, compare=False)
    queue_name: str | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a schedule needs a non-empty name, got {self.name!r}")
        if not isinstance(self.workflow, WorkflowDef):
            raise TypeError(
                f"Schedule {self.name!r} needs a workflow (an @fusee.workflow function), "
                f"got {self.workflow!r}"
            )
        if (self.cron is None) == (self.every is None):
            raise ValueError(
                f"Schedule {self.name!r} needs cron=... or every=..., exactly one of them"
            )
        try:
            zone: datetime.tzinfo = zoneinfo.ZoneInfo(self.tz)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
            raise ValueError(
                f"Schedule {self.name!r}: unknown time zone {self.tz!r}; "
                "pass an IANA name such as 'UTC' or 'Europe/Paris'"
            ) from None
        object.__setattr__(self, "zone", zone)
        every_ms = 0
        if self.cron is not None:
            try:
                cronsim.CronSim(self.cron, datetime.datetime(2026, 1, 1, tzinfo=zone))
            except (cronsim.CronSimError, TypeError) as e:
                raise ValueError(
                    f"Schedule {self.name!r}: {self.cron!r} is not a cron expression "
                    f"cronsim reads ({e}); write five fields, as '0 2 * * *'"
                ) from None
        else:
            every_ms = duration_ms(self.every)
            if every_ms < 1000:
                raise ValueError(
                    f"Schedule {self.name!r}: every={self.every!r} is under a second; "
                    "schedules tick at most once a second"
                )
        object.__setattr__(self, "every_ms", every_ms)
        if self.overlap not in OVERLAPS:
            raise ValueError(
                f"Schedule {self.name!r}: overlap must be one of {', '.join(OVERLAPS)}, "
                f"not {self.overlap!r}"
            )
        object.__setattr__(self, "catch_up_ms", duration_ms(self.catch_up))
        queue = getattr(self.queue, "name", self.queue)
        if queue is not None and (not isinstance(queue, str) or not queue or ";" in queue):
            raise ValueError(
                f"Schedule {self.name!r}: queue must be a fusee.Queue or a queue's name, "
                f"not {self.queue!r}"
            )
        object.__setattr__(self, "queue_name", queue)
        data = checked(
            self.input,
            self.workflow.decode_input,
            f"the input of schedule '{self.name}'",
            self.workflow.input_type,
        )
        object.__setattr__(self, "input_data", data)

    @property
    def spec(self) -> str:
        """What it ticks on and how, as text: stored, so that a change is seen on open."""
        what = (
            f"cron {self.cron} {self.tz}" if self.cron is not None else f"every {self.every_ms}ms"
        )
        on = f"; queue {self.queue_name}" if self.queue_name else ""
        return f"{what}; overlap {self.overlap}; catch_up {self.catch_up_ms}ms{on}"

    def next_tick(self, after_ms: int) -> int:
        """The first tick strictly after ``after_ms`` (Unix milliseconds).

        Example:
            >>> import fusee
            >>> @fusee.workflow("w")
            ... async def w(ctx: fusee.Ctx) -> None: ...
            >>> Schedule("s", w, every="1m").next_tick(90_000)
            120000
        """
        if self.every_ms:
            return (after_ms // self.every_ms + 1) * self.every_ms
        assert self.cron is not None
        return _next_cron(self.cron, self.zone, after_ms)

    def ticks(self, after_ms: int, until_ms: int) -> list[int]:
        """The ticks after ``after_ms`` up to ``until_ms`` (inclusive), in order.

        Example:
            >>> import fusee
            >>> @fusee.workflow("w")
            ... async def w(ctx: fusee.Ctx) -> None: ...
            >>> Schedule("s", w, every="1m").ticks(0, 180_000)
            [60000, 120000, 180000]
        """
        out: list[int] = []
        t = self.next_tick(after_ms)
        while t <= until_ms:
            out.append(t)
            t = self.next_tick(t)
        return out
