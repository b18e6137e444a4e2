"""`fusee.cli.main`: the parser, one-line errors and exit statuses, the console script."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import cli_workflows as wfs
import pytest

import fusee

from .conftest import MODULE, cli, engine_on, one_line_error


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
            ["list", "--store", "postgresql://127.0.0.1:1/x"], "cannot reach", id="postgres"
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
