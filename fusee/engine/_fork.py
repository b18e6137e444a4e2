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
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fusee._definitions import checked
from fusee._status import RunStatus
from fusee.engine._journal import decode_journal, no_run
from fusee.engine._run import check_id
from fusee.errors import AlreadyExists, RunQueued
from fusee.record import (
    Attempt,
    Awaiting,
    ChildDone,
    Chunk,
    Completed,
    Done,
    Fired,
    Heartbeat,
    Patch,
    Record,
    Resume,
    Start,
    Step,
    StreamEnd,
    Timer,
    Wait,
    encode,
    stream,
)
from fusee.store import RunRow

if TYPE_CHECKING:
    from fusee.engine._engine import Engine

__all__ = ["fork", "fork_records", "position"]

# Outcomes of operations begun before the position, kept after the cut.
_COMPLETIONS = (Step, Attempt, Resume, Heartbeat, Fired, ChildDone, Completed, Chunk, StreamEnd)
# Records that name their operation (what `fusee show` prints in its name column).
_NAMED = (Step, Attempt, Timer, Wait, Awaiting)


def _seq(rec: Record) -> int | None:
    """The operation a record belongs to (its position), or None (start, signal, end...)."""
    if isinstance(rec, Patch):
        return rec.at
    seq: int | None = getattr(rec, "seq", None)
    if seq == stream.WORKFLOW and isinstance(rec, Chunk | StreamEnd):
        return None
    return seq


def position(records: Sequence[Record], at: int | str, id: str) -> int:
    """The position ``at`` names in run ``id``'s journal ``records``.

    Raises:
        ValueError: ``at`` is negative, past the journal's last position, or
            a name no operation of the journal has.

    Example:
        >>> from fusee.record import Start, Status, Step
        >>> journal = [Start(1, "a", "wf"), Step(1, 0, "quote", 1, Status.OK, b"")]
        >>> position(journal, "quote", "a"), position(journal, 1, "a")
        (0, 1)
    """
    seqs = [s for rec in records if (s := _seq(rec)) is not None]
    last = max(seqs, default=-1)
    if isinstance(at, str):
        named = [rec.seq for rec in records if isinstance(rec, _NAMED) and rec.name == at]
        if not named:
            names = sorted({rec.name for rec in records if isinstance(rec, _NAMED)})
            raise ValueError(
                f"run '{id}' has no operation named {at!r} to fork at; "
                f"its names: {', '.join(names) or 'none'} (or pass a position 0..{last + 1})"
            )
        return min(named)
    if isinstance(at, bool) or not isinstance(at, int):
        raise TypeError(f"a fork's position is an int or a step name, got {at!r}")
    # One past the last position is allowed: the whole journal, the code
    # going on live from its next operation.
    if at < 0 or at > last + 1:
        raise ValueError(
            f"run '{id}' has positions 0..{last + 1}; {at} is not one of them "
            "(`fusee show` prints them in its seq column)"
        )
    return at


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
        seq = _seq(rec)
        if not cut and seq is not None and seq >= at:
            cut = True
        if cut and not (isinstance(rec, _COMPLETIONS) and seq is not None and seq < at):
            continue
        out.append(dataclasses.replace(rec, run=1))
    return out


async def fork(engine: Engine, id: str, new_id: str, at: int | str, input: bytes | None) -> None:
    """Forks run ``id`` of ``engine`` at ``at`` as ``new_id`` and starts it.

    ``input`` is the new run's encoded input; None keeps the old run's.

    Raises:
        ValueError: ``new_id`` is not a valid id, or ``at`` is no position.
        fusee.NotFound: No run has id ``id``.
        fusee.RunQueued: Run ``id`` is queued: it has no journal yet.
        fusee.AlreadyExists: ``new_id`` is taken.
        fusee.UnknownWorkflow: The engine was not given the run's workflow.
        fusee.PayloadError: ``input`` does not fit the workflow's input type.
    """
    engine.check_open()
    check_id(id, "a run")
    check_id(new_id, "a fork")
    # The old run's records still on their way to the store are part of it.
    await engine.committer.flush()
    row = await engine.store.get(id)
    if row is None:
        raise no_run(id)
    if row.status == RunStatus.QUEUED:
        raise RunQueued(id)  # no journal to copy yet
    wf = engine.workflow(row.workflow)
    data = None
    if input is not None:
        what = f"the input of run '{new_id}'"
        data = checked(wf.decode_input(input), wf.decode_input, what, wf.input_type)
    records = decode_journal(id, row.run, await engine.store.load(id, row.run))
    n = position(records, at, id)
    if (
        new_id in engine._starting
        or engine.runs.loaded(new_id) is not None
        or engine.runs.is_loading(new_id)
        or await engine.store.get(new_id) is not None
    ):
        raise AlreadyExists(f"run '{new_id}' exists; fork to an id no run has")
    if new_id in engine._starting:  # taken while the store was read
        raise AlreadyExists(f"run '{new_id}' is being started; fork to an id no run has")
    now = engine.clock.now_ms()
    copy = fork_records(records, new_id, n, input=data, started_ms=now)
    # The fork is a new run of this engine's code: its version.
    copy[0] = dataclasses.replace(copy[0], version=engine.version_number)  # type: ignore[arg-type]
    engine._starting[new_id] = []
    try:
        # No await from the first append to the row: the writer takes them
        # all in one batch, one store write.
        lsn = 0
        for rec in copy:
            lsn = engine.committer.append(new_id, 1, encode(rec))
        new_row = RunRow(new_id, 1, wf.name, RunStatus.RUNNING, now, version=engine.version)
        engine.committer.put_row(new_row)
        await engine.committer.durable(lsn)
        await engine.committer.flush()
        state = await engine.runs.wake(new_id, new_row)
        if state is not None and state.telemetry is not None:
            state.telemetry.forked(id)
    except BaseException as e:
        _settle(engine._starting.pop(new_id), e)
        raise
    _settle(engine._starting.pop(new_id), None)


def _settle(waiters: list[asyncio.Future[None]], error: BaseException | None) -> None:
    # `Engine.start` callers with IdPolicy.ATTACH that came while the fork
    # was being written wait for it as for a start.
    for fut in waiters:
        if not fut.done():
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)
