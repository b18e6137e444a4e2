"""Heartbeat progress drawn as bars, for ``fusee show --follow``.

The rule (documented in docs/cli.md): a running step's last heartbeat
progress (``s.heartbeat(progress)``) draws a bar when it is a number in
[0, 1] (the fraction done), or a mapping with ``"pct"`` (a number in [0,
100]) or with ``"done"`` and ``"total"`` (numbers, total above 0). Any other
value draws no bar; its heartbeat row in the timeline shows it as it is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeGuard

from rich.progress import BarColumn, Progress, TaskID, TaskProgressColumn, TextColumn
from rich.progress_bar import ProgressBar
from rich.table import Table

from fusee.cli._output import Output


def _number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def fraction(progress: Any) -> tuple[float, str] | None:
    """The fraction done that ``progress`` says and a label for it, or None for no bar.

    Example:
        >>> fraction(0.25), fraction({"pct": 50}), fraction({"done": 3, "total": 4})
        ((0.25, ''), (0.5, ''), (0.75, '3/4'))
        >>> fraction("downloading") is None, fraction(7) is None, fraction(True) is None
        (True, True, True)
    """
    if _number(progress):
        return (float(progress), "") if 0 <= progress <= 1 else None
    if isinstance(progress, Mapping):
        pct = progress.get("pct")
        if _number(pct) and 0 <= pct <= 100:
            return pct / 100, ""
        done, total = progress.get("done"), progress.get("total")
        if _number(done) and _number(total) and total > 0 and done >= 0:
            return min(1.0, done / total), f"{done:g}/{total:g}"
    return None


class Bars:
    """The bars of the steps running now: live on a terminal, else a line per change.

    On a terminal the bars stay under the timeline (rich's live display) and
    vanish when their step ends; printed to a file or a pipe, a bar is a line
    of its own each time its progress changes, so a log keeps every state.
    """

    def __init__(self, out: Output) -> None:
        self.out = out
        self._drawn: dict[int, tuple[str, float, str]] = {}
        self._tasks: dict[int, TaskID] = {}
        self._live: Progress | None = None
        if out.console.is_terminal:
            self._live = Progress(
                TextColumn("  {task.description}"),
                BarColumn(),
                TaskProgressColumn(),
                TextColumn("{task.fields[label]}"),
                console=out.console,
                transient=True,
            )
            self._live.start()

    def draw(self, running: Mapping[int, tuple[str, Any]]) -> None:
        """Shows the progress of the steps running now (journal position -> (name, progress))."""
        now: dict[int, tuple[str, float, str]] = {}
        for seq, (name, progress) in running.items():
            got = fraction(progress)
            if got is not None:
                now[seq] = (name, *got)
        if self._live is not None:
            for seq in [s for s in self._tasks if s not in now]:
                self._live.remove_task(self._tasks.pop(seq))
            for seq, (name, done, label) in now.items():
                if seq not in self._tasks:
                    self._tasks[seq] = self._live.add_task(name, total=1.0, label=label)
                self._live.update(self._tasks[seq], completed=done, label=label)
        else:
            changed = [seq for seq, bar in now.items() if self._drawn.get(seq) != bar]
            if changed:
                grid = Table.grid(padding=(0, 2))
                for _ in range(5):
                    grid.add_column(no_wrap=True)
                for seq in changed:
                    name, done, label = now[seq]
                    bar = ProgressBar(total=1.0, completed=done, width=30)
                    grid.add_row("  progress", name, bar, f"{done:4.0%}", label)
                self.out.table(grid)
        self._drawn = now

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
