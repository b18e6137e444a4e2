"""`fusee worker` and the commands it applies (start, signal, cancel, resume)."""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import asyncpg
import cli_workflows as wfs
import pytest
from _postgres import Cluster

from fusee.cli._inbox import worker_holder

from .conftest import MODULE, cli, eventually, one_line_error, worker


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
    assert worker_holder(tmp_path) is None


def test_a_worker_serves_the_queues_its_modules_define(tmp_path: Path) -> None:
    data = str(tmp_path)
    with worker(tmp_path) as log:
        assert log.wait_for("; queues orders;")
        for id in ("q-1", "q-2"):
            order = json.dumps({"id": id, "amount": 1})
            code, out, err = cli(
                "start", f"{MODULE}:gated", id, order, "--queue", "orders", "--data", data
            )
            assert (code, out.strip()) == (0, f"started run {id!r} (gated)"), err
        # One at a time (concurrency=1): q-2 waits for q-1's end.
        eventually(lambda: cli("queues", "--data", data, "--json")[1].count('"queued": 1') == 1)
        assert json.loads(cli("queues", "--data", data, "--json")[1])[0]["running"] == 1
        for id in ("q-1", "q-2"):
            code, _, err = cli("signal", id, "go", "true", "--data", data, "--timeout", "20")
            assert code == 0, err
            code, out, _ = cli("result", id, "--wait", "--timeout", "20", "--data", data)
            assert json.loads(out) == f"shipped FR-{id}"
        code, _, err = cli(
            "start", f"{MODULE}:greet", "g-9", '"x"', "--queue", "nope", "--data", data
        )
        assert code == 1
        assert "queue 'nope' is not one of this engine's queues ('orders')" in one_line_error(err)


def test_two_different_queues_of_one_name_stop_the_worker_with_a_clear_error(
    tmp_path: Path,
) -> None:
    for name, limit in (("qa", 1), ("qb", 2)):
        (tmp_path / f"{name}.py").write_text(
            f"import fusee\nmails = fusee.Queue('mails', concurrency={limit})\n"
        )
    code, _, err = cli(
        "worker", MODULE, str(tmp_path / "qa.py"), str(tmp_path / "qb.py"), "--data", str(tmp_path)
    )
    assert code == 1
    assert "two different queues are named 'mails'" in one_line_error(err)


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
        assert worker_holder(tmp_path) is not None
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
    assert worker_holder(tmp_path) is None


def test_the_worker_reports_a_run_that_pauses(tmp_path: Path) -> None:
    data = str(tmp_path)
    wfs.FLAKY_OK["ok"] = False
    with worker(tmp_path) as log:
        cli("start", f"{MODULE}:flaky", "flaky-1", "--data", data)
        assert log.wait_for(
            "flaky-1 (flaky) paused: step 'call' failed after 1 attempt(s): "
            "ConnectionError: still down; `fusee resume flaky-1` retries it"
        ), log.getvalue()
        wfs.FLAKY_OK["ok"] = True
        cli("resume", "flaky-1", "--data", data)
        assert log.wait_for("flaky-1 (flaky) completed: up"), log.getvalue()
    assert log.getvalue().count("flaky-1 (flaky) paused") == 1


def test_the_worker_shows_the_fusee_loggers_records_from_info_up(tmp_path: Path) -> None:
    logger = logging.getLogger("fusee")
    level, handlers = logger.level, list(logger.handlers)
    with worker(tmp_path) as log:
        logger.debug("too fine to show")
        logger.info("an engine note")
        logger.warning("run 'x' paused: step 'y' failed")
        assert log.wait_for("warning: run 'x' paused: step 'y' failed")
    text = log.getvalue()
    assert "info: an engine note" in text
    assert "too fine to show" not in text
    # Stopped, the worker leaves the logger as it found it.
    assert (logger.level, logger.handlers) == (level, handlers)


def test_a_worker_serves_a_postgres_store_and_the_commands_take_its_url(
    postgres_cluster: Cluster,
) -> None:
    name = postgres_cluster.new_name("cli_")

    async def create() -> None:
        conn = await asyncpg.connect(postgres_cluster.dsn)
        try:
            await conn.execute(f"CREATE DATABASE {name}")
        finally:
            await conn.close()

    asyncio.run(create())
    url = postgres_cluster.dsn_for(name)
    with worker(url) as log:
        assert postgres_cluster.password not in log.getvalue()
        assert log.wait_for(" of 64 shards")
        if "holds 64 of 64 shards" in log.getvalue():  # alone: nobody else serves any
            assert "other workers serve the rest" not in log.getvalue()
        order = '{"id": "o1", "amount": 3}'
        code, out, err = cli("start", f"{MODULE}:gated", "gated-1", order, "--store", url)
        assert (code, out.strip()) == (0, "started run 'gated-1' (gated)"), err
        code, out, err = cli("signal", "gated-1", "go", "true", "--store", url)
        assert (code, out.strip()) == (0, "signal 'go' delivered to run 'gated-1'"), err
        code, out, _ = cli("result", "gated-1", "--wait", "--timeout", "20", "--store", url)
        assert json.loads(out) == "shipped FR-o1"
        assert log.wait_for("gated-1 (gated) completed: shipped FR-o1")
    # What the commands print names the store without its password.
    for argv in (["show", "gated-1"], ["show", "nope"], ["check"], ["event", "nope", "k"]):
        code, out, err = cli(*argv, "--store", url)
        assert postgres_cluster.password not in out + err, argv
        assert "***@127.0.0.1" in out + err, (argv, out, err)


SETUP_MODULE = '''
import contextlib
import functools

import fusee

EVENTS: list[str] = []


class Greeter:
    """A service whose connection the worker's setup opens."""

    prefix: str | None = None

    def greet(self, name: str) -> str:
        if self.prefix is None:
            raise RuntimeError("the greeter is not set up")
        return f"{self.prefix} {name}"


greeter = Greeter()


@contextlib.asynccontextmanager
async def connected():
    greeter.prefix = "bonjour"
    EVENTS.append("entered")
    try:
        yield
    finally:
        greeter.prefix = None
        EVENTS.append("left")


def not_a_context_manager():
    return 3


@fusee.workflow("hail")
async def hail(ctx: fusee.Ctx, name: str) -> str:
    return await ctx.step("hail", functools.partial(greeter.greet, name))
'''


def test_a_workers_setup_builds_the_services_its_steps_use_and_closes_them(
    tmp_path: Path,
) -> None:
    module = tmp_path / "worker_setup_hook.py"
    module.write_text(SETUP_MODULE)
    data = str(tmp_path / "data")
    with worker(data, "--setup", "worker_setup_hook:connected", module=str(module)) as log:
        code, out, err = cli("start", f"{module}:hail", "h-1", '"ana"', "--data", data)
        assert code == 0, err
        code, out, _ = cli("result", "h-1", "--wait", "--timeout", "20", "--data", data)
        assert json.loads(out) == "bonjour ana"
        assert log.wait_for("h-1 (hail) completed: bonjour ana")
    # Entered once before the engine opened, left once after it closed.
    assert sys.modules["worker_setup_hook"].EVENTS == ["entered", "left"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param("worker_setup_bad", "--setup expects MODULE:FUNCTION", id="no-function"),
        pytest.param(
            "worker_setup_bad:nope",
            "module 'worker_setup_bad' has no function 'nope'",
            id="missing-function",
        ),
        pytest.param(
            "worker_setup_bad:not_a_context_manager",
            "it returned int, not an async context manager",
            id="not-a-context-manager",
        ),
    ],
)
def test_a_bad_setup_stops_the_worker_with_a_clear_error(
    tmp_path: Path, spec: str, message: str
) -> None:
    module = tmp_path / "worker_setup_bad.py"
    module.write_text(SETUP_MODULE)
    code, _, err = cli("worker", str(module), "--data", str(tmp_path), "--setup", spec)
    assert code == 1
    assert message in one_line_error(err)


def test_a_worker_given_a_version_starts_its_runs_on_it_and_its_retention_is_checked(
    tmp_path: Path,
) -> None:
    data = str(tmp_path)
    order = '{"id": "o1", "amount": 3}'
    with worker(tmp_path, "--version", "2026.12.1", "--retention", "30d") as log:
        assert "; version 2026.12.1;" in log.getvalue()
        code, _, err = cli("start", f"{MODULE}:gated", "gated-1", order, "--data", data)
        assert code == 0, err
        code, out, err = cli("versions", "--data", data, "--json")
        assert code == 0, err
        assert json.loads(out) == [
            {"version": "2026.12.1", "runs": 1, "workers": ["the serving engine"], "warning": None}
        ]
    code, _, err = cli("worker", MODULE, "--data", data, "--retention", "a month")
    assert code == 1
    assert "retention" in one_line_error(err)
