"""Forks: a new run whose journal is a copy of an old run's before a position.

`fork_records` picks and rewrites the records (pure, no I/O);
`fork` appends them with the new run's row and loads the new run, which
replays the copy (so the steps before the position do not run again) and
goes on live from there. The old run is not touched.

A position is an operation's 0-based number (its ``seq``, the column
``fusee show`` prints); a step name stands for its first position. The copy
is the journal up to the first record of an operation at or after the
position (the cut), without the run's end, plus, after the cut, the
completions of operations before the position (a step's result, its failed
attempts, a timer's firing, a child's end, a completion, heartbeats and a
step's stream chunks): the code had begun those before the position, so
their outcomes do not depend on what the forked run will do differently.
Everything else after the cut (signals, waits' outcomes, updates, a cancel)
is left out, so the copy is a journal some live run could have written.

The rule: the copy and the new run's row go to the store in one write
(one group commit), so after a crash the fork exists whole or not at all.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fusee._definitions import checked
from fusee._status import RunStatus
from fusee.engine._run import check_id
from fusee.errors import AlreadyExists, RunQueued
from fusee.record import (
    Attempt,
    ChildDone,
    Chunk,
    Completed,
    Done,
    Fired,
    Heartbeat,
    Record,
    Resume,
    Start,
    Status,
    Step,
    StreamEnd,
    encode,
)
from fusee.remote._journal import decode_journal, no_run, position, seq_of
from fusee.store import RunRow

if TYPE_CHECKING:
    from fusee._definitions import WorkflowDef
    from fusee.engine._clock import Clock
    from fusee.engine._commit import Committer
    from fusee.engine._runs import Runs
    from fusee.store import Store

__all__ = ["fork", "fork_records", "last_failure", "position"]

# Outcomes of operations begun before the position, kept after the cut.
_COMPLETIONS = (Step, Attempt, Resume, Heartbeat, Fired, ChildDone, Completed, Chunk, StreamEnd)


def last_failure(records: Sequence[Record]) -> int | None:
    """The position of the last step that failed for good or is paused, or None.

    A step whose attempts failed but which then succeeded does not count:
    a fork there would run again a step that did its work.

    Example:
        >>> ok, failed = Status.OK, Status.FAILED
        >>> last_failure([Step(1, 0, "a", 1, ok, b""), Step(1, 1, "b", 3, failed, b"")])
        1
    """
    succeeded = {r.seq for r in records if isinstance(r, Step) and r.status is Status.OK}
    found: int | None = None
    for rec in records:
        if (isinstance(rec, Step) and rec.status in (Status.FAILED, Status.TIMED_OUT)) or (
            isinstance(rec, Attempt) and rec.seq not in succeeded
        ):
            found = rec.seq
    return found


def fork_records(
    records: Sequence[Record],
    new_id: str,
    at: int,
    *,
    input: bytes | None = None,
    started_ms: int = 0,
) -> list[Record]:
    """The journal of a fork at position ``at`` of ``records``, as run 1 of ``new_id``.

    ``input`` replaces the old run's input (None keeps it). See the module
    docstring for which records are copied.

    Example:
        >>> from fusee.record import Start, Status, Step
        >>> journal = [
        ...     Start(2, "a", "wf", input=b"\\x01"),
        ...     Step(2, 0, "quote", 1, Status.OK, b"\\x02"),
        ...     Step(2, 1, "charge", 1, Status.OK, b"\\x03"),
        ... ]
        >>> [type(r).__name__ for r in fork_records(journal, "b", 1)]
        ['Start', 'Step']
        >>> fork_records(journal, "b", 1)[1].run
        1
    """
    start = records[0]
    assert isinstance(start, Start)
    out: list[Record] = [
        dataclasses.replace(
            start,
            run=1,
            id=new_id,
            started_ms=started_ms,
            # A top-level run: the old run's parent knows nothing of it.
            parent=None,
            input=start.input if input is None else input,
        )
    ]
    cut = False
    for rec in records[1:]:
        if isinstance(rec, Done):
            break
        seq = seq_of(rec)
        if not cut and seq is not None and seq >= at:
            cut = True
        if cut and not (isinstance(rec, _COMPLETIONS) and seq is not None and seq < at):
            continue
        out.append(dataclasses.replace(rec, run=1))
    return out


async def fork(
    id: str,
    new_id: str,
    at: int | str,
    input: bytes | None,
    *,
    store: Store,
    committer: Committer,
    runs: Runs,
    clock: Clock,
    workflow: Callable[[str], WorkflowDef[Any, Any]],
    starting: dict[str, list[asyncio.Future[None]]],
    version: str,
    version_number: int,
    check_open: Callable[[], None],
) -> None:
    """Forks run ``id`` at ``at`` as ``new_id`` and starts it, on the engine these come from.

    ``input`` is the new run's encoded input; None keeps the old run's.
    ``starting`` is the engine's starts in flight by id (an ATTACH start of
    ``new_id`` meanwhile waits for the fork); ``workflow`` finds a workflow
    by name; ``version`` and ``version_number`` are the engine's.

    Raises:
        ValueError: ``new_id`` is not a valid id, or ``at`` is no position.
        fusee.NotFound: No run has id ``id``.
        fusee.RunQueued: Run ``id`` is queued: it has no journal yet.
        fusee.AlreadyExists: ``new_id`` is taken.
        fusee.UnknownWorkflow: The engine was not given the run's workflow.
        fusee.PayloadError: ``input`` does not fit the workflow's input type.
    """
    check_open()
    check_id(id, "a run")
    check_id(new_id, "a fork")
    # The old run's records still on their way to the store are part of it.
    await committer.flush()
    row = await store.get(id)
    if row is None:
        raise no_run(id)
    if row.status == RunStatus.QUEUED:
        raise RunQueued(id)  # no journal to copy yet
    wf = workflow(row.workflow)
    data = None
    if input is not None:
        what = f"the input of run '{new_id}'"
        data = checked(wf.decode_input(input), wf.decode_input, what, wf.input_type)
    records = decode_journal(id, row.run, await store.load(id, row.run))
    n = position(records, at, id)
    if (
        new_id in starting
        or runs.loaded(new_id) is not None
        or runs.is_loading(new_id)
        or await store.get(new_id) is not None
    ):
        raise AlreadyExists(f"run '{new_id}' exists; fork to an id no run has")
    if new_id in starting:  # taken while the store was read
        raise AlreadyExists(f"run '{new_id}' is being started; fork to an id no run has")
    now = clock.now_ms()
    copy = fork_records(records, new_id, n, input=data, started_ms=now)
    # The fork is a new run of this engine's code: its version.
    copy[0] = dataclasses.replace(copy[0], version=version_number)  # type: ignore[arg-type]
    starting[new_id] = []
    try:
        # No await from the first append to the row: the writer takes them
        # all in one batch, one store write.
        lsn = 0
        for rec in copy:
            lsn = committer.append(new_id, 1, encode(rec))
        new_row = RunRow(new_id, 1, wf.name, RunStatus.RUNNING, now, version=version)
        committer.put_row(new_row)
        await committer.durable(lsn)
        await committer.flush()
        state = await runs.wake(new_id, new_row)
        if state is not None and state.telemetry is not None:
            state.telemetry.forked(id)
    except BaseException as e:
        _settle(starting.pop(new_id), e)
        raise
    _settle(starting.pop(new_id), None)


def _settle(waiters: list[asyncio.Future[None]], error: BaseException | None) -> None:
    # `Engine.start` callers with IdPolicy.ATTACH that came while the fork
    # was being written wait for it as for a start.
    for fut in waiters:
        if not fut.done():
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)
