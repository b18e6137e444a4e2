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

Schedules made at run time (`Scheduler.create`, from the Client, the CLI or
the UI) are rows too, with their input: every engine that runs their
workflow ticks them, from its next open, or at once when it made them, and a
change or a deletion from elsewhere is seen at its next tick. A worker
adopts the ones made elsewhere at each tick of its own and once a minute on
a shared store. `Scheduler.backfill` starts the runs of past ticks under
the same ids, so a backfilled tick never starts twice either.

The rule: a run id is derived from its tick alone, and every start goes
through the store's id uniqueness, so a tick starts at most one run however
many workers, restarts and triggers there are.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

from fusee._schedule import Schedule, manual_run_id, parse_spec, run_id
from fusee._status import FINISHED_STATUSES
from fusee.engine._clock import TimerHandle
from fusee.engine._leases import is_shared
from fusee.engine._run import Run
from fusee.errors import AlreadyExists, FuseeError, NotFound, RunFinished
from fusee.store import ScheduleRow

if TYPE_CHECKING:
    from fusee._definitions import WorkflowDef
    from fusee._queue import Queue
    from fusee._schedule import Overlap
    from fusee.engine._clock import Clock
    from fusee.remote import RunInfo
    from fusee.store import Store

__all__ = ["BACKFILL_MAX", "LATE_MS", "Scheduler", "check_schedules"]

log = logging.getLogger("fusee")

# The state a tick changes, written once at its end.
_TICK_FIELDS: Final = ("done_tick_ms", "buffered_ms", "last_run", "ticked_ms")

LATE_MS: Final = 10_000
"""How late a tick may fire and still start with ``catch_up="0s"`` (a busy loop, a restart)."""

BACKFILL_MAX: Final = 10_000
"""The most ticks one `Scheduler.backfill` starts: a longer range is refused, to be split."""

_ADOPT_MS: Final = 60_000
"""How often a worker of a shared store looks for schedules made at run time elsewhere."""

# The keyword arguments of `Scheduler.update` left as they are.
_KEEP: Final[Any] = object()

# What `Scheduler.update` may change, as `fusee.Schedule` names them.
_UPDATABLE: Final = ("cron", "every", "tz", "input", "overlap", "catch_up", "queue")


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


class StartTick(Protocol):
    """Starts run ``id`` of a schedule's tick ``tick_ms`` on ``queue`` (`Engine.start_tick`)."""

    def __call__(
        self, wf: WorkflowDef[Any, Any], id: str, data: bytes, *, queue: str | None, tick_ms: int
    ) -> Awaitable[None]: ...


class Scheduler:
    """The schedules of one engine: its ticker, and pause, resume, trigger and list.

    Reach it as ``engine.schedules`` (``t.schedules`` on the test host).

    Example:
        >>> async def main(engine: Engine) -> None:
        ...     await engine.schedules.pause("nightly")
        ...     run = await engine.schedules.trigger("nightly")
        ...     print([row.name for row in await engine.schedules.list()])
    """

    def __init__(
        self,
        schedules: Iterable[Schedule] = (),
        *,
        store: Store,
        clock: Clock,
        workflows: Mapping[str, WorkflowDef[Any, Any]],
        workflow: Callable[[WorkflowDef[Any, Any] | str], WorkflowDef[Any, Any]],
        resolve_queue: Callable[[str | None, bool], Queue],
        spawn: Callable[[Coroutine[Any, Any, Any]], object],
        closed: Callable[[], bool],
        check_open: Callable[[], None],
        start_tick: StartTick,
        cancel: Callable[[str, str], Awaitable[None]],
        describe: Callable[[str], Awaitable[RunInfo]],
        handle: Callable[[str], Run[Any]],
    ) -> None:
        self._store = store
        self._clock = clock
        self._workflows = workflows
        self._workflow_of = workflow
        self._resolve_queue = resolve_queue
        self._spawn = spawn
        self._closed = closed
        self._check_open = check_open
        self._tick_start = start_tick
        self._cancel_run = cancel
        self._describe_run = describe
        self._handle = handle
        self._schedules = check_schedules(workflows.values(), schedules)
        # The names of the schedules of this engine's code (the others were made at run time).
        self._in_code = frozenset(self._schedules)
        self._timers: dict[str, TimerHandle] = {}
        # The run each schedule started last, by run id: its end may start a buffered tick.
        self._last_runs: dict[str, str] = {}
        self._ticking: dict[str, asyncio.Lock] = {}
        self._stopped = False

    @property
    def names(self) -> list[str]:
        """The names of the schedules this engine ticks (run-time ones it adopted too)."""
        return sorted(self._schedules)

    # --- opening and closing -----------------------------------------------------------------

    async def open(self) -> None:
        """Reconciles the code's schedules with the store's rows, then arms their timers.

        A schedule new to the store ticks from now on (no tick before it was
        first opened runs); a changed one keeps its state and ticks on its new
        definition; a stored one the code no longer has is marked removed. An
        engine opened with no schedules leaves the stored ones as they are, and
        looks for the ones made at run time in the background.
        """
        if not self._in_code:
            # Nothing of its own to reconcile: opening waits for no read.
            self._spawn(self._adopt_new(first=True))
            return
        for s in self._schedules.values():
            if s.queue_name is not None:
                self._resolve_queue(s.queue_name, False)
        now = self._clock.now_ms()
        stored = {row.name: row for row in await self._store.schedules()}
        for found in stored.values():
            if found.name not in self._in_code:
                self._adopt(found)
        for name, s in self._schedules.items():
            if name not in self._in_code:
                continue
            row = stored.get(name)
            if row is None:
                row = ScheduleRow(name, s.workflow.name, s.spec, last_tick_ms=now, done_tick_ms=now)
                await self._store.put_schedule(row)
            elif (
                row.spec != s.spec or row.workflow != s.workflow.name or row.removed or row.dynamic
            ):
                await self._store.put_schedule(
                    ScheduleRow(name, s.workflow.name, s.spec, removed=False)
                )
            if row.last_run:
                self._last_runs[row.last_run] = name
        for name, s in self._schedules.items():
            claimed = stored.get(name)
            if claimed is not None:
                await self._finish_claimed(s, claimed)
        for name, row in stored.items():
            if name not in self._schedules and not row.removed and not row.dynamic:
                await self._store.put_schedule(
                    ScheduleRow(name, row.workflow, row.spec, removed=True)
                )
        for s in self._schedules.values():
            # Due ticks (missed while no worker ran) are looked at at once;
            # the tick then arms the timer of the next.
            self._spawn(self._fire(s))
        if is_shared(self._store):
            self._arm_adopting()

    async def _finish_claimed(self, s: Schedule, row: ScheduleRow) -> None:
        """Starts the tick ``row`` claimed if its worker stopped before starting it."""
        if row.done_tick_ms < row.last_tick_ms and not row.paused:
            tick = row.last_tick_ms
            id = run_id(s.name, tick)
            await self._start(s, id, tick)
            changes = {"done_tick_ms": tick, "last_run": id, "ticked_ms": tick}
            await self._store.set_schedule(s.name, changes)

    def _adopt(self, row: ScheduleRow) -> Schedule | None:
        """Takes run-time schedule ``row`` on, if this engine runs its workflow; returns it."""
        if not row.dynamic or row.removed:
            return None
        wf = self._workflows.get(row.workflow)
        if wf is None:
            return None  # a worker that runs that workflow ticks it
        try:
            s = _from_row(row, wf)
            if s.queue_name is not None:
                self._resolve_queue(s.queue_name, False)
        except (ValueError, TypeError, FuseeError) as e:
            log.error("schedule %r: its stored definition cannot tick here: %s", row.name, e)
            return None
        self._schedules[row.name] = s
        if row.last_run:
            self._last_runs[row.last_run] = row.name
        return s

    def _arm_adopting(self) -> None:
        if self._stopped:
            return

        def due() -> None:
            self._timers.pop("", None)
            self._spawn(self._adopt_new())

        # "" is no schedule's name: the timer of the look for new ones.
        self._timers[""] = self._clock.call_at(self._clock.now_ms() + _ADOPT_MS, due)

    async def _adopt_new(self, first: bool = False) -> None:
        try:
            await self._adopt_rows(await self._store.schedules())
        except FuseeError as e:
            if not self._closed():
                log.error("schedules: looking for new ones failed; tried again later: %s", e)
        # One engine writes a store that is not shared: it made them all.
        if not self._closed() and (is_shared(self._store) or not first):
            self._arm_adopting()

    async def _adopt_rows(self, rows: Iterable[ScheduleRow]) -> None:
        for row in rows:
            if row.name not in self._schedules and not self._stopped:
                s = self._adopt(row)
                if s is not None:
                    async with self._lock(s.name):
                        await self._finish_claimed(s, row)
                    self._spawn(self._fire(s))

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
            self._spawn(self._fire(s))

        self._timers[s.name] = self._clock.call_at(at_ms, due)

    async def _fire(self, s: Schedule) -> None:
        if self._schedules.get(s.name) is not s:
            return  # changed or deleted meanwhile: its new definition has its own timer
        nxt = s.next_tick(self._clock.now_ms())
        try:
            async with self._lock(s.name):
                current = await self._current(s)
                if current is None:
                    return
                s = current
                nxt = s.next_tick(self._clock.now_ms())
                await self.tick(s, nxt)
        except FuseeError as e:
            if self._closed():
                return
            log.error(
                "schedule %r: a tick failed; it is tried again at the next one: %s", s.name, e
            )
        if not self._closed():
            self._arm(s, nxt)

    async def _current(self, s: Schedule) -> Schedule | None:
        """``s`` as its row now says, for a schedule made at run time (None: deleted)."""
        if s.name in self._in_code:
            return s
        rows = await self._store.schedules()
        await self._adopt_rows(rows)
        row = next((r for r in rows if r.name == s.name), None)
        if row is None or row.removed or not row.dynamic:
            self._forget(s.name)
            return None
        if row.spec == s.spec and row.input == s.input_data and row.workflow == s.workflow.name:
            return s
        # Changed on another worker: tick on its new definition.
        fresh = self._adopt(row)
        if fresh is None:
            self._forget(s.name)
        return fresh

    def _forget(self, name: str) -> None:
        self._schedules.pop(name, None)
        handle = self._timers.pop(name, None)
        if handle is not None:
            handle.cancel()

    def _lock(self, name: str) -> asyncio.Lock:
        lock = self._ticking.get(name)
        if lock is None:
            lock = self._ticking[name] = asyncio.Lock()
        return lock

    async def _row(self, name: str) -> ScheduleRow | None:
        for row in await self._store.schedules():
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
        store = self._store
        row = await self._row(s.name)
        if row is None or row.removed:
            return
        before = row
        now = self._clock.now_ms()
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
                await self._cancel_run(previous, f"schedule '{s.name}' started a newer tick")
        id = run_id(s.name, tick)
        await self._start(s, id, tick)
        return dataclasses.replace(row, last_run=id, ticked_ms=tick)

    async def _start_buffered(self, s: Schedule, row: ScheduleRow) -> ScheduleRow:
        tick = row.buffered_ms
        id = run_id(s.name, tick)
        await self._start(s, id, tick)
        return dataclasses.replace(row, buffered_ms=0, last_run=id, ticked_ms=tick)

    async def _start(self, s: Schedule, id: str, tick: int) -> Run[Any]:
        # AlreadyExists: this tick's run started already, in another worker or before a crash.
        with contextlib.suppress(AlreadyExists):
            await self._tick_start(s.workflow, id, s.input_data, queue=s.queue_name, tick_ms=tick)
        self._last_runs[id] = s.name
        return self._handle(id)

    async def _is_running(self, id: str) -> bool:
        if not id:
            return False
        try:
            info = await self._describe_run(id)
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
        self._spawn(self._after_end(s, id))

    async def _after_end(self, s: Schedule, id: str) -> None:
        async with self._lock(s.name):
            row = await self._row(s.name)
            if row is not None and row.buffered_ms and row.last_run == id and not row.paused:
                after = await self._start_buffered(s, row)
                changes = {
                    "buffered_ms": 0,
                    "last_run": after.last_run,
                    "ticked_ms": after.ticked_ms,
                }
                await self._store.set_schedule(s.name, changes)

    # --- pause, resume, trigger, list ------------------------------------------------------

    async def pause(self, name: str) -> None:
        """Pauses schedule ``name``: its ticks are skipped until `resume` (across workers).

        Raises:
            fusee.NotFound: The store has no schedule of that name.
        """
        await self._known(name)
        await self._store.set_schedule(name, {"paused": True})

    async def resume(self, name: str) -> None:
        """Resumes schedule ``name``: its next tick starts; those skipped while paused do not.

        Raises:
            fusee.NotFound: The store has no schedule of that name.
        """
        await self._known(name)
        await self._store.set_schedule(name, {"paused": False})

    async def trigger(self, name: str) -> Run[Any]:
        """Starts a run of schedule ``name`` now, whatever its ticks, overlap and pause.

        Its id is ``"{name}-manual-{now}"`` (`fusee._schedule.manual_run_id`).

        Raises:
            fusee.NotFound: This engine was not opened with that schedule.
        """
        s = await self._here(name)
        if s is None:
            raise NotFound(
                f"schedule '{name}' is not one this engine was opened with "
                f"({', '.join(self.names) or 'none'}); trigger it where it is"
            )
        async with self._lock(name):
            now = self._clock.now_ms()
            run = await self._start(s, manual_run_id(name, now), now)
            await self._store.set_schedule(name, {"last_run": run.id})
        return run

    # --- run-time schedules -----------------------------------------------------------------

    async def create(
        self,
        name: str,
        workflow: WorkflowDef[Any, Any] | str,
        *,
        cron: str | None = None,
        every: Any = None,
        tz: str = "UTC",
        input: Any = None,
        overlap: Overlap = "skip",
        catch_up: Any = "0s",
        queue: Any = None,
    ) -> ScheduleRow:
        """Makes schedule ``name`` at run time: it ticks from now on, until `delete`.

        Its arguments are `fusee.Schedule`'s. It is kept in the store, so it
        ticks across restarts, on every worker that runs ``workflow``.

        Returns:
            Its row.

        Raises:
            fusee.AlreadyExists: A schedule of that name exists (in code or made at run time).
            fusee.UnknownWorkflow: This engine does not run ``workflow``.
            fusee.UnknownQueue: This engine has no queue ``queue``.
            ValueError: An argument `fusee.Schedule` refuses.

        Example:
            >>> async def main(engine: Engine) -> None:
            ...     await engine.schedules.create("hourly", "report", every="1h")
        """
        self._check_open()
        wf = self._workflow_of(workflow)
        s = Schedule(
            name,
            wf,
            cron=cron,
            every=every,
            tz=tz,
            input=input,
            overlap=overlap,
            catch_up=catch_up,
            queue=queue,
        )
        return await self._create(s)

    async def _create(self, s: Schedule) -> ScheduleRow:
        if s.queue_name is not None:
            self._resolve_queue(s.queue_name, False)
        async with self._lock(s.name):
            old = await self._row(s.name)
            if old is not None and not old.removed:
                made = "at run time" if old.dynamic else "in code"
                raise AlreadyExists(
                    f"schedule '{s.name}' exists (made {made}); update it, or delete it first"
                )
            now = self._clock.now_ms()
            row = ScheduleRow(
                s.name,
                s.workflow.name,
                s.spec,
                last_tick_ms=now,
                done_tick_ms=now,
                input=s.input_data,
                dynamic=True,
            )
            if old is not None:
                await self._store.delete_schedule(s.name)
            await self._store.put_schedule(row)
            self._schedules[s.name] = s
        self._spawn(self._fire(s))
        return row

    async def update(
        self,
        name: str,
        *,
        cron: Any = _KEEP,
        every: Any = _KEEP,
        tz: Any = _KEEP,
        input: Any = _KEEP,
        overlap: Any = _KEEP,
        catch_up: Any = _KEEP,
        queue: Any = _KEEP,
    ) -> ScheduleRow:
        """Changes schedule ``name`` (made at run time): the arguments given, the others kept.

        ``cron=`` replaces an interval and ``every=`` a cron expression;
        ``queue=None`` starts its runs on no queue. It keeps its state
        (paused, last tick): no tick before now starts because of a change.

        Returns:
            Its new row.

        Raises:
            fusee.NotFound: No schedule of that name.
            ValueError: It is defined in code (change the code), or an
                argument `fusee.Schedule` refuses.

        Example:
            >>> async def main(engine: Engine) -> None:
            ...     await engine.schedules.update("hourly", every="2h", input={"full": True})
        """
        self._check_open()
        given = {
            "cron": cron,
            "every": every,
            "tz": tz,
            "input": input,
            "overlap": overlap,
            "catch_up": catch_up,
            "queue": queue,
        }
        return await self._update(name, {k: v for k, v in given.items() if v is not _KEEP})

    async def _update(self, name: str, changes: Mapping[str, Any]) -> ScheduleRow:
        for key in changes:
            if key not in _UPDATABLE:
                raise ValueError(f"a schedule's {key!r} cannot change; it has {_UPDATABLE}")
        async with self._lock(name):
            row = self._runtime(await self._known(name), "update")
            wf = self._workflow_of(row.workflow)
            args = parse_spec(row.spec)
            args["input"] = wf.decode_input(row.input)
            if "cron" in changes and changes["cron"] is not None:
                args.pop("every", None)
            if "every" in changes and changes["every"] is not None:
                args.pop("cron", None)
                args.pop("tz", None)
            args.update(changes)
            s = Schedule(name, wf, **args)
            if s.queue_name is not None:
                self._resolve_queue(s.queue_name, False)
            new = dataclasses.replace(row, spec=s.spec, input=s.input_data)
            await self._store.put_schedule(new)
            self._forget(name)
            self._schedules[name] = s
        self._spawn(self._fire(s))
        return new

    async def delete(self, name: str) -> None:
        """Deletes schedule ``name`` (made at run time): it ticks no more; its runs go on.

        Raises:
            fusee.NotFound: No schedule of that name.
            ValueError: It is defined in code (remove it from the code).

        Example:
            >>> async def main(engine: Engine) -> None:
            ...     await engine.schedules.delete("hourly")
        """
        self._check_open()
        async with self._lock(name):
            self._runtime(await self._known(name), "delete")
            await self._store.delete_schedule(name)
            self._forget(name)

    async def backfill(
        self, name: str, start: datetime.datetime, end: datetime.datetime
    ) -> list[Run[Any]]:
        """Starts the runs of schedule ``name``'s ticks from ``start`` to ``end`` (both included).

        Each tick's run has the id its tick gives it (`fusee._schedule.run_id`),
        so a tick whose run started already (on schedule, or by an earlier
        backfill) is not started again. A backfill starts every tick of the
        range at once, whatever the schedule's pause and overlap policy, as
        Temporal's does.

        Returns:
            The handles of the ticks' runs, in order (those started before too).

        Raises:
            fusee.NotFound: No schedule of that name runs on this engine.
            ValueError: ``end`` is before ``start`` or after now, a time has
                no time zone, or the range holds over `BACKFILL_MAX` ticks.

        Example:
            >>> import datetime
            >>> async def main(engine: Engine) -> None:
            ...     day = datetime.datetime(2026, 3, 1, tzinfo=datetime.UTC)
            ...     await engine.schedules.backfill("hourly", day, day + datetime.timedelta(days=1))
        """
        self._check_open()
        start_ms, end_ms = _ms(start, "start"), _ms(end, "end")
        if end_ms < start_ms:
            raise ValueError(f"a backfill's end ({end}) is before its start ({start})")
        if end_ms > self._clock.now_ms():
            raise ValueError(
                f"a backfill covers past ticks; its end ({end}) is after now "
                "(later ticks start on schedule)"
            )
        s = await self._here(name)
        if s is None:
            raise NotFound(
                f"schedule '{name}' does not tick on this engine "
                f"({', '.join(self.names) or 'none'}); backfill it on a worker that runs "
                "its workflow"
            )
        ticks: list[int] = []
        t = s.next_tick(start_ms - 1)
        while t <= end_ms:
            if len(ticks) == BACKFILL_MAX:
                raise ValueError(
                    f"schedule '{name}' has over {BACKFILL_MAX} ticks from {start} to {end}; "
                    "backfill a shorter range at a time"
                )
            ticks.append(t)
            t = s.next_tick(t)
        return [await self._start(s, run_id(name, tick), tick) for tick in ticks]

    def _runtime(self, row: ScheduleRow, action: str) -> ScheduleRow:
        if not row.dynamic:
            raise ValueError(
                f"schedule '{row.name}' is defined in code (fusee.Schedule); to {action} "
                "it, change the code and deploy it"
            )
        return row

    async def apply(self, name: str, action: str, fields: Mapping[str, Any]) -> dict[str, Any]:
        """Applies a Client's ``schedule`` command: its ``action`` and that action's ``fields``.

        ``create`` and ``update`` take the encoded ``input`` (bytes) and
        durations in milliseconds; ``backfill`` takes ``start_ms`` and ``end_ms``.

        Returns:
            The answer's fields: a message, a trigger's run id, a backfill's run ids.

        Raises:
            ValueError: An action this engine does not know.
        """
        if action == "create":
            wf = self._workflow_of(str(fields["workflow"]))
            args = _transported(fields, wf)
            s = Schedule(name, wf, **args)
            await self._create(s)
            return {"message": f"schedule {name!r} created"}
        if action == "update":
            row = await self._known(name)
            wf = self._workflow_of(row.workflow)
            await self._update(name, _transported(fields, wf))
            return {"message": f"schedule {name!r} updated"}
        if action == "delete":
            await self.delete(name)
            return {"message": f"schedule {name!r} deleted"}
        if action == "backfill":
            start, end = (_datetime(int(fields[k])) for k in ("start_ms", "end_ms"))
            runs = await self.backfill(name, start, end)
            return {
                "message": f"schedule {name!r} backfilled {len(runs)} tick(s)",
                "run_ids": [run.id for run in runs],
            }
        if action == "pause":
            await self.pause(name)
            return {"message": f"schedule {name!r} paused"}
        if action == "resume":
            await self.resume(name)
            return {"message": f"schedule {name!r} resumed"}
        if action == "trigger":
            run = await self.trigger(name)
            return {"message": f"schedule {name!r} started run {run.id!r}", "run_id": run.id}
        raise ValueError(
            f"schedule action {action!r} is not create, update, delete, backfill, pause, "
            "resume or trigger"
        )

    async def list(self) -> list[ScheduleRow]:
        """Every schedule row of the store (removed ones too), by name."""
        return await self._store.schedules()

    async def _here(self, name: str) -> Schedule | None:
        """Schedule ``name`` if this engine ticks it, adopting a run-time one not adopted yet.

        Raises:
            fusee.NotFound: The store has no schedule of that name.
        """
        s = self._schedules.get(name)
        if s is None:
            await self._adopt_rows([await self._known(name)])
            s = self._schedules.get(name)
        return s

    async def _known(self, name: str) -> ScheduleRow:
        row = await self._row(name)
        if row is None:
            raise NotFound(
                f"no schedule '{name}' in this store; schedules are made by "
                "Engine.open(..., schedules=[fusee.Schedule(...)]) or "
                "engine.schedules.create(...)"
            )
        return row


def _from_row(row: ScheduleRow, wf: WorkflowDef[Any, Any]) -> Schedule:
    """The `fusee.Schedule` a run-time schedule's row holds."""
    return Schedule(row.name, wf, input=wf.decode_input(row.input), **parse_spec(row.spec))


def _ms(when: datetime.datetime, what: str) -> int:
    if not isinstance(when, datetime.datetime) or when.tzinfo is None:
        raise ValueError(
            f"a backfill's {what} must be a datetime with a time zone "
            f"(datetime.datetime(..., tzinfo=datetime.UTC)), not {when!r}"
        )
    return int(when.timestamp() * 1000)


def _datetime(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


def _transported(fields: Mapping[str, Any], wf: WorkflowDef[Any, Any]) -> dict[str, Any]:
    """A Client's ``create`` or ``update`` fields as `fusee.Schedule` arguments.

    The input travels encoded and is checked against ``wf``'s input type;
    durations travel in milliseconds.
    """
    out: dict[str, Any] = {}
    for key in _UPDATABLE:
        if key not in fields:
            continue
        value = fields[key]
        if key == "input":
            # Refused here, with the input type's message, if it does not fit.
            value = wf.decode_input(bytes(value))
        elif key in ("every", "catch_up") and type(value) is int:
            value = value / 1000
        out[key] = value
    return out
