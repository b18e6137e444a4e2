"""Schedule rows (`fusee.store._schedules`) on every store: kept across reopening, claimed once."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from _postgres import Cluster

from fusee.store import PostgresStore, ScheduleRow, SqliteStore, Store
from fusee.store import _sqlite_schema as sqlite_schema

from . import test_store as base
from .test_store import Opener

# The fixtures of the shared store tests: each test runs on every store.
opener = base.opener
store = base.store

pytestmark = pytest.mark.asyncio


async def test_a_schedule_row_is_stored_and_kept_across_reopening(
    opener: Opener, store: Store
) -> None:
    await store.put_schedule(ScheduleRow("b", "wf", "every 60000ms", last_tick_ms=5))
    await store.put_schedule(ScheduleRow("a", "wf", "cron * * * * * UTC"))
    await store.set_schedule("a", {"paused": True, "last_run": "a-1", "next_ms": 9})
    await store.set_schedule("nobody", {"paused": True})
    store = await opener.reopen(store)
    assert await store.schedules() == [
        ScheduleRow("a", "wf", "cron * * * * * UTC", paused=True, last_run="a-1", next_ms=9),
        ScheduleRow("b", "wf", "every 60000ms", last_tick_ms=5),
    ]


async def test_putting_a_known_schedule_changes_its_definition_only(store: Store) -> None:
    await store.put_schedule(ScheduleRow("a", "wf", "every 1000ms", last_tick_ms=7))
    await store.set_schedule("a", {"paused": True, "buffered_ms": 3})
    await store.put_schedule(ScheduleRow("a", "wf2", "every 2000ms", removed=True))
    assert await store.schedules() == [
        ScheduleRow("a", "wf2", "every 2000ms", True, True, 7, 0, 3, "", 0, b"", False, 0)
    ]


async def test_a_run_time_schedule_keeps_its_input_and_last_tick_and_can_be_deleted(
    opener: Opener, store: Store
) -> None:
    await store.put_schedule(ScheduleRow("a", "wf", "every 1000ms", input=b"\x01", dynamic=True))
    await store.put_schedule(ScheduleRow("b", "wf", "every 1000ms"))
    await store.set_schedule("a", {"ticked_ms": 4000})
    await store.put_schedule(ScheduleRow("a", "wf", "every 2000ms", input=b"\x02", dynamic=True))
    await store.delete_schedule("b")
    await store.delete_schedule("nobody")
    store = await opener.reopen(store)
    assert await store.schedules() == [
        ScheduleRow("a", "wf", "every 2000ms", input=b"\x02", dynamic=True, ticked_ms=4000)
    ]


async def test_a_tick_is_claimed_once_and_claims_only_move_forward(store: Store) -> None:
    await store.put_schedule(ScheduleRow("a", "wf", "every 1000ms", last_tick_ms=1000))
    assert not await store.claim_tick("a", 1000)
    assert await store.claim_tick("a", 3000)
    assert not await store.claim_tick("a", 2000)
    assert not await store.claim_tick("nobody", 5000)
    (row,) = await store.schedules()
    assert row.last_tick_ms == 3000


async def test_set_schedule_refuses_a_field_it_does_not_set(store: Store) -> None:
    await store.put_schedule(ScheduleRow("a", "wf", "every 1000ms"))
    with pytest.raises(ValueError, match="not 'last_tick_ms'"):
        await store.set_schedule("a", {"last_tick_ms": 5})


async def test_concurrent_claims_of_one_tick_on_postgres_let_one_through(
    postgres_cluster: Cluster,
) -> None:
    first = postgres_cluster.new_store()
    await first.open()
    others = [
        PostgresStore(postgres_cluster.dsn, schema=first.schema, durability="none")
        for _ in range(3)
    ]
    try:
        for other in others:
            await other.open()
        await first.put_schedule(ScheduleRow("a", "wf", "every 1000ms"))
        claims = await asyncio.gather(*(s.claim_tick("a", 1000) for s in [first, *others]))
        assert sorted(claims) == [False, False, False, True]
    finally:
        for s in [first, *others]:
            await s.close()


async def test_a_format_2_sqlite_store_gains_the_schedules_table_on_open(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path, durability="none")
    await store.open()
    await store.close()
    conn = sqlite3.connect(tmp_path / sqlite_schema.FILENAME, isolation_level=None)
    conn.execute("DROP TABLE schedules")
    # Format 4 added the runs' version column, format 5 their error.
    conn.execute("ALTER TABLE runs DROP COLUMN version")
    conn.execute("ALTER TABLE runs DROP COLUMN error")
    conn.execute("PRAGMA user_version = 2")
    conn.close()
    store = SqliteStore(tmp_path, durability="none")
    await store.open()
    try:
        await store.put_schedule(ScheduleRow("a", "wf", "every 1000ms"))
        assert [r.name for r in await store.schedules()] == ["a"]
    finally:
        await store.close()
    conn = sqlite3.connect(tmp_path / sqlite_schema.FILENAME)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_schema.FORMAT == 5
    conn.close()


async def test_a_format_2_postgres_store_gains_the_schedules_table_on_open(
    postgres_cluster: Cluster,
) -> None:
    import asyncpg

    store = postgres_cluster.new_store()
    await store.open()
    await store.close()
    conn = await asyncpg.connect(postgres_cluster.dsn)
    try:
        await conn.execute(f'DROP TABLE "{store.schema}".schedules')
        await conn.execute(f"UPDATE \"{store.schema}\".meta SET value = 2 WHERE key = 'format'")
    finally:
        await conn.close()
    store = PostgresStore(postgres_cluster.dsn, schema=store.schema, durability="none")
    await store.open()
    try:
        await store.put_schedule(ScheduleRow("a", "wf", "every 1000ms"))
        assert [r.name for r in await store.schedules()] == ["a"]
    finally:
        await store.close()
