"""`fusee queues` (fusee/cli/_queues.py), read-only, and `fusee start --queue`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import cli_workflows as wfs
import pytest

import fusee

from .conftest import MODULE, acli

pytestmark = pytest.mark.asyncio


async def test_queues_prints_queued_and_running_runs_per_queue_and_key(tmp_path: Path) -> None:
    code, out, _ = await acli("queues", "--data", str(tmp_path / "none"))
    assert code == 1
    q = fusee.Queue("orders", concurrency=1)
    async with await fusee.Engine.open(
        tmp_path, workflows=[wfs.gated], durability="none", queues=[q]
    ) as engine:
        for i, key in enumerate(["ada", "bo", "bo"]):
            await engine.start(wfs.gated, f"o-{i}", wfs.Order(f"o{i}", 5), queue=q, key=key)
        while [s.running for s in await engine.queue_stats()] != [1]:
            await asyncio.sleep(0.005)  # the admission runs meanwhile
        code, out, err = await acli(
            "start",
            "--data",
            str(tmp_path),
            f"{MODULE}:gated",
            "o-9",
            json.dumps({"id": "o9", "amount": 5}),
            "--queue",
            "orders",
            "--key",
            "bo",
        )
        assert code == 0, err
        code, out, _ = await acli("queues", "--data", str(tmp_path), "--json")
        assert code == 0
        assert json.loads(out) == [
            {
                "queue": "orders",
                "queued": 3,
                "running": 1,
                "keys": {
                    "ada": {"queued": 0, "running": 1},
                    "bo": {"queued": 3, "running": 0},
                },
            }
        ]
        code, out, _ = await acli("queues", "--data", str(tmp_path), "--keys")
        assert code == 0
        lines = [line.split() for line in out.strip().splitlines()]
        assert lines == [
            ["queue", "key", "queued", "running"],
            ["orders", "3", "1"],
            ["ada", "0", "1"],
            ["bo", "3", "0"],
        ]
        # A queued run has no journal yet: show says so, and its events are unset.
        code, out, _ = await acli("show", "o-1", "--data", str(tmp_path))
        assert code == 0
        assert "status queued" in out
        assert "queued: its journal starts when its queue admits it" in out
        code, _, err = await acli("event", "o-1", "progress", "--data", str(tmp_path))
        assert code == 1
        assert "has not set event 'progress' yet (queued)" in err
        code, _, err = await acli(
            "event", "o-1", "progress", "--wait", "--timeout", "0.2", "--data", str(tmp_path)
        )
        assert code == 1
        assert "did not set event 'progress' within 0.2s" in err
        await engine.get("o-1").cancel("no")
        await engine.get("o-2").cancel("no")
        await engine.get("o-9").cancel("no")
        await engine.get("o-0").cancel("no")
        with pytest.raises(fusee.Cancelled):
            await engine.get("o-0").result()
        while [s.running for s in await engine.queue_stats()] != [0]:
            await asyncio.sleep(0.005)  # the slot is freed meanwhile
    code, out, _ = await acli("queues", "--data", str(tmp_path))
    assert (code, out.strip()) == (0, "no queued or running runs in any queue")
