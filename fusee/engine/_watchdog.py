"""The watchdog: reports workflow code that runs too long without yielding.

A thread looks at every loaded run's current turn a few times per limit;
a turn older than the limit is reported once, with the loop thread's stack.

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

    Example:
        >>> w = Watchdog(lambda: [], 1.0, print)
        >>> w.stop()
    """

    def __init__(
        self, runs: Callable[[], Iterable[RunState]], limit_s: float, report: Callable[[str], None]
    ) -> None:
        self._runs = runs
        self._limit = limit_s
        self._report = report
        self._thread_id = threading.get_ident()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fusee-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the thread and waits for it."""
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        reported: set[int] = set()
        while not self._stop.wait(self._limit / 4):
            now = time.monotonic()
            for state in self._runs():
                started = state.driver.turn_started
                if started is None or now - started < self._limit or id(state) in reported:
                    continue
                reported.add(id(state))
                frame = sys._current_frames().get(self._thread_id)
                stack = "".join(traceback.format_stack(frame)) if frame is not None else ""
                msg = (
                    f"workflow code of run '{state.id}' has run {now - started:.1f}s without "
                    "yielding; blocking work belongs in a step (await ctx.step(...)).\n" + stack
                )
                self._report(msg)
                log.warning("%s", msg)
