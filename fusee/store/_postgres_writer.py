"""The Postgres store's writer task: it commits the queued appends, many to a transaction.

`PostgresStore` inherits it (`_PostgresWriter`); `append` queues a `_Write`
per caller, and the task answers them all after one commit (group commit).
The rule: only this task writes journals and rows, in call order, and a
fenced append's transaction locks the lease rows of its shards (``FOR
SHARE``), so a takeover waits for it or makes it fail with `StaleLease`.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from fusee.errors import StaleLease, StoreError
from fusee.store._base import Command, Entry, RunRow
from fusee.store._postgres_errors import _fails_every_write, _is_connection_lost, _PostgresErrors
from fusee.store._postgres_sql import _channel, _Sql, shard_of

if TYPE_CHECKING:
    import asyncpg


# How long a commit waits for a server that went away (a restart) before
# its caller hears of the failure.
_RECONNECT_S: Final = 30.0


@dataclass(slots=True)
class _Write:
    """One caller's append, queued for the writer task."""

    entries: tuple[Entry, ...]
    rows: builtins.list[tuple[Any, ...]]
    fence: tuple[tuple[int, int], ...]  # (lease slot, epoch), sorted
    fail: BaseException | None  # test hook: raised inside the transaction
    tops: dict[int, int]  # shard -> the write's highest LSN in it
    commands: tuple[Command, ...]  # posted in the same transaction
    # The failures the caller had seen reported when it called (see `_serve`).
    epoch: int
    # Resolves with None or the error; never cancelled, so reads wait on it.
    done: asyncio.Future[StoreError | None]
    # The same answer for the caller: cancelling the caller cancels this one only.
    answer: asyncio.Future[StoreError | None]


class _Stale(Exception):
    """Fenced shards whose epoch moved on: ``(shard, epoch)`` pairs."""

    def __init__(self, pairs: frozenset[tuple[int, int]]) -> None:
        super().__init__(sorted(pairs))
        self.pairs = pairs


class _PostgresWriter(_PostgresErrors):
    """The writer task's side of `PostgresStore` (whose ``__init__`` sets the attributes below)."""

    _shards: int
    _sql: _Sql
    _pool: asyncpg.Pool | None
    _loop: asyncio.AbstractEventLoop | None
    _queue: builtins.list[_Write]
    _wake: asyncio.Event
    _stop: bool
    _last_lsn: int
    _accepted: dict[int, int]
    _stored: dict[int, int]
    _inflight: int
    _tail: asyncio.Future[StoreError | None] | None
    _failures: int
    _last_failure: StoreError | None
    _pending: dict[str, tuple[RunRow, asyncio.Future[StoreError | None]]]
    _transactions: int
    _lane: int
    _lane_wanted: Callable[[str], int | None]

    _schema: str

    def _unslot(self, slot: int) -> int:
        """The shard of a lease slot of this store object's lane."""
        return slot - self._lane * self._shards

    def _submit(
        self,
        entries: tuple[Entry, ...],
        rows: builtins.list[tuple[Any, ...]],
        fence: tuple[tuple[int, int], ...],
        fail: BaseException | None,
        tops: dict[int, int],
        commands: tuple[Command, ...] = (),
    ) -> _Write:
        loop = self._loop
        assert loop is not None
        done: asyncio.Future[StoreError | None] = loop.create_future()
        self._accepted.update(tops)
        self._inflight += 1
        self._tail = done
        write = _Write(
            entries, rows, fence, fail, tops, commands, self._failures, done, loop.create_future()
        )
        self._queue.append(write)
        self._wake.set()
        return write

    async def _serve(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            # Everything queued meanwhile shares one transaction: group commit.
            writes, self._queue = self._queue, []
            if writes:
                errors = await self._write(writes)
                self._finish(writes, errors)
            elif self._stop:
                return
            if self._stop:
                self._wake.set()  # drain what came in while writing, then stop

    async def _write(self, writes: builtins.list[_Write]) -> builtins.list[StoreError | None]:
        # A journal has no holes: an append called before an earlier one's
        # failure was reported is not written either (queued in call order,
        # so those come first).
        stale = 0
        while stale < len(writes) and writes[stale].epoch < self._failures:
            stale += 1
        errors: builtins.list[StoreError | None] = [self._behind() for _ in writes[:stale]]
        writes = writes[stale:]
        if not writes:
            return errors
        try:
            await self._commit_surviving(writes)
            return errors + [None] * len(writes)
        except _Stale as e:
            lost = e.pairs
        except Exception as e:
            if len(writes) == 1 or _fails_every_write(e):
                return [*errors, self._failure(e), *(self._behind() for _ in writes[1:])]
            lost = frozenset()
        # One caller's failure (a lost lease, a bad value) must not fail the
        # appends beside it in the transaction: each alone, in order.
        for write in writes:
            if write.epoch < self._failures:
                errors.append(self._behind())
                continue
            if lost.intersection(write.fence):
                errors.append(
                    StaleLease(self._unslot(s) for s, _ in lost.intersection(write.fence))
                )
                continue
            try:
                await self._commit_surviving([write])
                errors.append(None)
            except _Stale as e:
                errors.append(StaleLease(self._unslot(s) for s, _ in e.pairs))
            except Exception as e:
                errors.append(self._failure(e))
        return errors

    async def _commit_surviving(self, writes: builtins.list[_Write]) -> None:
        """`_commit`, through a lost connection: a server restart, a dropped link.

        A connection lost before the commit's answer leaves it unknown
        whether the transaction committed: once the server answers again,
        the write's records are looked up, and the transaction is sent
        again only if they are not there (so it is never stored twice).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _RECONNECT_S
        delay = 0.05
        try:
            await self._commit(writes)
            return
        except Exception as e:
            if not _is_connection_lost(e):
                raise
            lost: BaseException = e
        while True:
            if loop.time() >= deadline or self._stop:
                raise lost
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
            try:
                if await self._landed(writes):
                    self._transactions += 1
                    return
                await self._commit(writes)
                return
            except Exception as e:
                if not _is_connection_lost(e):
                    raise
                lost = e

    async def _landed(self, writes: builtins.list[_Write]) -> bool:
        """Whether the journal holds the records of ``writes`` (a commit whose answer was lost)."""
        entries = [e for w in writes for e in w.entries]
        if not entries:
            return False  # rows only: writing them again changes nothing
        shards, base = self._shards, self._lane * self._shards
        assert self._pool is not None
        async with self._pool.acquire() as conn:
            found = await conn.fetchval(
                self._sql.count_entries,
                [base + shard_of(e.id, shards) for e in entries],
                [e.lsn for e in entries],
                [e.id for e in entries],
                [e.data for e in entries],
            )
        if found == len(entries):
            return True
        if found == 0 or any(w.fence for w in writes):
            # Not stored (fenced: some records, or all, may be another
            # worker's, written under a lease taken over meanwhile; sent
            # again, the fence check refuses the write with `StaleLease`).
            return False
        raise StoreError(
            f"a commit lost with its connection stored {found} of its {len(entries)} records; "
            "the store is damaged: run `fusee check`"
        )

    async def _commit(self, writes: builtins.list[_Write]) -> None:
        sql = self._sql
        fence = sorted({pair for w in writes for pair in w.fence})
        entries = [e for w in writes for e in w.entries]
        # The last row of an id wins; one INSERT may not update a row twice.
        rows = list({row[0]: row for w in writes for row in w.rows}.values())
        commands = [c for w in writes for c in w.commands]
        assert self._pool is not None
        async with self._pool.acquire() as conn, conn.transaction():
            if fence:
                held = await conn.fetch(sql.fence, [s for s, _ in fence], [e for _, e in fence])
                missing = set(fence) - {(r[0], r[1]) for r in held}
                if missing:
                    raise _Stale(frozenset(missing))
            if entries:
                shards, base = self._shards, self._lane * self._shards
                await conn.execute(
                    sql.insert_entries,
                    [base + shard_of(e.id, shards) for e in entries],
                    [e.lsn for e in entries],
                    [e.id for e in entries],
                    [e.run for e in entries],
                    [e.data for e in entries],
                )
            if rows:
                await conn.execute(
                    sql.upsert_rows, *(list(column) for column in zip(*rows, strict=True))
                )
            if commands:
                await conn.execute(
                    sql.post_commands,
                    [c.id for c in commands],
                    [c.kind for c in commands],
                    [c.run_id for c in commands],
                    [c.payload for c in commands],
                    [c.dedup for c in commands],
                    [c.created_ms for c in commands],
                    [shard_of(c.run_id, self._shards) for c in commands],
                    _channel(self._schema),
                    self._shards,
                    [self._lane_wanted(c.kind) for c in commands],
                )
            for w in writes:
                if w.fail is not None:
                    raise w.fail
        self._transactions += 1

    def _failure(self, e: BaseException) -> StoreError:
        error = self._last_failure = self._error(e, "writing to")
        self._failures += 1
        return error

    def _behind(self) -> StoreError:
        error = StoreError(
            f"not written: an append called before this one failed ({self._last_failure})"
        )
        error.__cause__ = self._last_failure
        return error

    def _finish(
        self, writes: builtins.list[_Write], errors: builtins.list[StoreError | None]
    ) -> None:
        for write, error in zip(writes, errors, strict=True):
            self._inflight -= 1
            if error is None and write.tops:
                self._stored.update(write.tops)
                self._last_lsn = max(self._last_lsn, *write.tops.values())
            write.done.set_result(error)
            if not write.answer.done():  # its caller was cancelled
                write.answer.set_result(error)
            pending = self._pending
            for row in write.rows:
                latest = pending.get(row[0])
                if latest is not None and latest[1] is write.done:
                    del pending[row[0]]
        if self._inflight == 0:
            # LSNs of failed appends were never stored: they may be used again.
            self._accepted = dict(self._stored)
