"""The commands inbox and the writer lock: one engine writes a store."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import cli_workflows as wfs
import pytest

import fusee
from fusee.cli import writer_lock
from fusee.cli._inbox import worker_holder

from .conftest import MODULE, cli, engine_on, one_line_error, worker


def test_commands_wait_in_the_inbox_until_a_worker_starts(tmp_path: Path) -> None:
    async def make() -> None:
        async with engine_on(tmp_path) as engine:
            await engine.start(wfs.gated, "gated-1", wfs.Order("o1", 5))

    asyncio.run(make())
    data = str(tmp_path)
    code, out, _ = cli("signal", "gated-1", "go", "true", "--data", data)
    assert code == 0
    assert "no worker is running" in out
    assert "queued" in out
    code, out, _ = cli("start", f"{MODULE}:greet", "g-1", '"ana"', "--data", data, "--json")
    assert json.loads(out)["applied"] is False
    with worker(tmp_path) as log:
        code, out, _ = cli("result", "gated-1", "--wait", "--timeout", "20", "--data", data)
        assert json.loads(out) == "shipped FR-o1"
        code, out, _ = cli("result", "g-1", "--wait", "--timeout", "20", "--data", data)
        assert json.loads(out) == "hello ana"
        assert "1 unfinished run(s) recovered" in log.getvalue()
    assert list((tmp_path / "inbox").glob("*.json")) == []


def test_a_program_holding_the_writer_lock_is_not_sent_commands(tmp_path: Path) -> None:
    async def make() -> None:
        async with engine_on(tmp_path) as engine:
            await engine.start(wfs.gated, "gated-1", wfs.Order("o1", 5))

    asyncio.run(make())
    with writer_lock(tmp_path):
        code, _, err = cli("signal", "gated-1", "go", "true", "--data", str(tmp_path))
        assert code == 1
        assert "takes no commands" in one_line_error(err)
        code, _, err = cli("worker", MODULE, "--data", str(tmp_path))
        assert code == 1
        assert f"(pid {os.getpid()}" in one_line_error(err)
        with (
            pytest.raises(fusee.StoreError, match="already writes the store"),
            writer_lock(tmp_path),
        ):
            pass
    assert worker_holder(tmp_path) is None
    assert list((tmp_path / "inbox").glob("*.json")) == []


@pytest.mark.asyncio
async def test_a_second_engine_on_a_store_in_use_is_refused(tmp_path: Path) -> None:
    async with engine_on(tmp_path) as engine:
        await engine.start(wfs.gated, "gated-1", wfs.Order("o1", 5))
        opened: list[fusee.Engine] = []
        try:
            with pytest.raises(fusee.StoreError):
                opened.append(await fusee.Engine.open(tmp_path, workflows=[wfs.gated, wfs.ship]))
        finally:
            for second in opened:
                await second.close()
