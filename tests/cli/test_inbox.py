"""The commands inbox the CLI posts to, and the writer lock: one engine writes a store."""

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

from .conftest import MODULE, acli, cli, engine_on, one_line_error, worker


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


@pytest.mark.asyncio
async def test_a_programs_own_engine_applies_the_commands_too(tmp_path: Path) -> None:
    data = str(tmp_path)
    async with engine_on(tmp_path) as engine:
        run = await engine.start(wfs.gated, "gated-1", wfs.Order("o1", 5))
        code, out, err = await acli("signal", "gated-1", "go", "true", "--data", data)
        assert (code, out.strip()) == (0, "signal 'go' delivered to run 'gated-1'"), err
        assert await run.result() == "shipped FR-o1"
        code, _, err = await acli("worker", MODULE, "--data", data)
        assert code == 1
        assert "open for writing in another process" in one_line_error(err)


@pytest.mark.asyncio
async def test_a_programs_own_engine_refuses_a_signal_payload_that_does_not_fit(
    tmp_path: Path,
) -> None:
    data = str(tmp_path)
    async with engine_on(tmp_path) as engine:
        run = await engine.start(wfs.gated, "gated-1", wfs.Order("o1", 5))
        code, out, err = await acli("signal", "gated-1", "go", '"yes"', "--data", data)
        assert (code, out) == (1, "")
        assert "payload does not fit the signal's type bool" in one_line_error(err)
        code, out, err = await acli("signal", "gated-1", "go", "true", "--data", data)
        assert (code, out.strip()) == (0, "signal 'go' delivered to run 'gated-1'"), err
        assert await run.result() == "shipped FR-o1"
    code, out, _ = await acli("show", "gated-1", "--json", "--data", data)
    records = json.loads(out)["records"]
    assert [r["payload"] for r in records if r["kind"] == "signal"] == [True]


def test_a_program_holding_the_writer_lock_keeps_a_worker_out(tmp_path: Path) -> None:
    with writer_lock(tmp_path):
        code, _, err = cli("worker", MODULE, "--data", str(tmp_path))
        assert code == 1
        assert f"(pid {os.getpid()}" in one_line_error(err)
        with (
            pytest.raises(fusee.StoreError, match="already writes the store"),
            writer_lock(tmp_path),
        ):
            pass
    assert worker_holder(tmp_path) is None


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


def _recorded_signals(data: str, id: str) -> list[str]:
    code, out, _ = cli("show", id, "--json", "--data", data)
    assert code == 0
    return [r["name"] for r in json.loads(out)["records"] if r["kind"] == "signal"]


def test_a_signal_no_workflow_declares_warns_and_is_still_delivered(tmp_path: Path) -> None:
    data = str(tmp_path)
    with worker(tmp_path) as log:
        order = '{"id": "o1", "amount": 3}'
        code, _, err = cli("start", f"{MODULE}:gated", "gated-1", order, "--data", data)
        assert code == 0, err
        code, out, err = cli("signal", "gated-1", "og", "true", "--data", data)
        assert code == 0, err
        assert out.strip() == "signal 'og' delivered to run 'gated-1'"
        assert err.startswith("fusee: warning: no workflow of this worker declares a signal 'og'")
        assert "(its modules define: 'go')" in err
        assert log.wait_for("? no workflow of this worker declares a signal 'og'")
        code, out, _ = cli(
            "signal", "gated-1", "og", "1", "--dedup", "d-2", "--json", "--data", data
        )
        assert code == 0
        reply = json.loads(out)
        assert (reply["ok"], reply["applied"]) == (True, True)
        assert "declares a signal 'og'" in reply["warning"]
        # A declared name: no warning.
        code, out, err = cli("signal", "gated-1", "go", "true", "--data", data)
        assert (code, err) == (0, "")
        cli("result", "gated-1", "--wait", "--timeout", "20", "--data", data)
    assert _recorded_signals(data, "gated-1") == ["og", "og", "go"]


def test_a_signal_payload_that_does_not_fit_its_type_is_refused_before_it_is_recorded(
    tmp_path: Path,
) -> None:
    data = str(tmp_path)
    with worker(tmp_path) as log:
        order = '{"id": "o1", "amount": 3}'
        cli("start", f"{MODULE}:gated", "gated-1", order, "--data", data)
        code, out, err = cli("signal", "gated-1", "go", '{"not": "a bool"}', "--data", data)
        assert code == 1
        assert "payload does not fit the signal's type" in one_line_error(err)
        assert out == ""
        assert log.wait_for("! signal 'go' to run 'gated-1' was not sent")
    assert _recorded_signals(data, "gated-1") == []
