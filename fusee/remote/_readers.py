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

__all__ = [
    "StreamReader",
    "latest_event",
    "never_set",
    "queue_stats",
    "read_event",
    "timed_out",
]


class StreamReader:
    """Reads run ``id``'s stream ``name`` from the store, a little more at each call.

    Each `read` loads and decodes only the records after the last one it
    read, so a reader polling a long stream reads each record once (a
    reader that read the whole journal at each poll would do work
    quadratic in the stream's length). A continue-as-new gives the id a
    new journal: the reader goes on in it, past as many chunks as it has
    handed out.

    Example:
        >>> async def main(store: Store) -> list[bytes]:
        ...     reader = StreamReader(store, "report-1", "rows")
        ...     return await reader.read()
    """

    def __init__(self, store: Store, id: str, name: str) -> None:
        self._store = store
        self._id = id
        self._name = name
        self._run = 0
        self._after_lsn = 0
        self._ended_here = False
        self._found = 0  # chunks of the current run's journal read so far
        self._sent = 0  # chunks handed out
        self.ended = False
        """Whether the stream has ended (its `StreamEnd`, or its run's end, was read)."""

    async def read(self) -> list[bytes]:
        """The chunks made durable since the last call (the stream's first ones at the first).

        Raises:
            fusee.NotFound: No run has this id.
        """
        row = await self._store.get(self._id)
        if row is None:
            raise no_run(self._id)
        if row.run != self._run:
            self._run, self._after_lsn, self._found, self._ended_here = row.run, 0, 0, False
        entries = await load_journal(self._store, row, after_lsn=self._after_lsn)
        if entries:
            self._after_lsn = entries[-1][0]
        new: list[bytes] = []
        for rec in decode_journal(self._id, row.run, entries):
            if isinstance(rec, Chunk) and rec.stream == self._name:
                self._found += 1
                if self._found > self._sent:
                    new.append(rec.payload)
            elif isinstance(rec, StreamEnd) and rec.stream == self._name:
                self._ended_here = True
        self._sent += len(new)
        self.ended = self._ended_here or row.status in FINISHED_STATUSES
        return new


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
