"""`fusee show`: a run's journal as a timeline, `--full`, and `--follow` with progress bars."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import cli_workflows as wfs
import pytest

import fusee
from fusee.cli import main

from .conftest import Terminal, Watch, acli, engine_on, one_line_error


@pytest.mark.asyncio
async def test_show_prints_the_journal_as_a_timeline(tmp_path: Path) -> None:
    async with engine_on(tmp_path) as engine:
        run = await engine.start(wfs.gated, "gated-1", wfs.Order("o1", 5))
        await engine.start(wfs.boom, "boom-1")
        await run.signal(wfs.go, True)  # buffered until the code waits for it
        assert await run.result() == "shipped FR-o1"

    code, out, _ = await acli("show", "gated-1", "--data", str(tmp_path))
    assert code == 0
    for text in ("gated-1", "charge", "retrying", "ConnectionError", "nap", "signal", "child"):
        assert text in out, text
    assert "shipped FR-o1" in out

    code, out, _ = await acli("show", "gated-1", "--data", str(tmp_path), "--json")
    shown = json.loads(out)
    assert shown["run"]["status"] == "completed"
    kinds = [r["kind"] for r in shown["records"]]
    assert kinds[0] == "start"
    assert kinds[-1] == "done"
    for kind in ("attributes", "step", "attempt", "value", "timer", "fired", "wait", "signal"):
        assert kind in kinds, kind
    for kind in ("waited", "child", "child-done", "chunk", "stream-end"):
        assert kind in kinds, kind
    start = shown["records"][0]
    assert start["payload"] == {"id": "o1", "amount": 5}
    assert start["time"] is not None
    charge = next(r for r in shown["records"] if r["kind"] == "step")
    assert (charge["name"], charge["attempt"], charge["status"], charge["payload"]) == (
        "charge",
        2,
        "ok",
        5,
    )
    attempt = next(r for r in shown["records"] if r["kind"] == "attempt")
    assert attempt["payload"] == ["ConnectionError", "first try fails"]
    now = next(r for r in shown["records"] if r["kind"] == "value")
    assert now["name"] == "now"
    assert now["payload"].startswith("20")
    assert shown["records"][-1]["payload"] == "shipped FR-o1"
    assert [r["lsn"] for r in shown["records"]] == sorted(r["lsn"] for r in shown["records"])

    code, out, _ = await acli("show", "boom-1", "--data", str(tmp_path), "--json")
    done = json.loads(out)["records"][-1]
    assert done["status"] == "failed"
    assert done["payload"][:2] == ["KeyError", "'sku'"]

    code, _, err = await acli("show", "gated-1", "--run", "999", "--data", str(tmp_path))
    assert code == 1
    assert "run 999 of 'gated-1'" in one_line_error(err)


@pytest.mark.asyncio
async def test_show_follow_prints_records_as_they_land(tmp_path: Path) -> None:
    async with engine_on(tmp_path) as engine:
        run = await engine.start(wfs.gated, "gated-1", wfs.Order("o1", 5))
        out = Watch()
        argv = ["show", "gated-1", "--follow", "--data", str(tmp_path), "--max-seconds", "30"]
        follower = asyncio.create_task(asyncio.to_thread(main, argv, stdout=out, stderr=out))
        # The follower has printed the wait: only now does the signal arrive.
        assert await asyncio.to_thread(out.wait_for, "waiting"), out.getvalue()
        assert "signal" not in out.getvalue()
        await run.signal(wfs.go, True)
        assert await run.result() == "shipped FR-o1"
        assert await asyncio.wait_for(follower, 30) == 0
    text = out.getvalue()
    assert text.index("waiting") < text.index("signal") < text.index("child-done")
    assert "run 'gated-1' completed" in text


@pytest.mark.asyncio
async def test_show_follow_json_prints_one_record_per_line_across_continue_as_new(
    tmp_path: Path,
) -> None:
    async with engine_on(tmp_path) as engine:
        await engine.execute(wfs.looper, "loop-1", 0)
    code, out, _ = await acli("show", "loop-1", "-f", "--json", "--data", str(tmp_path))
    assert code == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert records[0]["kind"] == "start"
    assert records[-1]["kind"] == "done"
    assert records[-1]["payload"] == 2


@pytest.mark.asyncio
async def test_show_full_prints_a_failed_runs_whole_traceback(tmp_path: Path) -> None:
    async with engine_on(tmp_path) as engine:
        with pytest.raises(fusee.WorkflowFailed) as failed:
            await engine.execute(wfs.deep_boom, "boom-1")
    traceback = failed.value.traceback
    assert traceback.count("\n") >= 3
    assert len(traceback) > 200

    code, out, _ = await acli("show", "boom-1", "--data", str(tmp_path))
    assert code == 0
    assert "`fusee show boom-1 --full` prints the whole traceback" in out
    assert "Traceback (most recent call last):" not in out.splitlines()

    code, out, _ = await acli("show", "boom-1", "--full", "--data", str(tmp_path))
    assert code == 0
    printed = out.splitlines()
    assert "error: ValueError: the parts list is empty" in printed
    start = printed.index("Traceback (most recent call last):")
    assert printed[start:] == traceback.rstrip("\n").splitlines()


@pytest.mark.asyncio
async def test_show_prints_what_a_bug_that_paused_the_run_raised(tmp_path: Path) -> None:
    async with engine_on(tmp_path, on_error="pause") as engine:
        run = await engine.start(wfs.boom, "boom-1")
        for _ in range(1500):
            if (await run.describe()).status == "paused":
                break
            await asyncio.sleep(0.01)
        error = (await run.describe()).error
    assert error is not None

    # The engine has stopped: the command reads the error from the run's row.
    code, out, _ = await acli("show", "boom-1", "--data", str(tmp_path))
    assert code == 0
    assert "paused by a bug in its code: KeyError: 'sku'" in out
    assert "`fusee show boom-1 --full` prints the whole traceback" in out
    assert "`fusee resume boom-1` replays it on the new code" in out

    code, out, _ = await acli("show", "boom-1", "--full", "--data", str(tmp_path))
    printed = out.splitlines()
    start = printed.index("Traceback (most recent call last):")
    assert printed[start:-1] == error.rstrip("\n").splitlines()

    code, out, _ = await acli("show", "boom-1", "--data", str(tmp_path), "--json")
    shown = json.loads(out)["run"]
    assert (shown["status"], shown["error"]) == ("paused", error)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "argv", [pytest.param((), id="show"), pytest.param(("--follow",), id="follow")]
)
async def test_show_full_on_an_80_column_terminal_prints_the_traceback_lines_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...]
) -> None:
    async with engine_on(tmp_path) as engine:
        with pytest.raises(fusee.WorkflowFailed) as failed:
            await engine.execute(wfs.deep_boom, "boom-1")
    expected = failed.value.traceback.rstrip("\n").splitlines()
    assert max(len(line) for line in expected) > 80
    monkeypatch.setenv("COLUMNS", "80")
    out = Terminal()
    code = await asyncio.to_thread(
        main, ["show", "boom-1", "--full", *argv, "--data", str(tmp_path)], stdout=out, stderr=out
    )
    assert code == 0
    # Styles and the live display's line clears aside, each line is whole.
    printed = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\r", "", out.getvalue()).splitlines()
    start = printed.index("Traceback (most recent call last):")
    assert printed[start : start + len(expected)] == expected


async def _follow_download(tmp_path: Path, out: Watch) -> None:
    """Follows a `download` run into ``out`` while its step reports 1/4, then 75%."""
    wfs.GATES.update(half=asyncio.Event(), done=asyncio.Event())
    async with engine_on(tmp_path) as engine:
        run = await engine.start(wfs.download, "dl-1", 4)
        argv = ["show", "dl-1", "--follow", "--data", str(tmp_path), "--max-seconds", "30"]
        follower = asyncio.create_task(asyncio.to_thread(main, argv, stdout=out, stderr=out))
        assert await asyncio.to_thread(out.wait_for, "25%"), out.getvalue()
        wfs.GATES["half"].set()
        assert await asyncio.to_thread(out.wait_for, "75%"), out.getvalue()
        wfs.GATES["done"].set()
        assert await run.result() == 4
        assert await asyncio.wait_for(follower, 30) == 0


@pytest.mark.asyncio
async def test_show_follow_draws_a_bar_from_heartbeat_progress(tmp_path: Path) -> None:
    out = Watch()
    await _follow_download(tmp_path, out)
    bars = [ln.split() for ln in out.getvalue().splitlines() if ln.startswith("  progress")]
    # The step's name is journaled when it ends: until then, its position names it.
    assert [(b[1:3], b[4:]) for b in bars] == [
        (["step", "#0"], ["25%", "1/4"]),
        (["step", "#0"], ["75%"]),
    ]
    assert "run 'dl-1' completed" in out.getvalue()


@pytest.mark.asyncio
async def test_show_follow_on_a_terminal_draws_live_bars(tmp_path: Path) -> None:
    out = Terminal()
    await _follow_download(tmp_path, out)
    text = out.getvalue()
    assert "step #0" in text
    assert "1/4" in text
    assert "run 'dl-1' completed" in text


def counting(name: str) -> fusee.WorkflowDef[None, Any]:
    """A workflow made by a factory: only its wait knows its signal's type."""
    count = fusee.signal(f"{name}-count", int)

    @fusee.workflow(name)
    async def flow(ctx: fusee.Ctx) -> Any:
        return await ctx.wait_for(count)

    return flow


@pytest.mark.asyncio
async def test_show_marks_a_signal_its_wait_set_aside(tmp_path: Path) -> None:
    counter = counting("cli-counter")
    by_name = fusee.signal("cli-counter-count")
    async with await fusee.Engine.open(tmp_path, workflows=[counter], durability="none") as engine:
        run = await engine.start(counter, "c-1")
        await run.signal(by_name, "five")
        await run.signal(by_name, 5)
        assert await run.result() == 5

    code, out, _ = await acli("show", "c-1", "--data", str(tmp_path), "--json")
    assert code == 0
    records = json.loads(out)["records"]
    signals = [(r["payload"], r["status"]) for r in records if r["kind"] == "signal"]
    assert signals == [("five", "set aside"), (5, "")]
    assert [r["status"] for r in records if r["kind"] == "waited"] == ["signal #1"]
    code, out, _ = await acli("show", "c-1", "--data", str(tmp_path))
    assert "set aside" in out


note = fusee.signal("cli-note", str)
closing = fusee.signal("cli-close", bool)


@fusee.workflow("cli-notebook")
async def notebook(ctx: fusee.Ctx) -> list[str]:
    """Notes by a named handler, any other unknown signal by the dynamic one, until closed."""
    notes: list[str] = []
    ctx.on_signal(note, notes.append)
    ctx.on_signal(None, lambda name, payload: notes.append(f"{name}={payload}"))
    await ctx.wait_for(closing)
    return notes


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "crash", [pytest.param(False, id="live"), pytest.param(True, id="crashed")]
)
async def test_show_marks_a_signal_a_handler_got_as_handled(tmp_path: Path, crash: bool) -> None:
    async with await fusee.Engine.open(tmp_path, workflows=[notebook], durability="none") as e:
        run = await e.start(notebook, "nb-1")
        await run.signal(note, "first")
        await run.signal(fusee.signal("cli-ping"), 7)
    if crash:
        # Reopened: the code replays, its handlers get the signals again, marked once.
        async with await fusee.Engine.open(tmp_path, workflows=[notebook], durability="none") as e:
            await e.get("nb-1").signal(note, "second")
    async with await fusee.Engine.open(tmp_path, workflows=[notebook], durability="none") as e:
        await e.get("nb-1").signal(closing, True)
        notes = await e.get("nb-1").result()
    assert notes == ["first", "cli-ping=7", *(["second"] if crash else [])]

    code, out, _ = await acli("show", "nb-1", "--data", str(tmp_path), "--json")
    assert code == 0
    records = json.loads(out)["records"]
    signals = [(r["name"], r["status"]) for r in records if r["kind"] == "signal"]
    handled = [("cli-note", "handled"), ("cli-ping", "handled")]
    if crash:
        handled.append(("cli-note", "handled"))
    # The wait's own signal is consumed by the wait, as its `waited` line says.
    assert signals == [*handled, ("cli-close", "")]
    marks = [r["status"] for r in records if r["kind"] == "handled"]
    assert marks == [f"signal #{i}" for i in range(len(handled))]
    code, out, _ = await acli("show", "nb-1", "--data", str(tmp_path))
    assert "handled" in out
