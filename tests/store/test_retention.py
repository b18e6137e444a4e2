"""`Store.delete_runs` on `MemoryStore`, `SqliteStore` and `PostgresStore`.

A finished run goes whole (its row, the journals of every run of its id),
once, durably; the check that it may go is the write's own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fusee.errors import NotFound
from fusee.store import Entry, RunRow, SqliteStore, Store

from . import test_store as base
from .test_store import Opener, entries

# The fixtures of the shared store tests: each test runs on every store.
opener = base.opener
store = base.store

pytestmark = pytest.mark.asyncio


def ended(id: str, status: str, started_ms: int, finished_ms: int, run: int = 1) -> RunRow:
    return RunRow(id, run, "wf", status, started_ms, finished_ms)


async def test_only_runs_finished_before_the_cutoff_go_with_every_run_of_their_id(
    opener: Opener, store: Store
) -> None:
    await store.append(
        [
            *entries("old", 1, [1, 2]),
            *entries("old", 2, [3]),
            *entries("new", 1, [4]),
            *entries("live", 1, [5]),
            *entries("cont", 1, [6]),
        ],
        [
            ended("old", "completed", 0, 10, run=2),
            ended("new", "failed", 5, 500),
            RunRow("live", 1, "wf", "suspended", 0),
            ended("cont", "continued", 0, 10),
        ],
    )
    assert await store.delete_runs(finished_before_ms=100) == ["old"]
    assert await store.delete_runs(finished_before_ms=100) == []
    store = await opener.reopen(store)
    assert await store.get("old") is None
    for run in (1, 2):
        with pytest.raises(NotFound):
            await store.load("old", run)
    assert [r.id for r in await store.list()] == ["cont", "live", "new"]
    assert await store.load("new") == [(4, b"new/1/4")]
    # A run not finished, or continuing as new, is never deleted, even by id.
    assert await store.delete_runs(["live", "cont", "nobody"]) == []
    assert await store.delete_runs(["new", "live"]) == ["new"]
    assert [r.id for r in await store.list()] == ["cont", "live"]


async def test_batches_are_bounded_oldest_first_and_lsns_stay_above_the_deleted(
    opener: Opener, store: Store
) -> None:
    await store.append(
        [Entry(n, f"r-{n}", 1, b"x") for n in range(1, 6)],
        [ended(f"r-{n}", "cancelled", 10 - n, 20) for n in range(1, 6)],
    )
    assert await store.delete_runs(finished_before_ms=100, limit=2) == ["r-5", "r-4"]
    assert await store.delete_runs(limit=10) == ["r-3", "r-2", "r-1"]
    store = await opener.reopen(store)
    if opener.kind != "postgres":  # Postgres's LSNs count per shard, by its leases
        assert store.last_lsn == 5
    with pytest.raises(ValueError, match="limit must be an int of 1 or more"):
        await store.delete_runs(limit=0)


async def test_an_sqlite_store_whose_newest_records_were_deleted_opens_past_its_mark(
    tmp_path: Path,
) -> None:
    first = SqliteStore(tmp_path)  # fsync: it keeps a high-water mark
    await first.open()
    await first.append(entries("a", 1, [1, 2]), [ended("a", "completed", 0, 1)])
    assert await first.delete_runs(["a"]) == ["a"]
    await first.close()
    again = SqliteStore(tmp_path)
    await again.open()
    try:
        assert again.last_lsn == 2
        await again.append(entries("b", 1, [3]))
        assert await again.load("b") == [(3, b"b/1/3")]
    finally:
        await again.close()
