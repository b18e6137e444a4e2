"""`fusee schedules`: list a store's schedules; pause, resume, trigger them via the engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fusee

from .conftest import acli, one_line_error

pytestmark = pytest.mark.asyncio


@fusee.workflow("nightly_job")
async def nightly_job(ctx: fusee.Ctx) -> str:
    return "ran"


nightly = fusee.Schedule("nightly", nightly_job, cron="0 2 * * *", tz="Europe/Paris")


async def test_schedules_lists_pauses_resumes_and_triggers(tmp_path: Path) -> None:
    data = str(tmp_path)
    async with await fusee.Engine.open(
        data, workflows=[nightly_job], durability="none", schedules=[nightly]
    ) as engine:
        code, out, _ = await acli("schedules", "--data", data)
        assert code == 0
        assert "nightly" in out
        assert "active" in out

        code, out, err = await acli("schedules", "pause", "nightly", "--data", data)
        assert (code, out.strip()) == (0, "schedule 'nightly' paused"), err
        code, out, _ = await acli("schedules", "list", "--data", data, "--json")
        [row] = json.loads(out)
        assert (row["name"], row["workflow"], row["paused"]) == ("nightly", "nightly_job", True)

        code, out, err = await acli("schedules", "resume", "nightly", "--data", data)
        assert (code, out.strip()) == (0, "schedule 'nightly' resumed"), err
        code, out, err = await acli("schedules", "trigger", "nightly", "--data", data, "--json")
        assert code == 0, err
        answer = json.loads(out)
        assert answer["ok"]
        assert "started run 'nightly-manual-" in answer["message"]
        [info] = [i async for i in engine.list()]
        assert await engine.get(info.id).result() == "ran"

        code, _, err = await acli("schedules", "pause", "--data", data)
        assert code == 1
        assert "needs the schedule's NAME" in one_line_error(err)
        code, _, err = await acli("schedules", "pause", "nope", "--data", data)
        assert code == 1
        assert "no schedule 'nope'" in one_line_error(err)
