"""`fusee.Client` and `fusee.SyncClient`: talk to runs that workers serve, from anywhere.

A web app, a script or the CLI holds no engine and no workflow code: it
reads the store directly (a run's row, journal and result) and changes runs
by posting commands to the store's inbox, which the serving engine applies
and answers (`fusee.engine._inbox`), through a `fusee.remote.Remote`. Its
`Run` handles are the engine's.

The rule: a client writes nothing but commands. On SQLite it never takes
the engine's writer lock (the store keeps one writing engine); every change
to a run is the serving engine's, so it stays durable and applied once.
"""

from __future__ import annotations

import builtins
import datetime
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, cast

from anyio.from_thread import BlockingPortal, start_blocking_portal

from fusee import _codec
from fusee._durations import deadline_after, duration_ms, not_before
from fusee._payloads import Payloads, default_blobs, install
from fusee._queue import Queue, QueueStats
from fusee.engine import (
    BulkActions,
    BulkResult,
    Filters,
    IdPolicy,
    Run,
    RunInfo,
    StartOptions,
    Starts,
    bulk,
)
from fusee.errors import Cancelled
from fusee.remote import KEEP_INPUT, Remote, caller_trace, check_id, queue_stats, row_info
from fusee.store import Answer, Command, ScheduleRow, Store, open_store

if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from types import TracebackType

    from fusee._definitions import QueryDef, SignalDef, UpdateDef, WorkflowDef
    from fusee._events import EventDef
    from fusee.blobs import BlobStore
    from fusee.codecs import PayloadCodec

__all__ = ["Client", "ClientSchedules", "SyncClient", "SyncRun", "SyncSchedules"]

T = TypeVar("T")
R = TypeVar("R")


class Client(BulkActions, Starts):
    """Starts and talks to runs that workers serve, without an engine of its own.

    Open one with `Client.connect` and use it as an async context manager.

    Example:
        >>> import asyncio, tempfile, fusee
        >>> @fusee.workflow("double")
        ... async def double(ctx, n: int) -> int:
        ...     return await ctx.step("times-two", lambda: n * 2)
        >>> async def main(data: str) -> int:
        ...     async with await fusee.Engine.open(data, workflows=[double], durability="none"):
        ...         async with await fusee.Client.connect(data) as client:
        ...             run = await client.start(double, "d-1", 21)
        ...             return await run.result()
        >>> with tempfile.TemporaryDirectory() as d:
        ...     asyncio.run(main(d))
        42
    """

    def __init__(self, store: Store, *, owned: bool = False) -> None:
        self.store = store
        self._remote = Remote(store)
        self._owned = owned

    @classmethod
    async def connect(
        cls,
        target: str | os.PathLike[str] | Store,
        *,
        durability: str = "fsync",
        codecs: Iterable[PayloadCodec] = (),
        blobs: BlobStore | None = None,
    ) -> Client:
        """Connects to the store that workers serve.

        Args:
            target: A store directory (SQLite), a ``postgresql://`` URL, or a
                store object (an engine's own, in the same process: a
                `fusee.store.MemoryStore` in tests).
            durability: ``"fsync"`` (a posted command is on disk when `start`
                or `signal` goes on) or ``"none"`` (tests and demos).
            codecs: The payload codecs the workers use (see
                `fusee.Engine.open`): results and values read through the
                store are decoded with them. A store object given without
                them is read as its engine reads it.
            blobs: The blob store the workers offload to (default, for an
                SQLite directory: its ``blobs`` subdirectory).

        Raises:
            fusee.StoreError: The store cannot be opened.

        Example:
            >>> async def main() -> None:
            ...     async with await Client.connect("./data") as client:
            ...         print(await client.get("order-1").describe())
        """
        codecs = list(codecs)
        if isinstance(target, str | os.PathLike):
            path = os.fspath(target)
            store = open_store(path, durability=durability, client=True)
            await store.open()
            blobs = blobs if blobs is not None else default_blobs(path)
            install(store, Payloads(codecs, blobs=blobs, max_payload=None))
            return cls(store, owned=True)
        if codecs or blobs is not None:
            install(target, Payloads(codecs, blobs=blobs, max_payload=None))
        return cls(target)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the client's store (not one it was given); closing twice is harmless."""
        if self._remote.closed:
            return
        self._remote.close()
        if self._owned:
            await self.store.close()

    # --- runs ---------------------------------------------------------------------------

    async def _start(
        self,
        workflow: WorkflowDef[Any, Any] | str,
        id: str,
        input: Any,
        options: StartOptions,
    ) -> Run[Any]:
        """`start` on the serving worker: posted to the store's inbox, answered once durable."""
        check_id(id, "a run")
        now = round(time.time() * 1000)
        deadline_ms = deadline_after(now, options.timeout)
        not_before_ms = not_before(now, options.delay, options.start_at)
        if isinstance(workflow, str):
            name = workflow
        else:
            name = workflow.name
            self._remote.workflows[name] = workflow
        data = _codec.encode(input, name=f"the input of run '{id}'")
        policy = IdPolicy(options.id_policy)
        fields: dict[str, Any] = {"workflow": name, "input": data, "id_policy": policy.value}
        queue, debounce = options.queue, options.debounce
        if queue is not None or debounce is not None:
            fields.update(
                queue=queue.name if isinstance(queue, Queue) else queue,
                key=options.key,
                priority=options.priority,
                debounce_ms=None if debounce is None else duration_ms(debounce),
            )
        if deadline_ms:
            fields["deadline_ms"] = deadline_ms
        if not_before_ms:
            fields["not_before_ms"] = not_before_ms
        trace = caller_trace()
        if trace is not None:
            fields["trace"] = trace
        await self._remote.call("start", id, fields)
        self._remote.started(id)
        return Run(self, id)

    def get(self, id: str) -> Run[Any]:
        """A handle on the run with id ``id`` (checked when used).

        Raises:
            ValueError: ``id`` is empty or not valid text.

        Example:
            >>> async def main(client: Client) -> None:
            ...     await client.get("order-1").cancel("customer asked")
        """
        check_id(id, "a run")
        return Run(self, id)

    async def list(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[RunInfo]:
        """The runs of the store, filtered, by start time.

        Example:
            >>> async def main(client: Client) -> None:
            ...     async for info in client.list(status="running"):
            ...         print(info.id)
        """
        self._remote.check_open()
        rows = await self.store.list(
            status=status, workflow=workflow, attributes=attributes, limit=limit
        )
        for row in rows:
            yield row_info(row)

    async def _bulk(self, filters: Filters, act: Any, dry_run: bool) -> BulkResult:
        self._remote.check_open()
        return await bulk(self, self.store, filters, act, now_ms=_now_ms(), dry_run=dry_run)

    async def queue_stats(self) -> builtins.list[QueueStats]:
        """Queued and running runs per queue (that has any) and per key, by queue name.

        Example:
            >>> async def main(client: Client) -> None:
            ...     for q in await client.queue_stats():
            ...         print(q.queue, q.queued, q.running)
        """
        self._remote.check_open()
        return queue_stats(await self.store.queue_items())

    async def complete(self, token: str, value: Any = None) -> None:
        """Resolves the ``ctx.await_completion`` that handed out ``token``.

        Raises:
            ValueError: ``token`` is not a token fusee handed out.

        Example:
            >>> async def main(client: Client, token: str) -> None:
            ...     await client.complete(token, {"approved": True})
        """
        await self._remote.complete(token, _codec.encode(value, name="the completion's value"))

    @property
    def schedules(self) -> ClientSchedules:
        """The store's schedules: list them; create, update, delete, backfill, pause, resume or
        trigger one on the serving worker.

        Example:
            >>> async def main(client: Client) -> None:
            ...     await client.schedules.pause("nightly")
        """
        return ClientSchedules(self)

    # --- the inbox ----------------------------------------------------------------------

    async def post(
        self, kind: str, run_id: str, fields: Mapping[str, Any], *, dedup: str | None = None
    ) -> Command:
        """Posts a command for the serving worker without waiting for its answer.

        The lower level of every change (the CLI's ``--no-wait``); see
        `wait_answer`.

        Example:
            >>> async def main(client: Client) -> None:
            ...     command = await client.post("resume", "order-1", {})
            ...     answer = await client.wait_answer(command.id, timeout_s=5)
        """
        return await self._remote.post(kind, run_id, fields, dedup=dedup)

    async def wait_answer(self, id: str, *, timeout_s: float | None = None) -> Answer | None:
        """The worker's answer to command ``id``; None when ``timeout_s`` passes first.

        Example:
            >>> async def main(client: Client) -> None:
            ...     command = await client.post("cancel", "order-1", {"reason": "late"})
            ...     print(await client.wait_answer(command.id))
        """
        return await self._remote.wait_answer(id, timeout_s)

    # --- what its `Run` handles call (`fusee.engine._run.RunOperations`) ------------------

    async def _result(self, id: str) -> Any:
        return await self._remote.result(id)

    async def _signal(
        self, id: str, name: str, payload: bytes, dedup: int, by: bytes | None
    ) -> None:
        await self._remote.signal(id, name, payload, dedup, by)

    async def _query(self, id: str, name: str, arg: bytes) -> Any:
        return await self._remote.query(id, name, arg)

    async def _update(self, id: str, name: str, update_id: str | None, payload: bytes) -> Any:
        return await self._remote.update(id, name, update_id, payload)

    async def _cancel(self, id: str, reason: str) -> None:
        await self._remote.cancel(id, reason)

    async def _resume(self, id: str) -> None:
        await self._remote.resume(id)

    def _stream(self, id: str, name: str) -> AsyncIterator[Any]:
        return self._remote.stream(id, name)

    async def _get_event(self, id: str, key: EventDef[Any], timeout_s: float | None) -> Any:
        return await self._remote.get_event(id, key, timeout_s)

    async def _describe(self, id: str) -> RunInfo:
        return await self._remote.describe(id)

    async def _fork(self, id: str, new_id: str, at: int | str, input: bytes | None) -> None:
        await self._remote.fork(id, new_id, at, input)

    async def _delete(self, id: str) -> None:
        await self._remote.delete(id)

    async def _start_now(self, id: str) -> None:
        await self._remote.start_now(id)


_SCHEDULE_ARGS: Final = ("cron", "every", "tz", "input", "overlap", "catch_up", "queue")


def _schedule_fields(name: str, args: Mapping[str, Any]) -> dict[str, Any]:
    """A schedule's arguments as a command carries them: input encoded, durations in ms."""
    out: dict[str, Any] = {}
    for key, value in args.items():
        if key not in _SCHEDULE_ARGS:
            raise TypeError(f"a schedule takes {', '.join(_SCHEDULE_ARGS)}, not {key!r}")
        if key == "input":
            value = _codec.encode(value, name=f"the input of schedule '{name}'")
        elif key in ("every", "catch_up") and value is not None:
            value = duration_ms(value)
        elif key == "queue" and isinstance(value, Queue):
            value = value.name
        out[key] = value
    return out


class ClientSchedules:
    """`Client.schedules`: the engine's ``engine.schedules`` calls, as commands to the worker.

    Example:
        >>> async def main(client: Client) -> None:
        ...     run = await client.schedules.trigger("nightly")
        ...     print([row.name for row in await client.schedules.list()])
    """

    __slots__ = ("_client",)

    def __init__(self, client: Client) -> None:
        self._client = client

    async def create(
        self,
        name: str,
        workflow: WorkflowDef[Any, Any] | str,
        *,
        cron: str | None = None,
        every: Any = None,
        tz: str = "UTC",
        input: Any = None,
        overlap: str = "skip",
        catch_up: Any = "0s",
        queue: Queue | str | None = None,
    ) -> None:
        """Makes schedule ``name`` on the serving worker: it ticks from now on, until `delete`.

        Its arguments are `fusee.Schedule`'s (``engine.schedules.create``).

        Raises:
            fusee.AlreadyExists: A schedule of that name exists.
            fusee.UnknownWorkflow: The worker does not serve that workflow.
            ValueError: An argument `fusee.Schedule` refuses.

        Example:
            >>> async def main(client: Client) -> None:
            ...     await client.schedules.create("hourly", "report", every="1h", input={"n": 1})
        """
        wf_name = workflow if isinstance(workflow, str) else workflow.name
        fields = _schedule_fields(
            name,
            dict(
                cron=cron,
                every=every,
                tz=tz,
                input=input,
                overlap=overlap,
                catch_up=catch_up,
                queue=queue,
            ),
        )
        await self._client._remote.call(
            "schedule", name, {"action": "create", "workflow": wf_name, **fields}
        )

    async def update(self, name: str, **changes: Any) -> None:
        """Changes schedule ``name`` (made at run time): the arguments given, the others kept.

        Takes ``cron``, ``every``, ``tz``, ``input``, ``overlap``,
        ``catch_up`` and ``queue``, as ``engine.schedules.update``.

        Raises:
            fusee.NotFound: No schedule of that name.
            ValueError: It is defined in code, or an argument is refused.

        Example:
            >>> async def main(client: Client) -> None:
            ...     await client.schedules.update("hourly", every="2h")
        """
        fields = _schedule_fields(name, changes)
        await self._client._remote.call("schedule", name, {"action": "update", **fields})

    async def delete(self, name: str) -> None:
        """Deletes schedule ``name`` (made at run time): it ticks no more; its runs go on.

        Example:
            >>> async def main(client: Client) -> None:
            ...     await client.schedules.delete("hourly")
        """
        await self._client._remote.call("schedule", name, {"action": "delete"})

    async def backfill(
        self, name: str, start: datetime.datetime, end: datetime.datetime
    ) -> builtins.list[Run[Any]]:
        """Starts the runs of schedule ``name``'s ticks from ``start`` to ``end``, each once.

        As ``engine.schedules.backfill``: a tick whose run started already is
        not started again. Returns the ticks' run handles, in order.

        Example:
            >>> import datetime
            >>> async def main(client: Client) -> None:
            ...     end = datetime.datetime.now(datetime.UTC)
            ...     await client.schedules.backfill("hourly", end - datetime.timedelta(days=1), end)
        """
        bounds = {}
        for key, when in (("start_ms", start), ("end_ms", end)):
            if not isinstance(when, datetime.datetime) or when.tzinfo is None:
                raise ValueError(
                    f"a backfill's {key[:-3]} must be a datetime with a time zone, not {when!r}"
                )
            bounds[key] = int(when.timestamp() * 1000)
        fields = await self._client._remote.call("schedule", name, {"action": "backfill", **bounds})
        return [Run(self._client, str(id)) for id in fields["run_ids"]]

    async def pause(self, name: str) -> None:
        """Pauses schedule ``name`` (its ticks are skipped until `resume`)."""
        await self._client._remote.call("schedule", name, {"action": "pause"})

    async def resume(self, name: str) -> None:
        """Resumes schedule ``name``."""
        await self._client._remote.call("schedule", name, {"action": "resume"})

    async def trigger(self, name: str) -> Run[Any]:
        """Starts a run of schedule ``name`` now; returns its handle."""
        fields = await self._client._remote.call("schedule", name, {"action": "trigger"})
        return Run(self._client, str(fields["run_id"]))

    async def list(self) -> list[ScheduleRow]:
        """Every schedule row of the store, by name (read from the store)."""
        self._client._remote.check_open()
        return await self._client.store.schedules()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _blocking(portal: BlockingPortal, call: Callable[[], Awaitable[T]]) -> T:
    """Runs ``call()`` on the portal's loop and waits; a `fusee.Cancelled` is raised as itself.

    (A portal turns an exception of the `asyncio.CancelledError` family
    into a cancelled future: the run's cancellation would read as the
    caller's.)
    """

    async def guarded() -> tuple[bool, Any]:
        try:
            return True, await call()
        except Cancelled as e:
            return False, e

    ok, value = portal.call(guarded)
    if not ok:
        raise value
    return cast("T", value)


class SyncRun(Generic[T]):
    """A `fusee.Run` whose calls block: what `SyncClient` hands out.

    Example:
        >>> def view(client: SyncClient) -> None:
        ...     print(client.get("order-1").result())
    """

    __slots__ = ("_portal", "_run", "id")

    def __init__(self, portal: BlockingPortal, run: Run[T]) -> None:
        self._portal = portal
        self._run = run
        self.id = run.id

    def __repr__(self) -> str:
        return f"<SyncRun {self.id!r}>"

    def result(self) -> T:
        """Waits for the run to end and returns its result (`fusee.Run.result`)."""
        return _blocking(self._portal, self._run.result)

    def signal(
        self, signal: SignalDef[Any], payload: Any = None, *, dedup: str | None = None
    ) -> None:
        """Sends ``signal`` to the run (`fusee.Run.signal`)."""
        _blocking(self._portal, lambda: self._run.signal(signal, payload, dedup=dedup))

    def query(self, query: QueryDef[R], arg: Any = None) -> R:
        """Asks the run's query handler; the answer decodes to its type (`fusee.Run.query`)."""
        return _blocking(self._portal, lambda: self._run.query(query, arg))

    def update(self, update: UpdateDef[Any], payload: Any = None, *, id: str | None = None) -> Any:
        """Sends an update and returns its result (`fusee.Run.update`)."""
        return _blocking(self._portal, lambda: self._run.update(update, payload, id=id))

    def cancel(self, reason: str = "cancelled") -> None:
        """Cancels the run (`fusee.Run.cancel`)."""
        _blocking(self._portal, lambda: self._run.cancel(reason))

    def resume(self) -> None:
        """Resumes the run's paused steps (`fusee.Run.resume`)."""
        _blocking(self._portal, self._run.resume)

    def delete(self) -> None:
        """Deletes the finished run from the store (`fusee.Run.delete`)."""
        _blocking(self._portal, self._run.delete)

    def start_now(self) -> None:
        """Starts a delayed run now (`fusee.Run.start_now`)."""
        _blocking(self._portal, self._run.start_now)

    def describe(self) -> RunInfo:
        """The run's status, times and attributes (`fusee.Run.describe`)."""
        return _blocking(self._portal, self._run.describe)

    def fork(self, new_id: str, *, at: int | str, input: Any = KEEP_INPUT) -> SyncRun[T]:
        """Starts ``new_id`` from this run's journal before ``at`` (`fusee.Run.fork`)."""
        run = _blocking(self._portal, lambda: self._run.fork(new_id, at=at, input=input))
        return SyncRun(self._portal, run)

    def get_event(self, key: str | EventDef[Any], *, timeout: Any = None) -> Any:
        """The run's latest value of event ``key``, once set (`fusee.Run.get_event`)."""
        return _blocking(self._portal, lambda: self._run.get_event(key, timeout=timeout))

    def stream(self, name: str) -> Iterator[Any]:
        """Reads stream ``name`` from its start until it ends (`fusee.Run.stream`)."""
        chunks = self._run.stream(name)
        while True:
            try:
                yield _blocking(self._portal, chunks.__anext__)
            except StopAsyncIteration:
                return


class SyncClient:
    """`Client` with blocking calls, for Django, Flask and scripts.

    Its event loop runs in a thread of its own (an anyio blocking portal);
    one client serves every thread of the program.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     with SyncClient.connect(d, durability="none") as client:
        ...         print(list(client.list()))
        []
    """

    def __init__(
        self, portal: BlockingPortal, stop: AbstractContextManager[BlockingPortal], client: Client
    ) -> None:
        self._portal = portal
        self._stop = stop
        self._client = client
        self._closed = False

    @classmethod
    def connect(
        cls,
        target: str | os.PathLike[str],
        *,
        durability: str = "fsync",
        codecs: Iterable[PayloadCodec] = (),
        blobs: BlobStore | None = None,
    ) -> SyncClient:
        """Connects to the store that workers serve (as `Client.connect`), blocking.

        ``codecs`` and ``blobs`` are the workers' (see `Client.connect`).

        Raises:
            fusee.StoreError: The store cannot be opened.

        Example:
            >>> def main() -> None:
            ...     with SyncClient.connect("./data") as client:
            ...         client.start("checkout", "order-1", {"sku": "A1"})
        """
        stop = start_blocking_portal()
        portal = stop.__enter__()
        try:
            client = portal.call(
                lambda: Client.connect(target, durability=durability, codecs=codecs, blobs=blobs)
            )
        except BaseException:
            stop.__exit__(None, None, None)
            raise
        return cls(portal, stop, client)

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Closes the client and stops its thread; closing twice is harmless."""
        if self._closed:
            return
        self._closed = True
        try:
            self._portal.call(self._client.close)
        finally:
            self._stop.__exit__(None, None, None)

    def start(
        self,
        workflow: WorkflowDef[Any, T] | str,
        id: str,
        input: Any = None,
        *,
        id_policy: IdPolicy = IdPolicy.REJECT,
        queue: Queue | str | None = None,
        key: str | None = None,
        priority: int = 0,
        debounce: Any = None,
        timeout: Any = None,
        delay: Any = None,
        start_at: datetime.datetime | None = None,
    ) -> SyncRun[T]:
        """Starts a run on the serving worker (`Client.start`)."""
        run = _blocking(
            self._portal,
            lambda: self._client.start(
                workflow,
                id,
                input,
                id_policy=id_policy,
                queue=queue,
                key=key,
                priority=priority,
                debounce=debounce,
                timeout=timeout,
                delay=delay,
                start_at=start_at,
            ),
        )
        return SyncRun(self._portal, run)

    def get(self, id: str) -> SyncRun[Any]:
        """A handle on the run with id ``id``."""
        return SyncRun(self._portal, self._client.get(id))

    def list(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        limit: int | None = None,
    ) -> list[RunInfo]:
        """The runs of the store, filtered (`Client.list`)."""

        async def collect() -> list[RunInfo]:
            listing = self._client.list(
                status=status, workflow=workflow, attributes=attributes, limit=limit
            )
            return [info async for info in listing]

        return _blocking(self._portal, collect)

    def cancel_many(self, **filters: Any) -> BulkResult:
        """Cancels every run the filters match (`fusee.Client.cancel_many`)."""
        return _blocking(self._portal, lambda: self._client.cancel_many(**filters))

    def resume_many(self, **filters: Any) -> BulkResult:
        """Resumes every run the filters match (`fusee.Client.resume_many`)."""
        return _blocking(self._portal, lambda: self._client.resume_many(**filters))

    def fork_many(self, **filters: Any) -> BulkResult:
        """Forks every run the filters match at its last failure (`fusee.Client.fork_many`)."""
        return _blocking(self._portal, lambda: self._client.fork_many(**filters))

    def queue_stats(self) -> builtins.list[QueueStats]:
        """Queued and running runs per queue and per key (`Client.queue_stats`)."""
        return _blocking(self._portal, self._client.queue_stats)

    def complete(self, token: str, value: Any = None) -> None:
        """Resolves the ``ctx.await_completion`` that handed out ``token``."""
        _blocking(self._portal, lambda: self._client.complete(token, value))

    @property
    def schedules(self) -> SyncSchedules:
        """The store's schedules, blocking (`Client.schedules`).

        Example:
            >>> def main(client: SyncClient) -> None:
            ...     client.schedules.pause("nightly")
        """
        return SyncSchedules(self._portal, self._client.schedules)


class SyncSchedules:
    """`SyncClient.schedules`: `ClientSchedules` with blocking calls.

    Example:
        >>> def main(client: SyncClient) -> None:
        ...     run = client.schedules.trigger("nightly")
        ...     print([row.name for row in client.schedules.list()], run.result())
    """

    __slots__ = ("_portal", "_schedules")

    def __init__(self, portal: BlockingPortal, schedules: ClientSchedules) -> None:
        self._portal = portal
        self._schedules = schedules

    def create(self, name: str, workflow: WorkflowDef[Any, Any] | str, **args: Any) -> None:
        """Makes schedule ``name`` (`ClientSchedules.create`), blocking.

        Example:
            >>> def main(client: SyncClient) -> None:
            ...     client.schedules.create("hourly", "report", every="1h")
        """
        _blocking(self._portal, lambda: self._schedules.create(name, workflow, **args))

    def update(self, name: str, **changes: Any) -> None:
        """Changes schedule ``name`` (`ClientSchedules.update`), blocking."""
        _blocking(self._portal, lambda: self._schedules.update(name, **changes))

    def delete(self, name: str) -> None:
        """Deletes schedule ``name`` (`ClientSchedules.delete`), blocking."""
        _blocking(self._portal, lambda: self._schedules.delete(name))

    def backfill(
        self, name: str, start: datetime.datetime, end: datetime.datetime
    ) -> builtins.list[SyncRun[Any]]:
        """Starts the runs of the ticks from ``start`` to ``end`` (`ClientSchedules.backfill`)."""
        runs = _blocking(self._portal, lambda: self._schedules.backfill(name, start, end))
        return [SyncRun(self._portal, run) for run in runs]

    def pause(self, name: str) -> None:
        """Pauses schedule ``name`` (its ticks are skipped until `resume`)."""
        _blocking(self._portal, lambda: self._schedules.pause(name))

    def resume(self, name: str) -> None:
        """Resumes schedule ``name``."""
        _blocking(self._portal, lambda: self._schedules.resume(name))

    def trigger(self, name: str) -> SyncRun[Any]:
        """Starts a run of schedule ``name`` now; returns its handle."""
        run = _blocking(self._portal, lambda: self._schedules.trigger(name))
        return SyncRun(self._portal, run)

    def list(self) -> builtins.list[ScheduleRow]:
        """Every schedule row of the store, by name (read from the store)."""
        return _blocking(self._portal, self._schedules.list)
