"""The schedule ticker: starts each `fusee.Schedule`'s runs at its ticks, on the engine's clock.

Each schedule's state is a row of the store (`fusee.store.ScheduleRow`),
shared by every worker and kept across restarts; each worker arms a timer
on its clock (the test host's virtual one included) for the next tick of
each schedule it was opened with. At a tick it reads the row again, so a
pause from elsewhere holds, and for each tick due since the last one claimed:

1. claims it (`claim_tick`: only the worker whose claim moved the row goes on);
2. skips it if the schedule is paused, or the tick is older than
   ``catch_up`` (plus ten seconds of lateness) before now;
3. applies ``overlap`` to the schedule's last run if it still runs;
4. starts run ``"{name}-{tick}"`` with `IdPolicy.REJECT`; `AlreadyExists`
   means it started already, and counts as done;
5. marks it done (``done_tick_ms``).

A crash between 1 and 5 leaves the claimed tick not done: the next open
starts it then (its run id makes a second start of it impossible).

The rule: a run id is derived from its tick alone, and every start goes
through the store's id uniqueness, so a tick starts at most one run however
many workers, restarts and triggers there are.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from fusee._schedule import Schedule, manual_run_id, run_id
from fusee._status import FINISHED_STATUSES
from fusee.engine._clock import TimerHandle
from fusee.engine._run import Run
from fusee.errors import AlreadyExists, FuseeError, NotFound, RunFinished
from fusee.store import ScheduleRow

if TYPE_CHECKING:
    from fusee._definitions import WorkflowDef
    from fusee.engine._engine import Engine

__all__ = ["LATE_MS", "Scheduler", "check_schedules"]

log = logging.getLogger("fusee")

# The state a tick changes, written once at its end.
_TICK_FIELDS: Final = ("done_tick_ms", "buffered_ms", "last_run")

LATE_MS: Final = 10_000
"""How late a tick may fire and still start with ``catch_up="0s"`` (a busy loop, a restart)."""


def check_schedules(
    workflows: Iterable[WorkflowDef[Any, Any]], schedules: Iterable[Schedule]
) -> dict[str, Schedule]:
    """The schedules by name, once each is a `fusee.Schedule` of one of ``workflows``.

    Checked before an engine opens its store, so a bad list opens nothing.

    Raises:
        TypeError: A value is not a `fusee.Schedule`.
        ValueError: Two share a name, or one's workflow is not among ``workflows``.

    Example:
        >>> check_schedules([], [])
        {}
    """
    by_name = {wf.name: wf for wf in workflows}
    out: dict[str, Schedule] = {}
    for s in schedules:
        if not isinstance(s, Schedule):
            raise TypeError(f"schedules=[...] takes fusee.Schedule values, not {s!r}")
        if s.name in out:
            raise ValueError(f"two schedules named '{s.name}' were given to one engine")
        if by_name.get(s.workflow.name) is not s.workflow:
            raise ValueError(
                f"schedule '{s.name}' starts workflow '{s.workflow.name}', which is not "
                "one this engine runs; pass it in workflows=[...] too"
            )
        out[s.name] = s
    return out


class Scheduler:
    """The schedules of one engine: its ticker, and pause, resume, trigger and list.

    Reach it as ``engine.schedules`` (``t.schedules`` on the test host).

    Example:
        >>> async def main(engine: Engine) -> None:
        ...     await engine.schedules.pause("nightly")
        ...     run = await engine.schedules.trigger("nightly")
        ...     print([row.name for row in await engine.schedules.list()])
    """

    def __init__(self, engine: Engine, schedules: Iterable[Schedule] = ()) -> None:
        self._engine = engine
        self._schedules = check_schedules(engine.workflows.values(), schedules)
        self._timers: dict[str, TimerHandle] = {}
        # The run each schedule started last, by run id: its end may start a buffered tick.
        self._last_runs: dict[str, str] = {}
        self._ticking: dict[str, asyncio.Lock] = {}
        self._stopped = False

    @property
    def names(self) -> list[str]:
        """The names of the schedules this engine ticks."""
        return sorted(self._schedules)

    # --- opening and closing -----------------------------------------------------------------

    async def open(self) -> None:
        """Reconciles the code's schedules with the store's rows, then arms their timers.

        A schedule new to the store ticks from now on (no tick before it was
        first opened runs); a changed one keeps its state and ticks on its new
        definition; a stored one the code no longer has is marked removed. An
        engine opened with no schedules leaves the stored ones as they are.
        """
        engine = self._engine
        if not self._schedules:
            # Nothing to tick: an engine without schedules (a worker of other
            # modules, a script) neither reads nor changes the stored ones.
            return
        now = engine.clock.now_ms()
        stored = {row.name: row for row in await engine.store.schedules()}
        for name, s in self._schedules.items():
            row = stored.get(name)
            if row is None:
                row = ScheduleRow(name, s.workflow.name, s.spec, last_tick_ms=now, done_tick_ms=now)
                await engine.store.put_schedule(row)
            elif row.spec != s.spec or row.workflow != s.workflow.name or row.removed:
                await engine.store.put_schedule(
                    ScheduleRow(name, s.workflow.name, s.spec, removed=False)
                )
            if row.last_run:
                self._last_runs[row.last_run] = name
            if row.done_tick_ms < row.last_tick_ms and not row.paused:
                # Claimed, then the worker stopped before it was done: start it now.
                id = run_id(name, row.last_tick_ms)
                await self._start(s, id)
                changes = {"done_tick_ms": row.last_tick_ms, "last_run": id}
                await engine.store.set_schedule(name, changes)
        for name, row in stored.items():
            if name not in self._schedules and not row.removed:
                await engine.store.put_schedule(
                    ScheduleRow(name, row.workflow, row.spec, removed=True)
                )
        for s in self._schedules.values():
            # Due ticks (missed while no worker ran) are looked at at once;
            # the tick then arms the timer of the next.
            engine.spawn(self._fire(s))

    def stop(self) -> None:
        """Cancels every timer (the engine closes or crashes)."""
        self._stopped = True
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

    # --- the ticker ------------------------------------------------------------------------

    def _arm(self, s: Schedule, at_ms: int) -> None:
        if self._stopped:
            return
        old = self._timers.pop(s.name, None)
        if old is not None:
            old.cancel()

        def due() -> None:
            self._timers.pop(s.name, None)
            self._engine.spawn(self._fire(s))

        self._timers[s.name] = self._engine.clock.call_at(at_ms, due)

    async def _fire(self, s: Schedule) -> None:
        engine = self._engine
        nxt = s.next_tick(engine.clock.now_ms())
        try:
            async with self._lock(s.name):
                await self.tick(s, nxt)
        except FuseeError as e:
            if engine.closed:
                return
            log.error(
                "schedule %r: a tick failed; it is tried again at the next one: %s", s.name, e
            )
        if not engine.closed:
            self._arm(s, nxt)

    def _lock(self, name: str) -> asyncio.Lock:
        lock = self._ticking.get(name)
        if lock is None:
            lock = self._ticking[name] = asyncio.Lock()
        return lock

    async def _row(self, name: str) -> ScheduleRow | None:
        for row in await self._engine.store.schedules():
            if row.name == name:
                return row
        return None

    async def tick(self, s: Schedule, next_ms: int = 0) -> None:
        """Starts the ticks of ``s`` due by now (what its timer does), noting ``next_ms``.

        Its state is written once, at the end, beside ``next_ms``: a tick
        costs one claim and one write besides its run's start. A crash
        before that write leaves the last claimed tick not done, which the
        next open starts (or finds started).
        """
        engine = self._engine
        store = engine.store
        row = await self._row(s.name)
        if row is None or row.removed:
            return
        before = row
        now = engine.clock.now_ms()
        if row.buffered_ms and not row.paused and not await self._is_running(row.last_run):
            row = await self._start_buffered(s, row)
        horizon = now - max(s.catch_up_ms, LATE_MS)
        # Ticks older than the horizon are skipped unseen: a long downtime
        # of a frequent schedule costs no work per missed tick.
        ticks = s.ticks(max(row.last_tick_ms, horizon - 1), now)
        for tick in ticks:
            if not await store.claim_tick(s.name, tick):
                continue  # another worker has it
            if not row.paused:
                row = await self._start_tick(s, row, tick)
            row = dataclasses.replace(row, done_tick_ms=tick)
        changes = {
            f: getattr(row, f) for f in _TICK_FIELDS if getattr(row, f) != getattr(before, f)
        }
        if next_ms and next_ms != before.next_ms:
            changes["next_ms"] = next_ms
        if changes:
            await store.set_schedule(s.name, changes)

    async def _start_tick(self, s: Schedule, row: ScheduleRow, tick: int) -> ScheduleRow:
        engine = self._engine
        previous = row.last_run
        if previous and s.overlap != "allow" and await self._is_running(previous):
            if s.overlap == "skip":
                return row
            if s.overlap == "buffer_one":
                if not row.buffered_ms:
                    return dataclasses.replace(row, buffered_ms=tick)
                return row
            # cancel_other: the newer tick wins.
            with contextlib.suppress(RunFinished, NotFound):
                await engine._cancel(previous, f"schedule '{s.name}' started a newer tick")
        id = run_id(s.name, tick)
        await self._start(s, id)
        return dataclasses.replace(row, last_run=id)

    async def _start_buffered(self, s: Schedule, row: ScheduleRow) -> ScheduleRow:
        id = run_id(s.name, row.buffered_ms)
        await self._start(s, id)
        return dataclasses.replace(row, buffered_ms=0, last_run=id)

    async def _start(self, s: Schedule, id: str) -> Run[Any]:
        engine = self._engine
        data = s.input_data
        # AlreadyExists: this tick's run started already, in another worker or before a crash.
        with contextlib.suppress(AlreadyExists):
            await engine.start(s.workflow, id, s.workflow.decode_input(data))
        self._last_runs[id] = s.name
        return Run(engine, id)

    async def _is_running(self, id: str) -> bool:
        if not id:
            return False
        try:
            info = await self._engine._describe(id)
        except NotFound:
            return False
        return info.status not in FINISHED_STATUSES

    def ended(self, id: str) -> None:
        """Run ``id`` ended: a tick its schedule buffered behind it starts now."""
        name = self._last_runs.get(id)
        if name is None or self._stopped:
            return
        s = self._schedules.get(name)
        if s is None or s.overlap != "buffer_one":
            return
        self._engine.spawn(self._after_end(s, id))

    async def _after_end(self, s: Schedule, id: str) -> None:
        async with self._lock(s.name):
            row = await self._row(s.name)
            if row is not None and row.buffered_ms and row.last_run == id and not row.paused:
                after = await self._start_buffered(s, row)
                changes = {"buffered_ms": 0, "last_run": after.last_run}
                await self._engine.store.set_schedule(s.name, changes)

    # --- pause, resume, trigger, list ------------------------------------------------------

    async def pause(self, name: str) -> None:
        """Pauses schedule ``name``: its ticks are skipped until `resume` (across workers).

        Raises:
            fusee.NotFound: The store has no schedule of that name.
        """
        await self._known(name)
        await self._engine.store.set_schedule(name, {"paused": True})

    async def resume(self, name: str) -> None:
        """Resumes schedule ``name``: its next tick starts; those skipped while paused do not.

        Raises:
            fusee.NotFound: The store has no schedule of that name.
        """
        await self._known(name)
        await self._engine.store.set_schedule(name, {"paused": False})

    async def trigger(self, name: str) -> Run[Any]:
        """Starts a run of schedule ``name`` now, whatever its ticks, overlap and pause.

        Its id is ``"{name}-manual-{now}"`` (`fusee._schedule.manual_run_id`).

        Raises:
            fusee.NotFound: This engine was not opened with that schedule.
        """
        s = self._schedules.get(name)
        if s is None:
            await self._known(name)
            raise NotFound(
                f"schedule '{name}' is not one this engine was opened with "
                f"({', '.join(self.names) or 'none'}); trigger it where it is"
            )
        async with self._lock(name):
            run = await self._start(s, manual_run_id(name, self._engine.clock.now_ms()))
            await self._engine.store.set_schedule(name, {"last_run": run.id})
        return run

    async def apply(self, name: str, action: str) -> dict[str, Any]:
        """Applies a Client's ``schedule`` command (``pause``, ``resume`` or ``trigger``).

        Returns:
            The answer's fields: a message, and a trigger's run id.

        Raises:
            ValueError: An action this engine does not know.
        """
        if action == "pause":
            await self.pause(name)
            return {"message": f"schedule {name!r} paused"}
        if action == "resume":
            await self.resume(name)
            return {"message": f"schedule {name!r} resumed"}
        if action == "trigger":
            run = await self.trigger(name)
            return {"message": f"schedule {name!r} started run {run.id!r}", "run_id": run.id}
        raise ValueError(f"schedule action {action!r} is not pause, resume or trigger")

    async def list(self) -> list[ScheduleRow]:
        """Every schedule row of the store (removed ones too), by name."""
        return await self._engine.store.schedules()

    async def _known(self, name: str) -> ScheduleRow:
        row = await self._row(name)
        if row is None:
            raise NotFound(
                f"no schedule '{name}' in this store; schedules are made by "
                "Engine.open(..., schedules=[fusee.Schedule(...)])"
            )
        return row
