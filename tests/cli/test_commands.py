"""`fusee list` and `fusee result`, read from a store an engine writes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import cli_workflows as wfs
import pytest

import fusee

from .conftest import acli, engine_on, one_line_error


@pytest.mark.asyncio
async def test_list_shows_runs_and_filters_them_while_the_engine_writes(tmp_path: Path) -> None:
    async with engine_on(tmp_path) as engine:
        await engine.execute(wfs.greet, "g-ana", "ana")
        await engine.execute(wfs.greet, "g-bo", "bo")
        await engine.start(wfs.gated, "gated-1", wfs.Order("o1", 5))

        code, out, _ = await acli("list", "--data", str(tmp_path))
        assert code == 0
        assert "g-ana" in out
        assert "g-bo" in out
        assert "gated-1" in out
        assert "completed" in out

        code, out, _ = await acli("list", "--data", str(tmp_path), "--attr", "customer=ana")
        assert "g-ana" in out
        assert "g-bo" not in out

        code, out, _ = await acli("--data", str(tmp_path), "list", "--json", "--workflow", "greet")
        rows = json.loads(out)
        assert [r["id"] for r in rows] == ["g-ana", "g-bo"]
        assert rows[0]["status"] == "completed"
        assert rows[0]["attributes"] == {"customer": "ana"}
        assert rows[0]["finished_at"] is not None

        code, out, _ = await acli(
            "list", "--data", str(tmp_path), "--json", "--status", "completed"
        )
        assert {r["id"] for r in json.loads(out)} == {"g-ana", "g-bo"}
        code, out, _ = await acli("list", "--data", str(tmp_path), "--json", "--limit", "1")
        assert len(json.loads(out)) == 1
        code, out, _ = await acli("list", "--data", str(tmp_path), "--attr", "amount=5", "--json")
        assert [r["id"] for r in json.loads(out)] == ["gated-1"]
        code, out, _ = await acli("list", "--data", str(tmp_path), "--workflow", "nope")
        assert code == 0
        assert "no runs match" in out


@pytest.mark.asyncio
async def test_result_prints_the_result_or_the_error(tmp_path: Path) -> None:
    async with engine_on(tmp_path) as engine:
        await engine.execute(wfs.greet, "g-1", "ana")
        with pytest.raises(fusee.WorkflowFailed):
            await engine.execute(wfs.boom, "b-1")
        run = await engine.start(wfs.gated, "c-1", wfs.Order("o1", 5))
        await run.cancel("changed my mind")
        with pytest.raises(fusee.Cancelled):
            await run.result()
        await engine.start(wfs.gated, "w-1", wfs.Order("o2", 5))

        code, out, _ = await acli("result", "g-1", "--data", str(tmp_path))
        assert (code, json.loads(out)) == (0, "hello ana")
        code, out, _ = await acli("result", "g-1", "--data", str(tmp_path), "--json")
        assert json.loads(out) == {
            "id": "g-1",
            "run": 1,
            "status": "completed",
            "result": "hello ana",
        }

        code, out, err = await acli("result", "b-1", "--data", str(tmp_path))
        assert code == 1
        assert "failed: KeyError: 'sku'" in one_line_error(err)
        code, out, _ = await acli("result", "b-1", "--data", str(tmp_path), "--json")
        assert code == 1
        assert json.loads(out)["error"]["type"] == "KeyError"

        code, _, err = await acli("result", "c-1", "--data", str(tmp_path))
        assert code == 1
        assert "cancelled: Cancelled: changed my mind" in one_line_error(err)

        code, _, err = await acli("result", "w-1", "--data", str(tmp_path))
        assert code == 1
        assert "pass --wait" in one_line_error(err)
        code, _, err = await acli(
            "result", "w-1", "--wait", "--timeout", "0.2", "--data", str(tmp_path)
        )
        assert code == 1
        assert "did not finish within 0.2s" in one_line_error(err)


@pytest.mark.asyncio
async def test_result_wait_returns_once_the_run_finishes(tmp_path: Path) -> None:
    async with engine_on(tmp_path) as engine:
        run = await engine.start(wfs.gated, "w-1", wfs.Order("o2", 5))
        argv = ["result", "w-1", "--wait", "--timeout", "30", "--data", str(tmp_path)]
        waiter = asyncio.create_task(acli(*argv))
        await run.signal(wfs.go, False)
        code, out, _ = await asyncio.wait_for(waiter, 30)
    assert (code, json.loads(out)) == (0, "rejected")
