"""Fixtures of the engine tests: each runs on the memory store, SQLite and Postgres.

`host` makes a `TestEngine` (virtual clock, dev profile) on a fresh store of
the kind under test; on SQLite, `crash()` abandons the engine and opens a new
`SqliteStore` on the same directory, as a restarted process would. Postgres
stores are schemas of the session's throwaway server (tests/_postgres.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import pytest
from _postgres import Cluster

import fusee
from fusee.pytest_plugin import EngineFactory
from fusee.store import Entry, MemoryStore, PostgresStore, RunRow, SqliteStore, Store
from fusee.testing import TestEngine

STORES = [
    pytest.param("memory", id="memory"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres"),
]


class Stores:
    """Fresh stores of one kind; each SQLite store in its own directory."""

    def __init__(self, kind: str, directory: Path, postgres: Cluster | None = None) -> None:
        self.kind = kind
        self.directory = directory
        self.postgres = postgres
        self._n = itertools.count(1)

    def new(self) -> Store:
        if self.kind == "memory":
            return MemoryStore()
        if self.kind == "postgres":
            assert self.postgres is not None
            return self.postgres.new_store()
        return SqliteStore(self.directory / f"store-{next(self._n)}", durability="none")


class Host(Protocol):
    def __call__(self, workflows: Iterable[Any] = (), **kw: Any) -> TestEngine: ...


@pytest.fixture(params=STORES)
def store_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
def stores(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Stores:
    postgres = request.getfixturevalue("postgres_cluster") if store_kind == "postgres" else None
    return Stores(store_kind, tmp_path, postgres)


@pytest.fixture
def host(fusee_engine: EngineFactory, stores: Stores) -> Host:
    """``host(workflows=[...], **kw)``: a TestEngine on a new store of the kind under test."""

    def make(workflows: Iterable[Any] = (), **kw: Any) -> TestEngine:
        kw.setdefault("store", stores.new())
        return fusee_engine(workflows=workflows, **kw)

    return make


def step_runs(t: TestEngine) -> Counter[tuple[str, int]]:
    """How often each step ``(id, seq)`` was invoked, over every life and run of ``t``."""
    return Counter((id, seq) for _, (id, _run, seq) in t.step_log)


def assert_steps_ran_once(t: TestEngine) -> None:
    """No step function ran twice (replays re-run workflow code, never steps)."""
    again = {key: n for key, n in Counter(key for _, key in t.step_log).items() if n > 1}
    assert not again, f"steps ran more than once: {again}"


class HeldWrites:
    """Holds a store's appends until `release` (a slow disk); ``with`` restores it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.real = store.append
        self.released = asyncio.Event()
        self.waiting = asyncio.Event()  # an append is held
        self.writes = 0

    async def append(
        self, entries: Sequence[Entry], runs: Sequence[RunRow] = (), **fence: Any
    ) -> None:
        self.waiting.set()
        await self.released.wait()
        await self.real(entries, runs, **fence)
        self.writes += 1

    def release(self) -> None:
        self.released.set()

    def __enter__(self) -> HeldWrites:
        self.store.append = self.append  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        # Released on the way out too, so a failing test does not hang in close().
        self.released.set()
        self.store.append = self.real  # type: ignore[method-assign]


async def eventually(
    check: Callable[[], Any], what: str = "the condition", *, within_s: float = 30.0
) -> Any:
    """Polls ``check`` (sync or async) until it returns a truthy value, which it returns.

    For conditions of other processes or engines (leases, workers), which
    no event of this one announces; ``what`` names it when it does not come.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        assert loop.time() < deadline, f"{what} did not come true in time"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def client_of(stores: Stores, store: Store) -> AsyncIterator[fusee.Client]:
    """A Client beside the engine on ``store``, as a web app beside a worker would have."""
    if isinstance(store, SqliteStore):
        async with await fusee.Client.connect(store.path.parent, durability="none") as c:
            yield c
    elif isinstance(store, PostgresStore):
        assert stores.postgres is not None
        theirs = PostgresStore(stores.postgres.dsn, schema=store.schema, client=True)
        await theirs.open()
        try:
            async with await fusee.Client.connect(theirs) as c:
                yield c
        finally:
            await theirs.close()
    else:
        async with await fusee.Client.connect(store) as c:
            yield c
