"""Run deadlines: a run whose `Start` carries ``deadline_ms`` is cancelled when it passes.

The deadline lives in the run's journal (its `Start` record), never in
memory alone: whichever worker loads the run (a start, a wake, a recovery,
a shard taken over) arms it again, and a run parked until after its
deadline is woken for it. Once the run's journal holds a `Cancel`, the
deadline has done its work (or a cancel came first): it is not armed again.

The rule: a deadline cancels as `Run.cancel` does, with the reason
`DEADLINE_EXCEEDED`, so compensation runs and the run ends ``cancelled``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from fusee.engine._timers import EXPIRE, RUN_DEADLINE
from fusee.errors import NotFound, RunFinished, StaleLease

if TYPE_CHECKING:
    from fusee.engine._state import RunState
    from fusee.engine._timers import Timers

__all__ = ["DEADLINE_EXCEEDED", "Deadlines", "capped"]

log = logging.getLogger("fusee.engine")

DEADLINE_EXCEEDED = "deadline exceeded"
"""The reason a run cancelled by its deadline is given."""


def capped(deadline_ms: int, parent_ms: int) -> int:
    """A child's deadline: its own, but never past its parent's (0 stands for none).

    Example:
        >>> capped(0, 5_000), capped(9_000, 5_000), capped(3_000, 0)
        (5000, 5000, 3000)
    """
    if not parent_ms:
        return deadline_ms
    if not deadline_ms:
        return parent_ms
    return min(deadline_ms, parent_ms)


class Deadlines:
    """Arms runs' deadlines on the engine's timers, and cancels the runs they pass.

    Args:
        timers: The engine's timers.
        spawn: Runs a coroutine as an engine task.
        cancel: Cancels a run (id, reason), routed to the worker serving it.
        loaded_run: The run number of the loaded run of an id, loading it if
            parked (None: finished).

    Example:
        See `fusee.engine.Engine`, which keeps one.
    """

    def __init__(
        self,
        *,
        timers: Timers,
        spawn: Callable[[Coroutine[Any, Any, Any]], object],
        cancel: Callable[[str, str], Awaitable[None]],
        loaded_run: Callable[[str], Awaitable[int | None]],
    ) -> None:
        self._timers = timers
        self._spawn = spawn
        self._cancel = cancel
        self._loaded_run = loaded_run

    def arm(self, state: RunState) -> None:
        """Arms the deadline of ``state``'s run, if it has one and was not cancelled."""
        deadline_ms = state.driver.machine.info().deadline_ms
        if deadline_ms and not state.cancelled:
            self._timers.arm(state.id, state.run, RUN_DEADLINE, deadline_ms, EXPIRE)

    def expire(self, id: str, run: int) -> None:
        """Run ``run`` of ``id`` reached its deadline: cancels it (the timers' callback)."""
        self._spawn(self._expire(id, run))

    async def _expire(self, id: str, run: int) -> None:
        # Its shard moved (its new owner arms the deadline again), or it
        # ended meanwhile: nothing is left to cancel.
        with contextlib.suppress(RunFinished, NotFound, StaleLease):
            if await self._loaded_run(id) != run:
                return  # ended, or a later run of the id (which has its own deadline)
            log.info("run %r passed its deadline: cancelling it", id)
            await self._cancel(id, DEADLINE_EXCEEDED)
