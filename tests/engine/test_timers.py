"""Timers: one alarm per run position, the latest run's, cancelled at its run's end."""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from fusee.engine._clock import VirtualClock, WallClock
from fusee.engine._state import RunState, Shard
from fusee.engine._timers import TIMER, WAKE, Timers

pytestmark = pytest.mark.asyncio


@dataclass
class _Ended:
    """What `Shard.drop_timers_of` reads of a run's state."""

    id: str
    run: int
    due: dict[int, int] = field(default_factory=dict)


def _timers(shard: Shard, clock: VirtualClock, fired: list[tuple[str, int, int]]) -> Timers:
    def fire(id: str, run: int, seq: int, completion: Any) -> None:
        fired.append((id, run, seq))

    return Timers(clock, asyncio.get_running_loop(), lambda id: shard, fire, lambda id: None)


@pytest.mark.parametrize("at_ms", [5_000, 9_000], ids=["earlier", "later"])
async def test_a_later_runs_timer_replaces_an_earlier_runs_and_outlives_its_end(
    at_ms: int,
) -> None:
    # A replace may start run 2 of an id before run 1's end is settled
    # (SQLite answers a row from a write under way): run 1's timer, still
    # armed at the same position, must neither keep run 2's from being armed
    # nor take it down when run 1's end cancels its own.
    shard, clock = Shard(), VirtualClock(0)
    fired: list[tuple[str, int, int]] = []
    timers = _timers(shard, clock, fired)
    timers.arm("r", 1, 0, at_ms, TIMER)
    timers.arm("r", 2, 0, 7_000, TIMER)
    shard.drop_timers_of(cast(RunState, _Ended("r", 1, {0: at_ms})))
    clock.advance_to(10_000)
    assert fired == [("r", 2, 0)]
    assert shard.timers == {}


async def test_a_runs_end_cancels_its_timers_and_wake_up_only() -> None:
    shard, clock = Shard(), VirtualClock(0)
    fired: list[tuple[str, int, int]] = []
    timers = _timers(shard, clock, fired)
    timers.arm("a", 1, 0, 5_000, TIMER)
    timers.arm("a", 1, 3, 6_000, TIMER)
    timers.arm("a", 1, -1, 6_000, WAKE)
    timers.arm("b", 1, 0, 5_000, TIMER)
    shard.drop_timers_of(cast(RunState, _Ended("a", 1, {0: 5_000, 3: 6_000})))
    assert sorted(shard.timers) == [("b", 0)]
    clock.advance_to(10_000)
    assert fired == [("b", 1, 0)]


async def test_arming_a_runs_timer_again_keeps_the_first() -> None:
    # A parked run's timer stays armed; reloading it arms it again.
    shard, clock = Shard(), VirtualClock(0)
    fired: list[tuple[str, int, int]] = []
    timers = _timers(shard, clock, fired)
    timers.arm("a", 1, 0, 5_000, TIMER)
    first = shard.timers[("a", 0)]
    timers.arm("a", 1, 0, 5_000, TIMER)
    assert shard.timers[("a", 0)] is first
    clock.advance_to(5_000)
    assert fired == [("a", 1, 0)]


async def test_a_wall_clock_timer_runs_in_no_callers_context() -> None:
    # An engine's timer fires for no caller: it sees none of the context of
    # the code that armed it (nor keeps a copy of it while it waits).
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    var.set("the caller's")
    clock = WallClock(asyncio.get_running_loop())
    seen: list[str] = []
    fired = asyncio.Event()

    def ring() -> None:
        seen.append(var.get())
        fired.set()

    clock.call_at(clock.now_ms(), ring)
    await fired.wait()
    assert seen == ["unset"]
