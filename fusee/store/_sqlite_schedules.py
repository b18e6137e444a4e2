"""The SQLite store's schedule rows (`fusee.store._schedules`): a mixin of `SqliteStore`.

The rule: writes go through the store's writer queue (`_write_inbox`), as
the inbox's do, so they are ordered with its appends; one engine writes an
SQLite store, so ``claim_tick``'s read and write are not raced by another.
"""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from fusee.store._schedules import SCHEDULE_COLUMNS, ScheduleRow, check_state

__all__ = ["SCHEDULES_FORMAT_4", "SCHEDULES_SCHEMA", "SqliteSchedules"]

_T = TypeVar("_T")

SCHEDULES_SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS schedules (name TEXT PRIMARY KEY, workflow TEXT NOT NULL,"
    " spec TEXT NOT NULL,"
    " paused INTEGER NOT NULL DEFAULT 0, removed INTEGER NOT NULL DEFAULT 0,"
    " last_tick_ms INTEGER NOT NULL DEFAULT 0, done_tick_ms INTEGER NOT NULL DEFAULT 0,"
    " buffered_ms INTEGER NOT NULL DEFAULT 0, last_run TEXT NOT NULL DEFAULT '',"
    " next_ms INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID",
)
"""The ``schedules`` table (format 3; `SCHEDULES_FORMAT_4` adds to it)."""

SCHEDULES_FORMAT_4: Final = (
    "ALTER TABLE schedules ADD COLUMN input BLOB NOT NULL DEFAULT x''",
    "ALTER TABLE schedules ADD COLUMN dynamic INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE schedules ADD COLUMN ticked_ms INTEGER NOT NULL DEFAULT 0",
)
"""Format 4: schedules made at run time (their input) and their real last tick."""

_COLUMNS: Final = ", ".join(SCHEDULE_COLUMNS)
_PLACES: Final = ", ".join("?" for _ in SCHEDULE_COLUMNS)


def _row(values: tuple[Any, ...]) -> ScheduleRow:
    name, workflow, spec, paused, removed, last, done, buffered, last_run, next_ms = values[:10]
    input, dynamic, ticked = values[10:]
    return ScheduleRow(
        name,
        workflow,
        spec,
        bool(paused),
        bool(removed),
        int(last),
        int(done),
        int(buffered),
        str(last_run),
        int(next_ms),
        bytes(input),
        bool(dynamic),
        int(ticked),
    )


class SqliteSchedules:
    """``schedules``, ``put_schedule``, ``set_schedule`` and ``claim_tick`` on SQLite.

    Example:
        >>> import asyncio, tempfile
        >>> from fusee.store import SqliteStore
        >>> async def demo(directory: str) -> list[bool]:
        ...     store = SqliteStore(directory, durability="none")
        ...     await store.open()
        ...     try:
        ...         await store.put_schedule(ScheduleRow("n", "wf", "every 1000ms"))
        ...         return [await store.claim_tick("n", 1000), await store.claim_tick("n", 1000)]
        ...     finally:
        ...         await store.close()
        >>> with tempfile.TemporaryDirectory() as d:
        ...     asyncio.run(demo(d))
        [True, False]
    """

    # The store's own (`SqliteStore`).
    _read: Callable[..., Any]
    _write_inbox: Callable[..., Any]

    async def schedules(self) -> builtins.list[ScheduleRow]:
        def read(conn: sqlite3.Connection) -> builtins.list[ScheduleRow]:
            found = conn.execute(f"SELECT {_COLUMNS} FROM schedules ORDER BY name").fetchall()
            return [_row(tuple(r)) for r in found]

        rows: builtins.list[ScheduleRow] = await self._read(read)
        return rows

    async def put_schedule(self, row: ScheduleRow) -> None:
        values = (
            row.name,
            row.workflow,
            row.spec,
            int(row.paused),
            int(row.removed),
            row.last_tick_ms,
            row.done_tick_ms,
            row.buffered_ms,
            row.last_run,
            row.next_ms,
            row.input,
            int(row.dynamic),
            row.ticked_ms,
        )
        await self._write_inbox(
            (
                (
                    f"INSERT INTO schedules ({_COLUMNS}) VALUES ({_PLACES})"
                    " ON CONFLICT (name) DO UPDATE SET workflow = excluded.workflow,"
                    " spec = excluded.spec, removed = excluded.removed,"
                    " input = excluded.input, dynamic = excluded.dynamic",
                    values,
                ),
            )
        )

    async def set_schedule(self, name: str, changes: Mapping[str, Any]) -> None:
        check_state(changes)
        if not changes:
            return
        # Column names come from STATE_FIELDS only (checked): never from the caller's text.
        sets = ", ".join(f"{key} = ?" for key in changes)
        values = tuple(int(v) if isinstance(v, bool) else v for v in changes.values())
        await self._write_inbox(((f"UPDATE schedules SET {sets} WHERE name = ?", (*values, name)),))

    async def delete_schedule(self, name: str) -> None:
        await self._write_inbox((("DELETE FROM schedules WHERE name = ?", (name,)),))

    async def claim_tick(self, name: str, tick_ms: int) -> bool:
        def read(conn: sqlite3.Connection) -> int | None:
            found = conn.execute(
                "SELECT last_tick_ms FROM schedules WHERE name = ?", (name,)
            ).fetchone()
            return None if found is None else int(found[0])

        last: int | None = await self._read(read)
        if last is None or last >= tick_ms:
            return False
        await self._write_inbox(
            (
                (
                    "UPDATE schedules SET last_tick_ms = ? WHERE name = ? AND last_tick_ms < ?",
                    (tick_ms, name, tick_ms),
                ),
            )
        )
        return True
