"""Worker processes on one Postgres database: kills, stops, joins, and a Client beside them.

Each worker is `scale_worker.py` in a process of its own; the test talks to
the runs through `fusee.Client` only, as a web app would, and judges by the
database and the step log the workers write.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from _postgres import Cluster

import fusee
from fusee.record import Step, decode
from fusee.store.postgres import PostgresStore

from .conftest import eventually

pytestmark = pytest.mark.asyncio

HERE = Path(__file__).parent
go = fusee.signal("go", int)


class Worker:
    """One worker process."""

    def __init__(self, url: str, name: str, lease: str, log: Path) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "scale_worker.py"), url, name, lease, str(log)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    async def ready(self) -> None:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.proc.stdout.readline), 60)
        assert line.strip() == "ready", self.stderr()

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return ""
        assert self.proc.stderr is not None
        return self.proc.stderr.read()

    async def stop(self) -> str:
        """Closes its stdin (it stops, giving its shards back); returns its stderr."""
        _, err = await asyncio.to_thread(self.proc.communicate, "", 60)
        return err

    def kill(self) -> None:
        self.proc.kill()
        self.proc.communicate()  # reaps it and closes its pipes


class Database:
    """A fresh database of the session's server, with its workers and step log."""

    def __init__(self, cluster: Cluster, tmp: Path) -> None:
        self.cluster = cluster
        self.name = cluster.new_name("workers_")
        self.url = cluster.dsn_for(self.name)
        self.log = tmp / "steps.log"
        self.workers: list[Worker] = []

    async def create(self) -> None:
        conn = await asyncpg.connect(self.cluster.dsn)
        try:
            await conn.execute(f'CREATE DATABASE "{self.name}"')
        finally:
            await conn.close()

    async def start(self, name: str, lease: str = "2s") -> Worker:
        worker = Worker(self.url, name, lease, self.log)
        self.workers.append(worker)
        await worker.ready()
        return worker

    def steps(self) -> list[tuple[str, str, str, str]]:
        if not self.log.exists():
            return []
        lines = self.log.read_text().splitlines()
        return [tuple(line.split()) for line in lines]  # type: ignore[misc]

    async def store(self) -> PostgresStore:
        store = PostgresStore(self.url, readonly=True)
        await store.open()
        return store

    async def owners(self) -> collections.Counter[str]:
        store = await self.store()
        try:
            leases = await store.leases()
        finally:
            await store.close()
        return collections.Counter(o for o, _, live in leases.values() if o is not None and live)


@pytest.fixture
async def db(postgres_cluster: Cluster, tmp_path: Path) -> AsyncIterator[Database]:
    d = Database(postgres_cluster, tmp_path)
    await d.create()
    try:
        yield d
    finally:
        for w in d.workers:
            if w.proc.returncode is None:
                try:
                    await w.stop()
                except subprocess.TimeoutExpired:
                    w.kill()


async def assert_one_record_per_step(db: Database, ids: list[str]) -> None:
    store = await db.store()
    try:
        for id in ids:
            seqs = [
                rec.seq for _, data in await store.load(id) if isinstance(rec := decode(data), Step)
            ]
            assert len(seqs) == len(set(seqs)), f"run {id!r} recorded a step twice: {seqs}"
    finally:
        await store.close()


async def test_three_workers_a_join_and_a_kill_lose_nothing_and_rerun_no_recorded_step(
    db: Database,
) -> None:
    w1 = await db.start("w1")
    await db.start("w2")
    ids = [f"j-{i}" for i in range(300)]
    async with await fusee.Client.connect(db.url) as client:
        runs: list[fusee.Run[Any]] = [await client.start("job", id, i) for i, id in enumerate(ids)]
        await db.start("w3")  # joins mid-load
        for id in ids[:150]:
            await client.get(id).signal(go, 1)
        await eventually(lambda: len(db.steps()) > 200)
        w1.kill()
        for id in ids[150:]:
            await client.get(id).signal(go, 1)
        results = [await asyncio.wait_for(r.result(), 120) for r in runs]
    assert results == [i + 1 for i in range(300)]
    # Every step ran; one that ran twice began first on the killed worker
    # (it was in flight), and no survivor ran a step twice.
    by_step: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for name, id, step, what in db.steps():
        if what == "begin":
            by_step[(id, step)].append(name)
    assert set(by_step) == {(id, s) for id in ids for s in ("a", "b")}
    for key, names in by_step.items():
        if len(names) > 1:
            assert names[0] == "w1", (key, names)
            assert "w1" not in names[1:], (key, names)
    await assert_one_record_per_step(db, ids)


async def test_a_stopped_workers_late_writes_are_refused_once_its_lease_moved(
    db: Database,
) -> None:
    w1 = await db.start("w1", lease="1.5s")
    await db.start("w2", lease="1.5s")
    await eventually(lambda: _two_share(db))
    ids = [f"s-{i}" for i in range(20)]
    async with await fusee.Client.connect(db.url) as client:
        runs: list[fusee.Run[Any]] = [await client.start("slow", id, i) for i, id in enumerate(ids)]
        await eventually(lambda: any(n == "w1" and what == "begin" for n, _, _, what in db.steps()))
        w1.proc.send_signal(signal.SIGSTOP)
        try:
            await eventually(lambda: _all_held_by(db, "w2"))
            results = [await asyncio.wait_for(r.result(), 60) for r in runs]
        finally:
            w1.proc.send_signal(signal.SIGCONT)
        assert results == list(range(20))
        # Back, w1 finds its leases gone and drops those runs: its late step
        # results are refused, and nothing of them is recorded.
        err = await w1.stop()
        assert "lost shards" in err
        assert [await client.get(id).result() for id in ids] == list(range(20))
    await assert_one_record_per_step(db, ids)


async def test_a_stopping_worker_gives_its_shards_to_the_others_at_once(db: Database) -> None:
    await db.start("w1", lease="30s")
    w2 = await db.start("w2", lease="30s")
    await eventually(lambda: _two_share(db))
    await w2.stop()
    # Released, not left to run out (a 30 s lease): w1 takes them within seconds.
    await eventually(lambda: _all_held_by(db, "w1"), within_s=10)


async def test_a_bad_url_stops_a_worker_with_a_clear_error_and_no_password(
    postgres_cluster: Cluster, tmp_path: Path
) -> None:
    url = postgres_cluster.dsn_for("postgres", password="not-the-password")
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, str(HERE / "scale_worker.py"), url, "w", "2s", os.devnull],
        capture_output=True,
        text=True,
        timeout=60,
        input="",
    )
    assert proc.returncode != 0
    assert "StoreError" in proc.stderr
    assert "not-the-password" not in proc.stderr


async def _two_share(db: Database) -> bool:
    owners = await db.owners()
    return len(owners) == 2 and sum(owners.values()) == 64


async def _all_held_by(db: Database, name: str) -> bool:
    owners = await db.owners()
    return owners == collections.Counter({name: 64})


async def test_a_server_restart_mid_run_loses_nothing_acknowledged(
    db: Database, postgres_cluster: Cluster
) -> None:
    await db.start("w1", lease="10s")
    await db.start("w2", lease="10s")
    ids = [f"r-{i}" for i in range(60)]
    async with await fusee.Client.connect(db.url) as client:
        runs: list[fusee.Run[Any]] = [await client.start("job", id, i) for i, id in enumerate(ids)]
        for id in ids[:30]:
            await client.get(id).signal(go, 1)
        # The server restarts while the workers commit (fast shutdown: every
        # connection is cut, a commit in flight with it).
        await asyncio.to_thread(postgres_cluster.restart)
        for id in ids[30:]:
            await client.get(id).signal(go, 1)
        results = [await asyncio.wait_for(r.result(), 120) for r in runs]
    assert results == [i + 1 for i in range(60)]
    await assert_one_record_per_step(db, ids)
