"""Readers of what runs recorded, from the store alone: streams, events, queue figures.

A process without workflow code (a `fusee.Client`, the CLI, the UI) reads
these; an engine's own readers build on them and add the waits.

The rule: a reader reads what the store holds and writes nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from fusee._queue import QueueStats
from fusee._status import FINISHED_STATUSES, RunStatus
from fusee.record import Chunk, Event, Record, StreamEnd
from fusee.remote._journal import decode_journal, no_run
from fusee.store import load_journal
from fusee.store._queues import QueueItem

if TYPE_CHECKING:
    from fusee._events import EventDef
    from fusee.store import RunRow, Store

__all__ = ["latest_event", "never_set", "queue_stats", "read_event", "read_stream", "timed_out"]


async def read_stream(store: Store, id: str, name: str) -> tuple[list[bytes], bool]:
    """Run ``id``'s stream ``name`` in ``store``: its durable chunks, and whether it has ended.

    Raises:
        fusee.NotFound: No run has this id.

    Example:
        >>> async def main(store: Store) -> int:
        ...     chunks, ended = await read_stream(store, "report-1", "rows")
        ...     return len(chunks)
    """
    row = await store.get(id)
    if row is None:
        raise no_run(id)
    chunks: list[bytes] = []
    ended = row.status in FINISHED_STATUSES
    for rec in decode_journal(id, row.run, await load_journal(store, row)):
        if isinstance(rec, Chunk) and rec.stream == name:
            chunks.append(rec.payload)
        elif isinstance(rec, StreamEnd) and rec.stream == name:
            ended = True
    return chunks, ended


def latest_event(records: Iterable[Record], key: str) -> bytes | None:
    """The payload of the last `Event` of ``key`` among ``records``, or None.

    Example:
        >>> latest_event([Event(1, 0, "k", b"\\x01"), Event(1, 1, "k", b"\\x02")], "k")
        b'\\x02'
    """
    found = None
    for rec in records:
        if type(rec) is Event and rec.key == key:
            found = rec.payload
    return found


def never_set(row: RunRow, key: str) -> TimeoutError | None:
    """The error for a run that ended without setting ``key`` (None: it may still set it).

    A run that ended cannot set it any more: waiting would only wait for the
    timeout, so the reader hears at once.

    Example:
        >>> from fusee.store import RunRow
        >>> print(never_set(RunRow("r", 1, "wf", "completed", 0), "k"))
        run 'r' ended (completed) without setting event 'k'; it will never be set
    """
    if row.status in FINISHED_STATUSES and row.status != RunStatus.CONTINUED:
        return TimeoutError(
            f"run '{row.id}' ended ({row.status}) without setting event '{key}'; "
            "it will never be set"
        )
    return None


async def read_event(store: Store, id: str, key: EventDef[Any]) -> tuple[bool, Any]:
    """Run ``id``'s latest value of ``key`` in ``store``: ``(True, value)``, or ``(False, None)``.

    Raises:
        fusee.NotFound: No run has this id.
        TimeoutError: The run ended without setting it.

    Example:
        >>> async def main(store: Store, key: EventDef[int]) -> int | None:
        ...     found, value = await read_event(store, "order-1", key)
        ...     return value if found else None
    """
    row = await store.get(id)
    if row is None:
        raise no_run(id)
    records = decode_journal(id, row.run, await load_journal(store, row))
    payload = latest_event(records, key.name)
    if payload is not None:
        return True, key.decode(payload)
    error = never_set(row, key.name)
    if error is not None:
        raise error
    return False, None


def timed_out(id: str, key: str, timeout_s: float) -> TimeoutError:
    """The error for a wait that outlasted its timeout.

    Example:
        >>> print(timed_out("r", "k", 1.5))
        run 'r' did not set event 'k' within 1.5s
    """
    return TimeoutError(f"run '{id}' did not set event '{key}' within {timeout_s:g}s")


def queue_stats(items: Iterable[QueueItem], names: Iterable[str] = ()) -> list[QueueStats]:
    """The figures of ``items``, one `QueueStats` per queue (``names`` listed even when empty).

    Example:
        >>> queue_stats([QueueItem("q", "a", 1, "wf", b"", key="k")], ["r"])
        [QueueStats(queue='q', queued=1, running=0, keys={'k': (1, 0)}), QueueStats(queue='r', queued=0, running=0, keys={})]
    """  # noqa: E501
    queued: Counter[str] = Counter({n: 0 for n in names})
    running: Counter[str] = Counter({n: 0 for n in names})
    keys: dict[str, dict[str, tuple[int, int]]] = {n: {} for n in names}
    for item in items:
        is_queued = item.state == "queued"
        (queued if is_queued else running)[item.queue] += 1
        running.setdefault(item.queue, 0)
        queued.setdefault(item.queue, 0)
        per = keys.setdefault(item.queue, {})
        if item.key is not None:
            q, r = per.get(item.key, (0, 0))
            per[item.key] = (q + 1, r) if is_queued else (q, r + 1)
    return [
        QueueStats(name, queued[name], running[name], dict(sorted(keys[name].items())))
        for name in sorted(keys)
    ]
