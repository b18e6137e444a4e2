"""Reports of step attempts that run far past their expected time with no heartbeat.

An attempt is expected to end, or to heartbeat, within its
``heartbeat_timeout``, else its ``timeout``, else `SLOW_STEP_S` (60 s,
``FUSEE_SLOW_STEP`` or `StepExecutor.slow_step_s` to change it). One that
does neither is reported once, at WARNING, with its stack: the worker
thread's for a sync step, the task's for an async one. Inline steps run on
the loop and block it, so the engine's watchdog thread reports those, as it
does workflow code that does not yield.

The rule: a report only reads (the clock, the stack); it never stops or
changes an attempt. fusee cannot interrupt a sync step's thread.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import traceback
import types
from typing import TYPE_CHECKING, Any

from fusee._durations import parse_duration

if TYPE_CHECKING:
    from fusee._runtime import StepCall
    from fusee.engine._clock import Clock, TimerHandle
    from fusee.engine._state import RunState

__all__ = ["SLOW_STEP_S", "AttemptWatch", "coroutine_stack", "slow_step_default_s", "thread_stack"]

log = logging.getLogger("fusee")

SLOW_STEP_S = 60.0
"""How long an attempt of a step with neither ``heartbeat_timeout`` nor
``timeout`` may run with no heartbeat before it is reported."""


def slow_step_default_s() -> float:
    """`SLOW_STEP_S`, or the duration ``FUSEE_SLOW_STEP`` gives (e.g. ``"5m"``).

    Example:
        >>> slow_step_default_s() > 0
        True
    """
    value = os.environ.get("FUSEE_SLOW_STEP")
    return parse_duration(value) if value else SLOW_STEP_S


def expected_s(call: StepCall, default_s: float) -> float:
    """How long an attempt of ``call`` may go with no heartbeat before it is reported."""
    for limit in (call.heartbeat_timeout_s, call.timeout_s):
        if limit is not None:
            return float(limit)
    return default_s


def thread_stack(thread_id: int) -> str:
    """The stack of thread ``thread_id`` now, innermost call last ("" if it is gone).

    Example:
        >>> import threading
        >>> "thread_stack" in thread_stack(threading.get_ident())
        True
    """
    frame = sys._current_frames().get(thread_id)
    return "".join(traceback.format_stack(frame)) if frame is not None else ""


def coroutine_stack(task: asyncio.Future[Any] | None) -> str:
    """Where a task's coroutines wait, outermost first (what ``await`` leads to).

    Example:
        >>> async def main() -> str:
        ...     async def inner() -> None:
        ...         await asyncio.sleep(1)
        ...     t = asyncio.ensure_future(inner())
        ...     await asyncio.sleep(0)
        ...     text = coroutine_stack(t)
        ...     t.cancel()
        ...     return text
        >>> "in inner" in asyncio.run(main())
        True
    """
    if not isinstance(task, asyncio.Task):
        return ""
    frames = []
    coro: Any = task.get_coro()
    # Bounded: a chain is a few dozen awaits deep, and a local may lead back.
    for _ in range(200):
        if coro is None:
            break
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if isinstance(frame, types.FrameType):
            frames.append((frame, frame.f_lineno))
        inner = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        if inner is None and isinstance(frame, types.FrameType) and "coro" in frame.f_locals:
            # An eager step's rest, awaited through a plain ``yield``
            # (fusee.engine._steps._Resume): its coroutine is a local there.
            inner = frame.f_locals["coro"]
        coro = inner
    return "".join(traceback.StackSummary.extract(frames).format())


class AttemptWatch:
    """Watches one step attempt on the engine's clock and reports it once if it is slow.

    Args:
        clock: The engine's clock.
        state: The attempt's run.
        call: The step.
        sctx: The attempt's context (``beat_ms``: its last sign of life;
            ``live``; ``thread_id`` and ``task``: where its code runs).
        limit_s: How long it may go with no heartbeat.

    Example:
        See `fusee.engine._steps.StepExecutor`, which watches each attempt.
    """

    __slots__ = ("_call", "_clock", "_handle", "_limit_ms", "_sctx", "_started", "_state")

    def __init__(
        self, clock: Clock, state: RunState, call: StepCall, sctx: Any, limit_s: float
    ) -> None:
        self._clock = clock
        self._state = state
        self._call = call
        self._sctx = sctx
        self._limit_ms = max(1, round(limit_s * 1000))
        self._started = clock.now_ms()
        self._handle: TimerHandle | None = clock.call_at(
            self._started + self._limit_ms, self._check
        )

    def stop(self) -> None:
        """The attempt ended: nothing more to report."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        sctx = self._sctx
        if self._handle is None or not sctx.live:
            return
        last = max(self._started, sctx.beat_ms)
        now = self._clock.now_ms()
        if now - last < self._limit_ms:
            # It heartbeat meanwhile: watch on from its last sign of life.
            self._handle = self._clock.call_at(last + self._limit_ms, self._check)
            return
        self._handle = None
        thread_id = sctx.thread_id
        if thread_id:
            stack = thread_stack(thread_id)
            where = "its worker thread, which fusee cannot interrupt; it sees s.cancelled"
        else:
            stack = coroutine_stack(sctx.task)
            where = "its task"
        log.warning(
            "step '%s' of run '%s' (attempt %d) has run %.1fs with no heartbeat, past the "
            "%gs expected of it (its heartbeat_timeout, else its timeout, else "
            "FUSEE_SLOW_STEP); the stack of %s:\n%s",
            self._call.name,
            self._state.id,
            sctx.attempt,
            (now - last) / 1000,
            self._limit_ms / 1000,
            where,
            stack,
        )
