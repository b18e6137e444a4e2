"""The crash harness: `crash_everywhere` runs a workflow crashing after each of its records.

Each crash is a store write that keeps a prefix of a batch and fails
(`_CrashingStore`); the engine then recovers as a restarted process would,
and the run must end as it did without a crash, running no durable step
again. The simulated crashes are expected: their log records are dropped
and the pytest plugin's error check lets them pass
(`caused_by_simulated_crash`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from fusee._durations import parse_duration
from fusee.engine._commit import Unrecoverable
from fusee.engine._run import IdPolicy, Run
from fusee.errors import Cancelled, RunFinished
from fusee.record import Start, Step, decode
from fusee.store import Entry, RunRow
from fusee.store._queues import QueueItem
from fusee.store.memory import MemoryStore
from fusee.testing._test_engine import TestEngine, _Stalled

if TYPE_CHECKING:
    from fusee._definitions import WorkflowDef

__all__ = ["caused_by_simulated_crash", "crash_everywhere"]

T = TypeVar("T")


class _CrashAfter(Unrecoverable):
    """A simulated crash: the process is gone, so the engine does not retry the write."""


def caused_by_simulated_crash(error: BaseException | None) -> bool:
    """Whether ``error`` is, or was caused by, a crash `crash_everywhere` simulates.

    The pytest plugin's error check lets these pass: they are expected.

    Example:
        >>> caused_by_simulated_crash(ValueError("boom"))
        False
    """
    todo = [error] if error is not None else []
    seen: set[int] = set()
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, _CrashAfter):
            return True
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        todo.extend(c for c in (e.__cause__, e.__context__) if c is not None)
    return False


def _is_simulated_crash(record: logging.LogRecord) -> bool:
    """Whether log ``record`` reports a simulated crash (in its exception or its args)."""
    if record.exc_info and caused_by_simulated_crash(record.exc_info[1]):
        return True
    args = record.args if isinstance(record.args, tuple) else ()
    return any(isinstance(a, BaseException) and caused_by_simulated_crash(a) for a in args)


class _SimulatedCrashFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _is_simulated_crash(record)


@contextlib.contextmanager
def _quiet_simulated_crashes() -> Iterator[None]:
    """Drops the log records of `crash_everywhere`'s simulated crashes, and only those.

    The engine logs a store failure at ERROR, as it should for a real one;
    the crashes crash_everywhere makes on purpose would read as failures.
    """
    loggers = [logging.getLogger("fusee"), logging.getLogger("asyncio")]
    quiet = _SimulatedCrashFilter()
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)


class _LoggingStore(MemoryStore):
    """A memory store that also keeps every record in log order."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[Entry] = []

    async def append(
        self,
        entries: Sequence[Entry],
        runs: Sequence[RunRow] = (),
        *,
        items: Sequence[QueueItem] = (),
        forget: Sequence[int] = (),
    ) -> None:
        await super().append(entries, runs, items=items, forget=forget)
        self.log.extend(entries)

    def record_count(self) -> int:
        return len(self.log)


class _CrashingStore(_LoggingStore):
    """A memory store that keeps only its first ``keep`` records, then fails once."""

    def __init__(self, keep: int) -> None:
        super().__init__()
        self.keep = keep
        self.armed = True

    async def append(
        self,
        entries: Sequence[Entry],
        runs: Sequence[RunRow] = (),
        *,
        items: Sequence[QueueItem] = (),
        forget: Sequence[int] = (),
    ) -> None:
        if self.armed:
            room = self.keep - self.record_count()
            if room < len(entries):
                self.armed = False
                if room > 0:
                    kept, lost = entries[:room], entries[room:]
                    # A queue item's change goes with its run's records (an
                    # admission with its `Start`, a freed slot with its
                    # `Done`): kept where they are all kept, as rows are.
                    lost_ids = {e.id for e in lost}
                    before = {id: await self.get(id) for id in lost_ids}
                    await super().append(
                        kept,
                        _rows_of_prefix(kept, lost, runs, before),
                        items=[i for i in items if i.id not in lost_ids],
                        forget=forget,
                    )
                raise _CrashAfter(f"simulated crash after record {self.keep}")
        await super().append(entries, runs, items=items, forget=forget)


def _rows_of_prefix(
    kept: Sequence[Entry],
    lost: Sequence[Entry],
    runs: Sequence[RunRow],
    before: Mapping[str, RunRow | None],
) -> list[RunRow]:
    """The rows a crash after ``kept`` leaves, as if each run's records and row were one write.

    A run whose records in the batch are all kept keeps its row. A run with
    records kept and records lost is in the middle of what the batch
    records: its row says "running", whatever it said before (``before``)
    or the batch would have made it say, so that recovery loads it and
    goes on from its journal. A real store writes a batch whole; this
    prefix is no state it can be in, and "running" is the one row under
    which the kept records act (a "suspended" row would hide what they
    owe other runs; an ended one, an end not recorded).
    """
    lost_ids = {e.id for e in lost}
    rows = [row for row in runs if row.id not in lost_ids]
    have = {row.id for row in rows}
    batch_rows = {row.id: row for row in runs}
    for e in kept:
        if e.id not in lost_ids or e.id in have:
            continue
        row = batch_rows.get(e.id) or before.get(e.id)
        if row is None:
            rec = decode(e.data)
            if not isinstance(rec, Start):
                continue
            row = RunRow(rec.id, rec.run, rec.wtype, "running", rec.started_ms)
        rows.append(dataclasses.replace(row, status="running", finished_ms=None, wake_ms=None))
        have.add(e.id)
    return rows


async def crash_everywhere(
    workflow: WorkflowDef[Any, T],
    input: Any = None,
    *,
    workflows: Iterable[WorkflowDef[Any, Any]] = (),
    id: str = "crash-everywhere",
    mocks: Mapping[tuple[str, str], Callable[..., Any]] | None = None,
    drive: Callable[[TestEngine, Run[T]], Awaitable[None]] | None = None,
    within: Any = "30d",
    engine_options: Mapping[str, Any] | None = None,
) -> T:
    """Runs ``workflow`` once, then once per record position, crashing after that record.

    Each crashed run recovers and must end with the same result (a value, an
    error, or `fusee.Cancelled` for a cancelled run), and no step whose result
    was durable before the crash may run again. The engine's log records of
    these simulated crashes are dropped (they are expected); every other
    record is logged as usual.

    Args:
        workflow: The workflow under test.
        input: Its input.
        workflows: Other workflows it needs (children).
        id: The run's id.
        mocks: Step mocks, as for `TestEngine.mock_step`.
        drive: Called after each start and recovery (to send signals; give
            them dedup ids so a signal sent twice counts once).
        within: How much virtual time each run may take to end. A run still
            waiting then, or waiting for something nothing left will send (a
            message a crash lost), fails the test.
        engine_options: More `TestEngine` arguments for every engine
            (``codecs=``, ``blobs=``, ``max_payload=``, ...).

    Returns:
        The result, equal in every run.

    Raises:
        AssertionError: A crashed run ended differently, ran a durable step
            again, or did not end (naming the crash position and the runs
            still waiting).

    Example:
        >>> import asyncio, fusee
        >>> @fusee.workflow("two")
        ... async def two(ctx) -> int:
        ...     a = await ctx.step("a", lambda: 1)
        ...     return a + await ctx.step("b", lambda: 1)
        >>> asyncio.run(crash_everywhere(two))
        2
    """
    all_workflows = [workflow, *[w for w in workflows if w is not workflow]]
    within_ms = round(parse_duration(within) * 1000)

    async def once(store: _LoggingStore) -> tuple[Any, int, TestEngine]:
        t = TestEngine(all_workflows, store, **(engine_options or {}))
        t._give_up_at_ms = t.clock.now_ms() + within_ms
        for (w, s), fn in (mocks or {}).items():
            t.mock_step(w, s, fn)
        async with t:
            while True:
                try:
                    # ATTACH: after a crash the start may or may not be durable.
                    run = await t.start(workflow, id, input, id_policy=IdPolicy.ATTACH)
                    if drive is not None:
                        await _drive_again(drive, t, run)
                    break
                except Exception:
                    if not isinstance(t.engine.committer.failed, _CrashAfter):
                        raise
                    await t.crash()
            outcome = await _outcome(t, run, drive)
            return outcome, store.record_count(), t

    with _quiet_simulated_crashes():
        result: T = await _crash_passes(once)
    return result


async def _crash_passes(
    once: Callable[[_LoggingStore], Awaitable[tuple[Any, int, TestEngine]]],
) -> Any:
    try:
        expected, total, _ = await once(_LoggingStore())
    except _Stalled as e:
        raise AssertionError(f"without a crash: {e}") from None
    for keep in range(1, total):
        store = _CrashingStore(keep)
        try:
            got, _, t = await once(store)
        except _Stalled as e:
            raise AssertionError(f"crashing after record {keep} of {total}: {e}") from None
        if got != expected:
            raise AssertionError(
                f"crashing after record {keep} of {total} changed the outcome: "
                f"{got!r} instead of {expected!r}"
            )
        _check_no_durable_step_ran_again(t, store, keep)
    if isinstance(expected, _Raised):
        raise expected.error
    return expected


class _Raised:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _Raised)
            and type(other.error) is type(self.error)
            and str(other.error) == str(self.error)
        )

    def __repr__(self) -> str:
        return f"raised {type(self.error).__name__}: {self.error}"


async def _outcome(
    t: TestEngine, run: Run[Any], drive: Callable[[TestEngine, Run[Any]], Awaitable[None]] | None
) -> Any:
    while True:
        try:
            return await run.result()
        except _Stalled:
            raise
        # A cancelled run's end (fusee.Cancelled is a BaseException) is an
        # outcome too; asyncio's own CancelledError cancels the test instead.
        except (Exception, Cancelled) as e:
            if not isinstance(t.engine.committer.failed, _CrashAfter):
                return _Raised(e)
        # The simulated crash happened: recover and go on.
        await t.crash()
        if drive is not None:
            try:
                await _drive_again(drive, t, run)
            except Exception:
                if not isinstance(t.engine.committer.failed, _CrashAfter):
                    raise


async def _drive_again(
    drive: Callable[[TestEngine, Run[Any]], Awaitable[None]], t: TestEngine, run: Run[Any]
) -> None:
    try:
        await drive(t, run)
    except RunFinished:
        # Recovered at (or past) its end: what drive sends again, with its
        # dedup ids, had reached the run before the crash.
        return


def _check_no_durable_step_ran_again(t: TestEngine, store: _LoggingStore, keep: int) -> None:
    durable: set[tuple[str, int, int]] = set()
    for entry in store.log[:keep]:
        rec = decode(entry.data)
        if isinstance(rec, Step):
            durable.add((entry.id, entry.run, rec.seq))
    again = [key for life, key in t.step_log if life > 0 and key in durable]
    if again:
        raise AssertionError(
            f"crashing after record {keep}: steps whose results were durable ran again: {again}"
        )
