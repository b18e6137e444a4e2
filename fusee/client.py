"""`fusee.Client` and `fusee.SyncClient`: talk to runs that workers serve, from anywhere.

A web app, a script or the CLI holds no engine and no workflow code: it
reads the store directly (a run's row, journal and result) and changes runs
by posting commands to the store's inbox, which the serving engine applies
and answers (`fusee.engine._inbox`). Its `Run` handles are the engine's.

The rule: a client writes nothing but commands. On SQLite it never takes
the engine's writer lock (the store keeps one writing engine); every change
to a run is the serving engine's, so it stays durable and applied once.
"""

from __future__ import annotations

import asyncio
import os
import time
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, cast

from anyio.from_thread import BlockingPortal, start_blocking_portal

from fusee import _codec
from fusee._status import FINISHED_STATUSES, RunStatus
from fusee.engine._events import latest_event, never_set, timed_out
from fusee.engine._inbox import decode_error, decode_payload, encode_payload
from fusee.engine._journal import decode_journal, end_value, no_run
from fusee.engine._run import IdPolicy, Run, RunInfo, info_of
from fusee.errors import Cancelled, FuseeError, StoreError
from fusee.record import Chunk, Done, StreamEnd
from fusee.store import Answer, Command, ScheduleRow, Store, open_store

if TYPE_CHECKING:
    from contextlib import AbstractContextManager
    from types import TracebackType

    from fusee._definitions import QueryDef, SignalDef, UpdateDef, WorkflowDef
    from fusee._events import EventDef

__all__ = ["Client", "ClientSchedules", "SyncClient", "SyncRun"]

T = TypeVar("T")

# How often a client looks for an answer or a run's end: soon at first (a
# live worker answers within milliseconds), then less often.
_FIRST_POLL_S: Final = 0.002
_MAX_POLL_S: Final = 0.1


class _Polling:
    """Intervals that start short and double up to a ceiling."""

    def __init__(self) -> None:
        self._next = _FIRST_POLL_S

    async def wait(self) -> None:
        await asyncio.sleep(self._next)
        self._next = min(self._next * 2, _MAX_POLL_S)


class Client:
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
        self._owned = owned
        self._closed = False
        # Workflows named by definition: their results decode to their types.
        self._workflows: dict[str, WorkflowDef[Any, Any]] = {}
        self._workflow_of: dict[str, str] = {}

    @classmethod
    async def connect(
        cls, target: str | os.PathLike[str] | Store, *, durability: str = "fsync"
    ) -> Client:
        """Connects to the store that workers serve.

        Args:
            target: A store directory (SQLite), a ``postgresql://`` URL, or a
                store object (an engine's own, in the same process: a
                `fusee.store.MemoryStore` in tests).
            durability: ``"fsync"`` (a posted command is on disk when `start`
                or `signal` goes on) or ``"none"`` (tests and demos).

        Raises:
            fusee.StoreError: The store cannot be opened.

        Example:
            >>> async def main() -> None:
            ...     async with await Client.connect("./data") as client:
            ...         print(await client.get("order-1").describe())
        """
        if isinstance(target, str | os.PathLike):
            store = open_store(os.fspath(target), durability=durability, client=True)
            await store.open()
            return cls(store, owned=True)
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
        if self._closed:
            return
        self._closed = True
        if self._owned:
            await self.store.close()

    # --- runs ---------------------------------------------------------------------------

    async def start(
        self,
        workflow: WorkflowDef[Any, T] | str,
        id: str,
        input: Any = None,
        *,
        id_policy: IdPolicy = IdPolicy.REJECT,
    ) -> Run[T]:
        """Starts a run on the serving worker; returns once its start is durable.

        Args:
            workflow: A `fusee.WorkflowDef` or a workflow's name.
            id: The run's workflow id.
            input: Its input.
            id_policy: What to do when the id is taken (`fusee.IdPolicy`).

        Raises:
            fusee.AlreadyExists: The id is taken.
            fusee.UnknownWorkflow: The worker does not serve that workflow.
            fusee.PayloadError: ``input`` cannot be encoded, or does not fit
                the workflow's input type.

        Example:
            >>> async def main(client: Client) -> None:
            ...     run = await client.start("checkout", "order-1", {"sku": "A1"})
        """
        if not isinstance(id, str) or not id:
            raise ValueError(f"a run needs a non-empty string id, got {id!r}")
        if isinstance(workflow, str):
            name = workflow
        else:
            name = workflow.name
            self._workflows[name] = workflow
        data = _codec.encode(input, name=f"the input of run '{id}'")
        policy = IdPolicy(id_policy)
        await self._call("start", id, {"workflow": name, "input": data, "id_policy": policy.value})
        self._workflow_of[id] = name
        return Run(self, id)

    def get(self, id: str) -> Run[Any]:
        """A handle on the run with id ``id`` (checked when used).

        Example:
            >>> async def main(client: Client) -> None:
            ...     await client.get("order-1").cancel("customer asked")
        """
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
        rows = await self.store.list(
            status=status, workflow=workflow, attributes=attributes, limit=limit
        )
        for row in rows:
            yield info_of(row, None, None)

    async def complete(self, token: str, value: Any = None) -> None:
        """Resolves the ``ctx.await_completion`` that handed out ``token``.

        Raises:
            ValueError: ``token`` is not a token fusee handed out.

        Example:
            >>> async def main(client: Client, token: str) -> None:
            ...     await client.complete(token, {"approved": True})
        """
        data = _codec.encode(value, name="the completion's value")
        run_id = token.rsplit("/", 3)[0] if isinstance(token, str) else ""
        await self._call("complete", run_id, {"token": token, "value": data})

    @property
    def schedules(self) -> ClientSchedules:
        """The store's schedules: list them; pause, resume or trigger one on the serving worker.

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
        self._check_open()
        command = Command.new(kind, run_id, encode_payload(fields), dedup=dedup)
        await self.store.post_command(command)
        return command

    async def wait_answer(self, id: str, *, timeout_s: float | None = None) -> Answer | None:
        """The worker's answer to command ``id``; None when ``timeout_s`` passes first.

        Example:
            >>> async def main(client: Client) -> None:
            ...     command = await client.post("cancel", "order-1", {"reason": "late"})
            ...     print(await client.wait_answer(command.id))
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        polling = _Polling()
        while True:
            self._check_open()
            answer = await self.store.get_answer(id)
            if answer is not None:
                return answer
            if deadline is not None and loop.time() >= deadline:
                return None
            await polling.wait()

    async def _call(
        self, kind: str, run_id: str, fields: Mapping[str, Any], *, dedup: str | None = None
    ) -> dict[str, Any]:
        command = await self.post(kind, run_id, fields, dedup=dedup)
        answer = await self.wait_answer(command.id)
        assert answer is not None
        return answer_fields(answer)

    def _check_open(self) -> None:
        if self._closed:
            raise FuseeError("this client is closed; connect a new one with fusee.Client.connect")

    # --- run handle operations (`Run` calls these) --------------------------------------

    async def _result(self, id: str) -> Any:
        polling = _Polling()
        while True:
            self._check_open()
            row = await self.store.get(id)
            if row is None:
                raise no_run(id)
            if row.status in FINISHED_STATUSES and row.status != RunStatus.CONTINUED:
                entries = await self.store.load(id, row.run)
                done = decode_journal(id, row.run, entries[-1:])[0]
                if not isinstance(done, Done):
                    raise StoreError(
                        f"run '{id}' is marked {row.status} but its journal has no end record"
                    )
                return end_value(self._decoder(row.workflow), done)
            await polling.wait()

    def _decoder(self, workflow: str) -> WorkflowDef[Any, Any]:
        wf = self._workflows.get(workflow)
        if wf is not None:
            return wf
        # A workflow known by name only: its result decodes to plain values.
        return cast("WorkflowDef[Any, Any]", types.SimpleNamespace(decode_result=_codec.decode))

    async def _signal(
        self, id: str, name: str, payload: bytes, dedup: int, by: bytes | None
    ) -> None:
        fields = {"name": name, "payload": payload, "dedup": dedup}
        await self._call("signal", id, fields, dedup=str(dedup) if dedup else None)

    async def _query(self, id: str, name: str, arg: bytes) -> Any:
        fields = await self._call("query", id, {"name": name, "arg": arg})
        return _codec.decode(fields["value"])

    async def _update(self, id: str, name: str, update_id: str | None, payload: bytes) -> Any:
        fields = await self._call(
            "update", id, {"name": name, "payload": payload, "update_id": update_id}
        )
        return _codec.decode(fields["value"])

    async def _cancel(self, id: str, reason: str) -> None:
        await self._call("cancel", id, {"reason": reason})

    async def _resume(self, id: str) -> None:
        await self._call("resume", id, {})

    async def _stream(self, id: str, name: str) -> AsyncIterator[Any]:
        sent = 0
        polling = _Polling()
        while True:
            self._check_open()
            row = await self.store.get(id)
            if row is None:
                raise no_run(id)
            entries = await self.store.load(id, row.run)
            chunks: list[bytes] = []
            ended = row.status in FINISHED_STATUSES
            for rec in decode_journal(id, row.run, entries):
                if isinstance(rec, Chunk) and rec.stream == name:
                    chunks.append(rec.payload)
                elif isinstance(rec, StreamEnd) and rec.stream == name:
                    ended = True
            if len(chunks) > sent:
                polling = _Polling()
            for c in chunks[sent:]:
                yield _codec.decode(c)
            sent = len(chunks)
            if ended:
                return
            await polling.wait()

    async def _get_event(self, id: str, key: EventDef[Any], timeout_s: float | None) -> Any:
        # The client reads the journal: polled, as for a result or a stream.
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        polling = _Polling()
        while True:
            self._check_open()
            row = await self.store.get(id)
            if row is None:
                raise no_run(id)
            records = decode_journal(id, row.run, await self.store.load(id, row.run))
            payload = latest_event(records, key.name)
            if payload is not None:
                return key.decode(payload)
            error = never_set(row, key.name)
            if error is not None:
                raise error
            if deadline is not None and time.monotonic() >= deadline:
                assert timeout_s is not None
                raise timed_out(id, key.name, timeout_s)
            await polling.wait()

    async def _describe(self, id: str) -> RunInfo:
        row = await self.store.get(id)
        if row is None:
            raise no_run(id)
        return info_of(row, None, None)


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

    async def pause(self, name: str) -> None:
        """Pauses schedule ``name`` (its ticks are skipped until `resume`)."""
        await self._client._call("schedule", name, {"action": "pause"})

    async def resume(self, name: str) -> None:
        """Resumes schedule ``name``."""
        await self._client._call("schedule", name, {"action": "resume"})

    async def trigger(self, name: str) -> Run[Any]:
        """Starts a run of schedule ``name`` now; returns its handle."""
        fields = await self._client._call("schedule", name, {"action": "trigger"})
        return Run(self._client, str(fields["run_id"]))

    async def list(self) -> list[ScheduleRow]:
        """Every schedule row of the store, by name (read from the store)."""
        self._client._check_open()
        return await self._client.store.schedules()


def answer_fields(answer: Answer) -> dict[str, Any]:
    """An answer's fields; raises the error of a command that failed, with its type.

    Example:
        >>> from fusee.store import Answer
        >>> answer_fields(Answer(True, encode_payload({"message": "ok"}), 0))
        {'message': 'ok'}
    """
    fields = decode_payload(answer.payload)
    if not answer.ok:
        raise decode_error(bytes(fields.get("error") or b""))
    return fields


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

    def query(self, query: QueryDef, arg: Any = None) -> Any:
        """Asks the run's query handler (`fusee.Run.query`)."""
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

    def describe(self) -> RunInfo:
        """The run's status, times and attributes (`fusee.Run.describe`)."""
        return _blocking(self._portal, self._run.describe)

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
    def connect(cls, target: str | os.PathLike[str], *, durability: str = "fsync") -> SyncClient:
        """Connects to the store that workers serve (as `Client.connect`), blocking.

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
            client = portal.call(lambda: Client.connect(target, durability=durability))
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
    ) -> SyncRun[T]:
        """Starts a run on the serving worker (`Client.start`)."""
        run = _blocking(
            self._portal, lambda: self._client.start(workflow, id, input, id_policy=id_policy)
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

    def complete(self, token: str, value: Any = None) -> None:
        """Resolves the ``ctx.await_completion`` that handed out ``token``."""
        _blocking(self._portal, lambda: self._client.complete(token, value))
