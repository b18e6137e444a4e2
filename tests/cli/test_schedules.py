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
        assert row == {
            "name": "nightly",
            "workflow": "nightly_job",
            "state": "paused",
            "origin": "code",
            "spec": "cron 0 2 * * * Europe/Paris; overlap skip; catch_up 0s",
            "queue": None,
            "last_tick_at": None,
            "next_tick_at": row["next_tick_at"],
            "buffered_tick_at": None,
            "last_run": None,
        }
        assert row["next_tick_at"].endswith("01:00:00+00:00")

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


@fusee.workflow("greet")
async def greet(ctx: fusee.Ctx, name: str) -> str:
    return f"hello {name}"


@pytest.mark.asyncio
async def test_schedules_are_created_updated_backfilled_and_deleted_at_run_time(
    tmp_path: Path,
) -> None:
    data = str(tmp_path)
    async with await fusee.Engine.open(data, workflows=[greet], durability="none") as engine:
        code, out, err = await acli(
            "schedules", "create", "hi", "--workflow", "greet", "--every", "1h",
            "--input", '"ana"', "--data", data,
        )  # fmt: skip
        assert (code, out.strip()) == (0, "schedule 'hi' created"), err
        code, out, err = await acli(
            "schedules", "update", "hi", "--cron", "0 * * * *", "--input", '"bo"', "--data", data
        )
        assert (code, out.strip()) == (0, "schedule 'hi' updated"), err
        code, out, _ = await acli("schedules", "--data", data, "--json")
        [row] = json.loads(out)
        assert (row["origin"], row["spec"]) == (
            "runtime",
            "cron 0 * * * * UTC; overlap skip; catch_up 0s",
        )
        code, out, err = await acli(
            "schedules", "backfill", "hi", "--from", "2026-01-01T00:00:00+00:00",
            "--to", "2026-01-01T02:30:00+00:00", "--data", data,
        )  # fmt: skip
        assert (code, out.strip()) == (0, "schedule 'hi' backfilled 3 tick(s)"), err
        ids = sorted([i.id async for i in engine.list()])
        assert ids == [run_id("hi", 1_767_225_600_000 + h * 3_600_000) for h in range(3)]
        assert await engine.get(ids[0]).result() == "hello bo"
        code, out, err = await acli("schedules", "delete", "hi", "--data", data)
        assert (code, out.strip()) == (0, "schedule 'hi' deleted"), err

        code, _, err = await acli("schedules", "create", "x", "--every", "1h", "--data", data)
        assert "needs --workflow NAME" in one_line_error(err)
        code, _, err = await acli("schedules", "update", "x", "--data", data)
        assert "needs what to change" in one_line_error(err)
        code, _, err = await acli(
            "schedules", "backfill", "x", "--from", "soon", "--to", "later", "--data", data
        )
        assert "is not an ISO 8601 time" in one_line_error(err)
        code, _, err = await acli(
            "schedules", "create", "x", "--workflow", "greet", "--cron", "daily", "--data", data
        )
        assert code == 1
        assert "is not a cron expression" in one_line_error(err)


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
        assert (row["name"], row["workflow"], row["state"]) == ("yearly", "yearly_job", "active")
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
