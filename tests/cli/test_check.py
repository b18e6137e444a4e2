"""`fusee check`: every row and record of a store read, and the damage reported by run."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import cli_workflows as wfs
import pytest

import fusee
from fusee.store import Entry, SqliteStore
from fusee.store._sqlite_mark import Mark, read_store_id

from .conftest import cli, engine_on

GREETED = [f"g-{n}" for n in range(1, 8)]


HOLD = fusee.Queue("hold", concurrency=1)


def _healthy_store(data: Path) -> None:
    """Seven completed runs g-1..g-7, gated-1 waiting for its signal, queued-1 queued behind it."""

    async def make() -> None:
        async with engine_on(data, queues=[HOLD]) as engine:
            for id in GREETED:
                await engine.execute(wfs.greet, id, id)
            run = await engine.start(wfs.gated, "gated-1", wfs.Order("o1", 5), queue=HOLD)
            while await run.query(wfs.phase) != "waiting":
                await asyncio.sleep(0.01)
            # No journal until its queue admits it: no damage either.
            await engine.start(wfs.greet, "queued-1", "q", queue=HOLD)

    asyncio.run(make())


@contextlib.contextmanager
def _sql(data: Path) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(data / "fusee.db")
    try:
        with conn:
            yield conn
    finally:
        conn.close()


def _lsns(conn: sqlite3.Connection, id: str) -> list[int]:
    return [
        lsn for (lsn,) in conn.execute("SELECT lsn FROM journal WHERE id = ? ORDER BY lsn", (id,))
    ]


def _append(data: Path, id: str, payload: Callable[[list[tuple[int, bytes]]], bytes]) -> None:
    """Appends one record to run ``id``'s journal through the store's own append."""

    async def go() -> None:
        store = SqliteStore(data, durability="none")
        await store.open()
        try:
            row = await store.get(id)
            assert row is not None
            journal = await store.load(id)
            await store.append([Entry(store.last_lsn + 1, id, row.run, payload(journal))])
        finally:
            await store.close()

    asyncio.run(go())


def garbage_record(data: Path) -> None:
    _append(data, "gated-1", lambda _: b"\xff\x00 not a record")


def no_start(data: Path) -> None:
    with _sql(data) as conn:
        conn.execute("DELETE FROM journal WHERE lsn = ?", (_lsns(conn, "g-1")[0],))


def after_done(data: Path) -> None:
    # A copy of the run's second record, landed after its end.
    _append(data, "g-2", lambda journal: journal[1][1])


def finished_without_done(data: Path) -> None:
    with _sql(data) as conn:
        conn.execute("DELETE FROM journal WHERE lsn = ?", (_lsns(conn, "g-3")[-1],))


def missing_journal(data: Path) -> None:
    with _sql(data) as conn:
        conn.execute("DELETE FROM journal WHERE id = 'g-4'")


def queued_in_no_queue(data: Path) -> None:
    with _sql(data) as conn:
        conn.execute("DELETE FROM queue_items WHERE id = 'queued-1'")


def unreadable_row(data: Path) -> None:
    with _sql(data) as conn:
        # 0xc1 is the one byte msgpack never uses.
        conn.execute("UPDATE runs SET attributes = x'c1' WHERE id = 'g-5'")


DAMAGE = [
    pytest.param(garbage_record, "gated-1", "does not decode", id="garbage-record"),
    pytest.param(no_start, "g-1", "does not start with Start", id="no-start"),
    pytest.param(after_done, "g-2", "1 record(s) after its Done", id="records-after-done"),
    pytest.param(
        finished_without_done,
        "g-3",
        "its row says completed but its journal has no Done record",
        id="finished-without-done",
    ),
    pytest.param(missing_journal, "g-4", "its journal is missing", id="missing-journal"),
    pytest.param(
        queued_in_no_queue, "queued-1", "says queued but no queue holds it", id="queue-item-lost"
    ),
    pytest.param(unreadable_row, None, "cannot be read", id="unreadable-row"),
]


def _digest(data: Path) -> str:
    return hashlib.sha256((data / "fusee.db").read_bytes()).hexdigest()


def test_check_of_a_healthy_store_prints_one_line_and_exits_0(tmp_path: Path) -> None:
    _healthy_store(tmp_path)
    before = _digest(tmp_path)
    code, out, err = cli("check", "--data", str(tmp_path))
    assert (code, err) == (0, "")
    (line,) = out.splitlines()
    assert line.startswith(f"{tmp_path}: 9 run(s) and ")
    assert line.endswith("record(s) read: no damage")
    assert _digest(tmp_path) == before


@pytest.mark.parametrize(("damage", "id", "problem"), DAMAGE)
def test_check_names_the_damaged_run_and_exits_1(
    tmp_path: Path, damage: Callable[[Path], None], id: str | None, problem: str
) -> None:
    _healthy_store(tmp_path)
    damage(tmp_path)
    before = _digest(tmp_path)
    code, out, _ = cli("check", "--data", str(tmp_path), "--json")
    assert code == 1
    report = json.loads(out)
    (finding,) = report["findings"]
    assert finding["id"] == id
    assert problem in finding["problem"]
    assert report["damaged"] == 1
    assert _digest(tmp_path) == before

    code, out, _ = cli("check", "--data", str(tmp_path))
    assert code == 1
    damaged = [ln for ln in out.splitlines() if ln.startswith("  damaged")]
    assert len(damaged) == 1
    assert problem in damaged[0]
    if id is not None:
        assert f"  damaged  {id} (run " in damaged[0]
    assert "1 damaged run(s) or row(s)" in out


def test_one_damaged_run_does_not_stop_the_check_of_the_others(tmp_path: Path) -> None:
    _healthy_store(tmp_path)
    for param in DAMAGE:
        damage = param.values[0]
        assert callable(damage)
        damage(tmp_path)
    code, out, _ = cli("check", "--data", str(tmp_path), "--json")
    assert code == 1
    report = json.loads(out)
    found = {(f["id"], f["problem"]) for f in report["findings"]}
    for param in DAMAGE:
        _, id, problem = param.values
        assert any(fid == id and str(problem) in text for fid, text in found), param.id
    assert len(report["findings"]) == len(DAMAGE)
    # The rows that still read are all checked: every one but g-5's.
    assert report["runs"] == 8
    named = {f["id"] for f in report["findings"]}
    assert {"g-6", "g-7"}.isdisjoint(named)


def test_check_reports_a_store_behind_its_high_water_mark_and_exits_1(tmp_path: Path) -> None:
    async def make() -> int:
        async with await fusee.Engine.open(tmp_path, workflows=[wfs.greet]) as engine:
            await engine.execute(wfs.greet, "g-1", "g-1")
            return engine.store.last_lsn

    last = asyncio.run(make())
    code, out, _ = cli("check", "--data", str(tmp_path))
    assert code == 0, out  # level with its mark
    # The mark says three more records were made durable than the store holds
    # (as a WAL cut after them leaves it).
    with contextlib.closing(sqlite3.connect(tmp_path / "fusee.db")) as conn:
        store_id = read_store_id(conn)
    assert store_id is not None
    Mark(tmp_path / "fusee.db", store_id=store_id, lsn=last + 3).close()
    code, out, _ = cli("check", "--data", str(tmp_path))
    assert code == 1
    assert "(the store): the store is behind its high-water mark" in out
    assert f"through LSN {last + 3} but holds them only through LSN {last} (3 lost" in out
    code, out, _ = cli("check", "--data", str(tmp_path), "--json")
    assert code == 1
    (finding,) = json.loads(out)["findings"]
    assert finding["problem"].startswith("the store is behind its high-water mark")
