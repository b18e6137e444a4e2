"""The commands inbox every store keeps: post, take, answer, wait; on memory, SQLite and Postgres.

A client store (``client=True``) posts beside the engine's store, which
takes each command once per opening and answers it; a store opened again
(an engine's next life) takes again what it had not answered.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import pytest
import pytest_asyncio
from _postgres import Cluster
from engine.conftest import eventually

from fusee.errors import StoreError
from fusee.store import (
    Command,
    Entry,
    MemoryStore,
    PostgresStore,
    RunRow,
    SqliteStore,
    Store,
    open_store,
)
from fusee.store import sqlite as sqlite_store


@dataclasses.dataclass
class Inbox:
    """Opens the engine's store, a client store beside it, and both again."""

    kind: str
    directory: Path
    postgres: Cluster | None = None
    memory: MemoryStore = dataclasses.field(default_factory=MemoryStore)
    opened: list[Store] = dataclasses.field(default_factory=list)
    schema: str = ""

    def _make(self, client: bool) -> Store:
        if self.kind == "memory":
            return self.memory
        if self.kind == "postgres":
            assert self.postgres is not None
            if not self.schema:
                self.schema = self.postgres.new_name("inbox_")
            return PostgresStore(
                self.postgres.dsn, schema=self.schema, durability="none", client=client
            )
        return SqliteStore(self.directory, durability="none", client=client)

    async def engine(self) -> Store:
        store = self._make(client=False)
        await store.open()
        self.opened.append(store)
        return store

    async def client(self) -> Store:
        store = self._make(client=True)
        await store.open()
        self.opened.append(store)
        return store


KINDS = [
    pytest.param("memory", id="memory"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres"),
]


@pytest_asyncio.fixture(params=KINDS)
async def inbox(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Inbox]:
    cluster = request.getfixturevalue("postgres_cluster") if request.param == "postgres" else None
    box = Inbox(request.param, tmp_path / "store", cluster)
    try:
        yield box
    finally:
        for store in reversed(box.opened):
            await store.close()


def command(id: str, kind: str = "signal", run_id: str = "r-1") -> Command:
    return Command(id, kind, run_id, b"\x01" + id.encode(), None, 1_700_000_000_000)


async def test_commands_a_client_posts_are_taken_once_oldest_first(inbox: Inbox) -> None:
    engine = await inbox.engine()
    client = await inbox.client()
    for n in range(3):
        assert await client.post_command(command(f"c-{n}")) == f"c-{n}"
    taken = await engine.take_commands(limit=2)
    assert [c.id for c in taken] == ["c-0", "c-1"]
    assert taken[0] == dataclasses.replace(command("c-0"), attempt=1)
    assert [c.id for c in await engine.take_commands()] == ["c-2"]
    assert await engine.take_commands() == []


async def test_posting_one_id_twice_stores_it_once(inbox: Inbox) -> None:
    engine = await inbox.engine()
    client = await inbox.client()
    await client.post_command(command("c-1"))
    await client.post_command(dataclasses.replace(command("c-1"), payload=b"other"))
    taken = await engine.take_commands()
    assert [(c.id, c.payload) for c in taken] == [("c-1", b"\x01c-1")]


async def test_an_answered_command_is_not_taken_again_and_its_answer_reads_back(
    inbox: Inbox,
) -> None:
    engine = await inbox.engine()
    client = await inbox.client()
    await client.post_command(command("c-1"))
    assert await client.get_answer("c-1") is None
    await engine.take_commands()
    await engine.answer_command("c-1", False, b"why")
    await engine.answer_command("c-1", True, b"late")  # the first answer stands
    answer = await client.get_answer("c-1")
    assert answer is not None
    assert (answer.ok, answer.payload) == (False, b"why")
    assert answer.answered_ms > 0
    await engine.close()
    engine = await inbox.engine()
    assert await engine.take_commands() == []


async def test_a_command_taken_but_not_answered_is_taken_again_by_the_next_opening(
    inbox: Inbox,
) -> None:
    engine = await inbox.engine()
    await engine.post_command(command("c-1"))
    assert [c.attempt for c in await engine.take_commands()] == [1]
    await engine.close()  # stopped before answering: a crash, to the inbox
    engine = await inbox.engine()
    assert [(c.id, c.attempt) for c in await engine.take_commands()] == [("c-1", 2)]


async def test_a_bad_command_is_refused_and_nothing_is_stored(inbox: Inbox) -> None:
    engine = await inbox.engine()
    with pytest.raises(ValueError, match="command kind 'explode' is not one of"):
        await engine.post_command(command("c-1", kind="explode"))
    with pytest.raises(ValueError, match="non-empty string id"):
        await engine.post_command(command(""))
    with pytest.raises(ValueError, match="command kind"):
        Command.new("explode", "r-1")
    assert await engine.take_commands() == []


async def test_waiting_for_commands_wakes_when_a_client_posts(inbox: Inbox) -> None:
    engine = await inbox.engine()
    client = await inbox.client()
    await engine.wait_commands(0)  # a Postgres store starts listening here
    loop = asyncio.get_running_loop()
    waiting = asyncio.ensure_future(engine.wait_commands(60))
    await asyncio.sleep(0)
    began = loop.time()
    await client.post_command(command("c-1"))
    await asyncio.wait_for(waiting, 30)
    assert loop.time() - began < 30
    assert [c.id for c in await engine.take_commands()] == ["c-1"]


async def test_forgetting_deletes_only_commands_answered_before_the_time(inbox: Inbox) -> None:
    engine = await inbox.engine()
    await engine.post_command(command("c-1"))
    await engine.post_command(command("c-2"))
    await engine.take_commands()
    await engine.answer_command("c-1", True, b"")
    answer = await engine.get_answer("c-1")
    assert answer is not None
    assert await engine.forget_commands(answer.answered_ms) == 0
    assert await engine.forget_commands(answer.answered_ms + 1) == 1
    assert await engine.get_answer("c-1") is None
    await engine.answer_command("c-2", True, b"")
    assert await engine.get_answer("c-2") is not None


@pytest.mark.parametrize(
    "kind", [pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres")]
)
async def test_a_client_store_reads_and_posts_but_writes_nothing_else(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    cluster = request.getfixturevalue("postgres_cluster") if kind == "postgres" else None
    box = Inbox(kind, tmp_path / "store", cluster)
    try:
        engine = await box.engine()
        await engine.append([Entry(1, "a", 1, b"x")], [RunRow("a", 1, "wf", "running", 0)])
        client = await box.client()
        row = await client.get("a")
        assert row is not None
        assert row.status == "running"
        with pytest.raises(StoreError, match="open as a client"):
            await client.append([Entry(2, "a", 1, b"y")])
        with pytest.raises(StoreError, match="open as a client"):
            await client.take_commands()
        with pytest.raises(StoreError, match="open as a client"):
            await client.answer_command("c-1", True, b"")
    finally:
        for store in reversed(box.opened):
            await store.close()


async def test_an_sqlite_client_posts_while_the_engine_holds_the_writer_lock(
    tmp_path: Path,
) -> None:
    engine = SqliteStore(tmp_path, durability="none")
    await engine.open()
    try:
        with pytest.raises(StoreError, match="open for writing in another process"):
            await SqliteStore(tmp_path).open()
        client = open_store(tmp_path, durability="none", client=True)
        await client.open()
        await client.post_command(command("c-1"))
        await client.close()
        assert [c.id for c in await engine.take_commands()] == ["c-1"]
    finally:
        await engine.close()


async def test_a_client_creates_an_sqlite_store_no_engine_opened_yet(tmp_path: Path) -> None:
    client = SqliteStore(tmp_path / "new", durability="none", client=True)
    await client.open()
    await client.post_command(command("c-1"))
    await client.close()
    engine = SqliteStore(tmp_path / "new", durability="none")
    await engine.open()
    try:
        assert [c.id for c in await engine.take_commands()] == ["c-1"]
    finally:
        await engine.close()


async def test_a_format_1_sqlite_store_gains_the_inbox_when_an_engine_opens_it(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path, durability="none")
    await store.open()
    await store.append([Entry(1, "a", 1, b"x")], [RunRow("a", 1, "wf", "running", 0)])
    await store.close()
    conn = sqlite3.connect(tmp_path / sqlite_store.FILENAME, isolation_level=None)
    conn.execute("DROP TABLE commands")
    conn.execute("DROP TABLE schedules")
    # Format 4 added the runs' version column, format 5 their error.
    conn.execute("ALTER TABLE runs DROP COLUMN version")
    conn.execute("ALTER TABLE runs DROP COLUMN error")
    conn.execute("PRAGMA user_version = 1")
    conn.close()
    client = SqliteStore(tmp_path, client=True)
    with pytest.raises(StoreError, match="has format 1, older than this fusee's"):
        await client.open()
    store = SqliteStore(tmp_path, durability="none")
    await store.open()
    try:
        assert await store.load("a") == [(1, b"x")]
        await store.post_command(command("c-1"))
        assert [c.id for c in await store.take_commands()] == ["c-1"]
    finally:
        await store.close()
    conn = sqlite3.connect(tmp_path / sqlite_store.FILENAME)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_store.FORMAT == 5
    conn.close()


async def test_a_format_1_postgres_store_gains_the_inbox_when_it_opens(
    postgres_cluster: Cluster,
) -> None:
    import asyncpg

    store = postgres_cluster.new_store()
    await store.open()
    await store.close()
    conn = await asyncpg.connect(postgres_cluster.dsn)
    try:
        # Format 1: no inbox, no workers table.
        await conn.execute(f'DROP TABLE "{store.schema}".commands')
        await conn.execute(f'DROP TABLE "{store.schema}".workers')
        await conn.execute(f'DROP TABLE "{store.schema}".schedules')
        await conn.execute(f"UPDATE \"{store.schema}\".meta SET value = 1 WHERE key = 'format'")
    finally:
        await conn.close()
    store = PostgresStore(postgres_cluster.dsn, schema=store.schema, durability="none")
    await store.open()
    try:
        await store.post_command(command("c-1"))
        assert [c.id for c in await store.take_commands()] == ["c-1"]
    finally:
        await store.close()


@pytest_asyncio.fixture
async def postgres_pair(
    postgres_cluster: Cluster,
) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    """An engine's Postgres store and a client store beside it that polls for answers hourly."""
    engine = postgres_cluster.new_store()
    await engine.open()
    client = PostgresStore(
        postgres_cluster.dsn, schema=engine.schema, client=True, answer_poll_s=3600
    )
    await client.open()
    try:
        yield engine, client
    finally:
        await client.close()
        await engine.close()


async def test_answers_wake_each_of_their_waiting_posters_however_many_a_batch_answers(
    postgres_pair: tuple[PostgresStore, PostgresStore],
) -> None:
    # 250 ids answered at once are too many to name in one notification:
    # it names none, and every waiting poster looks.
    engine, client = postgres_pair
    for size in (3, 250):
        ids = [f"batch{size}-{n:03}-{'x' * 24}" for n in range(size)]
        await asyncio.gather(*(client.post_command(command(id)) for id in ids))
        waits = [asyncio.ensure_future(client.wait_answer(id)) for id in ids]
        assert await client.wait_answer(ids[0], timeout_s=0) is None
        await engine.take_commands(limit=size)
        await asyncio.gather(*(engine.answer_command(id, True, id.encode()) for id in ids))
        answers = await asyncio.gather(*waits)  # the hourly poll never comes
        assert [a.payload for a in answers if a is not None] == [id.encode() for id in ids]


async def test_an_answer_stored_without_a_notification_is_found_by_the_slow_poll(
    postgres_cluster: Cluster,
) -> None:
    import asyncpg

    # A worker of an older fusee answers without a NOTIFY.
    store = postgres_cluster.new_store()
    await store.open()
    client = PostgresStore(
        postgres_cluster.dsn, schema=store.schema, client=True, answer_poll_s=0.05
    )
    await client.open()
    conn = await asyncpg.connect(postgres_cluster.dsn)
    try:
        await client.post_command(command("c-1"))
        waiting = asyncio.ensure_future(client.wait_answer("c-1"))
        await store.take_commands()
        await conn.execute(
            f'UPDATE "{store.schema}".commands SET answered_ms = 1, ok = true, answer = $1'
            " WHERE id = 'c-1'",
            b"old",
        )
        answer = await waiting
        assert answer is not None
        assert (answer.ok, answer.payload) == (True, b"old")
    finally:
        await conn.close()
        await client.close()
        await store.close()


async def test_a_wait_for_an_answer_listens_again_after_its_connection_is_cut(
    postgres_pair: tuple[PostgresStore, PostgresStore], postgres_cluster: Cluster
) -> None:
    import asyncpg

    engine, client = postgres_pair
    await client.post_command(command("c-1"))
    waiting = asyncio.ensure_future(client.wait_answer("c-1"))
    conn = await asyncpg.connect(postgres_cluster.dsn)

    async def listening() -> set[int]:
        rows = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'fusee-answers'"
        )
        return {int(r[0]) for r in rows}

    try:
        cut = await eventually(listening, "the listening connection")
        await conn.execute("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid", cut)
        # The wait hears of the loss and listens on a new connection.
        await eventually(lambda: _is_new(listening(), cut), "listening on a new connection")
    finally:
        await conn.close()
    await engine.take_commands()
    await engine.answer_command("c-1", True, b"heard")
    answer = await waiting
    assert answer is not None
    assert answer.payload == b"heard"


async def test_closing_a_store_ends_the_waits_for_answers_on_it(
    postgres_pair: tuple[PostgresStore, PostgresStore],
) -> None:
    _, client = postgres_pair
    await client.post_command(command("c-1"))
    waiting = asyncio.ensure_future(client.wait_answer("c-1"))
    await asyncio.sleep(0)
    await client.close()
    with pytest.raises(StoreError, match="closed"):
        await waiting


async def _is_new(pids: Awaitable[set[int]], old: set[int]) -> bool:
    found = await pids
    return bool(found) and not found & old
