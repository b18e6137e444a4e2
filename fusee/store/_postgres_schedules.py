"""The Postgres store's schedule rows (`fusee.store._schedules`): a mixin of `PostgresStore`.

The rule: ``claim_tick`` is one conditional ``UPDATE``, so of many workers
claiming one tick at once exactly one sees its row move.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from fusee.store._schedules import SCHEDULE_COLUMNS, ScheduleRow, check_state

__all__ = ["PostgresSchedules", "schedules_format_4_sql", "schedules_sql"]

_COLUMNS: Final = ", ".join(SCHEDULE_COLUMNS)
_PLACES: Final = ", ".join(f"${i}" for i in range(1, len(SCHEDULE_COLUMNS) + 1))


def schedules_sql(s: str) -> tuple[str, ...]:
    """The ``schedules`` table in schema ``s`` (format 3; safe to repeat).

    Example:
        >>> schedules_sql("fusee")[0].split(" (")[0]
        'CREATE TABLE IF NOT EXISTS fusee.schedules'
    """
    return (
        f'CREATE TABLE IF NOT EXISTS {s}.schedules (name TEXT COLLATE "C" PRIMARY KEY,'
        " workflow TEXT NOT NULL, spec TEXT NOT NULL, paused BOOLEAN NOT NULL DEFAULT false,"
        " removed BOOLEAN NOT NULL DEFAULT false, last_tick_ms BIGINT NOT NULL DEFAULT 0,"
        " done_tick_ms BIGINT NOT NULL DEFAULT 0, buffered_ms BIGINT NOT NULL DEFAULT 0,"
        " last_run TEXT NOT NULL DEFAULT '', next_ms BIGINT NOT NULL DEFAULT 0)",
    )


def schedules_format_4_sql(s: str) -> tuple[str, ...]:
    """Format 4's columns of ``schedules`` in schema ``s``: run-time schedules, the real last tick.

    Example:
        >>> schedules_format_4_sql("fusee")[0].split(" ADD")[0]
        'ALTER TABLE fusee.schedules'
    """
    return (
        f"ALTER TABLE {s}.schedules"
        " ADD COLUMN IF NOT EXISTS input BYTEA NOT NULL DEFAULT ''::bytea,"
        " ADD COLUMN IF NOT EXISTS dynamic BOOLEAN NOT NULL DEFAULT false,"
        " ADD COLUMN IF NOT EXISTS ticked_ms BIGINT NOT NULL DEFAULT 0",
    )


def _row(values: tuple[Any, ...]) -> ScheduleRow:
    name, workflow, spec, paused, removed, last, done, buffered, last_run, next_ms = values[:10]
    input, dynamic, ticked = values[10:]
    return ScheduleRow(
        name,
        workflow,
        spec,
        paused,
        removed,
        last,
        done,
        buffered,
        last_run,
        next_ms,
        bytes(input),
        bool(dynamic),
        int(ticked),
    )


class PostgresSchedules:
    """``schedules``, ``put_schedule``, ``set_schedule`` and ``claim_tick`` on Postgres.

    Example:
        >>> from fusee.store import PostgresStore
        >>> hasattr(PostgresStore("postgresql://h/db"), "claim_tick")
        True
    """

    # The store's own (`PostgresStore`).
    _q: str
    _query: Callable[..., Awaitable[Any]]
    _check_writable: Callable[[], None]

    async def schedules(self) -> builtins.list[ScheduleRow]:
        found = await self._query(
            lambda conn: conn.fetch(f"SELECT {_COLUMNS} FROM {self._q}.schedules ORDER BY name"),
            "reading schedules from",
        )
        return [_row(tuple(r)) for r in found]

    async def put_schedule(self, row: ScheduleRow) -> None:
        self._check_writable()
        values = (
            row.name,
            row.workflow,
            row.spec,
            row.paused,
            row.removed,
            row.last_tick_ms,
            row.done_tick_ms,
            row.buffered_ms,
            row.last_run,
            row.next_ms,
            row.input,
            row.dynamic,
            row.ticked_ms,
        )
        sql = (
            f"INSERT INTO {self._q}.schedules ({_COLUMNS}) VALUES ({_PLACES})"
            " ON CONFLICT (name) DO UPDATE SET workflow = excluded.workflow,"
            " spec = excluded.spec, removed = excluded.removed,"
            " input = excluded.input, dynamic = excluded.dynamic"
        )
        await self._query(lambda conn: conn.execute(sql, *values), "writing a schedule in")

    async def set_schedule(self, name: str, changes: Mapping[str, Any]) -> None:
        self._check_writable()
        check_state(changes)
        if not changes:
            return
        # Column names come from STATE_FIELDS only (checked): never from the caller's text.
        sets = ", ".join(f"{key} = ${i}" for i, key in enumerate(changes, start=2))
        sql = f"UPDATE {self._q}.schedules SET {sets} WHERE name = $1"
        values = tuple(changes.values())
        await self._query(lambda conn: conn.execute(sql, name, *values), "writing a schedule in")

    async def delete_schedule(self, name: str) -> None:
        self._check_writable()
        sql = f"DELETE FROM {self._q}.schedules WHERE name = $1"
        await self._query(lambda conn: conn.execute(sql, name), "deleting a schedule in")

    async def claim_tick(self, name: str, tick_ms: int) -> bool:
        self._check_writable()
        sql = (
            f"UPDATE {self._q}.schedules SET last_tick_ms = $2"
            " WHERE name = $1 AND last_tick_ms < $2"
        )
        status: str = await self._query(
            lambda conn: conn.execute(sql, name, tick_ms), "claiming a schedule tick in"
        )
        return status.endswith(" 1")
