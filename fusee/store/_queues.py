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
import dataclasses
from bisect import bisect_left, insort
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from fusee._codegen import fast_init, replacer

if TYPE_CHECKING:
    from fusee.store._base import RunRow

__all__ = [
    "ACTIVE_STATES",
    "QUEUE_STATES",
    "Admission",
    "Budget",
    "ItemBook",
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


@fast_init
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


# `dataclasses.replace` for items: each admission and each run's end changes
# one, so a busy queue replaces items as often as it starts and ends runs.
_replace: Final[Callable[..., QueueItem]] = replacer(QueueItem)


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


class Budget:
    """One queue's counts at an admission, and the one rule that admits against them.

    What holds a slot (admitted items, per key too) and the admissions a
    rate window still counts. `plan_admission` builds one from a store's
    items for each admission; an `ItemBook` keeps one per queue up to date
    between admissions.

    Example:
        >>> budget = Budget(QueueLimits("q", concurrency=1))
        >>> items, wake = budget.admit([QueueItem("q", "a", 1, "wf", b""),
        ...                             QueueItem("q", "b", 1, "wf", b"", seq=1)], 0)
        >>> [i.id for i in items], budget.running
        (['a'], 1)
    """

    __slots__ = ("by_key", "limits", "recent", "running")

    def __init__(self, limits: QueueLimits) -> None:
        self.limits = limits
        self.running = 0
        self.by_key: Counter[str | None] = Counter()
        # Admission times a rate window may still count, oldest first.
        self.recent: deque[int] = deque()

    @classmethod
    def of(cls, limits: QueueLimits, items: Iterable[QueueItem]) -> Budget:
        """The counts of ``items`` (a queue's stored items; queued ones hold nothing).

        Example:
            >>> Budget.of(QueueLimits("q"), [QueueItem("q", "a", 1, "wf", b"",
            ...                                        state="admitted")]).running
            1
        """
        budget = cls(limits)
        recent: builtins.list[int] = []
        for item in items:
            if item.state == "admitted":
                budget.running += 1
                budget.by_key[item.key] += 1
            if item.admitted_ms is not None and limits.rate_n is not None:
                recent.append(item.admitted_ms)
        budget.recent.extend(sorted(recent))
        return budget

    def release(self, item: QueueItem) -> None:
        """``item``'s run ended: its slot is free (its admission still counts for the rate)."""
        self.running -= 1
        left = self.by_key[item.key] - 1
        if left:
            self.by_key[item.key] = left
        else:
            del self.by_key[item.key]

    def admit(
        self,
        waiting: Iterable[QueueItem],
        now_ms: int,
        runnable: Callable[[QueueItem], bool] | None = None,
    ) -> tuple[builtins.list[QueueItem], int | None]:
        """Admits from ``waiting`` (queued items, in admission order) what the limits allow.

        Lower priority number first, then arrival order (the caller's
        order); an item whose key is at its ``per_key`` bound is passed over
        for the next one, while a full queue (concurrency or rate) admits
        nothing more. ``runnable``, when given, says which items the
        admitting engine can run (its workflows, its shards): others wait
        for an engine that can. The admitted items are counted here.

        Returns:
            The admitted items (state ``"admitted"``), and the earliest time
            a rate window or a debounce lets more in (None: only a run's end
            or a new start can).
        """
        limits = self.limits
        recent = self.recent
        window_from = now_ms - limits.rate_ms
        while recent and recent[0] <= window_from:
            recent.popleft()
        rate_n = limits.rate_n
        concurrency = limits.concurrency
        per_key = limits.per_key
        by_key = self.by_key
        wake: int | None = None
        admitted: builtins.list[QueueItem] = []
        for item in waiting:
            if runnable is not None and not runnable(item):
                continue
            if item.not_before_ms > now_ms:
                wake = item.not_before_ms if wake is None else min(wake, item.not_before_ms)
                continue
            if concurrency is not None and self.running >= concurrency:
                break
            if rate_n is not None and len(recent) >= rate_n:
                # Free again once the window's oldest admission leaves it.
                free_at = recent[len(recent) - rate_n] + limits.rate_ms
                wake = free_at if wake is None else min(wake, free_at)
                break
            if per_key is not None and item.key is not None and by_key[item.key] >= per_key:
                continue
            self.running += 1
            by_key[item.key] += 1
            if rate_n is not None:
                recent.append(now_ms)
            admitted.append(_replace(item, state="admitted", admitted_ms=now_ms))
        return admitted, wake


def _admission_order(item: QueueItem) -> tuple[int, int]:
    return item.priority, item.seq


def plan_admission(
    limits: QueueLimits,
    items: Iterable[QueueItem],
    now_ms: int,
    runnable: Callable[[QueueItem], bool] | None = None,
) -> Admission:
    """Which of ``items`` (every counted item of one queue) to admit at ``now_ms``.

    The rule is `Budget.admit`'s, against the counts of ``items``.

    Example:
        >>> q = QueueLimits("q", concurrency=1)
        >>> a = plan_admission(q, [QueueItem("q", "a", 1, "wf", b""),
        ...                        QueueItem("q", "b", 1, "wf", b"", seq=1)], 0)
        >>> [i.id for i in a.items]
        ['a']
    """
    items = builtins.list(items)
    budget = Budget.of(limits, items)
    waiting = sorted((i for i in items if i.state == "queued"), key=_admission_order)
    admitted, wake = budget.admit(waiting, now_ms, runnable)
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


class ItemBook:
    """Queue items held in memory, indexed for admissions that cost little.

    `MemoryQueues` (the memory store) keeps its items in one; so does an
    engine alone on its store (`fusee.engine._queues`), which decides
    admissions in memory and writes each change with its next batch of
    records (`_put` and `_drop` say what changed). Each queue's queued items
    are kept in admission order and its counts in a `Budget`, so that an
    admission reads only the items it admits or passes over. The rule: every
    change goes through these methods, so the indexes and the hooks see it.

    Example:
        >>> book = ItemBook()
        >>> item = book.add(QueueItem("q", "a", 1, "wf", b""))
        >>> [i.id for i in book.admit_now(QueueLimits("q", concurrency=1), 0).items]
        ['a']
    """

    def __init__(self) -> None:
        # Every item by seq (dicts keep arrival order), and each active
        # item's seq by run id.
        self._queue_items: dict[int, QueueItem] = {}
        self._active_seq: dict[str, int] = {}
        self._queue_seq = 0
        # Per queue: its queued items' (priority, seq) in admission order,
        # its done items' seqs as they ended, and its counts (made at its
        # first admission, or again when its limits change).
        self._waiting: dict[str, builtins.list[tuple[int, int]]] = {}
        self._done: dict[str, deque[int]] = {}
        self._budgets: dict[str, Budget] = {}

    def _put(self, item: QueueItem) -> None:
        """Hook: ``item`` was stored or changed."""

    def _drop(self, seq: int) -> None:
        """Hook: the item ``seq`` was deleted."""

    def _index(self, item: QueueItem, old: QueueItem | None) -> None:
        was = old.state if old is not None else None
        if was == item.state:
            return
        if was == "queued":
            waiting = self._waiting[item.queue]
            del waiting[bisect_left(waiting, (item.priority, item.seq))]
        if item.state == "queued":
            insort(self._waiting.setdefault(item.queue, []), (item.priority, item.seq))
        elif item.state == "done":
            self._done.setdefault(item.queue, deque()).append(item.seq)
        if item.state in ACTIVE_STATES:
            self._active_seq[item.id] = item.seq
        elif self._active_seq.get(item.id) == item.seq:
            del self._active_seq[item.id]

    def _set(self, item: QueueItem) -> None:
        self._index(item, self._queue_items.get(item.seq))
        self._queue_items[item.seq] = item
        if item.seq > self._queue_seq:
            self._queue_seq = item.seq
        self._put(item)

    def _delete(self, seq: int) -> None:
        item = self._queue_items.pop(seq, None)
        if item is not None:
            if item.state == "queued":
                waiting = self._waiting[item.queue]
                del waiting[bisect_left(waiting, (item.priority, item.seq))]
            if self._active_seq.get(item.id) == seq:
                del self._active_seq[item.id]
            if item.state != "queued":
                # Its budget counted it: counted again from the items left.
                self._budgets.pop(item.queue, None)
        self._drop(seq)

    def take_stored(self, items: Iterable[QueueItem]) -> None:
        """Takes ``items`` as they are stored (no hook is told)."""
        for item in items:
            self._index(item, self._queue_items.get(item.seq))
            self._queue_items[item.seq] = item
            self._queue_seq = max(self._queue_seq, item.seq)
        self._budgets.clear()

    def active(self, id: str) -> QueueItem | None:
        """``id``'s queued or admitted item, or None."""
        seq = self._active_seq.get(id)
        return None if seq is None else self._queue_items[seq]

    def add(self, item: QueueItem) -> QueueItem | None:
        """Stores ``item`` as queued (its seq the next); None if ``id`` has an active item."""
        if item.id in self._active_seq:
            return None
        stored = _replace(
            item, seq=self._queue_seq + 1, state="queued", admitted_ms=None, signals=()
        )
        self._set(stored)
        return stored

    def debounce(self, id: str, input: bytes, not_before_ms: int) -> bool:
        """Replaces queued ``id``'s input and admission time; False if it is not queued."""
        item = self.active(id)
        if item is None or item.state != "queued":
            return False
        self._set(_replace(item, input=input, not_before_ms=not_before_ms))
        return True

    def start_early(self, id: str, now_ms: int) -> str | None:
        """Lets queued ``id`` in from ``now_ms`` on; its queue, or None if it is not queued."""
        item = self.active(id)
        if item is None or item.state != "queued":
            return None
        if item.not_before_ms > now_ms:
            self._set(_replace(item, not_before_ms=now_ms))
        return item.queue

    def add_signal(self, id: str, signal: bytes) -> bool:
        """Adds ``signal`` to queued ``id``'s signals; False, changing nothing, if not queued."""
        item = self.active(id)
        if item is None or item.state != "queued":
            return False
        self._set(_replace(item, signals=(*item.signals, signal)))
        return True

    def admit_now(
        self,
        limits: QueueLimits,
        now_ms: int,
        runnable: Callable[[QueueItem], bool] | None = None,
        released: Collection[str] = (),
        *,
        count_left: bool = True,
    ) -> Admission:
        """Frees ``released``'s slots, then admits what ``limits`` allow at ``now_ms``.

        ``count_left``: count the items left (`Admission.left`), which reads
        every queued item; an admission that does not look at it skips that.
        """
        for id in released:
            self.release(id)
        name = limits.name
        done = self._done.get(name)
        items = self._queue_items
        while done:
            first = items.get(done[0])
            if first is not None and not forgettable(first, now_ms, limits.rate_ms):
                break
            done.popleft()
            if first is not None:  # else deleted already
                self._forget_done(first.seq)
        budget = self._budgets.get(name)
        if budget is None or budget.limits != limits:
            budget = self._budgets[name] = Budget.of(
                limits, [i for i in items.values() if i.queue == name]
            )
        waiting = self._waiting.get(name, [])
        admitted, wake = budget.admit((items[seq] for _, seq in waiting), now_ms, runnable)
        for item in admitted:
            self._set(item)
        if not count_left:
            return Admission(admitted, wake)
        left = sum(1 for _, seq in waiting if runnable is None or runnable(items[seq]))
        return Admission(admitted, wake, left)

    def _forget_done(self, seq: int) -> None:
        # Not `_delete`: a done item holds no slot, and its admission has left
        # the rate window, so the queue's budget stays as it is.
        item = self._queue_items.pop(seq)
        if self._active_seq.get(item.id) == seq:
            del self._active_seq[item.id]
        self._drop(seq)

    def release(self, id: str) -> str | None:
        """Run ``id`` ended: its admitted item frees its slot; returns its queue, or None."""
        item = self.active(id)
        if item is None or item.state != "admitted":
            return None
        budget = self._budgets.get(item.queue)
        if budget is not None:
            budget.release(item)
        self._set(_replace(item, state="done"))
        return item.queue

    def remove(self, id: str) -> QueueItem | None:
        """Removes ``id``'s item if it is still queued (not admitted); returns it, or None."""
        item = self.active(id)
        if item is None or item.state != "queued":
            return None
        self._delete(item.seq)
        return item

    def items(self, *, done: bool = False) -> builtins.list[QueueItem]:
        """Every queued or admitted item (``done``: and every done one kept), by arrival."""
        return [i for i in self._queue_items.values() if done or i.state in ACTIVE_STATES]


class MemoryQueues(ItemBook):
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

    def _write_items(self, items: Iterable[QueueItem], forget: Iterable[int]) -> None:
        # An engine's own book's changes, stored with its batch (`append`):
        # counted again at this store's next admission.
        for seq in forget:
            self._delete(seq)
        for item in items:
            self._set(item)
        self._budgets.clear()

    async def enqueue(self, item: QueueItem, row: RunRow) -> QueueItem | None:
        """Stores ``item`` (state ``"queued"``) and ``row`` together; None if ``id`` has one."""
        self._check_open()
        stored = self.add(item)
        if stored is not None:
            self._rows[row.id] = row
        return stored

    async def debounce_queued(self, id: str, input: bytes, not_before_ms: int) -> bool:
        """Replaces queued ``id``'s input and admission time; False if it is not queued."""
        self._check_open()
        return self.debounce(id, input, not_before_ms)

    async def start_queued(self, id: str, now_ms: int) -> str | None:
        """Lets queued ``id`` in from ``now_ms`` on; its queue, or None if it is not queued."""
        self._check_open()
        queue = self.start_early(id, now_ms)
        row = self._rows.get(id)
        if queue is not None and row is not None and row.status == "queued":
            self._rows[id] = dataclasses.replace(row, wake_ms=None)
        return queue

    async def signal_queued(self, id: str, signal: bytes) -> bool:
        """Adds ``signal`` to queued ``id``'s signals; False, changing nothing, if not queued."""
        self._check_open()
        return self.add_signal(id, signal)

    async def admit(
        self,
        limits: QueueLimits,
        now_ms: int,
        runnable: Callable[[QueueItem], bool] | None = None,
        released: Collection[str] = (),
    ) -> Admission:
        """Frees ``released``'s slots, then admits what ``limits`` allow at ``now_ms``."""
        self._check_open()
        return self.admit_now(limits, now_ms, runnable, released)

    async def release_queued(self, id: str) -> str | None:
        """Run ``id`` ended: its admitted item frees its slot; returns its queue, or None."""
        self._check_open()
        return self.release(id)

    async def unqueue(self, id: str) -> QueueItem | None:
        """Removes ``id``'s item if it is still queued (not admitted); returns it, or None."""
        self._check_open()
        return self.remove(id)

    async def queue_items(self, *, done: bool = False) -> builtins.list[QueueItem]:
        """Every queued or admitted item (``done``: and every done one kept), by arrival."""
        self._check_open()
        return self.items(done=done)
