"""Runs an example as a process and reads its output line by line, with timeouts."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


class Example:
    """``python examples/NAME.py ARGS`` in ``cwd``, its output read as it comes.

    Example:
        >>> (EXAMPLES / "checkout.py").is_file()
        True
    """

    def __init__(self, name: str, *args: str, cwd: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-u", str(EXAMPLES / f"{name}.py"), *args],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, text: str, timeout: float = 30.0) -> str:
        """Reads lines until one contains ``text``; fails after ``timeout`` s without one."""
        while True:
            try:
                line = self._queue.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(
                    f"no line with {text!r} within {timeout}s; got:\n" + "\n".join(self.lines)
                ) from None
            if line is None:
                raise AssertionError(
                    f"the example ended without a line with {text!r}:\n" + "\n".join(self.lines)
                )
            self.lines.append(line)
            if text in line:
                return line

    def finish(self, timeout: float = 60.0) -> str:
        """Waits for the process to end; returns its whole output."""
        self.proc.wait(timeout)
        while True:
            line = self._queue.get(timeout=timeout)
            if line is None:
                break
            self.lines.append(line)
        self._close()
        return "\n".join(self.lines)

    def kill(self) -> None:
        """Kills the process (SIGKILL: no cleanup, as a crash)."""
        self.proc.kill()
        self.proc.wait(30)
        self._close()

    def _close(self) -> None:
        # The reader stops at the pipe's end; only then is the pipe closed.
        self._reader.join(30)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def run_example(name: str, *args: str, cwd: Path, timeout: float = 60.0) -> str:
    """Runs an example to its end; returns its output, checking it exited 0."""
    done = subprocess.run(
        [sys.executable, "-u", str(EXAMPLES / f"{name}.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout
