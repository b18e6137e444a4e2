"""The `fusee` command, run in-process through `fusee.cli.main` (and once as a real process)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import cli_workflows as wfs
import pytest

import fusee
from fusee.cli import _post, _worker_holder, main, writer_lock

HERE = Path(__file__).parent
MODULE = str(HERE / "cli_workflows.py")


class Watch(io.StringIO):
    """An output stream a test can wait on, for commands running in another thread."""

    def __init__(self) -> None:
        super().__init__()
        self._changed = threading.Condition()

    def write(self, s: str) -> int:
        with self._changed:
            n = super().write(s)
            self._changed.notify_all()
            return n

    def wait_for(self, text: str, timeout: float = 15.0) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: text in self.getvalue(), timeout)


def eventually(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    """Polls ``condition`` (a state another thread reaches) until it holds."""
    pause = threading.Event()
    for _ in range(int(timeout / 0.02)):
        if condition():
            return
        pause.wait(0.02)
    raise AssertionError("the condition did not hold in time")


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


async def acli(*argv: str) -> tuple[int, str, str]:
    """`cli` from async code: the command runs its own event loop in a thread."""
    return await asyncio.to_thread(cli, *argv)


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("fusee: error: "), err
    assert "Traceback" not in err
    return lines[0]


@contextlib.asynccontextmanager
async def engine_on(data: Path) -> AsyncIterator[fusee.Engine]:
    workflows: list[fusee.WorkflowDef[Any, Any]] = [
        wfs.greet,
        wfs.ship,
        wfs.gated,
        wfs.boom,
        wfs.flaky,
        wfs.looper,
    ]
    async with await fusee.Engine.open(data, workflows=workflows, durability="none") as engine:
        yield engine


@contextlib.contextmanager
def worker(data: Path, *extra: str) -> Iterator[Watch]:
    """A `fusee worker` on ``data`` in a thread, stopped through its inbox at the end."""
    out = Watch()
    codes: list[int] = []
    argv = ["worker", MODULE, "--data", str(data), "--durability", "none", "--max-seconds", "60"]

    def serve() -> None:
        codes.append(main([*argv, *extra], stdout=out, stderr=out))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert out.wait_for("fusee worker (pid"), out.getvalue()
    try:
        yield out
    finally:
        _post(data, {"op": "stop", "id": ""})
        thread.join(15)
        assert not thread.is_alive()
        assert codes == [0], out.getvalue()


# --- list ----------------------------------------------------------------------------------------


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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["list", "--status", "bogus"], "is not a status", id="bad-status"),
        pytest.param(["list", "--attr", "novalue"], "KEY=VALUE", id="bad-attr"),
        pytest.param(["show", "nope"], "no run 'nope'", id="unknown-id"),
        pytest.param(["result", "nope"], "no run 'nope'", id="unknown-id-result"),
        pytest.param(["signal", "nope", "go", "true"], "no run 'nope'", id="unknown-id-signal"),
        pytest.param(["signal", "g-1", "go", "{bad"], "not valid JSON", id="bad-json"),
        pytest.param(["start", "nosuchmodule:wf", "x"], "No module named", id="unknown-module"),
        pytest.param(["start", MODULE + ":nope", "x"], "has no workflow 'nope'", id="unknown-wf"),
        pytest.param(["start", "no-colon", "x"], "MODULE:WORKFLOW", id="no-colon"),
        pytest.param(["start", MODULE + ":greet", "x", "5"], "does not fit", id="bad-input"),
        pytest.param(["start", MODULE + ":greet", "g-1", '"x"'], "exists", id="taken-id"),
        pytest.param(["replay", "nosuchmodule"], "cannot import", id="replay-module"),
        pytest.param(["cancel", "g-1"], "has finished", id="cancel-finished"),
    ],
)
def test_errors_are_one_line_on_stderr(tmp_path: Path, argv: list[str], message: str) -> None:
    async def make() -> None:
        async with engine_on(tmp_path) as engine:
            await engine.execute(wfs.greet, "g-1", "ana")

    asyncio.run(make())
    code, out, err = cli(*argv, "--data", str(tmp_path))
    assert code == 1
    assert message in one_line_error(err)
    assert out == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["list"], "no fusee store in", id="no-store"),
        pytest.param(["list", "--store", "memory"], "keeps nothing", id="memory"),
        pytest.param(
            ["list", "--store", "postgresql://db/x"],
            "cannot reach the Postgres server",
            id="postgres",
        ),
        pytest.param(["list", "--store", "x", "--data", "y"], "not both", id="both"),
        pytest.param(["signal", "a", "b"], "no fusee store in", id="signal-no-store"),
        pytest.param(["disk-check", "/nonexistent/dir"], "no directory", id="disk-no-dir"),
        pytest.param(["replay", "/nonexistent/mod.py"], "no module file", id="replay-no-file"),
    ],
)
def test_store_errors_are_one_line_on_stderr(tmp_path: Path, argv: list[str], message: str) -> None:
    empty = tmp_path / "empty"
    code, _, err = cli(
        *argv, *([] if {"--data", "--store"} & set(argv) else ["--data", str(empty)])
    )
    assert code == 1
    assert message in one_line_error(err)


def test_usage_errors_exit_2() -> None:
    code, _, err = cli("frobnicate")
    assert code == 2
    assert "invalid choice" in err
    code, out, _ = cli("--help")
    assert code == 0
    assert "worker" in out
    assert "inbox" in out


# --- show ----------------------------------------------------------------------------------------


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


# --- result --------------------------------------------------------------------------------------


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


# --- the worker and the commands that act on runs ------------------------------------------------


def test_worker_applies_start_signal_cancel_and_resume(tmp_path: Path) -> None:
    data = str(tmp_path)
    wfs.FLAKY_OK["ok"] = False
    with worker(tmp_path) as log:
        code, out, _ = cli("start", f"{MODULE}:greet", "g-1", '"ana"', "--data", data)
        assert (code, out.strip()) == (0, "started run 'g-1' (greet)")
        code, out, _ = cli("result", "g-1", "--wait", "--timeout", "20", "--data", data)
        assert json.loads(out) == "hello ana"
        assert log.wait_for("g-1 (greet) completed: hello ana")

        order = '{"id": "o1", "amount": 3}'
        code, out, _ = cli("start", f"{MODULE}:gated", "gated-1", order, "--data", data, "--json")
        assert json.loads(out)["applied"] is True
        code, out, _ = cli("signal", "gated-1", "go", "true", "--data", data)
        assert (code, out.strip()) == (0, "signal 'go' delivered to run 'gated-1'")
        code, out, _ = cli("result", "gated-1", "--wait", "--timeout", "20", "--data", data)
        assert json.loads(out) == "shipped FR-o1"

        cli("start", f"{MODULE}:gated", "gated-2", order, "--data", data)
        code, out, _ = cli("cancel", "gated-2", "--reason", "out of stock", "--data", data)
        assert (code, out.strip()) == (0, "run 'gated-2' cancelled")
        code, _, err = cli("result", "gated-2", "--wait", "--timeout", "20", "--data", data)
        assert "out of stock" in err

        cli("start", f"{MODULE}:flaky", "flaky-1", "--data", data)
        eventually(
            lambda: bool(json.loads(cli("list", "--status", "paused", "--json", "--data", data)[1]))
        )
        wfs.FLAKY_OK["ok"] = True
        code, out, _ = cli("resume", "flaky-1", "--data", data)
        assert (code, out.strip()) == (0, "run 'flaky-1' resumed")
        code, out, _ = cli("result", "flaky-1", "--wait", "--timeout", "20", "--data", data)
        assert json.loads(out) == "up"

        # A second worker on the same store is refused: one engine writes a store.
        code, _, err = cli("worker", MODULE, "--data", data)
        assert code == 1
        assert "already writes the store" in one_line_error(err)

        code, _, err = cli("signal", "g-1", "go", "true", "--data", data)
        assert code == 1
        assert "has finished (completed)" in one_line_error(err)
        code, out, _ = cli("signal", "gated-1", "go", "--data", data, "--no-wait")
        assert code == 1 or "queued" in out
    assert "> started run 'g-1' (greet)" in log.getvalue()
    assert _worker_holder(tmp_path) is None


def test_a_failed_command_is_reported_by_the_worker(tmp_path: Path) -> None:
    data = str(tmp_path)
    with worker(tmp_path):
        cli("start", f"{MODULE}:greet", "g-1", '"ana"', "--data", data)
        cli("result", "g-1", "--wait", "--timeout", "20", "--data", data)
        # Started again with a taken id, past the CLI's own check: the engine refuses.
        code, out, err = cli(
            "start", f"{MODULE}:greet", "g-1", '"bo"', "--id-policy", "attach", "--data", data
        )
        assert code == 0
        code, out, err = cli(
            "start", f"{MODULE}:greet", "g-1", '"bo"', "--id-policy", "replace", "--data", data
        )
        assert code == 0, err
        code, out, _ = cli("result", "g-1", "--wait", "--timeout", "20", "--data", data)
        assert json.loads(out) == "hello bo"


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
    assert _worker_holder(tmp_path) is None
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


# --- replay --------------------------------------------------------------------------------------

V1 = """
import fusee

@fusee.workflow("order")
async def order(ctx: fusee.Ctx, n: int) -> int:
    a = await ctx.step("reserve", lambda: n)
    await ctx.sleep("wait", "1h")
    return a
"""

V2 = """
import fusee

@fusee.workflow("order")
async def order(ctx: fusee.Ctx, n: int) -> int:
    a = await ctx.step("reserve", lambda: n)
    b = await ctx.step("charge", lambda: n)
    await ctx.sleep("wait", "1h")
    return a + b
"""


def test_replay_lists_each_divergence_with_its_position_and_line(tmp_path: Path) -> None:
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    v1, v2 = tmp_path / "v1" / "order_v1.py", tmp_path / "v2" / "order_v2.py"
    v1.write_text(V1)
    v2.write_text(V2)
    data = tmp_path / "data"

    async def make() -> None:
        async with engine_on(data) as engine:
            await engine.execute(wfs.greet, "g-1", "ana")
        order = _load(v1).order
        async with await fusee.Engine.open(data, workflows=[order], durability="none") as engine:
            await engine.start(order, "o-1", 1)
            await _until_timer(engine, "o-1")

    asyncio.run(make())
    code, out, _ = cli("replay", str(v1), "--data", str(data))
    assert code == 0, out
    assert "ok" in out
    assert "skipped" in out

    code, out, _ = cli("replay", str(v2), "--data", str(data))
    assert code == 1
    assert "diverged" in out
    assert "o-1" in out
    assert "journal position 1" in out
    assert f"{v2}:7" in out.replace("\n", "")

    code, out, _ = cli("replay", str(v2), "--data", str(data), "--json", "--id", "o-1")
    report = json.loads(out)
    assert report["problems"] == 1
    (o1,) = report["runs"]
    assert (o1["id"], o1["outcome"], o1["seq"]) == ("o-1", "diverged", 1)
    assert o1["location"] == f"{v2}:7"
    assert "step 'charge'" in o1["message"] or "step 'reserve'" in o1["message"]

    code, out, _ = cli("replay", MODULE, "--data", str(data), "--json")
    report = json.loads(out)
    assert code == 1  # o-1's workflow 'order' is unknown to that module, and o-1 is unfinished
    assert {r["id"]: r["outcome"] for r in report["runs"]} == {
        "g-1": "ok",
        "o-1": "unknown workflow",
    }


def _load(path: Path) -> Any:
    from fusee.cli import _import

    return _import(str(path))


async def _until_timer(engine: fusee.Engine, id: str) -> None:
    from fusee.record import Timer, decode

    while not any(isinstance(decode(d), Timer) for _, d in await engine.store.load(id)):
        await asyncio.sleep(0.01)


# --- disk-check ----------------------------------------------------------------------------------


def test_disk_check_prints_flush_latency(tmp_path: Path) -> None:
    code, out, _ = cli("disk-check", str(tmp_path), "--count", "5")
    assert code == 0
    assert "p50" in out
    assert "p99" in out
    assert "max" in out
    assert "µs" in out
    code, out, _ = cli("disk-check", str(tmp_path), "--count", "5", "--size", "512", "--json")
    report = json.loads(out)
    assert report["count"] == 5
    assert report["size"] == 512
    assert 0 < report["p50_us"] <= report["p99_us"] <= report["max_us"]
    assert list(tmp_path.iterdir()) == []


# --- the console script --------------------------------------------------------------------------


def test_the_console_script_and_python_m_fusee_run(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "fusee"
    env = {**os.environ, "COLUMNS": "120"}
    done = subprocess.run(
        [str(script), "list", "--data", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("fusee: error: no fusee store in")
    done = subprocess.run(
        [sys.executable, "-m", "fusee", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, f"fusee {fusee.__version__}")


def test_a_worker_process_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    worker = subprocess.Popen(
        [sys.executable, "-m", "fusee", "worker", MODULE, "--data", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert worker.stdout is not None
        for line in worker.stdout:
            lines.put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert "fusee worker (pid" in lines.get(timeout=30)
        assert _worker_holder(tmp_path) is not None
        _, out, _ = cli("start", f"{MODULE}:greet", "g-1", '"ana"', "--data", str(tmp_path))
        assert out.strip() == "started run 'g-1' (greet)"
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    finally:
        worker.kill()
        worker.wait(30)
        reader.join(30)
        assert worker.stdout is not None
        worker.stdout.close()
    rest = "".join(lines.get_nowait() for _ in range(lines.qsize()))
    assert "fusee worker stopped" in rest
    assert _worker_holder(tmp_path) is None
