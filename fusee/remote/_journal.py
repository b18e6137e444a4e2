"""Reading journals: records decoded from a store, how a run's end reads, positions.

The rule: a damaged record is reported with its run and LSN, so the caller
knows which run to act on and the others are not affected.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from fusee import _codec
from fusee.errors import Cancelled, CorruptRecord, NotFound, WorkflowFailed
from fusee.record import (
    Attempt,
    Awaiting,
    Chunk,
    Done,
    Patch,
    Record,
    Status,
    Step,
    StreamEnd,
    Timer,
    Wait,
    decode,
    stream,
)

if TYPE_CHECKING:
    from fusee._definitions import WorkflowDef

__all__ = [
    "decode_journal",
    "end_record",
    "end_value",
    "error_pair",
    "no_run",
    "position",
    "seq_of",
    "text",
]


def decode_journal(id: str, run: int, entries: Iterable[tuple[int, bytes]]) -> list[Record]:
    """The records of run ``run`` of ``id`` from its stored ``(lsn, data)`` pairs.

    Raises:
        CorruptRecord: A record does not decode (names the run and the LSN).

    Example:
        >>> from fusee.record import Start, encode
        >>> decode_journal("a", 1, [(1, encode(Start(1, "a", "wf")))])[0].wtype
        'wf'
    """
    records = []
    for lsn, data in entries:
        try:
            records.append(decode(data))
        except CorruptRecord as e:
            raise CorruptRecord(
                f"the journal of run '{id}' (run {run}) has a damaged record at LSN {lsn}: {e}; "
                "restore the store from a backup (other runs are not affected)"
            ) from e
    return records


def end_record(id: str, run: int, entries: list[tuple[int, bytes]]) -> Done | None:
    """The `Done` of a journal, or None: its last record, or an earlier one.

    No record follows a run's end; a store written before that rule held may
    have some after it (a signal acknowledged while the run ended), and a
    finished run must still read.
    """
    if not entries:
        return None
    (last,) = decode_journal(id, run, entries[-1:])
    if isinstance(last, Done):
        return last
    for rec in decode_journal(id, run, entries):
        if isinstance(rec, Done):
            return rec
    return None


def end_value(wf: WorkflowDef[Any, Any], done: Done) -> Any:
    """A run's result as `fusee.Run.result` returns it, or its failure raised.

    Raises:
        fusee.WorkflowFailed: The workflow raised.
        fusee.Cancelled: The run was cancelled.
    """
    if done.status is Status.OK:
        return wf.decode_result(done.payload)
    if done.status is Status.CANCELLED:
        raise Cancelled(text(done.payload))
    err = _codec.decode(done.payload)
    if isinstance(err, list) and len(err) == 3:
        raise WorkflowFailed(str(err[0]), str(err[1]), str(err[2]))
    raise WorkflowFailed("Error", str(err))


def no_run(id: str) -> NotFound:
    """The error for an id no run has.

    Example:
        >>> str(no_run("x")).startswith("no run has id 'x'")
        True
    """
    return NotFound(f"no run has id '{id}'; `fusee list` shows the runs of a store")


def text(payload: bytes) -> str:
    """A recorded reason (a cancellation's) as text."""
    v = _codec.decode(payload)
    return v if isinstance(v, str) else repr(v)


def error_pair(payload: bytes) -> tuple[str, str]:
    """A recorded error's ``(type, message)``."""
    v = _codec.decode(payload)
    if isinstance(v, list) and len(v) >= 2:
        return str(v[0]), str(v[1])
    return "Error", str(v)


# Records that name their operation (what `fusee show` prints in its name column).
_NAMED = (Step, Attempt, Timer, Wait, Awaiting)


def seq_of(rec: Record) -> int | None:
    """The operation a record belongs to (its position), or None (start, signal, end...).

    Example:
        >>> from fusee.record import Start, Status, Step
        >>> seq_of(Step(1, 3, "quote", 1, Status.OK, b"")), seq_of(Start(1, "a", "wf"))
        (3, None)
    """
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
    seqs = [s for rec in records if (s := seq_of(rec)) is not None]
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
