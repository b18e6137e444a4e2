"""How the ``fusee`` command writes: rich text for people, JSON with ``--json``.

The rule: payloads, ids and names are printed as they are (rich markup is
off), and whatever JSON cannot hold is shown as text, never dropped.
"""

from __future__ import annotations

import datetime
import json
import os
from typing import IO, Any, Final, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from fusee._jsonview import iso, jsonable
from fusee.store import RunRow


class CliError(Exception):
    """A failure to report as one line on stderr, with exit status 1."""


class Output:
    """Where a command writes: rich text for people, or JSON with ``--json``."""

    def __init__(self, stdout: TextIO, stderr: TextIO, as_json: bool) -> None:
        self.stdout = stdout
        self.stderr = stderr
        self.json = as_json
        width = None if _isatty(stdout) else int(os.environ.get("COLUMNS", "120") or 120)
        # markup off: run ids, payloads and names are printed as they are.
        self.console = Console(
            file=stdout, markup=False, highlight=False, emoji=False, width=width, soft_wrap=False
        )

    def say(self, *parts: str | tuple[str, str]) -> None:
        """Prints a line made of plain strings and ``(text, style)`` pairs."""
        if not self.json:
            # Long lines stay whole (soft wrap): they are read and grepped as lines.
            self.console.print(Text.assemble(*parts), soft_wrap=True)

    def table(self, table: Table) -> None:
        self.console.print(table)

    def emit(self, value: Any, *, compact: bool = False) -> None:
        """Prints ``value`` as JSON (one line when ``compact``)."""
        text = json.dumps(value, ensure_ascii=False, indent=None if compact else 2)
        self.stdout.write(text + "\n")
        self.stdout.flush()

    def warn(self, message: str) -> None:
        self.stderr.write(f"fusee: warning: {message}\n")
        self.stderr.flush()

    def error(self, message: str) -> None:
        self.stderr.write(f"fusee: error: {message}\n")
        self.stderr.flush()


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def short(value: Any, limit: int | None = 120) -> str:
    """``value`` as text (JSON unless a string), cut to ``limit`` characters (None: whole)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def local_time(ms: int | None, *, date: bool = True) -> str:
    if ms is None:
        return ""
    t = datetime.datetime.fromtimestamp(ms / 1000)
    return t.strftime("%Y-%m-%d %H:%M:%S") if date else t.strftime("%H:%M:%S.%f")[:-3]


STATUS_STYLE: Final = {
    "running": "cyan",
    "suspended": "blue",
    "paused": "yellow",
    "completed": "green",
    "failed": "red",
    "cancelled": "magenta",
    "continued": "dim",
}


def row_json(row: RunRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "run": row.run,
        "workflow": row.workflow,
        "status": row.status,
        "started_at": iso(row.started_ms),
        "finished_at": iso(row.finished_ms),
        "wake_at": iso(row.wake_ms),
        "attributes": jsonable(dict(row.attributes)),
        "parent": row.parent,
        "error": row.error,
    }
