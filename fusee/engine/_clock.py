"""Clocks: the wall clock, and the virtual one of the test host.

The engine reads time and sets timers only through a clock, so the test
host can move time itself instead of waiting for it.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Clock", "VirtualClock", "WallClock"]


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Where the engine reads the time and sets its timers."""

    def now_ms(self) -> int:
        """Unix time in milliseconds."""
        ...

    def call_at(self, at_ms: int, callback: Callable[[], object]) -> TimerHandle:
        """Calls ``callback`` on the engine's loop once the clock reaches ``at_ms``."""
        ...


class WallClock:
    """The real clock: ``time.time()`` and the event loop's timers.

    Example:
        >>> WallClock().now_ms() > 1_600_000_000_000
        True
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        # The engine's loop: timers are set from inside workflow turns too,
        # where asyncio's running loop is the run's own.
        self.loop = loop
        # Every timer's callback runs in this one empty context: asyncio would
        # copy the arming code's context into each handle (64 bytes a parked
        # run keeps), and an engine's timer belongs to no caller's context.
        self._context = contextvars.Context()

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def call_at(self, at_ms: int, callback: Callable[[], object]) -> TimerHandle:
        loop = self.loop if self.loop is not None else asyncio.get_running_loop()
        delay = max(0.0, (at_ms - self.now_ms()) / 1000)
        return loop.call_later(delay, callback, context=self._context)


class _VirtualHandle:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], object]) -> None:
        self.callback: Callable[[], object] | None = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        # Stays in the heap until its time, as asyncio's handles do; like
        # theirs, it lets go of its callback and what that holds (a run).
        self.callback = None


class VirtualClock:
    """A clock that stands still until `advance` moves it (the test host's).

    Example:
        >>> c = VirtualClock(start_ms=1000)
        >>> fired = []
        >>> _ = c.call_at(1500, lambda: fired.append(c.now_ms()))
        >>> c.advance_to(2000)
        >>> fired
        [1500]
    """

    def __init__(self, start_ms: int | None = None) -> None:
        self._now = start_ms if start_ms is not None else WallClock().now_ms()
        self._heap: list[tuple[int, int, _VirtualHandle]] = []
        self._order = itertools.count()

    def now_ms(self) -> int:
        return self._now

    def call_at(self, at_ms: int, callback: Callable[[], object]) -> TimerHandle:
        h = _VirtualHandle(callback)
        heapq.heappush(self._heap, (at_ms, next(self._order), h))
        return h

    def next_at(self) -> int | None:
        """When the earliest pending timer is due, or None."""
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def advance_to(self, at_ms: int) -> None:
        """Moves time to ``at_ms``, calling each timer due by then at its own time."""
        while True:
            due = self.next_at()
            if due is None or due > at_ms:
                break
            _, _, h = heapq.heappop(self._heap)
            self._now = max(self._now, due)
            callback = h.callback
            assert callback is not None, "next_at drops cancelled timers"
            callback()
        self._now = max(self._now, at_ms)
