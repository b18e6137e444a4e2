"""Reading journals: records decoded from a store, and how a run's end reads.

The rule: a damaged record is reported with its run and LSN, so the caller
knows which run to act on and the others are not affected.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from fusee import _codec
from fusee.errors import Cancelled, CorruptRecord, NotFound, WorkflowFailed
from fusee.record import Done, Record, Status, decode

if TYPE_CHECKING:
    from fusee._definitions import WorkflowDef

__all__ = ["decode_journal", "end_record", "end_value", "error_pair", "no_run", "text"]


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
