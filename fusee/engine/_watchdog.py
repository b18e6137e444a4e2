"""The watchdog: stops workflow code that blocks the loop too long, and reports it.

A thread looks at every loaded run's current turn, and at the inline step
running on the loop, a few times per limit; one older than the limit is
reported once, with the loop thread's stack. Workflow code still running
Python there is interrupted: the watchdog raises `fusee.WatchdogError`
(carrying that stack) inside the loop's thread, asynchronously
(``PyThreadState_SetAsyncExc``), so the runaway run fails like code that
raised it, and every other run goes on. Code blocked inside a C call (a
``time.sleep``, a lock, a socket read) cannot be interrupted: the error
lands when the call returns to Python. An inline step is only reported.

The rule: an interruption lands inside the turn it is aimed at, or nowhere.
The watchdog aims only while that turn runs (checked under `_AIMING`, after
telling the driver through ``driver.watch``) and only at the run's own code
(the loop thread's innermost frame is neither fusee's nor asyncio's); the
driver, ending the turn, clears an interruption still pending
(`Watchdog.turn_ended`).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from types import FrameType
from typing import TYPE_CHECKING

from fusee.errors import WatchdogError

if TYPE_CHECKING:
    from fusee._driver import RunDriver
    from fusee.engine._state import RunState

__all__ = ["Watchdog"]

log = logging.getLogger("fusee")

# Held while an interruption is aimed, and while a turn that was aimed at
# ends: the two never interleave.
_AIMING = threading.Lock()
# Frames of these directories are the engine's and asyncio's, never a run's code.
_MACHINERY = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
    os.path.dirname(asyncio.__file__) + os.sep,
)
# Raises an exception class in a thread at its next bytecode; with NULL,
# drops the one pending there.
_set_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
)
_clear_async_exc = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi)
)


def _interruption(message: str) -> type[WatchdogError]:
    """A `WatchdogError` class whose instances carry ``message``.

    The interpreter raises an asynchronous exception from its class alone,
    with no arguments: the message rides on a subclass of the same name.
    """

    class Interruption(WatchdogError):
        def __init__(self, *args: object) -> None:
            super().__init__(message)

    Interruption.__name__ = Interruption.__qualname__ = "WatchdogError"
    return Interruption


def _in_run_code(frame: FrameType | None) -> bool:
    """Whether the loop thread is running code of a run (not the engine's, not asyncio's)."""
    return frame is not None and not frame.f_code.co_filename.startswith(_MACHINERY)


class Watchdog:
    """Reports workflow code of ``runs()`` that runs ``limit_s`` without yielding.

    Args:
        runs: The loaded runs (called from the watchdog's thread: it must
            return a snapshot).
        limit_s: How long a turn may run.
        report: Called with each report's text (from the watchdog's thread).
        inline: The inline step running on the loop now, if any: (since,
            run id, step name), as `time.monotonic` counts.
        interrupt: Whether workflow code past the limit is interrupted with
            `fusee.WatchdogError` (its run fails), or only reported.

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
        interrupt: bool = True,
    ) -> None:
        self._runs = runs
        self._interrupt = interrupt
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

    def turn_ended(self, driver: RunDriver) -> None:
        """Called by ``driver`` ending a turn it was told of: drops an interruption not landed."""
        with _AIMING:
            driver.watch = None
            _clear_async_exc(self._thread_id, None)

    def _aim(self, driver: RunDriver, started: float, message: str) -> None:
        """Interrupts ``driver``'s turn that began at ``started``, if it still runs its code."""
        with _AIMING:
            driver.watch = self
            if driver.turn_started != started:
                return  # it ended: `turn_ended` may have run already
            if not _in_run_code(sys._current_frames().get(self._thread_id)):
                return  # in the engine's own code: aimed again on the next look
            _set_async_exc(self._thread_id, _interruption(message))

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
                if started is None or now - started < self._limit:
                    continue
                msg = (
                    f"workflow code of run '{state.id}' has run {now - started:.1f}s without "
                    "yielding; blocking work belongs in a step (await ctx.step(...)).\n"
                    + self._loop_stack()
                )
                if self._interrupt:
                    # Before the report, which code blocked on it may see first;
                    # again on every look while the turn lasts (code may catch it).
                    self._aim(state.driver, started, msg)
                if id(state) not in reported:
                    reported.add(id(state))
                    self._report(msg)
                    log.warning("%s", msg)
