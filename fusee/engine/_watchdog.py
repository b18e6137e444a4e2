"""The watchdog: reports workflow code, and inline steps, that block the loop too long.

A thread looks at every loaded run's current turn, and at the inline step
running on the loop, a few times per limit; one older than the limit is
reported once, with the loop thread's stack.

The rule: the watchdog only reads (turn start times, the stack) and
reports; it never stops or changes a run.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fusee.engine._state import RunState

__all__ = ["Watchdog"]

log = logging.getLogger("fusee")


class Watchdog:
    """Reports workflow code of ``runs()`` that runs ``limit_s`` without yielding.

    Args:
        runs: The loaded runs (called from the watchdog's thread: it must
            return a snapshot).
        limit_s: How long a turn may run.
        report: Called with each report's text (from the watchdog's thread).
        inline: The inline step running on the loop now, if any: (since,
            run id, step name), as `time.monotonic` counts.

    Example:
        >>> w = Watchdog(lambda: [], 1.0, print)
        >>> w.stop()
    """

    def __init__(
        self,
        runs: Callable[[], Iterable[RunState]],
        limit_s: float,
        report: Callable[[str], None],
        inline: Callable[[], tuple[float, str, str] | None] | None = None,
    ) -> None:
        self._runs = runs
        self._inline = inline
        self._limit = limit_s
        self._report = report
        self._thread_id = threading.get_ident()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fusee-watchdog", daemon=True)
        self._thread.start()

    def _loop_stack(self) -> str:
        frame = sys._current_frames().get(self._thread_id)
        return "".join(traceback.format_stack(frame)) if frame is not None else ""

    def stop(self) -> None:
        """Stops the thread and waits for it."""
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        reported: set[int] = set()
        inline_reported: tuple[float, str, str] | None = None
        while not self._stop.wait(self._limit / 4):
            now = time.monotonic()
            inline = self._inline() if self._inline is not None else None
            if inline is not None and inline != inline_reported and now - inline[0] >= self._limit:
                inline_reported = inline
                since, run_id, name = inline
                msg = (
                    f"inline step '{name}' of run '{run_id}' has blocked the loop for "
                    f"{now - since:.1f}s; a blocking step must not be inline (without "
                    "inline=True it runs in a worker thread).\n" + self._loop_stack()
                )
                self._report(msg)
                log.warning("%s", msg)
            for state in self._runs():
                started = state.driver.turn_started
                if started is None or now - started < self._limit or id(state) in reported:
                    continue
                reported.add(id(state))
                msg = (
                    f"workflow code of run '{state.id}' has run {now - started:.1f}s without "
                    "yielding; blocking work belongs in a step (await ctx.step(...)).\n"
                    + self._loop_stack()
                )
                self._report(msg)
                log.warning("%s", msg)
