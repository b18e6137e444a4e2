"""``fusee cancel`` and ``fusee resume`` over filters; ``fusee prune``."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import cli_workflows as wfs
import pytest

import fusee
from fusee.store import SqliteStore
from fusee.testing import TestEngine

from .conftest import acli, engine_on, one_line_error

pytestmark = pytest.mark.asyncio

_DAY_MS = 86_400_000


async def _status(engine: fusee.Engine, id: str, want: str) -> None:
    # The engine pauses the runs on its own time: polled, as a result is.
    for _ in range(1000):
        if (await engine.get(id).describe()).status == want:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"run {id!r} did not become {want}")


async def test_cancel_with_filters_cancels_each_matching_run_and_a_dry_run_changes_nothing(
    tmp_path: Path,
) -> None:
    data = str(tmp_path)
    async with engine_on(tmp_path) as engine:
        runs = [await engine.start(wfs.gated, f"gated-{n}", wfs.Order(f"o{n}", n)) for n in (1, 2)]
        assert await engine.execute(wfs.greet, "g-1", "ana") == "hello ana"
        code, out, err = await acli(
            "cancel", "--workflow", "gated", "--dry-run", "--json", "--data", data
        )
        assert code == 0, err
        assert json.loads(out) == {
            "action": "cancel",
            "dry_run": True,
            "count": 2,
            "ids": ["gated-1", "gated-2"],
            "skipped": {},
        }
        assert [(await r.describe()).status.is_finished for r in runs] == [False, False]
        code, out, err = await acli(
            "cancel", "--workflow", "gated", "--reason", "shop closed", "--data", data
        )
        assert code == 0, err
        assert out.splitlines() == ["cancelled 2 run(s)", "  gated-1", "  gated-2"]
        for run in runs:
            with pytest.raises(fusee.Cancelled, match="shop closed"):
                await run.result()
        assert (await engine.get("g-1").describe()).status == "completed"
        code, _, err = await acli("cancel", "gated-1", "--workflow", "gated", "--data", data)
        assert code == 1
        assert "not both" in one_line_error(err)
        code, _, err = await acli("cancel", "--data", data)
        assert code == 1
        assert "give a run ID, or filters" in one_line_error(err)


async def test_resume_with_filters_resumes_every_paused_run(tmp_path: Path) -> None:
    data = str(tmp_path)
    wfs.FLAKY_OK["ok"] = False
    try:
        async with engine_on(tmp_path) as engine:
            runs = [await engine.start(wfs.flaky, f"flaky-{n}") for n in (1, 2)]
            for run in runs:
                await _status(engine, run.id, "paused")
            wfs.FLAKY_OK["ok"] = True
            code, out, err = await acli(
                "resume", "--status", "paused", "--workflow", "flaky", "--data", data
            )
            assert code == 0, err
            assert out.splitlines()[0] == "resumed 2 run(s)"
            assert [await run.result() for run in runs] == ["up", "up"]
            # One id still resumes that run alone, as before.
            code, _, err = await acli("resume", "flaky-1", "--data", data)
            assert code == 1
            assert "has finished" in one_line_error(err)
    finally:
        wfs.FLAKY_OK["ok"] = False


async def test_prune_deletes_the_runs_that_ended_longer_ago_and_a_dry_run_counts_them(
    tmp_path: Path,
) -> None:
    data = str(tmp_path)
    # Two runs that ended two days ago, on a clock set back.
    now_ms = time.time_ns() // 1_000_000
    store = SqliteStore(tmp_path, durability="none")
    async with TestEngine([wfs.greet], store, start_ms=now_ms - 2 * _DAY_MS) as t:
        for name in ("ana", "bo"):
            await t.execute(wfs.greet, f"old-{name}", name)
    async with engine_on(tmp_path) as engine:
        assert await engine.execute(wfs.greet, "new-1", "cy") == "hello cy"
        waiting = await engine.start(wfs.gated, "gated-1", wfs.Order("o1", 5))
        code, out, err = await acli("prune", "--older-than", "1d", "--dry-run", "--data", data)
        assert (code, out.strip()) == (0, "would delete 2 finished run(s) that ended over 1d ago")
        code, out, err = await acli("prune", "--older-than", "1d", "--json", "--data", data)
        assert code == 0, err
        assert json.loads(out)["message"] == "deleted 2 finished run(s)"
        assert [info.id async for info in engine.list()] == ["new-1", "gated-1"]
        with pytest.raises(fusee.NotFound):
            await engine.get("old-ana").result()
        assert (await waiting.describe()).status.is_finished is False
        code, _, err = await acli("prune", "--older-than", "soon", "--data", data)
        assert code == 1
        assert "--older-than takes a duration" in one_line_error(err)
    # Gone for good: the engine's next life does not find them either.
    async with engine_on(tmp_path) as engine:
        assert sorted([info.id async for info in engine.list()]) == ["gated-1", "new-1"]
