"""`fusee schedules`: list a store's schedules; pause, resume, trigger them via the engine."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import fusee
from fusee._schedule import run_id
from fusee.cli import main
from fusee.cli._output import local_time
from fusee.store import SqliteStore
from fusee.testing import TestEngine

from .conftest import Watch, acli, cli, one_line_error


@fusee.workflow("nightly_job")
async def nightly_job(ctx: fusee.Ctx) -> str:
    return "ran"


nightly = fusee.Schedule("nightly", nightly_job, cron="0 2 * * *", tz="Europe/Paris")


@pytest.mark.asyncio
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


WORKER_MODULE = """
import fusee


@fusee.workflow("yearly_job")
async def yearly_job(ctx: fusee.Ctx) -> str:
    return "ran"


yearly = fusee.Schedule("yearly", yearly_job, cron="0 0 1 1 *")
"""


def test_a_worker_ticks_the_schedules_its_modules_define(tmp_path: Path) -> None:
    module = tmp_path / "scheduled_jobs.py"
    module.write_text(WORKER_MODULE)
    data = tmp_path / "data"
    with worker_of(str(module), data) as out:
        assert "schedules yearly" in out.getvalue()
        code, listed, _ = cli("schedules", "--data", str(data), "--json")
        [row] = json.loads(listed)
        assert (row["name"], row["workflow"], row["removed"]) == ("yearly", "yearly_job", False)
        code, answer, err = cli("schedules", "trigger", "yearly", "--data", str(data), "--json")
        assert code == 0, err
        assert json.loads(answer)["ok"]


@contextlib.contextmanager
def worker_of(module: str, data: Path) -> Iterator[Watch]:
    """`fusee worker MODULE` on ``data`` in a thread, stopped by a command at the end."""
    out = Watch()
    codes: list[int] = []
    argv = ["worker", module, "--data", str(data), "--durability", "none", "--max-seconds", "60"]
    thread = threading.Thread(target=lambda: codes.append(main(argv, stdout=out, stderr=out)))
    thread.start()
    assert out.wait_for("fusee worker (pid"), out.getvalue()
    try:
        yield out
    finally:
        asyncio.run(_stop(data))
        thread.join(15)
        assert codes == [0], out.getvalue()


async def _stop(data: Path) -> None:
    async with await fusee.Client.connect(data, durability="none") as client:
        await client.post("stop", "", {})


hourly = fusee.Schedule("hourly", nightly_job, every="1h")


@pytest.mark.asyncio
async def test_schedules_list_shows_the_last_tick_and_the_interval_as_written(
    tmp_path: Path,
) -> None:
    opened_ms = 1_767_225_600_000 + 30_000  # 2026-01-01T00:00:30Z: between two ticks
    async with TestEngine(
        workflows=[nightly_job],
        store=SqliteStore(tmp_path, durability="none"),
        schedules=[hourly],
        start_ms=opened_ms,
    ) as t:
        await t.settle()
        code, out, err = await acli("schedules", "--data", str(tmp_path))
        assert code == 0, err
        [row] = [line.split() for line in out.splitlines() if line.startswith("hourly")]
        # Not ticked yet: no last tick (the time it was first opened is none).
        assert local_time(opened_ms).split()[1] not in row
        assert row[:3] == ["hourly", "nightly_job", "active"]
        assert "every 1h; overlap skip; catch_up 0s" in out
        assert "3600000ms" not in out

        await t.advance("1h")
        await t.settle()
        tick_ms = opened_ms - 30_000 + 3_600_000
        code, out, err = await acli("schedules", "--data", str(tmp_path))
        assert code == 0, err
        [row] = [line.split() for line in out.splitlines() if line.startswith("hourly")]
        assert row[3:5] == local_time(tick_ms).split()
        assert run_id("hourly", tick_ms) in out
