"""The Postgres store: journals and run rows in a PostgreSQL schema, on asyncpg.

Schema, format 5, in one schema of the database (``fusee`` by default; the
store creates it, and upgrades an older format, on open)::

    meta(key TEXT PRIMARY KEY, value BIGINT)
        'format': FORMAT; 'shards': the shard count, fixed at creation;
        'run_reserved': run numbers up to it may have been handed out
    journal(shard INT, lsn BIGINT, id TEXT, run BIGINT, data BYTEA,
            PRIMARY KEY (shard, lsn))             -- a second guard against two writers
        index (id, run, lsn)                      -- load(), by run then LSN
    runs(id TEXT PRIMARY KEY, shard, run, workflow, status, started_ms,
         finished_ms, wake_ms, attributes BYTEA, parent, version, error)
        index (started_ms, id), (status, started_ms, id), (workflow, started_ms, id),
        (shard) of unfinished runs                -- recovery of the shards a worker holds
    shard_leases(shard INT PRIMARY KEY, owner TEXT, epoch BIGINT, lease_until TIMESTAMPTZ)
                                                  -- lane k's shard s at k * shards + s
    versions(version TEXT PRIMARY KEY, lane INT)  -- a lane per version (format 5)
    lane_for(run_id, wanted) -> INT               -- the lane a command goes to
    commands(seq BIGSERIAL, id TEXT PRIMARY KEY, kind, run_id, payload BYTEA, dedup,
             created_ms, attempts, answered_ms, ok, answer BYTEA)
        index (seq) of unanswered commands        -- the inbox (format 2)
    queues(name TEXT PRIMARY KEY)                 -- a queue's admission lock
    queue_items(seq BIGSERIAL PRIMARY KEY, queue, id, run, workflow, input BYTEA, key,
                priority, not_before_ms, state, admitted_ms, origin BYTEA)
        unique index (id) of items not done       -- queued starts (format 3)
    schedules(name TEXT PRIMARY KEY, workflow, spec, paused, removed, last_tick_ms,
              done_tick_ms, buffered_ms, last_run, next_ms,
              input, dynamic, ticked_ms)          -- schedules (format 3; 4 adds the last three)

A posted command sends a ``NOTIFY`` on the store's channel (`PostgresStore.channel`)
in its own transaction; the serving engine ``LISTEN``s on a connection of its
own and, should that connection be lost, polls. Its answers go the other
way: one ``NOTIFY`` per batch answered, on the answers' channel, names the
commands answered, and a poster waiting for an answer (`wait_answer`)
``LISTEN``s there, reading the store again only when one of its commands is
named (or, slowly, should a notification never come).

A run's shard is ``zlib.crc32(id.encode()) % shards`` (`shard_of`), the
engine's rule. Each engine version given to a worker has a lane
(`serve_version`; lane 0 for workers that pin none): a lane's workers lease
their own copy of the shards, and a worker's records are written, and its
commands taken, under its lane's slot of each shard (``lane * shards +
shard`` in ``journal.shard``, ``shard_leases`` and ``commands.shard``), so
that workers of two versions write one shard's runs at once. A posted
command goes to the lane serving its run (``lane_for``), a start to the
poster's lane, or a client's to the newest lane with a live worker.

Ids sort by code point (``COLLATE "C"``), as Python sorts them, so
listings and their cursors agree with the other stores. Leases are timed by
the database's clock (``now()``), never this process's.

The rule: only the writer task writes journals and rows, one transaction per
group of appends, in call order (but for a queued run's first row, which
`enqueue` writes in the transaction of its queue item:
`fusee.store._postgres_queues`); a fenced append's transaction locks the
lease rows of its shards (``FOR SHARE``), so a takeover, which updates them,
waits for it or makes it fail with `StaleLease`. Reads are plain snapshot
reads on other connections: they never lock a table nor wait for a writer.

Its parts: `fusee.store._postgres_sql` (format, schema, statements,
`shard_of`), `fusee.store._postgres_errors` (driver and connection errors as
`StoreError`s, without the password) and `fusee.store._postgres_writer`
(the writer task).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypeVar, cast

from fusee._status import FINISHED_STATUSES, RunStatus
from fusee.errors import CorruptRecord, NotFound, StoreError
from fusee.store._base import (
    UNFINISHED_STATUSES,
    Answer,
    Command,
    Entry,
    RunRow,
    _check_batch,
    _check_command,
    _check_durability,
    _check_list_args,
    _matches,
    _normalize_filter,
    _not_found,
    _now_ms,
    _queued,
)
from fusee.store._batch import Batched
from fusee.store._postgres_errors import _import_asyncpg, _is_connection_lost
from fusee.store._postgres_queues import PostgresQueues
from fusee.store._postgres_schedules import PostgresSchedules
from fusee.store._postgres_sql import (
    _MIGRATIONS,
    _ROW_COLUMNS,
    _SCHEMA_NAME,
    FORMAT,
    _answers_channel,
    _channel,
    _row,
    _schema_sql,
    _Sql,
    shard_of,
)
from fusee.store._postgres_writer import _PostgresWriter, _Write
from fusee.store._queues import QueueItem
from fusee.store._redact import redact_dsn, secrets_of
from fusee.store._retention import PostgresDeletes

if TYPE_CHECKING:
    import asyncpg
    from asyncpg.pool import PoolConnectionProxy

    # What the pool hands out; every query runs on one.
    _Conn: TypeAlias = PoolConnectionProxy[asyncpg.Record]

__all__ = ["DEFAULT_SHARDS", "FORMAT", "PostgresStore", "shard_of"]

DEFAULT_SHARDS: Final = 64
"""The shard count of a new store.

Far more shards than workers: a shard moves between workers whole, so with
64 shards 2 to 16 workers each hold an even share within one shard (under
7% apart at 16), and a dead worker's runs spread over all the others rather
than landing on one. A lease costs one row renewed per interval, so 64 are
cheap; the count is fixed when the store is created.
"""

# Run numbers reserved per meta write: a crash wastes at most this many.
_RUN_BLOCK: Final = 128

# Rows per read trip of a listing that filters attributes here (msgpack
# blobs Postgres cannot look into).
_PREFETCH: Final = 512

# How a poster waits for an answer while it cannot listen for one (no
# connection for LISTEN): reads soon at first, then less often.
_FIRST_POLL_S: Final = 0.002
_MAX_POLL_S: Final = 0.1
# After a failed attempt to connect for LISTEN, the next one waits this long.
_RELISTEN_S: Final = 1.0

_T = TypeVar("_T")


class PostgresStore(PostgresQueues, _PostgresWriter, PostgresSchedules, PostgresDeletes):
    """A `fusee.store.Store` in a PostgreSQL database (asyncpg, the ``postgres`` extra).

    Args:
        dsn: A ``postgresql://user:password@host:port/database`` URL (libpq's
            form; ``postgres://`` too). The password never appears in an
            error or in this object's ``repr``.
        schema: The schema holding the store's tables, created if missing: one
            database can hold several stores.
        shards: The shard count of a new store (`DEFAULT_SHARDS` when None);
            an existing store keeps its own, and a different count given
            here is refused.
        durability: ``"fsync"`` (an append is on the server's disk when it
            returns) or ``"none"`` (``synchronous_commit=off``: a server
            crash may lose the last appends; for tests and demos).
        readonly: Read an existing store only (the CLI does).
        client: Read it, and post commands to its inbox (`fusee.Client`):
            creates the schema if there is none, and appends nothing.
        pool_size: At most this many connections (one writes at a time).
        connect_timeout_s: How long connecting to the server may take.
        answer_poll_s: How often `wait_answer` reads the store while it
            listens for answers: the fallback should a notification never
            come (a worker of an older fusee answers without one).

    Raises:
        ValueError: An unknown ``durability``, a bad schema name, a shard
            count below 1, a pool of fewer than 2 connections, or an
            ``answer_poll_s`` not above 0.

    Example:
        >>> store = PostgresStore("postgresql://app:secret@db.internal/app")
        >>> store
        PostgresStore('postgresql://app:***@db.internal/app', schema='fusee')
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "fusee",
        shards: int | None = None,
        durability: str = "fsync",
        readonly: bool = False,
        client: bool = False,
        pool_size: int = 4,
        connect_timeout_s: float = 10.0,
        answer_poll_s: float = 1.0,
    ) -> None:
        _check_durability(durability)
        if not _SCHEMA_NAME.fullmatch(schema) or schema.lower().startswith("pg_"):
            raise ValueError(
                "schema must be a plain SQL name (letters, digits, _; at most 63; not "
                f"starting with pg_, which Postgres keeps for itself), not {schema!r}"
            )
        if shards is not None and shards < 1:
            raise ValueError(f"shards must be 1 or more, not {shards}")
        if pool_size < 2:
            raise ValueError(
                f"pool_size must be 2 or more (a writer and a reader), not {pool_size}"
            )
        if not answer_poll_s > 0:
            raise ValueError(f"answer_poll_s must be more than 0 seconds, not {answer_poll_s!r}")
        self._dsn = dsn
        self._shown = redact_dsn(dsn)
        self._secrets = secrets_of(dsn)
        self._schema = schema
        self._q = f'"{schema}"'
        self._shards_wanted = shards
        self._shards = 0
        self._durability = durability
        if readonly and client:
            raise ValueError("a store opens read-only or as a client, not both")
        self._readonly = readonly
        self._client = client
        # The inbox: commands taken since `open`, and the LISTEN connection.
        self._taken: set[str] = set()
        # Posts, answers and reads of answers made at once share a trip.
        self._posts: Batched[tuple[Any, ...], None] = Batched(self._post_trip)
        self._answering: Batched[tuple[str, bool, bytes], None] = Batched(self._answer_trip)
        self._reading_answers: Batched[str, Answer | None] = Batched(self._read_answers_trip)
        # Rows read at once (a worker's starts, each checking its id) too.
        self._reading_rows: Batched[str, RunRow | None] = Batched(self._read_rows_trip)
        self._reading_ends: Batched[str, tuple[RunRow | None, tuple[int, bytes] | None]] = Batched(
            self._read_ends_trip
        )
        self._queries: set[asyncio.Future[Any]] = set()
        self._listener: Any = None
        self._notified = asyncio.Event()
        # Waiting for answers: the LISTEN connection, its connecting, and
        # each waiting call's wake-up by the id of its command.
        self._answer_poll_s = answer_poll_s
        self._answers: Any = None
        self._answers_connecting: asyncio.Future[None] | None = None
        self._relisten_at = 0.0
        self._answer_waits: dict[str, builtins.list[asyncio.Event]] = {}
        self._pool_size = pool_size
        self._connect_timeout_s = connect_timeout_s
        self._pool: asyncpg.Pool | None = None
        self._state = "new"  # -> opening -> open -> closing -> closed (-> opening again)
        self._closing: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: builtins.list[_Write] = []
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._stop = False
        self._last_lsn = 0
        # LSNs increase per shard (a shard's records have one writer at a
        # time; a worker that takes a shard over numbers past its last LSN,
        # see `max_lsn`): every append's LSNs exceed the highest LSN at open
        # and, per shard, every LSN stored or queued before.
        self._floor_lsn = 0
        self._accepted: dict[int, int] = {}
        self._stored: dict[int, int] = {}
        self._inflight = 0
        self._tail: asyncio.Future[StoreError | None] | None = None
        self._failures = 0
        self._last_failure: StoreError | None = None
        # The latest row of each id in a write not finished yet (see `get`).
        self._pending: dict[str, tuple[RunRow, asyncio.Future[StoreError | None]]] = {}
        self._run_next = 1
        self._run_reserved = 0
        # The lane this store object's worker serves (`serve_version`): its
        # leases, records and taken commands are that lane's slots. A store
        # object no worker serves through (a client's) starts runs on the
        # newest version a live worker has.
        self._lane = 0
        self._serving = False
        self._run_lock = asyncio.Lock()
        self._fail_next: BaseException | None = None
        self._transactions = 0  # for tests: committed write transactions
        self._sql = _Sql(self._q)

    def __repr__(self) -> str:
        return f"PostgresStore({self._shown!r}, schema={self._schema!r})"

    @property
    def dsn(self) -> str:
        """The DSN with its password replaced by ``***`` (for messages and logs).

        Example:
            >>> PostgresStore("postgresql://u:pw@h/db").dsn
            'postgresql://u:***@h/db'
        """
        return self._shown

    @property
    def schema(self) -> str:
        """The schema holding the store's tables.

        Example:
            >>> PostgresStore("postgresql://h/db", schema="billing").schema
            'billing'
        """
        return self._schema

    @property
    def shards(self) -> int:
        """The store's shard count (valid after `open`; 0 before).

        Example:
            >>> PostgresStore("postgresql://h/db").shards
            0
        """
        return self._shards

    @property
    def last_lsn(self) -> int:
        """The highest LSN stored, 0 when empty (for a read-only store: at open).

        Example:
            >>> PostgresStore("postgresql://h/db").last_lsn
            0
        """
        return self._last_lsn

    # -- opening and closing -----------------------------------------------------------

    async def open(self) -> None:
        """Connects, creates the schema or checks (and upgrades) the one there.

        Opening an open store does nothing; a closed one may be opened again.

        Raises:
            StoreError: asyncpg is not installed, the DSN is malformed, the
                server cannot be reached or refuses the credentials, the
                tables are not a fusee store, its format is newer than this
                fusee's, or (read-only) there is no store there.

        Example:
            >>> import asyncio
            >>> store = PostgresStore("postgresql://u:pw@127.0.0.1:1/db")
            >>> asyncio.run(store.open())
            Traceback (most recent call last):
            fusee.errors.StoreError: cannot reach the Postgres server at 127.0.0.1:1 ...
        """
        if self._state == "open":
            return
        if self._state == "opening":
            raise StoreError(f"the store {self._shown} is being opened already; await that open()")
        if self._state == "closing":
            await self.close()
        driver = _import_asyncpg()
        self._loop = asyncio.get_running_loop()
        self._queue = []
        self._wake = asyncio.Event()
        self._stop = False
        self._tail = None
        self._pending = {}
        self._inflight = 0
        self._failures = 0
        self._run_lock = asyncio.Lock()
        self._state = "opening"
        try:
            self._pool = await self._connect(driver)
            async with self._pool.acquire() as conn:
                self._shards, last_lsn, reserved = await self._check_format(conn)
        except BaseException:
            await self._close_pool()
            self._state = "closed"
            raise
        self._last_lsn = self._floor_lsn = last_lsn
        self._accepted = {}
        self._stored = {}
        self._run_reserved = reserved
        self._run_next = reserved + 1
        self._taken = set()
        self._notified = asyncio.Event()
        if not self._readonly and not self._client:
            self._writer = asyncio.create_task(self._serve(), name=f"fusee-store-write {self}")
        self._state = "open"

    async def _connect(self, driver: Any) -> asyncpg.Pool:
        settings = {"application_name": "fusee"}
        if self._durability == "none":
            settings["synchronous_commit"] = "off"
        if self._readonly:
            settings["default_transaction_read_only"] = "on"
        try:
            pool = await driver.create_pool(
                self._dsn,
                min_size=1,
                max_size=self._pool_size,
                timeout=self._connect_timeout_s,
                server_settings=settings,
                # The store keeps no session state (no SET, LISTEN or session
                # locks), so a connection goes back to the pool as it is:
                # the default reset would cost a round trip per read.
                reset=_no_reset,
            )
        except Exception as e:
            raise self._connect_error(e, driver) from None
        return cast("asyncpg.Pool", pool)

    async def _check_format(self, conn: _Conn) -> tuple[int, int, int]:
        """Creates or checks the schema; returns (shards, last LSN, reserved runs)."""
        q = self._q
        try:
            async with conn.transaction():
                if not self._readonly:
                    # Two engines opening a new database at once create it once.
                    await conn.execute(
                        "SELECT pg_advisory_xact_lock(hashtext('fusee.create'), hashtext($1))",
                        self._schema,
                    )
                meta = await conn.fetchval("SELECT to_regclass($1)", f"{q}.meta")
                if meta is None:
                    await self._create(conn)
                values: dict[str, int] = {
                    r[0]: r[1] for r in await conn.fetch(f"SELECT key, value FROM {q}.meta")
                }
                if "format" not in values or "shards" not in values:
                    raise self._foreign()
                version, shards = int(values["format"]), int(values["shards"])
                if version > FORMAT:
                    raise StoreError(
                        f"the store in schema {self._schema!r} of {self._shown} has format "
                        f"{version}, newer than this fusee understands ({FORMAT}); upgrade fusee"
                    )
                if version < FORMAT:
                    await self._migrate(conn, version)
                if self._shards_wanted is not None and self._shards_wanted != shards:
                    raise StoreError(
                        f"the store in schema {self._schema!r} of {self._shown} has {shards} "
                        f"shards, not {self._shards_wanted}: the count is fixed when a store "
                        "is created; omit shards= or pass another schema"
                    )
                last_lsn = await conn.fetchval(self._sql.last_lsn)
                return shards, int(last_lsn), int(values.get("run_reserved", 0))
        except StoreError:
            raise
        except Exception as e:
            raise self._error(e, "opening") from None

    async def _create(self, conn: _Conn) -> None:
        where = f"schema {self._schema!r} of {self._shown}"
        if self._readonly:
            raise StoreError(
                f"no fusee store in {where}; start an engine on it first, or pass the "
                "schema it uses"
            )
        found = await conn.fetchval(
            "SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = ANY($2)",
            self._schema,
            ["journal", "runs", "shard_leases"],
        )
        if found:
            raise self._foreign()
        exists = await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", self._schema)
        if not exists:
            await conn.execute(f"CREATE SCHEMA {self._q}")
        shards = self._shards_wanted or DEFAULT_SHARDS
        for statement in _schema_sql(self._q, shards):
            await conn.execute(statement)

    async def _migrate(self, conn: _Conn, version: int) -> None:
        if self._readonly:
            raise StoreError(
                f"the store in schema {self._schema!r} of {self._shown} has format {version}, "
                f"older than this fusee's ({FORMAT}); open it once with an engine (not "
                "read-only) to upgrade it"
            )
        while version < FORMAT:
            steps = _MIGRATIONS.get(version)
            if steps is None:
                raise StoreError(
                    f"the store in schema {self._schema!r} of {self._shown} has format "
                    f"{version}, which this fusee cannot upgrade; restore it from a backup"
                )
            for statement in steps(self._q):
                await conn.execute(statement)
            version += 1
            await conn.execute(
                f"UPDATE {self._q}.meta SET value = $1 WHERE key = 'format'", version
            )

    def _foreign(self) -> StoreError:
        return StoreError(
            f"schema {self._schema!r} of {self._shown} holds tables that are not a fusee "
            "store; pass another schema (schema=...)"
        )

    async def close(self) -> None:
        """Waits for the appends queued so far, then closes; closing twice is harmless.

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").close())
        """
        if self._state in ("new", "opening", "closed"):
            return
        if self._closing is not None:
            await asyncio.shield(self._closing)
            return
        loop = asyncio.get_running_loop()
        closing = self._closing = loop.create_future()
        self._state = "closing"
        try:
            writer, self._writer = self._writer, None
            if writer is not None:
                self._stop = True
                self._wake.set()
                await writer
            if self._queries:
                # Queries whose callers were cancelled, still on their way.
                await asyncio.wait(self._queries, timeout=self._connect_timeout_s)
            await self._stop_listening()
            await self._stop_listening_for_answers()
            await self._close_pool()
        finally:
            self._state = "closed"
            self._closing = None
            closing.set_result(None)

    async def _close_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), self._connect_timeout_s)
            except Exception:
                pool.terminate()

    # -- appending ---------------------------------------------------------------------

    async def append(
        self,
        entries: Sequence[Entry],
        runs: Sequence[RunRow] = (),
        *,
        fence: Mapping[int, int] | None = None,
        commands: Sequence[Command] = (),
        items: Sequence[QueueItem] = (),
        forget: Sequence[int] = (),
    ) -> None:
        """Stores ``entries`` and ``runs`` in one transaction, or nothing when it raises.

        Appends queued while the writer commits go to the server together in
        its next transaction. Cancelling the caller does not cancel the
        write. When one fails, those called before its failure was reported
        fail too (a journal never has a hole); a `StaleLease` fails only the
        appends fenced by the lost shards, as every later append of those
        shards carries the same stale epoch.

        Args:
            entries: Records with increasing LSNs above every LSN appended before.
            runs: Rows that replace the rows of their ids, in order.
            fence: Shard to lease epoch (from `acquire_shards`): the write
                commits only while every one of those shards still has that
                epoch.
            commands: Commands posted to the inbox in the same transaction
                (as `post_command`), so that they are stored exactly when
                the records that cause them are.
            items: Never any: queue items are admitted inside the database
                (`admit`), where every worker's limits meet.
            forget: Never any, as ``items``.

        Raises:
            ValueError: LSNs that do not increase past those appended before;
                queue items (an engine's own admissions, which would not
                hold across workers).
            TypeError: Record data that is not bytes, or attributes msgpack
                cannot encode.
            StaleLease: A fenced shard's lease was taken over; nothing is stored.
            StoreError: The write failed (connection lost, disk full, another
                writer's LSN, read-only or closed store).

        Example:
            >>> import asyncio
            >>> store = PostgresStore("postgresql://h/db")
            >>> asyncio.run(store.append([Entry(1, "a", 1, b"x")]))
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        self._check_writable()
        if items or forget:
            raise ValueError(
                "a Postgres store admits queued runs inside the database (Store.admit), so that "
                "limits hold across workers; an engine does not write queue items with its records"
            )
        entries = tuple(entries)
        _, packed = _check_batch(entries, runs, self._floor_lsn)
        commands = tuple(commands)
        for command in commands:
            _check_command(command)
        if not entries and not runs and not commands:
            return
        shards = self._shards
        accepted = self._accepted
        tops: dict[int, int] = {}
        for e in entries:
            shard = shard_of(e.id, shards)
            floor = accepted.get(shard, 0)
            if e.lsn <= floor:
                raise ValueError(
                    f"entry LSN {e.lsn} does not exceed the store's last LSN {floor} in shard "
                    f"{shard}; the engine must assign increasing LSNs above every one "
                    "appended before to the shard"
                )
            tops[shard] = e.lsn
        rows = [
            (
                r.id,
                shard_of(r.id, shards),
                r.run,
                r.workflow,
                r.status,
                r.started_ms,
                r.finished_ms,
                r.wake_ms,
                blob,
                r.parent,
                r.version,
                r.error,
            )
            for r, blob in zip(runs, packed, strict=True)
        ]
        base = self._lane * shards
        fenced = tuple(sorted((base + s, epoch) for s, epoch in fence.items())) if fence else ()
        fail, self._fail_next = self._fail_next, None
        write = self._submit(entries, rows, fenced, fail, tops, commands)
        pending = self._pending
        for r in runs:
            pending[r.id] = (r, write.done)
        error = await write.answer
        if error is not None:
            raise error

    def fail_next_append(self, exc: BaseException) -> None:
        """Fault-injection hook for tests: the next append raises ``exc`` inside its transaction.

        The transaction is rolled back and the append fails with the
        `StoreError` a real failure would give (an asyncpg error: its
        translation), so tests see what a failed durable write does. One
        call fails one append.

        Example:
            >>> store = PostgresStore("postgresql://h/db")
            >>> store.fail_next_append(OSError("injected: disk full"))
        """
        self._fail_next = exc

    @property
    def transactions(self) -> int:
        """For tests: how many write transactions this store object committed since it was made.

        Example:
            >>> PostgresStore("postgresql://h/db").transactions
            0
        """
        return self._transactions

    # -- run numbers -------------------------------------------------------------------

    async def next_run(self) -> int:
        """Returns a run number this store never gave out before (from 1 up).

        Numbers are reserved in blocks, atomically in the database, so
        several engines on one store never share one.

        Raises:
            StoreError: A read-only or closed store, or the server failed.

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").next_run())
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        self._check_writable()
        if self._run_next > self._run_reserved:
            async with self._run_lock:
                self._check_writable()
                if self._run_next > self._run_reserved:
                    reserved = await self._query(
                        lambda conn: conn.fetchval(self._sql.reserve_runs, _RUN_BLOCK),
                        "writing to",
                    )
                    self._run_next = reserved - _RUN_BLOCK + 1
                    self._run_reserved = reserved
        run = self._run_next
        self._run_next += 1
        return run

    # -- the commands inbox -------------------------------------------------------------

    @property
    def channel(self) -> str:
        """The ``LISTEN``/``NOTIFY`` channel on which posted commands are announced.

        Example:
            >>> PostgresStore("postgresql://h/db", schema="billing").channel
            'fusee_commands_billing'
        """
        return _channel(self._schema)

    async def post_command(self, command: Command) -> str:
        """Stores ``command`` in the inbox and announces it (``NOTIFY``); returns its id.

        Raises:
            ValueError: An unknown kind or an empty id; nothing is stored.
            StoreError: A read-only or closed store, or the server failed.

        Example:
            >>> import asyncio
            >>> from fusee.store import Command
            >>> store = PostgresStore("postgresql://h/db", client=True)
            >>> asyncio.run(store.post_command(Command.new("cancel", "order-1")))
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        _check_command(command)
        self._check_open()
        if self._readonly:
            self._check_writable()
        values = (
            command.id,
            command.kind,
            command.run_id,
            command.payload,
            command.dedup,
            command.created_ms,
        )
        # A stop is for whichever worker takes it; the rest go to their run's
        # shard's owner in the lane serving the run (`lane_for`).
        shard = shard_of(command.run_id, self._shards) if command.kind != "stop" else None
        await self._posts((*values, shard, self._lane_wanted(command.kind)))
        return command.id

    async def _post_trip(self, posts: Sequence[tuple[Any, ...]]) -> list[None]:
        if len(posts) == 1:
            await self._query(
                lambda conn: conn.execute(
                    self._sql.post_command,
                    *posts[0][:6],
                    self.channel,
                    posts[0][6],
                    self._shards,
                    posts[0][7],
                ),
                "posting a command to",
            )
            return [None]
        # One statement, one commit, one NOTIFY for the commands posted at once.
        columns = [builtins.list(c) for c in zip(*posts, strict=True)]
        await self._query(
            lambda conn: conn.execute(
                self._sql.post_commands, *columns[:7], self.channel, self._shards, columns[7]
            ),
            "posting commands to",
        )
        return [None] * len(posts)

    async def take_commands(
        self, limit: int = 100, *, shards: Collection[int] | None = None
    ) -> builtins.list[Command]:
        """The unanswered commands not taken since `open`, oldest first, each counted taken.

        Args:
            limit: At most this many.
            shards: Only commands for runs of these shards (the shards a
                worker holds) and those for any worker; None for all.

        Raises:
            StoreError: A read-only, client or closed store, or the server failed.

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").take_commands())
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        self._check_writable()
        taken = builtins.list(self._taken)
        base = self._lane * self._shards
        wanted = None if shards is None else sorted({base + s for s in shards})
        rows = await self._query(
            lambda conn: conn.fetch(self._sql.take_commands, limit, taken, wanted),
            "taking commands from",
        )
        rows = sorted(rows, key=lambda r: r[0])
        self._taken.update(r[1] for r in rows)
        return [
            Command(id, kind, run_id, bytes(payload), dedup, created_ms, attempts)
            for _, id, kind, run_id, payload, dedup, created_ms, attempts in rows
        ]

    def untake_command(self, id: str) -> None:
        """Lets `take_commands` take command ``id`` again (its taker left it unanswered).

        Example:
            >>> PostgresStore("postgresql://h/db").untake_command("c")
        """
        self._taken.discard(id)

    async def wait_commands(self, timeout_s: float) -> None:
        """Returns when a ``NOTIFY`` announces a command, or after ``timeout_s``.

        The first call (and the first after the listening connection was
        lost) connects and ``LISTEN``s, then returns at once so the caller
        takes what was posted meanwhile; without that connection it polls.

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").wait_commands(0))
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        self._check_open()
        listener = self._listener
        if listener is None or listener.is_closed():
            self._listener = None
            with contextlib.suppress(Exception):
                # Not cut short by a cancelled caller either (see `_query`).
                await self._finished_alone(self._listen())
                return
            await asyncio.sleep(min(timeout_s, 0.1))  # polling, until it can listen again
            return
        event = self._notified
        if not event.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout_s)
        # Several notifications coalesce into one wake-up.
        event.clear()

    async def _listen(self) -> None:
        driver = _import_asyncpg()
        conn = await driver.connect(
            self._dsn,
            timeout=self._connect_timeout_s,
            server_settings={"application_name": "fusee-inbox"},
        )
        try:
            await conn.add_listener(self.channel, self._on_notify)
        except BaseException:
            await conn.close()
            raise
        self._listener = conn

    def _on_notify(self, *_: object) -> None:
        self._notified.set()

    async def _stop_listening(self) -> None:
        conn, self._listener = self._listener, None
        if conn is not None:
            try:
                await asyncio.wait_for(conn.close(), self._connect_timeout_s)
            except Exception:
                conn.terminate()

    async def answer_command(self, id: str, ok: bool, payload: bytes) -> None:
        """Stores the answer to command ``id``, durably (an unknown id is ignored).

        Raises:
            StoreError: A read-only, client or closed store, or the server failed.

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").answer_command("c", True, b""))
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        self._check_writable()
        await self._answering((id, bool(ok), bytes(payload)))
        self._taken.discard(id)

    async def _answer_trip(self, answers: Sequence[tuple[str, bool, bytes]]) -> list[None]:
        ids, oks, payloads = (builtins.list(c) for c in zip(*answers, strict=True))
        channel = _answers_channel(self._schema)
        await self._query(
            lambda conn: conn.execute(
                self._sql.answer_commands, ids, _now_ms(), oks, payloads, channel
            ),
            "answering commands in",
        )
        return [None] * len(answers)

    async def get_answer(self, id: str) -> Answer | None:
        """The answer to command ``id``, or None while it has none.

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").get_answer("c"))
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        self._check_open()
        return await self._reading_answers(id)

    async def _read_answers_trip(self, ids: Sequence[str]) -> list[Answer | None]:
        rows = await self._query(
            lambda conn: conn.fetch(self._sql.get_answers, builtins.list(ids)), "reading"
        )
        found = {r[0]: Answer(bool(r[1]), bytes(r[2] or b""), int(r[3])) for r in rows}
        return [found.get(id) for id in ids]

    async def wait_answer(self, id: str, timeout_s: float | None = None) -> Answer | None:
        """The answer to command ``id`` once it has one; None when ``timeout_s`` passes first.

        It listens for the engines' notifications of answers (one
        connection for every call waiting) and reads the store again when
        one names ``id``; it reads every ``answer_poll_s`` too, should a
        notification never come. While it cannot listen (the connection
        lost, the server refusing another), it polls, soon at first, and
        listens again once it can.

        Raises:
            StoreError: A closed store (closing it ends every wait), or the
                server failed a read.

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").wait_answer("c", 1))
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        self._check_open()
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        woken = asyncio.Event()
        waits = self._answer_waits.setdefault(id, [])
        waits.append(woken)
        polling = _FIRST_POLL_S
        try:
            while True:
                # Listening before the read: an answer stored after the read
                # is announced to this wait.
                listening = timeout_s != 0 and await self._listen_for_answers()
                woken.clear()
                answer = await self.get_answer(id)
                if answer is not None:
                    return answer
                if listening:
                    wait = self._answer_poll_s
                else:
                    wait, polling = polling, min(polling * 2, _MAX_POLL_S)
                if deadline is not None:
                    left = deadline - loop.time()
                    if left <= 0:
                        return None
                    wait = min(wait, left)
                if not woken.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(woken.wait(), wait)
                self._check_open()
        finally:
            waits.remove(woken)
            if not waits and self._answer_waits.get(id) is waits:
                del self._answer_waits[id]

    async def _listen_for_answers(self) -> bool:
        """Whether the answers' ``LISTEN`` connection is up, connecting it first when need be."""
        conn = self._answers
        if conn is not None and not conn.is_closed():
            return True
        self._answers = None
        loop = asyncio.get_running_loop()
        connecting = self._answers_connecting
        if connecting is None:
            if loop.time() < self._relisten_at:
                return False
            # One connection for every wait; not cut short by a cancelled waiter.
            connecting = self._answers_connecting = asyncio.ensure_future(
                self._finished_alone(self._connect_answers())
            )
        try:
            await asyncio.shield(connecting)
        except Exception:
            self._relisten_at = loop.time() + _RELISTEN_S
            return False
        finally:
            if self._answers_connecting is connecting and connecting.done():
                self._answers_connecting = None
        return self._answers is not None

    async def _connect_answers(self) -> None:
        driver = _import_asyncpg()
        conn = await driver.connect(
            self._dsn,
            timeout=self._connect_timeout_s,
            server_settings={"application_name": "fusee-answers"},
        )
        try:
            await conn.add_listener(_answers_channel(self._schema), self._on_answers)
            conn.add_termination_listener(self._answers_lost)
        except BaseException:
            await conn.close()
            raise
        if self._state != "open":  # closed while connecting
            await conn.close()
            return
        self._answers = conn

    def _on_answers(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        waits = self._answer_waits
        if not waits:
            return
        try:
            ids = json.loads(payload) if payload else None
        except ValueError:
            ids = None
        if not isinstance(ids, builtins.list):
            # Too many to name: every waiting call looks.
            ids = builtins.list(waits)
        for id in ids:
            for woken in waits.get(id, ()) if isinstance(id, str) else ():
                woken.set()

    def _answers_lost(self, *_: object) -> None:
        # Answers announced from now on are not heard: every waiting call
        # reads again, and listens again (or polls).
        self._answers = None
        for waits in self._answer_waits.values():
            for woken in waits:
                woken.set()

    async def _stop_listening_for_answers(self) -> None:
        conn, self._answers = self._answers, None
        self._answers_lost()  # the waits read again, and find the store closed
        if conn is not None:
            try:
                await asyncio.wait_for(conn.close(), self._connect_timeout_s)
            except Exception:
                conn.terminate()

    async def forget_commands(self, answered_before_ms: int) -> int:
        """Deletes the commands answered before ``answered_before_ms``; returns how many.

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").forget_commands(0))
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        self._check_writable()
        status: str = await self._query(
            lambda conn: conn.execute(self._sql.forget_commands, answered_before_ms),
            "writing to",
        )
        return int(status.rsplit(" ", 1)[-1])

    # -- shard leases ------------------------------------------------------------------

    async def acquire_shards(
        self, owner: str, want: int, lease_s: float, *, reclaim: bool = False
    ) -> dict[int, int]:
        """Takes up to ``want`` shards that are free or whose lease ran out.

        With ``reclaim``, shards ``owner`` still holds are taken again too:
        a worker that restarts under the same name takes its shards back at
        once, and the new epochs fence off writes of its previous life.

        Each shard taken gets a new epoch (its previous holder's fenced writes
        are refused from then on) and a lease until the database's
        ``now() + lease_s``. Shards another worker is taking at the same
        moment are skipped, not waited for.

        Args:
            owner: This worker's name (unique among the workers of a store).
            want: At most this many shards.
            lease_s: The lease's length in seconds.

        Returns:
            The shards taken, each with its new epoch (pass them as ``fence``).

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").acquire_shards("w1", 8, 10))
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        self._check_writable()
        _check_lease(owner, lease_s)
        if want <= 0:
            return {}
        base = self._lane * self._shards
        taken = await self._query(
            lambda conn: conn.fetch(
                self._sql.acquire,
                owner,
                want,
                float(lease_s),
                reclaim,
                base,
                base + self._shards - 1,
            ),
            "writing to",
        )
        return {int(r[0]) - base: int(r[1]) for r in taken}

    async def renew_shards(
        self, owner: str, shards: Iterable[int], lease_s: float
    ) -> dict[int, int]:
        """Extends ``owner``'s leases of ``shards`` to the database's ``now() + lease_s``.

        A lease that ran out but was not taken over is renewed too (its
        epoch is unchanged, so nobody wrote meanwhile).

        Returns:
            The shards still held, with their epochs; a shard missing from it
            was taken over: drop its runs.

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").renew_shards("w1", [1], 10))
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        self._check_writable()
        _check_lease(owner, lease_s)
        base = self._lane * self._shards
        wanted = sorted({base + s for s in shards})
        if not wanted:
            return {}
        held = await self._query(
            lambda conn: conn.fetch(self._sql.renew, owner, wanted, float(lease_s)),
            "writing to",
        )
        return {int(r[0]) - base: int(r[1]) for r in held}

    async def release_shards(self, owner: str, shards: Iterable[int]) -> None:
        """Gives ``owner``'s leases of ``shards`` back at once, for others to take.

        The epoch moves on, so a late write fenced with the old one is refused.
        Shards ``owner`` does not hold are left alone.

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").release_shards("w1", [1]))
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        self._check_writable()
        _check_lease(owner, 1.0)
        base = self._lane * self._shards
        wanted = sorted({base + s for s in shards})
        if wanted:
            await self._query(
                lambda conn: conn.execute(self._sql.release, owner, wanted), "writing to"
            )

    async def serve_version(self, version: str) -> int:
        """Makes this store object's worker serve the lane of ``version``; returns the lane.

        Each engine version a worker is given has a lane (numbered from 1 in
        the order versions first came; lane 0, ``version=""``, is that of
        workers that pin no version). A lane leases its own copy of the
        shards and writes its records under them, so that workers of
        several versions serve the runs of their own at once: the leases,
        records and commands of this store object are its lane's from here
        on.

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").serve_version("v1"))
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        self._check_writable()
        self._serving = True
        if not version:
            self._lane = 0
            return 0
        sql, shards = self._sql, self._shards

        async def register(conn: _Conn) -> int:
            async with conn.transaction():
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtext('fusee.versions'), hashtext($1))",
                    self._schema,
                )
                lane = await conn.fetchval(sql.lane_of, version)
                if lane is None:
                    lane = await conn.fetchval(sql.new_lane, version)
                    lane = int(lane)
                    await conn.execute(sql.lane_leases, lane * shards, lane * shards + shards - 1)
                return int(lane)

        self._lane = await self._query(register, "writing to")
        return self._lane

    @property
    def lane(self) -> int:
        """The lane this store object's worker serves (`serve_version`; 0 by default).

        Example:
            >>> PostgresStore("postgresql://h/db").lane
            0
        """
        return self._lane

    async def lanes(self) -> tuple[dict[str, int], builtins.set[int]]:
        """Each registered version's lane, and the lanes that have a live worker.

        A version missing from the first is lane 0's.

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").lanes())
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        self._check_open()

        async def read(conn: _Conn) -> tuple[dict[str, int], builtins.set[int]]:
            lanes = {str(r[0]): int(r[1]) for r in await conn.fetch(self._sql.lanes)}
            live = {int(r[0]) for r in await conn.fetch(self._sql.live_lanes)}
            return lanes, live

        return await self._query(read, "reading")

    async def lane_of(self, version: str) -> int:
        """The lane of runs of ``version`` (0 for one no worker registered).

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").lane_of("v1"))
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        self._check_open()
        found = await self._query(lambda conn: conn.fetchval(self._sql.lane_of, version), "reading")
        return 0 if found is None else int(found)

    async def reroute_commands(self) -> int:
        """Moves the unanswered commands to the lane serving their runs now; returns how many.

        A command posted to a lane whose last worker then stopped would
        wait for a worker of that version; a run another lane serves now
        hears it there. Starts stay with the lane they were sent to.

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").reroute_commands())
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        self._check_writable()
        status: str = await self._query(
            lambda conn: conn.execute(self._sql.reroute, self._shards, ["start", "fork"]),
            "writing to",
        )
        moved = int(status.rsplit(" ", 1)[-1])
        if moved:
            await self._query(
                lambda conn: conn.execute("SELECT pg_notify($1, '')", self.channel),
                "writing to",
            )
        return moved

    def _lane_wanted(self, kind: str) -> int | None:
        """`lane_for`'s ``wanted`` for a command of ``kind`` posted through this store object.

        A start (or a fork's new run) posted by a worker starts on its own
        version, one posted by a client (a store object no worker serves
        through) on the newest version a live worker has; any other command
        goes to the lane serving its run.
        """
        if kind not in ("start", "fork"):
            return None
        return self._lane if self._serving else -1

    async def join(self, owner: str, lease_s: float, version: str = "") -> int:
        """Counts ``owner`` live for ``lease_s`` more seconds; returns how many of its lane are.

        Workers call it with each renewal: the count of live workers of this
        store object's lane (`serve_version`) is what a fair share of its
        shards is reckoned from. ``version`` is the worker's engine version
        (`workers` lists it).

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").join("w1", 10))
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        _check_lease(owner, lease_s)
        self._check_writable()
        live = await self._query(
            lambda conn: conn.fetchval(self._sql.join, owner, float(lease_s), version, self._lane),
            "writing to",
        )
        return int(live)

    async def workers(self) -> builtins.list[tuple[str, str]]:
        """The live workers, by name, each with its engine version ("" if it gave none).

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").workers())
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        found = await self._query(
            lambda conn: conn.fetch(self._sql.live_workers), "reading workers from"
        )
        return [(str(r[0]), str(r[1])) for r in found]

    async def leave(self, owner: str) -> None:
        """Stops counting ``owner`` as a live worker (it stops).

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").leave("w1"))
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        _check_lease(owner, 1.0)
        self._check_writable()
        await self._query(lambda conn: conn.execute(self._sql.leave, owner), "writing to")

    async def max_lsn(self, shards: Iterable[int]) -> int:
        """The highest LSN stored in ``shards`` (0 when they hold none).

        A worker that takes shards over numbers its records past it.

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").max_lsn([1, 2]))
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        base = self._lane * self._shards
        wanted = sorted({base + s for s in shards})
        found = await self._query(lambda conn: conn.fetchval(self._sql.max_lsn, wanted), "reading")
        return int(found)

    async def leases(self) -> dict[int, tuple[str | None, int, bool]]:
        """Every shard's lease: ``shard -> (owner, epoch, live)``, by the database's clock.

        ``owner`` is None for a free shard; ``live`` tells whether the lease
        has not run out yet.

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").leases())
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        self._check_open()
        found = await self._query(lambda conn: conn.fetch(self._sql.leases), "reading")
        return {int(r[0]): (r[1], int(r[2]), bool(r[3])) for r in found}

    # -- reading -----------------------------------------------------------------------

    async def load(
        self, id: str, run: int | None = None, *, after_lsn: int = 0
    ) -> builtins.list[tuple[int, bytes]]:
        """Returns a run's records after ``after_lsn`` as ``(lsn, data)`` in LSN order.

        Args:
            id: The workflow id.
            run: The run number; None for the id's latest run (its row's, or
                the highest with records when it has no row).
            after_lsn: Only records with a higher LSN are returned.

        Raises:
            NotFound: No such id, or no records for that run of it.
            StoreError: The server failed.

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").load("a"))
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        await self._after_writes()
        return await self._query(lambda conn: self._load(conn, id, run, after_lsn), "reading")

    async def _load(
        self, conn: _Conn, id: str, run: int | None, after_lsn: int
    ) -> builtins.list[tuple[int, bytes]]:
        sql = self._sql
        if run is None:
            found = await conn.fetch(sql.load_latest, id, after_lsn)
        else:
            found = await conn.fetch(sql.load_run, id, run, after_lsn)
        if found:
            return [(r[0], r[1]) for r in found]
        # Nothing: an empty run, no such run, or no such id (the rare path).
        runs = await conn.fetchrow(sql.runs_of, id)
        assert runs is not None  # a SELECT without FROM returns one row
        row_run, max_run, status = runs
        target = run if run is not None else (row_run if row_run is not None else max_run)
        if target is None:
            raise _not_found(id)
        # Nothing after ``after_lsn`` is an answer; nothing at all is not.
        if after_lsn > 0 and await conn.fetchval(sql.has_run, id, target) is not None:
            return []
        if target == row_run and status == RunStatus.QUEUED:
            raise _queued(id)
        if target == row_run:
            raise CorruptRecord(
                f"run {id!r} (run {target}) has a row in {self._where()} but no journal records: "
                "its journal is lost or damaged; the other runs are not affected (`fusee check` "
                "lists every damaged run): restore the database from a backup to read this one"
            )
        raise _not_found(id, run if row_run is not None or max_run is not None else None)

    async def get(self, id: str) -> RunRow | None:
        """Returns the row of ``id`` (its latest run), or None.

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").get("a"))
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        latest = self._pending.get(id)
        if latest is not None:
            # Being written: what a read after the write sees once it commits.
            # Not before: a write may yet fail (its shard's lease lost), and
            # a row read then would say what the journal never held.
            row, done = latest
            await asyncio.wait((done,))
            if done.result() is None:
                return row
        self._check_open()
        return await self._reading_rows(id)

    async def get_ended(self, id: str) -> tuple[RunRow | None, tuple[int, bytes] | None]:
        """The row of ``id`` and, when it says the run ended, that run's last record: one read.

        What a `fusee.Client` waiting for a result reads: the row, and the
        ``(lsn, data)`` of the end record once there is one (None before,
        and for a finished status `FINISHED_STATUSES` does not hold).

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").get_ended("a"))
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        self._check_open()
        if id in self._pending:
            # Being written here: read as `get` and `load` read it.
            row = await self.get(id)
            if row is None or row.status not in FINISHED_STATUSES:
                return row, None
            return row, (await self.load(id, row.run))[-1]
        return await self._reading_ends(id)

    async def _read_ends_trip(
        self, ids: Sequence[str]
    ) -> list[tuple[RunRow | None, tuple[int, bytes] | None]]:
        rows = await self._query(
            lambda conn: conn.fetch(
                self._sql.get_ended, builtins.list(set(ids)), sorted(FINISHED_STATUSES)
            ),
            "reading",
        )
        found = {
            r[0]: (_row(r[:-2]), None if r[-2] is None else (int(r[-2]), bytes(r[-1])))
            for r in rows
        }
        return [found.get(id, (None, None)) for id in ids]

    async def _read_rows_trip(self, ids: Sequence[str]) -> list[RunRow | None]:
        if len(ids) == 1:
            found = await self._query(lambda conn: conn.fetchrow(self._sql.get, ids[0]), "reading")
            return [None if found is None else _row(found)]
        rows = await self._query(
            lambda conn: conn.fetch(self._sql.get_many, builtins.list(set(ids))), "reading"
        )
        by_id = {row.id: row for row in map(_row, rows)}
        return [by_id.get(id) for id in ids]

    async def list(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        limit: int | None = None,
        newest_first: bool = False,
        after: tuple[int, str] | None = None,
        started_from_ms: int | None = None,
        started_to_ms: int | None = None,
    ) -> builtins.list[RunRow]:
        """Returns the rows matching every filter given, by start time then id.

        Args:
            status: Only rows with this status.
            workflow: Only rows of this workflow type.
            attributes: Only rows having each of these keys with an equal value.
            limit: At most this many rows.
            newest_first: Latest start first.
            after: The ``(started_ms, id)`` of the previous page's last row.
            started_from_ms: Only rows started at or after this time.
            started_to_ms: Only rows started at or before this time.

        Raises:
            ValueError: An unknown status, a negative limit, a bad cursor.

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").list(limit=-1))
            Traceback (most recent call last):
            ValueError: limit must be 0 or more, not -1
        """
        _check_list_args(status, limit, after)
        wanted = _normalize_filter(attributes)
        await self._after_writes()
        where: builtins.list[str] = []
        params: builtins.list[object] = []

        def param(value: object) -> str:
            params.append(value)
            return f"${len(params)}"

        if status is not None:
            where.append(f"status = {param(status)}")
        if workflow is not None:
            where.append(f"workflow = {param(workflow)}")
        if after is not None:
            op = "<" if newest_first else ">"
            where.append(f"(started_ms, id) {op} ({param(after[0])}, {param(after[1])})")
        if started_from_ms is not None:
            where.append(f"started_ms >= {param(started_from_ms)}")
        if started_to_ms is not None:
            where.append(f"started_ms <= {param(started_to_ms)}")
        sql = f"SELECT {_ROW_COLUMNS} FROM {self._q}.runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY started_ms DESC, id DESC" if newest_first else " ORDER BY started_ms, id"
        if limit == 0:
            return []
        if wanted is None:
            if limit is not None:
                sql += f" LIMIT {param(limit)}"
            found = await self._query(lambda conn: conn.fetch(sql, *params), "reading")
            return [_row(r) for r in found]

        async def filtered(conn: _Conn) -> builtins.list[RunRow]:
            # Attributes are msgpack blobs Postgres cannot look into: filter
            # here, reading in pages until the limit is reached.
            rows: builtins.list[RunRow] = []
            async with conn.transaction(readonly=True):
                async for record in conn.cursor(sql, *params, prefetch=_PREFETCH):
                    row = _row(record)
                    if _matches(row, wanted):
                        rows.append(row)
                        if len(rows) == limit:
                            break
            return rows

        return await self._query(filtered, "reading")

    async def unfinished(self, *, shards: Collection[int] | None = None) -> builtins.list[RunRow]:
        """Returns the rows of runs that are running, suspended or paused.

        Args:
            shards: Only runs of these shards (a worker recovers the shards it
                holds); None for every shard.

        Example:
            >>> import asyncio
            >>> asyncio.run(PostgresStore("postgresql://h/db").unfinished())
            Traceback (most recent call last):
            fusee.errors.StoreError: the store ... is closed; await store.open() first
        """
        await self._after_writes()
        statuses = sorted(UNFINISHED_STATUSES)
        if shards is None:
            found = await self._query(
                lambda conn: conn.fetch(self._sql.unfinished, statuses), "reading"
            )
        else:
            wanted = sorted(set(shards))
            found = await self._query(
                lambda conn: conn.fetch(self._sql.unfinished_in, statuses, wanted), "reading"
            )
        return [_row(r) for r in found]

    # -- plumbing ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._state != "open":
            raise StoreError(f"the store {self} is closed; await store.open() first")

    def _check_writable(self) -> None:
        self._check_open()
        if self._client:
            raise StoreError(
                f"the store {self} is open as a client: it posts commands and reads; the "
                "engine serving it writes the rest (open it without client=True)"
            )
        if self._readonly:
            raise StoreError(
                f"the store {self} is open read-only; an engine writes it "
                "(open it without readonly=True)"
            )

    async def _after_writes(self) -> None:
        self._check_open()
        tail = self._tail
        if tail is not None and not tail.done():
            # Reads see every append called before them, committed or failed.
            await asyncio.wait((tail,))
            self._check_open()  # closed meanwhile

    async def _query(self, fn: Callable[[_Conn], Awaitable[_T]], doing: str) -> _T:
        """Runs ``fn`` on a pooled connection; a connection lost on the way is retried once.

        Every ``fn`` is a read, or a single statement that commits alone, so
        running it again after the server dropped the connection is safe. A
        caller cancelled meanwhile does not cut the query short: it ends on
        its own and gives its connection back (`close` waits for it), as
        asyncpg cleans up badly after a query cancelled mid-flight.
        """
        return await self._finished_alone(self._query_now(fn, doing))

    async def _finished_alone(self, call: Awaitable[_T]) -> _T:
        task = asyncio.ensure_future(call)
        self._queries.add(task)
        task.add_done_callback(self._query_done)
        return await asyncio.shield(task)

    def _query_done(self, task: asyncio.Future[Any]) -> None:
        self._queries.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: its caller may be gone

    async def _query_now(self, fn: Callable[[_Conn], Awaitable[_T]], doing: str) -> _T:
        for attempt in (1, 2):
            self._check_open()
            pool = self._pool
            assert pool is not None
            try:
                async with pool.acquire() as conn:
                    return await fn(conn)
            except (NotFound, StoreError):
                raise
            except Exception as e:
                if attempt == 1 and _is_connection_lost(e):
                    continue
                raise self._error(e, doing) from None
        raise AssertionError("unreachable")


def _check_lease(owner: str, lease_s: float) -> None:
    if not isinstance(owner, str) or not owner:
        raise ValueError(f"owner must be a non-empty str naming the worker, not {owner!r}")
    if not lease_s > 0:
        raise ValueError(f"lease_s must be more than 0 seconds, not {lease_s!r}")


async def _no_reset(conn: _Conn) -> None:
    """A pool ``reset`` that sends nothing (the store leaves no session state)."""
