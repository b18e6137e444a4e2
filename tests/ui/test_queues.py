"""`GET /api/queues` (fusee/ui/_app.py): the figures of a store's queues as JSON."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from fusee.store import RunRow, SqliteStore
from fusee.store._queues import QueueItem, QueueLimits
from fusee.ui import create_app


@pytest.mark.asyncio
async def test_the_queues_route_gives_queued_and_running_runs_per_queue_and_key(
    tmp_path: Path,
) -> None:
    store = SqliteStore(tmp_path, durability="none")
    await store.open()
    try:
        for i, key in enumerate(["a", "b", "b"]):
            await store.enqueue(
                QueueItem("mail", f"m-{i}", 1, "send", b"\xc0", key=key),
                RunRow(f"m-{i}", 1, "send", "queued", 0),
            )
        await store.admit(QueueLimits("mail", concurrency=1), 0)
    finally:
        await store.close()
    with TestClient(create_app(str(tmp_path)), base_url="http://127.0.0.1:8700") as client:
        r = client.get("/api/queues")
    assert r.status_code == 200, r.text
    assert r.json() == [
        {
            "queue": "mail",
            "queued": 2,
            "running": 1,
            "keys": {"a": {"queued": 0, "running": 1}, "b": {"queued": 2, "running": 0}},
        }
    ]


@pytest.mark.asyncio
async def test_a_queued_runs_page_shows_it_queued_with_an_empty_journal(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path, durability="none")
    await store.open()
    try:
        await store.enqueue(
            QueueItem("mail", "m-1", 1, "send", b"\xc0"), RunRow("m-1", 1, "send", "queued", 0)
        )
    finally:
        await store.close()
    with TestClient(create_app(str(tmp_path)), base_url="http://127.0.0.1:8700") as client:
        r = client.get("/api/runs/m-1")
        assert r.status_code == 200, r.text
        detail = r.json()
        assert (detail["run"]["status"], detail["records"], detail["operations"]) == (
            "queued",
            0,
            [],
        )
        with client.stream("GET", "/api/runs/m-1/events") as events:
            assert events.status_code == 200
            first = next(line for line in events.iter_lines() if line.startswith("data:"))
    assert '"queued"' in first
