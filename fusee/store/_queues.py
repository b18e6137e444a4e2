"""Queue admission in the store: the queue items' values and the one admission rule.

A queued run is a `QueueItem` (state ``"queued"``) beside its `RunRow`
(status ``"queued"``) until an admission takes it (state ``"admitted"``,
``admitted_ms`` set); it stays admitted, holding its slot, until its run
ends (`release_queued`: state ``"done"``, kept one rate window long so the
window still counts it). Each backend stores the items (memory: a dict;
SQLite and Postgres: a ``queue_items`` table) and runs `plan_admission`
inside one write, so what it admits never exceeds a limit.

The rule: `plan_admission` is the only place the limits are decided; the
backends give it every item that counts (queued, admitted, and done within
the rate window) read inside the write that applies its answer.
"""

from __future__ import annotations

import builtins
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from fusee.store._base import RunRow

__all__ = [
    "ACTIVE_STATES",
    "QUEUE_STATES",
    "Admission",
    "QueueItem",
    "QueueLimits",
    "plan_admission",
]

QUEUE_STATES: Final = ("queued", "admitted", "done")
"""Every value `QueueItem.state` may take."""

ACTIVE_STATES: Final = ("queued", "admitted")
"""The states of items whose run has not ended (one such item per run id at most)."""


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """A queue's limits as the store applies them (`fusee.Queue.limits` makes one).

    Attributes:
        name: The queue's name.
        concurrency: At most this many of its runs admitted and not ended
            (None: no bound).
        per_key: The same bound per key (None: no bound).
        rate_n: At most this many admissions in any window ``rate_ms`` long
            (None: no rate limit).
        rate_ms: The rate window's length, in milliseconds.

    Example:
        >>> QueueLimits("emails", concurrency=10).per_key is None
        True
    """

    name: str
    concurrency: int | None = None
    per_key: int | None = None
    rate_n: int | None = None
    rate_ms: int = 0

    @property
    def shares_budget(self) -> bool:
        """Whether an admission uses a budget the whole queue shares (concurrency, rate).

        Example:
            >>> QueueLimits("q", per_key=1).shares_budget
            False
        """
        return self.concurrency is not None or self.rate_n is not None


@dataclass(frozen=True, slots=True)
class QueueItem:
    """A run waiting in a queue, or admitted from it.

    Attributes:
        queue: The queue's name.
        id: The run's workflow id.
        run: The run number its start will have.
        workflow: The workflow's name.
        input: The run's encoded input.
        key: Its key for ``per_key`` limits (None: no key).
        priority: Lower numbers are admitted first.
        seq: Order of arrival (the store assigns it; FIFO within a priority).
        not_before_ms: It is not admitted before this time (a debounce).
        state: One of `QUEUE_STATES`.
        admitted_ms: When it was admitted, or None.
        origin: What the engine needs to start it besides the above (a
            child's parent link), encoded by the engine; opaque to the store.
        signals: Signals sent to it while it was queued, in arrival order,
            each encoded by the engine (opaque to the store); its run
            records them before its code starts.

    Example:
        >>> QueueItem("emails", "mail-1", 1, "send", b"\\xc0").state
        'queued'
    """

    queue: str
    id: str
    run: int
    workflow: str
    input: bytes
    key: str | None = None
    priority: int = 0
    seq: int = 0
    not_before_ms: int = 0
    state: str = "queued"
    admitted_ms: int | None = None
    origin: bytes = b""
    signals: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class Admission:
    """What one admission took, and when the next could take more on its own.

    Attributes:
        items: The items admitted now (state ``"admitted"``), in admission order.
        wake_ms: The earliest time a rate window or a debounce lets more in
            (None: only a run's end or a new start can).
        left: How many items it left queued (of those the caller can run).

    Example:
        >>> Admission([], None).wake_ms is None
        True
    """

    items: builtins.list[QueueItem]
    wake_ms: int | None
    left: int = 0


def plan_admission(
    limits: QueueLimits,
    items: Iterable[QueueItem],
    now_ms: int,
    runnable: Callable[[QueueItem], bool] | None = None,
) -> Admission:
    """Which of ``items`` (every counted item of one queue) to admit at ``now_ms``.

    Lower priority number first, then arrival order; an item whose key is
    at its ``per_key`` bound is passed over for the next one, while a full
    queue (concurrency or rate) admits nothing more. ``runnable``, when
    given, says which items the admitting engine can run (its workflows, its
    shards): others wait for an engine that can.

    Example:
        >>> q = QueueLimits("q", concurrency=1)
        >>> a = plan_admission(q, [QueueItem("q", "a", 1, "wf", b""),
        ...                        QueueItem("q", "b", 1, "wf", b"", seq=1)], 0)
        >>> [i.id for i in a.items]
        ['a']
    """
    running = 0
    by_key: Counter[str | None] = Counter()
    recent: list[int] = []
    waiting: list[QueueItem] = []
    window_from = now_ms - limits.rate_ms
    for item in items:
        if item.state == "queued":
            waiting.append(item)
            continue
        if item.state == "admitted":
            running += 1
            by_key[item.key] += 1
        if item.admitted_ms is not None and item.admitted_ms > window_from:
            recent.append(item.admitted_ms)
    recent.sort()
    waiting.sort(key=lambda i: (i.priority, i.seq))
    wake: int | None = None
    admitted: list[QueueItem] = []
    for item in waiting:
        if runnable is not None and not runnable(item):
            continue
        if item.not_before_ms > now_ms:
            wake = item.not_before_ms if wake is None else min(wake, item.not_before_ms)
            continue
        if limits.concurrency is not None and running >= limits.concurrency:
            break
        if limits.rate_n is not None and len(recent) >= limits.rate_n:
            # Free again once the window's oldest admission leaves it.
            free_at = recent[len(recent) - limits.rate_n] + limits.rate_ms
            wake = free_at if wake is None else min(wake, free_at)
            break
        per_key = limits.per_key
        if per_key is not None and item.key is not None and by_key[item.key] >= per_key:
            continue
        running += 1
        by_key[item.key] += 1
        recent.append(now_ms)
        admitted.append(replace(item, state="admitted", admitted_ms=now_ms))
    left = sum(1 for i in waiting if runnable is None or runnable(i))
    return Admission(admitted, wake, left - len(admitted))


def forgettable(item: QueueItem, now_ms: int, window_ms: int) -> bool:
    """Whether a done item no longer counts for any rate window (a store may delete it).

    Example:
        >>> forgettable(QueueItem("q", "a", 1, "wf", b"", state="done", admitted_ms=0), 10, 5)
        True
    """
    if item.state != "done":
        return False
    return item.admitted_ms is None or item.admitted_ms <= now_ms - window_ms


class MemoryQueues:
    """The memory store's queue items (`fusee.store.MemoryStore` inherits it).

    Example:
        >>> import asyncio
        >>> from fusee.store import MemoryStore, RunRow
        >>> async def demo() -> list[str]:
        ...     store = MemoryStore()
        ...     await store.open()
        ...     await store.enqueue(QueueItem("q", "a", 1, "wf", b""),
        ...                         RunRow("a", 1, "wf", "queued", 0))
        ...     admission = await store.admit(QueueLimits("q", concurrency=1), 0)
        ...     return [i.id for i in admission.items]
        >>> asyncio.run(demo())
        ['a']
    """

    _rows: dict[str, RunRow]
    _check_open: Callable[[], None]

    def __init__(self) -> None:
        # Every item by seq: dicts keep arrival order.
        self._queue_items: dict[int, QueueItem] = {}
        self._queue_seq = 0

    def _active_item(self, id: str) -> QueueItem | None:
        for item in self._queue_items.values():
            if item.id == id and item.state in ACTIVE_STATES:
                return item
        return None

    async def enqueue(self, item: QueueItem, row: RunRow) -> QueueItem | None:
        """Stores ``item`` (state ``"queued"``) and ``row`` together; None if ``id`` has one."""
        self._check_open()
        if self._active_item(item.id) is not None:
            return None
        self._queue_seq += 1
        stored = replace(item, seq=self._queue_seq, state="queued", admitted_ms=None, signals=())
        self._queue_items[stored.seq] = stored
        self._rows[row.id] = row
        return stored

    async def debounce_queued(self, id: str, input: bytes, not_before_ms: int) -> bool:
        """Replaces queued ``id``'s input and admission time; False if it is not queued."""
        self._check_open()
        item = self._active_item(id)
        if item is None or item.state != "queued":
            return False
        self._queue_items[item.seq] = replace(item, input=input, not_before_ms=not_before_ms)
        return True

    async def signal_queued(self, id: str, signal: bytes) -> bool:
        """Adds ``signal`` to queued ``id``'s signals; False, changing nothing, if not queued."""
        self._check_open()
        item = self._active_item(id)
        if item is None or item.state != "queued":
            return False
        self._queue_items[item.seq] = replace(item, signals=(*item.signals, signal))
        return True

    async def admit(
        self,
        limits: QueueLimits,
        now_ms: int,
        runnable: Callable[[QueueItem], bool] | None = None,
        released: Collection[str] = (),
    ) -> Admission:
        """Frees ``released``'s slots, then admits what ``limits`` allow at ``now_ms``."""
        self._check_open()
        for id in released:
            await self.release_queued(id)
        items = [i for i in self._queue_items.values() if i.queue == limits.name]
        for item in items:
            if forgettable(item, now_ms, limits.rate_ms):
                del self._queue_items[item.seq]
        admission = plan_admission(limits, items, now_ms, runnable)
        for item in admission.items:
            self._queue_items[item.seq] = item
        return admission

    async def release_queued(self, id: str) -> str | None:
        """Run ``id`` ended: its admitted item frees its slot; returns its queue, or None."""
        self._check_open()
        item = self._active_item(id)
        if item is None or item.state != "admitted":
            return None
        self._queue_items[item.seq] = replace(item, state="done")
        return item.queue

    async def unqueue(self, id: str) -> QueueItem | None:
        """Removes ``id``'s item if it is still queued (not admitted); returns it, or None."""
        self._check_open()
        item = self._active_item(id)
        if item is None or item.state != "queued":
            return None
        del self._queue_items[item.seq]
        return item

    async def queue_items(self) -> builtins.list[QueueItem]:
        """Every queued or admitted item, in arrival order."""
        self._check_open()
        return [i for i in self._queue_items.values() if i.state in ACTIVE_STATES]
