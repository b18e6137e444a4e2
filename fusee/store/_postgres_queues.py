"""The Postgres store's queue items: the ``queues`` and ``queue_items`` tables (format 3).

`fusee.store.PostgresStore` inherits `PostgresQueues`. Several engines
admit from one queue at once, so an admission is one transaction that
cannot race another into exceeding a limit:

- a queue with a budget every admission shares (``concurrency``, a rate,
  or ``per_key``) first locks its row of ``queues`` (``SELECT ... FOR
  UPDATE``): admissions of that queue take turns, and each reads the items
  (in a fresh READ COMMITTED snapshot taken after the lock) that the one
  before it committed, so two never both take the last slot (write skew);
- a queue without limits takes its next items with ``FOR UPDATE SKIP
  LOCKED``: engines admit side by side, each skipping the others' rows.

The rule: queue items change only inside one of these transactions, and a
queue's admission reads its counted items only after taking its lock.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, Final, TypeVar

from fusee.store._base import RunRow
from fusee.store._postgres_sql import _Sql, shard_of
from fusee.store._queues import Admission, QueueItem, QueueLimits, forgettable, plan_admission

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresQueues"]

_T = TypeVar("_T")

_COLUMNS: Final = (
    "queue, id, run, workflow, input, key, priority, seq, not_before_ms, state, admitted_ms,"
    " origin, signals"
)
# How many items one admission of a queue without limits takes at most.
_UNLIMITED_BATCH: Final = 500


def _item(r: Any) -> QueueItem:
    return QueueItem(
        r["queue"],
        r["id"],
        int(r["run"]),
        r["workflow"],
        bytes(r["input"]),
        r["key"],
        int(r["priority"]),
        int(r["seq"]),
        int(r["not_before_ms"]),
        r["state"],
        None if r["admitted_ms"] is None else int(r["admitted_ms"]),
        bytes(r["origin"]),
        tuple(bytes(b) for b in r["signals"] or ()),
    )


class PostgresQueues:
    """`Store`'s queue methods on Postgres (see the module's docstring).

    Example:
        >>> PostgresQueues.admit.__name__
        'admit'
    """

    _q: str
    _sql: _Sql
    _shards: int
    _lane: int
    _check_writable: Callable[[], None]
    _check_open: Callable[[], None]
    _query: Callable[..., Awaitable[Any]]

    async def _in_transaction(
        self, fn: Callable[[asyncpg.Connection], Awaitable[_T]], doing: str
    ) -> _T:
        self._check_writable()

        async def run(conn: asyncpg.Connection) -> _T:
            async with conn.transaction():
                return await fn(conn)

        result: _T = await self._query(run, doing)
        return result

    async def enqueue(self, item: QueueItem, row: RunRow) -> QueueItem | None:
        """Stores queued ``item`` and ``row`` in one transaction; None if ``id`` has an item."""
        q = self._q

        async def write(conn: asyncpg.Connection) -> QueueItem | None:
            seq = await conn.fetchval(
                f"INSERT INTO {q}.queue_items (queue, id, run, workflow, input, key, priority,"
                " not_before_ms, state, origin) VALUES ($1, $2, $3, $4, $5, $6, $7, $8,"
                " 'queued', $9) ON CONFLICT (id) WHERE state <> 'done' DO NOTHING RETURNING seq",
                item.queue,
                item.id,
                item.run,
                item.workflow,
                item.input,
                item.key,
                item.priority,
                item.not_before_ms,
                item.origin,
            )
            if seq is None:
                return None
            await conn.execute(
                f"INSERT INTO {q}.runs (id, shard, run, workflow, status, started_ms, parent,"
                " wake_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (id) DO UPDATE"
                " SET shard = EXCLUDED.shard, run = EXCLUDED.run, workflow = EXCLUDED.workflow,"
                " status = EXCLUDED.status, started_ms = EXCLUDED.started_ms,"
                " finished_ms = NULL, wake_ms = EXCLUDED.wake_ms, attributes = NULL,"
                " parent = EXCLUDED.parent, version = '', error = NULL",
                row.id,
                shard_of(row.id, self._shards),
                row.run,
                row.workflow,
                str(row.status),
                row.started_ms,
                row.parent,
                row.wake_ms,
            )
            return QueueItem(
                item.queue,
                item.id,
                item.run,
                item.workflow,
                item.input,
                item.key,
                item.priority,
                int(seq),
                item.not_before_ms,
                "queued",
                None,
                item.origin,
            )

        return await self._in_transaction(write, "queueing a run in")

    async def debounce_queued(self, id: str, input: bytes, not_before_ms: int) -> bool:
        """Replaces queued ``id``'s input and admission time; False if it is not queued."""
        q = self._q

        async def write(conn: asyncpg.Connection) -> bool:
            status = await conn.execute(
                f"UPDATE {q}.queue_items SET input = $1, not_before_ms = $2"
                " WHERE id = $3 AND state = 'queued'",
                input,
                not_before_ms,
                id,
            )
            return str(status) != "UPDATE 0"

        return await self._in_transaction(write, "debouncing a queued run in")

    async def start_queued(self, id: str, now_ms: int) -> str | None:
        """Lets queued ``id`` in from ``now_ms`` on; its queue, or None if it is not queued."""
        q = self._q

        async def write(conn: asyncpg.Connection) -> str | None:
            # One conditional update: a debounce's new input, written in the
            # same instant, stays (the row lock orders the two).
            queue = await conn.fetchval(
                f"UPDATE {q}.queue_items SET not_before_ms = least(not_before_ms, $1)"
                " WHERE id = $2 AND state = 'queued' RETURNING queue",
                now_ms,
                id,
            )
            if queue is None:
                return None
            await conn.execute(
                f"UPDATE {q}.runs SET wake_ms = NULL WHERE id = $1 AND status = 'queued'", id
            )
            return str(queue)

        return await self._in_transaction(write, "starting a queued run early in")

    async def signal_queued(self, id: str, signal: bytes) -> bool:
        """Adds ``signal`` to queued ``id``'s signals; False if it is not queued."""
        q = self._q

        async def write(conn: asyncpg.Connection) -> bool:
            status = await conn.execute(
                f"UPDATE {q}.queue_items SET signals = array_append(signals, $1::bytea)"
                " WHERE id = $2 AND state = 'queued'",
                signal,
                id,
            )
            return str(status) != "UPDATE 0"

        return await self._in_transaction(write, "signalling a queued run in")

    async def admit(
        self,
        limits: QueueLimits,
        now_ms: int,
        runnable: Callable[[QueueItem], bool] | None = None,
        released: Collection[str] = (),
        *,
        fence: Mapping[int, int] | None = None,
    ) -> Admission:
        """Frees ``released``'s slots, then admits what ``limits`` allow (see the module).

        ``fence``: shard to lease epoch, the admitting worker's; an item is
        admitted only while its shard's lease is still that (checked, and
        the lease row held, in the admission's transaction), so a worker
        that takes the shard over finds every item admitted before it took
        it, and none admitted after.
        """
        q = self._q
        shards = self._shards
        serialized = limits.shares_budget or limits.per_key is not None

        async def write(conn: asyncpg.Connection) -> Admission:
            if released:
                # Before the lock: freeing a slot only ever lets more in.
                await conn.execute(
                    f"UPDATE {q}.queue_items SET state = 'done'"
                    " WHERE id = ANY($1::text[]) AND state = 'admitted'",
                    list(released),
                )
            if serialized:
                await conn.execute(
                    f"INSERT INTO {q}.queues (name) VALUES ($1) ON CONFLICT DO NOTHING",
                    limits.name,
                )
                await conn.execute(
                    f"SELECT name FROM {q}.queues WHERE name = $1 FOR UPDATE", limits.name
                )
                rows = await conn.fetch(
                    f"SELECT {_COLUMNS} FROM {q}.queue_items WHERE queue = $1", limits.name
                )
            else:
                rows = await conn.fetch(
                    f"SELECT {_COLUMNS} FROM {q}.queue_items WHERE queue = $1 AND state = 'queued'"
                    f" ORDER BY priority, seq LIMIT {_UNLIMITED_BATCH} FOR UPDATE SKIP LOCKED",
                    limits.name,
                )
            items = [_item(r) for r in rows]
            old = [i.seq for i in items if forgettable(i, now_ms, limits.rate_ms)]
            if old:
                await conn.execute(
                    f"DELETE FROM {q}.queue_items WHERE seq = ANY($1::bigint[])", old
                )
            admission = plan_admission(limits, items, now_ms, runnable)
            if admission.items and fence is not None:
                # Under this worker's lane's leases (`PostgresStore.serve_version`).
                base = self._lane * shards
                wanted = sorted(
                    {
                        (base + s, fence[s])
                        for i in admission.items
                        if (s := shard_of(i.id, shards)) in fence
                    }
                )
                held = {
                    r[0] - base
                    for r in await conn.fetch(
                        self._sql.fence, [s for s, _ in wanted], [e for _, e in wanted]
                    )
                }
                kept = [i for i in admission.items if shard_of(i.id, shards) in held]
                admission = Admission(kept, admission.wake_ms, admission.left)
            if admission.items:
                # The items as they are now, not as read: a signal held for
                # one (`signal_queued`) may have landed since the read, which
                # takes no row lock when the queue's lock row serializes.
                updated = await conn.fetch(
                    f"UPDATE {q}.queue_items SET state = 'admitted', admitted_ms = $1"
                    f" WHERE seq = ANY($2::bigint[]) AND state = 'queued' RETURNING {_COLUMNS}",
                    now_ms,
                    [i.seq for i in admission.items],
                )
                fresh = {i.seq: i for i in map(_item, updated)}
                admitted = [fresh[i.seq] for i in admission.items if i.seq in fresh]
                admission = Admission(admitted, admission.wake_ms, admission.left)
            return admission

        return await self._in_transaction(write, "admitting queued runs in")

    async def release_queued(self, id: str) -> str | None:
        """Run ``id`` ended: its admitted item frees its slot; returns its queue, or None."""
        q = self._q

        async def write(conn: asyncpg.Connection) -> str | None:
            name = await conn.fetchval(
                f"UPDATE {q}.queue_items SET state = 'done' WHERE id = $1 AND state = 'admitted'"
                " RETURNING queue",
                id,
            )
            return None if name is None else str(name)

        return await self._in_transaction(write, "freeing a queue slot in")

    async def unqueue(self, id: str) -> QueueItem | None:
        """Removes ``id``'s item if it is still queued; returns it, or None."""
        q = self._q

        async def write(conn: asyncpg.Connection) -> QueueItem | None:
            r = await conn.fetchrow(
                f"DELETE FROM {q}.queue_items WHERE id = $1 AND state = 'queued'"
                f" RETURNING {_COLUMNS}",
                id,
            )
            return None if r is None else _item(r)

        return await self._in_transaction(write, "cancelling a queued run in")

    async def queue_items(self, *, done: bool = False) -> builtins.list[QueueItem]:
        """Every queued or admitted item (``done``: and every done one kept), by arrival."""
        self._check_open()
        q = self._q
        where = "" if done else " WHERE state <> 'done'"

        async def read(conn: asyncpg.Connection) -> builtins.list[QueueItem]:
            rows = await conn.fetch(f"SELECT {_COLUMNS} FROM {q}.queue_items{where} ORDER BY seq")
            return [_item(r) for r in rows]

        items: builtins.list[QueueItem] = await self._query(read, "reading queue items in")
        return items
