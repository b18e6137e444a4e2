"""Schedule rows: the state of each `fusee.Schedule` that workers share through the store.

A row holds what the code says (workflow, spec, removed) and what the
ticker decided (paused, the last tick claimed and done, a buffered tick,
the last run started). The stores add these methods to `Store`:
``schedules``, ``put_schedule`` (the definition), ``set_schedule`` (named
state fields), ``delete_schedule`` (a schedule made at run time, deleted),
and ``claim_tick``, the compare-and-set that lets one worker of many take a
tick.

The rule: a tick is claimed (``claim_tick``) before its run starts, and a
claim only moves forward, so two workers never both take one tick.
"""

from __future__ import annotations

import builtins
import datetime
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Final, Protocol, runtime_checkable

from fusee._schedule import spec_text

__all__ = [
    "SCHEDULE_COLUMNS",
    "STATE_FIELDS",
    "MemorySchedules",
    "ScheduleRow",
    "ScheduleStore",
    "check_state",
]


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """One schedule's stored row.

    Attributes:
        name: The schedule's name (unique in a store).
        workflow: Its workflow's name.
        spec: What it ticks on, as text (``"cron 0 2 * * * Europe/Paris"``,
            ``"every 60000ms"``), with its overlap and catch-up policies.
        paused: Ticks are skipped while it is paused.
        removed: No code opened with it since it was last reconciled: it stopped.
        last_tick_ms: The last tick claimed (Unix ms; 0: none yet). Ticks at or
            before it are never started again.
        done_tick_ms: The last tick whose run was started (or deliberately
            skipped); below ``last_tick_ms`` only after a crash between the two.
        buffered_ms: A tick waiting for the previous run to end (``buffer_one``; 0: none).
        last_run: The id of the last run it started ("" if none).
        next_ms: When it ticks next, as the last worker to arm it computed it.
        input: A schedule made at run time: its runs' input, encoded (b"" for
            one in code, whose code holds it).
        dynamic: Made at run time (``engine.schedules.create``), not in code:
            no engine's code removes it; it lives until deleted.
        ticked_ms: The last tick that started a run (Unix ms; 0: no tick yet).

    Example:
        >>> ScheduleRow("nightly", "report", "cron 0 2 * * * UTC").paused
        False
    """

    name: str
    workflow: str
    spec: str
    paused: bool = False
    removed: bool = False
    last_tick_ms: int = 0
    done_tick_ms: int = 0
    buffered_ms: int = 0
    last_run: str = ""
    next_ms: int = 0
    input: bytes = b""
    dynamic: bool = False
    ticked_ms: int = 0

    def as_json(self) -> dict[str, Any]:
        """The row as people and scripts read it (``fusee schedules --json``, the UI's API).

        Its spec's durations read as written (``every 1h``), its times are
        ISO 8601 in UTC (null: none yet), its state one of ``active``,
        ``paused`` and ``removed``; ``origin`` says whether code or a run-time
        call (``engine.schedules.create``) made it.

        Example:
            >>> ScheduleRow("nightly", "report", "every 60000ms").as_json()["last_tick_at"] is None
            True
        """
        what = self.spec.split(";")
        queue = next((p.strip()[6:] for p in what if p.strip().startswith("queue ")), None)
        return {
            "name": self.name,
            "workflow": self.workflow,
            "state": "removed" if self.removed else ("paused" if self.paused else "active"),
            "origin": "runtime" if self.dynamic else "code",
            "spec": spec_text(self.spec),
            "queue": queue,
            "last_tick_at": _iso(self.ticked_ms),
            "next_tick_at": None if self.removed else _iso(self.next_ms),
            "buffered_tick_at": _iso(self.buffered_ms),
            "last_run": self.last_run or None,
        }


def _iso(ms: int) -> str | None:
    # 0 stands for "none yet" in a row.
    if not ms:
        return None
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat()


SCHEDULE_COLUMNS: Final = tuple(f.name for f in fields(ScheduleRow))
"""The row's fields, in order: the columns of the stores' ``schedules`` tables."""

STATE_FIELDS: Final = frozenset(
    {"paused", "done_tick_ms", "buffered_ms", "last_run", "next_ms", "ticked_ms"}
)
"""The fields ``set_schedule`` changes (``last_tick_ms`` moves only by ``claim_tick``)."""


def check_state(changes: Mapping[str, Any]) -> None:
    """Refuses a ``set_schedule`` of fields it does not set.

    Raises:
        ValueError: A field is not one of `STATE_FIELDS`.

    Example:
        >>> check_state({"paused": True})
        >>> try:
        ...     check_state({"spec": "every 1s"})
        ... except ValueError as e:
        ...     print(str(e)[-32:])
        next_ms or ticked_ms, not 'spec'
    """
    for key in changes:
        if key not in STATE_FIELDS:
            order = [f for f in SCHEDULE_COLUMNS if f in STATE_FIELDS]
            raise ValueError(
                f"set_schedule sets {', '.join(order[:-1])} or {order[-1]}, not {key!r}"
            )


@runtime_checkable
class ScheduleStore(Protocol):
    """What a store keeps of schedules (every store implements it)."""

    async def schedules(self) -> builtins.list[ScheduleRow]:
        """Every schedule row, by name."""
        ...

    async def put_schedule(self, row: ScheduleRow) -> None:
        """Stores ``row`` if its name is new; else sets its definition only.

        Its definition: workflow, spec, removed, input and dynamic.
        """
        ...

    async def delete_schedule(self, name: str) -> None:
        """Deletes schedule ``name``'s row (an unknown name is ignored)."""
        ...

    async def set_schedule(self, name: str, changes: Mapping[str, Any]) -> None:
        """Sets fields of `STATE_FIELDS` of schedule ``name`` (an unknown name is ignored)."""
        ...

    async def claim_tick(self, name: str, tick_ms: int) -> bool:
        """Moves ``last_tick_ms`` of ``name`` to ``tick_ms`` if it is below; whether it moved."""
        ...


class MemorySchedules:
    """The schedule rows of a `fusee.store.MemoryStore` (a mixin).

    Example:
        >>> import asyncio
        >>> async def demo() -> tuple[bool, bool]:
        ...     store = MemorySchedules()
        ...     await store.put_schedule(ScheduleRow("n", "wf", "every 1000ms"))
        ...     return await store.claim_tick("n", 1000), await store.claim_tick("n", 1000)
        >>> asyncio.run(demo())
        (True, False)
    """

    _schedule_rows: dict[str, ScheduleRow]

    def _schedule_table(self) -> dict[str, ScheduleRow]:
        # Made on first use: the store's own __init__ need not know of it.
        try:
            return self._schedule_rows
        except AttributeError:
            self._schedule_rows = {}
            return self._schedule_rows

    async def schedules(self) -> builtins.list[ScheduleRow]:
        table = self._schedule_table()
        return [table[name] for name in sorted(table)]

    async def put_schedule(self, row: ScheduleRow) -> None:
        table = self._schedule_table()
        old = table.get(row.name)
        table[row.name] = (
            row
            if old is None
            else replace(
                old,
                workflow=row.workflow,
                spec=row.spec,
                removed=row.removed,
                input=row.input,
                dynamic=row.dynamic,
            )
        )

    async def delete_schedule(self, name: str) -> None:
        self._schedule_table().pop(name, None)

    async def set_schedule(self, name: str, changes: Mapping[str, Any]) -> None:
        check_state(changes)
        table = self._schedule_table()
        old = table.get(name)
        if old is not None:
            table[name] = replace(old, **changes)

    async def claim_tick(self, name: str, tick_ms: int) -> bool:
        table = self._schedule_table()
        old = table.get(name)
        if old is None or old.last_tick_ms >= tick_ms:
            return False
        table[name] = replace(old, last_tick_ms=tick_ms)
        return True
