"""Group commit: every record appended meanwhile goes to storage in one durable write.

Workflow code runs ahead of the disk: `append` assigns a record its LSN at
once and returns. A committer task writes whatever accumulated since its
last write as one batch (one transaction, one fsync), then wakes whoever
waits for an LSN it covered. Only what leaves the process waits, and only
for the records it depends on.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

from fusee.errors import StoreError
from fusee.store import Entry, RunRow

if TYPE_CHECKING:
    from fusee.store import Store

__all__ = ["Committer"]


class Committer:
    """Batches appends and makes them durable in order.

    Example:
        >>> import asyncio
        >>> from fusee.store.memory import MemoryStore
        >>> async def main() -> int:
        ...     store = MemoryStore()
        ...     await store.open()
        ...     c = Committer(store)
        ...     c.start()
        ...     lsn = c.append("wf", 1, b"record")
        ...     await c.durable(lsn)
        ...     await c.close()
        ...     return c.durable_lsn
        >>> asyncio.run(main())
        1
    """

    def __init__(self, store: Store, on_fail: Callable[[StoreError], None] | None = None) -> None:
        self.store = store
        self._on_fail = on_fail
        self.lsn = store.last_lsn
        self.durable_lsn = store.last_lsn
        self._entries: list[Entry] = []
        self._rows: dict[str, RunRow] = {}
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._callbacks: list[tuple[int, int, Callable[[], object]]] = []
        self._order = itertools.count()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        self.failed: StoreError | None = None
        self.writes = 0
        # A batch handed to the store and not yet back: with SQLite it is on
        # a writer thread for a while, and "idle" must not say nothing is
        # left to write meanwhile (the test host settles on `idle`).
        self._writing = False

    def start(self) -> None:
        """Starts the committer task on the running loop."""
        self._task = self._loop.create_task(self._run(), name="fusee-committer")

    def append(self, id: str, run: int, data: bytes) -> int:
        """Queues an encoded record of run ``run`` of ``id``; returns its LSN."""
        if self.failed is not None:
            raise self.failed
        lsn = self.lsn = self.lsn + 1
        self._entries.append(Entry(lsn, id, run, data))
        self._wake.set()
        return lsn

    def put_row(self, row: RunRow) -> None:
        """Writes ``row`` with the next batch (the latest row per id wins)."""
        self._rows[row.id] = row
        self._wake.set()

    def is_durable(self, lsn: int) -> bool:
        """Whether the log is durable through ``lsn``."""
        return lsn <= self.durable_lsn

    async def durable(self, lsn: int) -> None:
        """Returns once the log is durable through ``lsn``.

        Raises:
            StoreError: The store failed; nothing after its last good write is durable.
        """
        if lsn <= self.durable_lsn:
            return
        if self.failed is not None:
            raise self.failed
        fut = self._loop.create_future()
        heapq.heappush(self._waiters, (lsn, next(self._order), fut))
        await fut

    def on_durable(self, lsn: int, callback: Callable[[], object]) -> None:
        """Calls ``callback`` once the log is durable through ``lsn`` (at once if it is)."""
        if lsn <= self.durable_lsn:
            callback()
        else:
            heapq.heappush(self._callbacks, (lsn, next(self._order), callback))

    @property
    def idle(self) -> bool:
        """Nothing is waiting to be written, and no write is in flight."""
        return not self._entries and not self._rows and not self._writing

    async def flush(self) -> None:
        """Returns once everything appended so far is durable."""
        await self.durable(self.lsn)
        while self._rows and self.failed is None:
            await self.durable(self.lsn)
            await asyncio.sleep(0)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._entries and not self._rows:
                continue
            entries, self._entries = self._entries, []
            rows, self._rows = list(self._rows.values()), {}
            self._writing = True
            try:
                await self.store.append(entries, rows)
            except StoreError as e:
                self._fail(e)
                return
            finally:
                self._writing = False
            self.writes += 1
            if entries:
                self.durable_lsn = entries[-1].lsn
            self._release()

    def _release(self) -> None:
        durable = self.durable_lsn
        waiters = self._waiters
        while waiters and waiters[0][0] <= durable:
            fut = heapq.heappop(waiters)[2]
            if not fut.done():
                fut.set_result(None)
        callbacks = self._callbacks
        while callbacks and callbacks[0][0] <= durable:
            heapq.heappop(callbacks)[2]()

    def _fail(self, error: StoreError) -> None:
        self.failed = error
        for _, _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(error)
        self._waiters.clear()
        self._callbacks.clear()
        if self._on_fail is not None:
            self._on_fail(error)

    async def close(self) -> None:
        """Writes what is queued, then stops."""
        if self._task is None:
            return
        if self.failed is None and (self._entries or self._rows):
            with contextlib.suppress(StoreError):
                await self.flush()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    def abandon(self) -> None:
        """Stops at once, losing what is not durable yet (a simulated crash)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._entries.clear()
        self._rows.clear()
        for _, _, fut in self._waiters:
            fut.cancel()
        self._waiters.clear()
        self._callbacks.clear()
