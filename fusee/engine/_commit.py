"""Group commit: every record appended meanwhile goes to storage in one durable write.

Workflow code runs ahead of the disk: `append` assigns a record its LSN at
once and returns. A writer task takes whatever accumulated since the
last write as one batch (one transaction, one fsync), then wakes whoever
waits for an LSN it covered. Only what leaves the process waits, and only
for the records it depends on. Rows, posted commands and queue item
changes ride in the batch of the records they go with; `stored` waits for
a batch with no record of its own.

Two writers take turns, so two writes may be in flight: while the store
syncs one batch, the next is already queued behind it, and the disk does not
wait for the event loop to notice a write ended and hand over the next. The
store keeps appends in call order and fails those behind a failed one, so
the journal has no hole. With a store that writes at once (memory), one
writer does everything and the other never wakes.

A failed write (a full disk, a lost connection) is retried with backoff on
the engine's clock, the failed batches in their order and nothing new
meanwhile, until the store takes it: what was not acknowledged waits, and
nothing acknowledged is lost. When both writers' batches failed, the outage
ends with the last of their retries, never before the older one is stored.
A `StaleLease` (the shard is another worker's now) and an `Unrecoverable`
error are not retried: the committer stops and every waiter gets the error.

A caller never waits on a failed write for long: while a write is being
retried, a call waiting for its own write (a start, a signal) gets a
`StoreError` once it has waited `write_timeout_s`, which says that the
store takes no writes and that nothing acknowledged is lost (its own
write stays queued, stored once the store takes writes). The engine's
own waits (a step's gate, parking) are unbounded: they resume with the
store. A read waits for no write during an outage: it answers from what
the store holds.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from fusee.errors import CorruptRecord, FuseeError, StaleLease, StoreError
from fusee.store import Command, Entry, RunRow
from fusee.store._queues import QueueItem

if TYPE_CHECKING:
    from fusee.engine._clock import Clock
    from fusee.store import Store

__all__ = ["RETRY_FIRST_S", "RETRY_MAX_S", "WRITE_TIMEOUT_S", "Committer", "Unrecoverable"]

log = logging.getLogger("fusee")

RETRY_FIRST_S = 0.1
"""The wait before the first retry of a failed write; it doubles up to `RETRY_MAX_S`."""
RETRY_MAX_S = 30.0
"""The longest wait between two retries of a failed write."""

WRITE_TIMEOUT_S = 5.0
"""How long a call waits for its write while the store takes none, by default."""

# What a waiter is: a caller whose wait is bounded during an outage, the
# engine's own (unbounded) wait, or a read (released when an outage begins).
_BOUNDED, _UNBOUNDED, _READ = 0, 1, 2

_Waiters = list[tuple[int, int, asyncio.Future[None], int]]

_CLOSED = "this engine is closed; open a new one with fusee.Engine.open(...)"

# One batch being written and one queued behind it: enough to keep the disk
# busy; more would only split what the next batch could carry.
_WRITERS = 2


class Unrecoverable(StoreError):
    """A store failure the committer does not retry: the process is gone (a simulated crash).

    Example:
        >>> isinstance(Unrecoverable("simulated crash"), StoreError)
        True
    """


def retries(error: StoreError) -> bool:
    """Whether the committer retries a write that failed with ``error``.

    A full disk, a lock or a lost connection may pass; a `StaleLease` (the
    shard's runs are another worker's now: the engine drops them), a
    `CorruptRecord` and an `Unrecoverable` error do not.

    Example:
        >>> retries(StoreError("disk full")), retries(StaleLease([3]))
        (True, False)
    """
    return not isinstance(error, StaleLease | CorruptRecord | Unrecoverable)


class _Flight:
    """One batch handed to the store and not yet back."""

    __slots__ = ("done", "last_lsn", "number")

    def __init__(self, last_lsn: int, number: int) -> None:
        self.last_lsn = last_lsn  # 0: rows only
        self.number = number  # batches count from 1, in the order writers take them
        self.done = False


class _Batch:
    """What one write hands the store: records, rows, commands and queue item changes."""

    __slots__ = ("commands", "entries", "forget", "items", "rows")

    def __init__(
        self,
        entries: list[Entry],
        rows: list[RunRow],
        commands: list[tuple[str, Command]],
        items: list[QueueItem],
    ) -> None:
        self.entries = entries
        self.rows = rows
        self.commands = commands
        self.items = items
        self.forget: list[int] = []


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

    # Slots: `append` runs for every record (see `RunDriver`'s).
    __slots__ = (
        "_abandoned",
        "_backing_off",
        "_batch_waiters",
        "_callbacks",
        "_clock",
        "_closing",
        "_commands",
        "_entries",
        "_failed_batches",
        "_fence",
        "_flights",
        "_forget",
        "_idle",
        "_items",
        "_loop",
        "_lost",
        "_on_fail",
        "_on_stale",
        "_order",
        "_outage_waiters",
        "_retry_turn",
        "_rows",
        "_shard_of",
        "_stopped",
        "_stored",
        "_taken",
        "_tasks",
        "_waiters",
        "_woken",
        "durable_lsn",
        "failed",
        "lsn",
        "on_write",
        "outage",
        "retried_writes",
        "store",
        "write_timeout_s",
        "writes",
    )

    def __init__(
        self,
        store: Store,
        on_fail: Callable[[StoreError], None] | None = None,
        clock: Clock | None = None,
        write_timeout_s: float | None = WRITE_TIMEOUT_S,
    ) -> None:
        self.store = store
        # None: a caller waits for its write however long the store fails.
        self.write_timeout_s = write_timeout_s
        self._on_fail = on_fail
        # Retries wait on the engine's clock (the test host's is virtual).
        self._clock = clock
        self.lsn = store.last_lsn
        self.durable_lsn = store.last_lsn
        self._entries: list[Entry] = []
        self._rows: dict[str, RunRow] = {}
        # Commands to post with the next batch, each with the run whose
        # shard's part of the batch carries it.
        self._commands: list[tuple[str, Command]] = []
        # Queue item changes of an engine alone on its store (`put_item`).
        self._items: dict[int, QueueItem] = {}
        self._forget: list[int] = []
        self._waiters: _Waiters = []
        # Batches taken by writers, and stored (in order): `stored` waits on them.
        self._taken = 0
        self._stored = 0
        self._batch_waiters: _Waiters = []
        # By LSN, then as registered: most come in LSN order (a run's gate is
        # the newest record), so a deque takes them at its end.
        self._callbacks: collections.deque[tuple[int, Callable[[], object]]] = collections.deque()
        self._order = itertools.count()
        self._loop = asyncio.get_running_loop()
        self.failed: StoreError | None = None
        self.writes = 0
        # Batches handed to the store and not yet back, in call order: with
        # SQLite one is on a writer thread for a while, and "idle" must not
        # say nothing is left to write meanwhile (the test host settles on it).
        self._flights: collections.deque[_Flight] = collections.deque()
        self._tasks: list[asyncio.Task[None]] = []
        # Writers waiting for something to write, and whether one was woken
        # and has not run yet (it takes everything appended until it runs,
        # so one woken writer is enough).
        self._idle: list[asyncio.Future[None]] = []
        self._woken = False
        # Fencing, on a shared store: a shard's epoch (None: not held), a
        # run's shard, and who hears of shards lost.
        self._fence: Callable[[int], int | None] | None = None
        self._shard_of: Callable[[str], int] = _no_shard
        self._on_stale: Callable[[list[int]], None] | None = None
        # LSNs of records a lost lease refused, with why: never durable.
        self._lost: dict[int, StaleLease] = {}
        # Called after each write with its record count and seconds
        # (telemetry); None, and no clock read, when nobody listens.
        self.on_write: Callable[[int, float], None] | None = None
        # The failure being retried (None: the store takes writes), and the
        # writers waiting for it to end before they take a new batch.
        self.outage: StoreError | None = None
        self._outage_waiters: list[asyncio.Future[None]] = []
        # Failed batches retry one at a time, in the order they were written.
        self._retry_turn = asyncio.Lock()
        self._failed_batches = 0  # waiting for their retry, or being retried
        self._closing = False
        self._stopped = False
        # Set by `abandon`: what was handed over and not stored is gone.
        self._abandoned = False
        self._backing_off = False
        self.retried_writes = 0

    def fenced(
        self,
        fence: Callable[[int], int | None],
        shard_of: Callable[[str], int],
        on_stale: Callable[[list[int]], None],
    ) -> None:
        """Fences every write by shard: ``fence(shard)`` gives the epoch to write under."""
        self._fence = fence
        self._shard_of = shard_of
        self._on_stale = on_stale

    def advance(self, lsn: int) -> None:
        """Numbers the next records past ``lsn`` (another worker's last, in shards taken over)."""
        if lsn > self.lsn:
            self.lsn = lsn

    def start(self) -> None:
        """Starts the writer tasks on the running loop."""
        self._tasks = [
            self._loop.create_task(self._writer(), name=f"fusee-committer-{n}")
            for n in range(_WRITERS)
        ]

    def append(self, id: str, run: int, data: bytes) -> int:
        """Queues an encoded record of run ``run`` of ``id``; returns its LSN."""
        if self.failed is not None:
            raise self.failed
        lsn = self.lsn = self.lsn + 1
        self._entries.append(Entry(lsn, id, run, data))
        if not self._woken and self._idle:
            self._wake()
        return lsn

    def put_row(self, row: RunRow) -> None:
        """Writes ``row`` with the next batch (the latest row per id wins)."""
        self._rows[row.id] = row
        if not self._woken and self._idle:
            self._wake()

    def post(self, id: str, command: Command) -> None:
        """Posts ``command`` to the store's inbox with the next batch's records of run ``id``.

        It is stored exactly when they are (in the same transaction), and
        lost with them when their shard's lease is. Only a store shared by
        several workers takes commands this way.
        """
        assert self._fence is not None, "commands are posted with records on shared stores only"
        self._commands.append((id, command))
        if not self._woken and self._idle:
            self._wake()

    def put_item(self, item: QueueItem) -> None:
        """Writes queue item ``item`` with the next batch (the latest per seq wins)."""
        self._items[item.seq] = item
        if not self._woken and self._idle:
            self._wake()

    def forget_item(self, seq: int) -> None:
        """Deletes queue item ``seq`` with the next batch."""
        self._items.pop(seq, None)
        self._forget.append(seq)
        if not self._woken and self._idle:
            self._wake()

    async def stored(self, *, bounded: bool = True) -> None:
        """Returns once everything handed over so far (records, rows, items) is durable.

        Args:
            bounded: Whether the wait ends with a `StoreError` after
                `write_timeout_s` of an outage (a caller's wait), or lasts
                until the store takes writes again (the engine's own).

        Raises:
            StoreError: The store failed; nothing after its last good write is
                durable. Or (``bounded``) the store took no write for
                `write_timeout_s`: nothing acknowledged is lost.
            FuseeError: The engine crashed (`abandon`), or closed with
                something still to write.
        """
        if self._abandoned:
            # The crash dropped the batches not yet stored, and with them the
            # count that says which ones a caller's changes rode in: none of
            # them may be acknowledged as stored (an ATTACH start that found
            # another call's queue item, a signal held for a queued run).
            raise FuseeError(_CLOSED)
        number = self._taken + 1 if self._pending() else self._taken
        if number > self._stored:
            await self._wait(self._batch_waiters, number, _BOUNDED if bounded else _UNBOUNDED)

    async def readable(self) -> None:
        """Returns once what was handed over so far is stored, or at once during an outage.

        A read's wait: it reads its own writes while the store takes them,
        and never waits on a write the store refuses (it then answers from
        what the store holds).

        Raises:
            StoreError: The store failed for good.
        """
        if self.outage is not None:
            return
        number = self._taken + 1 if self._pending() else self._taken
        if number > self._stored:
            await self._wait(self._batch_waiters, number, _READ)

    def _pending(self) -> bool:
        return bool(self._entries or self._rows or self._commands or self._items or self._forget)

    def drop(self, shards: Collection[int]) -> None:
        """Loses what is queued and not yet handed to the store for runs of ``shards``.

        Their runs are dropped (the shards moved to another worker, or are
        given back): queued records of theirs must not be written, not even
        should this worker take the shard again (under a new epoch), where
        they would follow records its lost lease refused.
        """
        shard_of = self._shard_of
        dropped = set(shards)
        # Left in the queue, lost: the batch that takes them skips them, and
        # its end releases their waiters (with `StaleLease`) in LSN order.
        gone = [e for e in self._entries if shard_of(e.id) in dropped]
        if gone:
            self._lose(gone, StaleLease(sorted(dropped)))
        for id in [id for id in self._rows if shard_of(id) in dropped]:
            del self._rows[id]
        self._commands = [(id, c) for id, c in self._commands if shard_of(id) not in dropped]

    def is_durable(self, lsn: int) -> bool:
        """Whether the log is durable through ``lsn``."""
        return lsn <= self.durable_lsn

    async def durable(self, lsn: int, *, bounded: bool = True) -> None:
        """Returns once the log is durable through ``lsn``.

        Args:
            lsn: The record waited for.
            bounded: As for `stored`.

        Raises:
            StoreError: The store failed; nothing after its last good write is
                durable. Or (``bounded``) the store took no write for
                `write_timeout_s`: nothing acknowledged is lost.
        """
        if lsn <= self.durable_lsn:
            if self._lost and lsn in self._lost:
                raise self._lost[lsn]
            return
        await self._wait(self._waiters, lsn, _BOUNDED if bounded else _UNBOUNDED)

    async def _wait(self, waiters: _Waiters, at: int, kind: int) -> None:
        """Waits in ``waiters`` until ``_release`` reaches ``at`` (an LSN, or a batch's number)."""
        if self.failed is not None:
            raise self.failed
        if self._stopped:
            # Nothing writes any more (the engine closed, or crashed under the
            # test host): a caller still working in it must not wait forever.
            raise FuseeError(_CLOSED)
        fut = self._loop.create_future()
        heapq.heappush(waiters, (at, next(self._order), fut, kind))
        if kind == _BOUNDED and self.outage is not None:
            self._bound(fut)
        await fut

    def _bound(self, fut: asyncio.Future[None]) -> None:
        """Fails caller's wait ``fut`` if the outage lasts `write_timeout_s` more."""
        timeout_s = self.write_timeout_s
        if timeout_s is None:
            return
        if self._clock is None:
            self._loop.call_later(timeout_s, self._time_out, fut)
        else:
            at_ms = self._clock.now_ms() + max(1, round(timeout_s * 1000))
            self._clock.call_at(at_ms, lambda: self._time_out(fut))

    def _time_out(self, fut: asyncio.Future[None]) -> None:
        outage = self.outage
        if fut.done() or outage is None:
            return  # written meanwhile, or about to be (the store took the retry)
        fut.set_exception(
            StoreError(
                f"{outage}. This call waited {self.write_timeout_s:g}s for its write and is not "
                "acknowledged: the write stays queued, stored once the store takes writes "
                "unless this engine stops first. Nothing acknowledged is lost, and the engine "
                "resumes by itself once the store takes writes again"
            )
        )

    def _outage_began(self) -> None:
        """Bounds the callers' waits, and releases the reads: none waits on the failed write."""
        for _, _, fut, kind in self._waiters + self._batch_waiters:
            if fut.done():
                continue
            if kind == _BOUNDED:
                self._bound(fut)
            elif kind == _READ:
                fut.set_result(None)

    def on_durable(self, lsn: int, callback: Callable[[], object]) -> None:
        """Calls ``callback`` once the log is durable through ``lsn`` (at once if it is)."""
        if lsn <= self.durable_lsn:
            if not (self._lost and lsn in self._lost):  # never durable: refused with its lease
                callback()
        else:
            callbacks = self._callbacks
            if not callbacks or callbacks[-1][0] <= lsn:
                callbacks.append((lsn, callback))
            else:
                bisect.insort_right(callbacks, (lsn, callback), key=_lsn_of)

    @property
    def idle(self) -> bool:
        """Nothing is waiting to be written, and no write is in flight."""
        return not self._pending() and not self._flights

    async def flush(self, *, bounded: bool = True) -> None:
        """Returns once everything appended so far is durable (or lost with its shard's lease).

        Args:
            bounded: As for `stored`.
        """
        # What a lost lease refused is settled too (its run is dropped): its
        # batch was stored without it.
        await self.stored(bounded=bounded)

    def _wake(self) -> None:
        idle = self._idle
        while idle:
            writer = idle.pop()
            if not writer.done():  # not a writer cancelled by close()
                self._woken = True
                writer.set_result(None)
                return

    async def _writer(self) -> None:
        flights = self._flights
        while self.failed is None:
            if self.outage is not None:
                # Nothing new is written while a failed batch waits for its
                # retry: the journal would have a hole.
                await self._outage_over()
                continue
            if not (self._entries or self._rows or self._commands or self._items or self._forget):
                idle = self._loop.create_future()
                self._idle.append(idle)
                try:
                    await idle
                finally:
                    self._woken = False
                continue
            entries, self._entries = self._entries, []
            rows: list[RunRow] = []
            if self._rows:  # most batches carry records alone
                rows, self._rows = list(self._rows.values()), {}
            batch: _Batch | None = None
            if self._fence is not None or self._items or self._forget or self._commands:
                batch = _Batch(entries, rows, self._commands, list(self._items.values()))
                batch.forget, self._commands, self._items, self._forget = self._forget, [], {}, []
            self._taken += 1
            flight = _Flight(entries[-1].lsn if entries else 0, self._taken)
            flights.append(flight)
            on_write = self.on_write
            began = time.perf_counter() if on_write is not None else 0.0
            try:
                if batch is None:
                    # Records and rows alone, unfenced: the common write, straight on.
                    await self.store.append(entries, rows)
                else:
                    await self._append(batch)
            except StoreError as e:
                if batch is None:
                    batch = _Batch(entries, rows, [], [])
                final = await self._retry(batch, e) if retries(e) else e
                if final is not None:
                    flights.clear()
                    if self.failed is None:  # the writes behind it fail too: report the first
                        self._fail(final)
                    return
            if on_write is not None:
                on_write(len(entries), time.perf_counter() - began)
            # Not kept while this writer waits for the next batch.
            del entries, rows, batch
            self.writes += 1
            flight.done = True
            while flights and flights[0].done:
                landed = flights.popleft()
                self._stored = landed.number
                if landed.last_lsn:
                    self.durable_lsn = landed.last_lsn
            # This writer looks for more right after: what the released code
            # appends needs no other writer woken.
            woken, self._woken = self._woken, True
            self._release()
            self._woken = woken

    async def _append(self, batch: _Batch) -> None:
        if self._fence is not None:
            await self._append_fenced(batch)
        elif batch.items or batch.forget:
            await self.store.append(
                batch.entries, batch.rows, items=batch.items, forget=batch.forget
            )
        else:
            await self.store.append(batch.entries, batch.rows)

    async def _append_fenced(self, batch: _Batch) -> None:
        """One append per shard, each under its lease; a lost shard's part is lost alone."""
        fence, shard_of = self._fence, self._shard_of
        assert fence is not None
        # A shared store admits queued runs itself: no engine writes items.
        assert not batch.items
        assert not batch.forget
        entries, rows, commands = batch.entries, batch.rows, batch.commands
        parts: dict[int, tuple[list[Entry], list[RunRow], list[Command]]] = {}
        lost_before = self._lost
        for e in entries:
            if lost_before and e.lsn in lost_before:
                continue  # dropped with its shard's runs (`drop`)
            parts.setdefault(shard_of(e.id), ([], [], []))[0].append(e)
        for r in rows:
            parts.setdefault(shard_of(r.id), ([], [], []))[1].append(r)
        for id, c in commands:
            parts.setdefault(shard_of(id), ([], [], []))[2].append(c)
        lost: list[int] = []
        sent: list[tuple[int, int, list[Entry]]] = []
        appends = []
        for shard, (es, rs, cs) in parts.items():
            epoch = fence(shard)
            if epoch is None:
                self._lose(es, StaleLease([shard]))
                lost.append(shard)
                continue
            sent.append((shard, epoch, es))
            # A shared store's append (`PostgresStore.append`) takes both.
            append = self.store.append(es, rs, fence={shard: epoch}, commands=cs)  # type: ignore[call-arg]
            appends.append(append)
        # Queued together, the store commits them in one transaction.
        results = await asyncio.gather(*appends, return_exceptions=True)
        error: BaseException | None = None
        failed: set[int] = set()
        for (shard, epoch, es), result in zip(sent, results, strict=True):
            if isinstance(result, StaleLease):
                self._lose(es, result)
                # Refused under an epoch since replaced (the shard was lost,
                # then taken again): the runs of that life are gone already.
                if fence(shard) in (epoch, None):
                    lost.append(shard)
            elif isinstance(result, BaseException):
                failed.add(shard)
                if error is None:
                    error = result
        if lost and self._on_stale is not None:
            self._on_stale(lost)
        if error is not None:
            # What is retried is the failed shards' parts only: the others
            # are stored (or refused) already.
            entries[:] = [e for e in entries if shard_of(e.id) in failed]
            rows[:] = [r for r in rows if shard_of(r.id) in failed]
            commands[:] = [(id, c) for id, c in commands if shard_of(id) in failed]
            raise error

    def _lose(self, entries: list[Entry], why: StaleLease) -> None:
        for e in entries:
            self._lost[e.lsn] = why

    # --- retrying a failed write ---------------------------------------------------------------

    @property
    def retrying(self) -> bool:
        """A failed write waits for its retry (the store failed and may recover)."""
        return self.outage is not None

    @property
    def callers_waiting(self) -> int:
        """How many callers wait for their writes (the engine's own waits not counted)."""
        return sum(
            kind == _BOUNDED and not fut.done()
            for _, _, fut, kind in self._waiters + self._batch_waiters
        )

    @property
    def backing_off(self) -> bool:
        """A failed write waits on the clock for its next attempt (none is in flight)."""
        return self._backing_off

    async def _retry(self, batch: _Batch, error: StoreError) -> StoreError | None:
        """Writes a failed batch again until the store takes it; returns None, or why not.

        A store's append is all or nothing, so the whole batch goes again (on
        a shared store, the parts of the shards whose append failed); a store
        that kept part of it is refused, never written to twice.
        """
        if self.outage is None:
            self.outage = error
            self._outage_began()
            log.warning(
                "the store failed to write (%s); retrying with backoff, and what was not "
                "acknowledged waits for it (nothing acknowledged is lost)",
                error,
            )
        delay = RETRY_FIRST_S
        # Both writers' batches may have failed: the outage lasts until the
        # last of them is stored, or a writer would write a newer batch
        # before an older one's retry (a hole, then a refused append).
        self._failed_batches += 1
        try:
            return await self._retry_turns(batch, error, delay)
        finally:
            self._failed_batches -= 1

    async def _retry_turns(
        self, batch: _Batch, error: StoreError, delay: float
    ) -> StoreError | None:
        async with self._retry_turn:
            while True:
                if self._closing:
                    return error
                self._backing_off = True
                try:
                    await self._sleep(delay)
                finally:
                    self._backing_off = False
                if self._closing or self.failed is not None:
                    return error
                entries = batch.entries
                if self._fence is None and entries and entries[0].lsn <= self.store.last_lsn:
                    # The store holds records past this batch's start (it
                    # broke its all-or-nothing rule): written again, the
                    # batch would repeat them or leave a hole. (A shared
                    # store numbers by shard, and checks that itself.)
                    return StoreError(
                        f"the store holds records from LSN {entries[0].lsn} on, which a "
                        f"failed write was to store ({error}); reopen the engine to recover "
                        "from what the store holds"
                    )
                try:
                    await self._append(batch)
                except StoreError as e:
                    if not retries(e):
                        return e
                    error, delay = e, min(delay * 2, RETRY_MAX_S)
                    continue
                break
        self.retried_writes += 1
        if self.outage is not None and self._failed_batches == 1:  # this one's, the last
            self.outage = None
            log.warning("the store takes writes again; the failed writes are stored")
            for fut in self._outage_waiters:
                if not fut.done():
                    fut.set_result(None)
            self._outage_waiters.clear()
        return None

    async def _outage_over(self) -> None:
        fut = self._loop.create_future()
        self._outage_waiters.append(fut)
        await fut

    async def _sleep(self, delay_s: float) -> None:
        if self._clock is None:
            await asyncio.sleep(delay_s)
            return
        fut: asyncio.Future[None] = self._loop.create_future()
        at_ms = self._clock.now_ms() + max(1, round(delay_s * 1000))
        handle = self._clock.call_at(at_ms, lambda: _wake_up(fut))
        try:
            await fut
        finally:
            handle.cancel()

    def _release(self) -> None:
        durable = self.durable_lsn
        waiters = self._waiters
        lost = self._lost
        while waiters and waiters[0][0] <= durable:
            lsn, _, fut, _ = heapq.heappop(waiters)
            if not fut.done():
                if lost and lsn in lost:
                    fut.set_exception(lost[lsn])
                else:
                    fut.set_result(None)
        callbacks = self._callbacks
        while callbacks and callbacks[0][0] <= durable:
            lsn, callback = callbacks.popleft()
            if not (lost and lsn in lost):
                callback()
        batches = self._batch_waiters
        while batches and batches[0][0] <= self._stored:
            fut = heapq.heappop(batches)[2]
            if not fut.done():
                fut.set_result(None)

    def _fail(self, error: StoreError) -> None:
        self.failed = error
        for _, _, fut, _ in self._waiters + self._batch_waiters:
            if not fut.done():
                fut.set_exception(error)
        self._waiters.clear()
        self._batch_waiters.clear()
        self._callbacks.clear()
        if self._on_fail is not None:
            self._on_fail(error)

    async def close(self) -> None:
        """Writes what is queued, then stops."""
        if not self._tasks:
            return
        # During an outage nothing more is written: what is not durable is
        # left to the next open's replay, as after a crash.
        if self.failed is None and self.outage is None and self._pending():
            with contextlib.suppress(StoreError):
                await self.flush()
        self._closing = True
        tasks, self._tasks = self._tasks, []
        self._stopped = True
        # Nothing wakes a writer from here on: what is appended now (a run
        # parking while the engine closes) stays for the next open's replay.
        self._idle.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def abandon(self) -> None:
        """Stops at once, losing what is not durable yet (a simulated crash)."""
        self._stopped = True
        self._abandoned = True
        for task in self._tasks:
            task.cancel()
        self._tasks = []
        self._idle.clear()
        self._flights.clear()
        self._entries.clear()
        self._rows.clear()
        self._commands.clear()
        self._items.clear()
        self._forget.clear()
        for _, _, fut, _ in self._waiters + self._batch_waiters:
            fut.cancel()
        self._waiters.clear()
        self._batch_waiters.clear()
        self._callbacks.clear()


def _lsn_of(callback: tuple[int, Callable[[], object]]) -> int:
    return callback[0]


def _no_shard(id: str) -> int:
    return 0


def _wake_up(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
