"""What a run's row tells, and the checks on ids every surface shares.

`RunInfo` is what `fusee.Run.describe` and the lists answer; a process
without workflow code builds it from a run's row alone (`row_info`), an
engine adds what its loaded state knows (`fusee.engine._run.info_of`).
"""

from __future__ import annotations

import datetime
import enum
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fusee._status import RunStatus

if TYPE_CHECKING:
    from fusee.store import RunRow

__all__ = ["KEEP_INPUT", "RunInfo", "check_id", "dedup_key", "row_info"]


class _KeepInput(enum.Enum):
    KEEP = "keep"


KEEP_INPUT: Any = _KeepInput.KEEP
"""`Run.fork`'s default input: the old run's."""


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What `Run.describe` and `Engine.list` tell about a run.

    Example:
        >>> RunInfo("order-1", 3, "checkout", RunStatus.COMPLETED, None, None, {}, ()).status
        <RunStatus.COMPLETED: 'completed'>
    """

    id: str
    run: int
    workflow: str
    status: RunStatus
    """The run's `fusee.RunStatus` (a string: ``info.status == "running"`` works)."""
    started_at: datetime.datetime | None
    finished_at: datetime.datetime | None
    attributes: Mapping[str, Any]
    paused_steps: tuple[str, ...]
    error: str | None = None
    """Why the run cannot go on, if so: its code diverged from its journal, or (a run
    ``paused`` by a bug, ``on_error="pause"``) the traceback of what its code raised."""
    wake_at: datetime.datetime | None = None
    """When a delayed run starts (``start(..., delay=)``), while it is ``queued``."""
    version: str | None = None
    """The version of the engine it started on (`fusee.Engine.open`'s ``version``; None
    for a run started before versions were recorded, or still queued)."""


def check_id(id: object, what: str) -> None:
    """Refuses a run id (or dedup key) that is not a non-empty string of valid text.

    Ids are stored as UTF-8: a string with a lone surrogate (``"\\ud800"``)
    has no UTF-8 form, so it is refused here rather than by the store.

    Raises:
        ValueError: ``id`` is empty, not a string, or not valid text.

    Example:
        >>> check_id("order-1", "a run")
        >>> try:
        ...     check_id("bad\\ud800", "a run")
        ... except ValueError:
        ...     print("refused")
        refused
    """
    if not isinstance(id, str) or not id:
        raise ValueError(f"{what} needs a non-empty string id, got {id!r}")
    try:
        id.encode()
    except UnicodeEncodeError:
        raise ValueError(
            f"{what}'s id {id!r} is not valid text (a lone surrogate has no UTF-8 form); "
            "use an id of valid characters"
        ) from None


def dedup_key(dedup: str | None) -> int:
    """A signal's dedup id as the 63-bit key its record keeps (0: none).

    Raises:
        ValueError: ``dedup`` is empty or not valid text.

    Example:
        >>> dedup_key(None), dedup_key("a") == dedup_key("a")
        (0, True)
    """
    if dedup is None:
        return 0
    check_id(dedup, "a dedup key")
    # 63 bits so that 0 stays "no key".
    return (
        int.from_bytes(hashlib.blake2b(dedup.encode(), digest_size=8).digest(), "little") >> 1
    ) or 1


def row_info(
    row: RunRow,
    status: RunStatus | None = None,
    paused_steps: tuple[str, ...] = (),
    error: BaseException | str | None = None,
) -> RunInfo:
    """The `RunInfo` of a run with ``row``; its status is the row's unless ``status`` is given.

    Its error is ``error``; with neither given, the row's own (a bug that paused it).

    Example:
        >>> from fusee.store import RunRow
        >>> row_info(RunRow("a", 1, "wf", "completed", 0)).status
        <RunStatus.COMPLETED: 'completed'>
    """
    return RunInfo(
        id=row.id,
        run=row.run,
        workflow=row.workflow,
        status=RunStatus(row.status) if status is None else status,
        started_at=_time(row.started_ms),
        finished_at=_time(row.finished_ms),
        attributes=dict(row.attributes),
        paused_steps=paused_steps,
        error=str(error) if error is not None else row.error if status is None else None,
        wake_at=_time(row.wake_ms) if row.status == RunStatus.QUEUED else None,
        version=row.version or None,
    )


def _time(ms: int | None) -> datetime.datetime | None:
    return None if ms is None else datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
