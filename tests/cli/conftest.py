"""Helpers of the CLI tests: the command run in-process, a worker in a thread, an engine."""

from __future__ import annotations

import asyncio
import contextlib
import io
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import cli_workflows as wfs
import pytest

import fusee
from fusee.cli import main

HERE = Path(__file__).parent.parent
MODULE = str(HERE / "cli_workflows.py")


@pytest.fixture(autouse=True)
def _wide_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """The width the command prints at when not on a terminal, whatever runs the suite.

    pytest-xdist's workers inherit ``COLUMNS=80`` from execnet; a test that
    checks the narrow layout sets its own.
    """
    monkeypatch.setenv("COLUMNS", "120")


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


class Terminal(Watch):
    """A `Watch` that says it is a terminal, as a shell's stdout does."""

    def isatty(self) -> bool:
        return True


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
async def engine_on(data: Path, **kw: Any) -> AsyncIterator[fusee.Engine]:
    workflows: list[fusee.WorkflowDef[Any, Any]] = [
        wfs.greet,
        wfs.ship,
        wfs.gated,
        wfs.boom,
        wfs.flaky,
        wfs.looper,
        wfs.download,
        wfs.deep_boom,
    ]
    async with await fusee.Engine.open(
        data, workflows=workflows, durability="none", **kw
    ) as engine:
        yield engine


@contextlib.contextmanager
def worker(data: Path | str, *extra: str, module: str = MODULE) -> Iterator[Watch]:
    """A `fusee worker` of ``module`` on ``data`` in a thread, stopped by a command at the end."""
    out = Watch()
    codes: list[int] = []
    where = "--store" if "://" in str(data) else "--data"
    argv = ["worker", module, where, str(data), "--durability", "none", "--max-seconds", "60"]

    def serve() -> None:
        codes.append(main([*argv, *extra], stdout=out, stderr=out))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert out.wait_for("fusee worker (pid"), out.getvalue()
    try:
        yield out
    finally:
        asyncio.run(_post_stop(data))
        thread.join(15)
        assert not thread.is_alive()
        assert codes == [0], out.getvalue()


async def _post_stop(data: Path | str) -> None:
    async with await fusee.Client.connect(data, durability="none") as client:
        await client.post("stop", "", {})
