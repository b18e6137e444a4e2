"""Timers: a run's durable sleeps, its waits' deadlines, and parked runs' wake-ups.

Timers are rebuilt from journals on open (`Timer`, `Wait` records);
nothing else is persisted for them.

The rule: a timer names its run by id and number, never by its state: it
outlives parking and must not keep a parked run in memory.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from fusee.errors import StoreError
from fusee.machine import Completion, TimerFired, WaitTimedOut

if TYPE_CHECKING:
    from fusee.engine._clock import Clock, TimerHandle
    from fusee.engine._state import RunState, Shard

__all__ = ["DEADLINE", "EXPIRE", "RUN_DEADLINE", "TIMER", "WAKE", "Alarm", "Timers"]

# What an alarm does when its time comes: fire a timer, time a wait out,
# wake a parked run, or cancel a run whose deadline passed.
TIMER, DEADLINE, WAKE, EXPIRE = 0, 1, 2, 3

# The position a run's own deadline is armed at (-1 is its wake-up): below
# every operation's, so that it never takes an operation's place.
RUN_DEADLINE = -2


class Alarm:
    """A timer's callback: fires a run's timer or wait deadline, or wakes a parked run.

    A slotted object rather than closures: a parked run keeps one per timer,
    and a parked run's bytes add up over many runs. It knows its run: a
    shard holds one alarm per (id, position), and a later run of the id
    replaces an earlier one's.

    Example:
        See `Timers`, which arms them.
    """

    __slots__ = ("handle", "id", "kind", "run", "seq", "timers")

    def __init__(self, timers: Timers, id: str, run: int, seq: int, kind: int) -> None:
        self.timers = timers
        self.id = id
        self.run = run
        self.seq = seq
        self.kind = kind
        # The clock's handle, set once armed.
        self.handle: TimerHandle | None = None

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()

    def __call__(self) -> None:
        timers, id, seq = self.timers, self.id, self.seq
        shard = timers.shard_of(id)
        if shard.timers.at(id, seq) is not self:
            return  # disarmed, or replaced by a later run's timer at its position
        shard.timers.pop(id, seq)
        state = shard.runs.get(id)
        if state is not None:
            state.due.pop(seq, None)
        try:
            if self.kind == WAKE:
                timers.wake(id)
            elif self.kind == EXPIRE:
                timers.expire(id, self.run)
            else:
                completion = TimerFired() if self.kind == TIMER else WaitTimedOut()
                timers.fire(id, self.run, seq, completion)
        except StoreError:
            # The store failed for good (the engine said so once): nothing
            # this alarm would record can be written. The journal keeps the
            # timer, so the run's recovery arms it again.
            return


class Timers:
    """Arms and disarms the timers of every shard on the engine's clock.

    Args:
        clock: The engine's clock.
        loop: The engine's loop.
        shard_of: The shard of a run id.
        fire: Delivers a timer's or deadline's completion to a run.
        wake: Wakes a parked run (its earliest due time came).
        expire: Cancels a run whose deadline passed (its id and run number).

    Example:
        >>> import asyncio
        >>> from fusee.engine._clock import VirtualClock
        >>> from fusee.engine._state import Shard
        >>> async def main() -> list[str]:
        ...     shard, clock, woken = Shard(), VirtualClock(0), []
        ...     t = Timers(clock, asyncio.get_running_loop(), lambda id: shard,
        ...                lambda *a: None, woken.append)
        ...     t.arm("r-1", 1, -1, 5_000, WAKE)
        ...     clock.advance_to(5_000)
        ...     return woken
        >>> asyncio.run(main())
        ['r-1']
    """

    def __init__(
        self,
        clock: Clock,
        loop: asyncio.AbstractEventLoop,
        shard_of: Callable[[str], Shard],
        fire: Callable[[str, int, int, Completion], None],
        wake: Callable[[str], None],
        expire: Callable[[str, int], None] = lambda id, run: None,
    ) -> None:
        self.clock = clock
        self._loop = loop
        self.shard_of = shard_of
        self.fire = fire
        self.wake = wake
        self.expire = expire

    def arm(self, id: str, run: int, seq: int, at_ms: int, kind: int) -> None:
        """Sets a timer (`TIMER`), a wait's deadline (`DEADLINE`), a parked run's wake-up
        (`WAKE`, at -1) or a run's deadline (`EXPIRE`, at `RUN_DEADLINE`)."""
        shard = self.shard_of(id)
        state = shard.runs.get(id)
        # A run's deadline counts among its due times, so that a parked run
        # is woken for it (a wake-up does not: it is the parked run's own).
        if state is not None and seq != -1:
            state.due[seq] = at_ms
        armed = shard.timers.at(id, seq)
        if armed is not None:
            if armed.run == run:
                return
            # An earlier run of the id left it, its end not settled yet (a
            # replace started the new run meanwhile): the new run's wins.
            armed.cancel()
        alarm = Alarm(self, id, run, seq, kind)
        alarm.handle = self.clock.call_at(at_ms, alarm)
        shard.timers.put(alarm)

    def disarm(self, id: str, seq: int) -> None:
        """Cancels timer ``seq`` of run ``id`` (-1: its wake-up), if armed."""
        shard = self.shard_of(id)
        state = shard.runs.get(id)
        if state is not None:
            state.due.pop(seq, None)
        alarm = shard.timers.pop(id, seq)
        if alarm is not None:
            alarm.cancel()

    def disarm_waits(self, state: RunState) -> None:
        """Cancels the deadlines of every open wait of ``state``'s run."""
        for seq in list(state.waits):
            self.disarm(state.id, seq)

    async def sleep_until(self, at_ms: int) -> None:
        """Sleeps on the engine's clock until ``at_ms``."""
        fut: asyncio.Future[None] = self._loop.create_future()
        h = self.clock.call_at(at_ms, functools.partial(_settle, fut))
        try:
            await fut
        finally:
            h.cancel()


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
