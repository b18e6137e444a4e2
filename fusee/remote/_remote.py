"""Runs served elsewhere: commands posted to the store's inbox, answered by the run's owner.

`Remote` is the run-handle side of a process that does not host a run:
a `fusee.Client` holds one (it hosts none), and an engine on a store shared
by several workers (Postgres) uses one for runs of shards it does not hold.
It reads the store directly (a run's row, journal and result) and changes
runs by posting `fusee.store.Command` rows, which the owner applies and
answers (`fusee.engine._inbox`).

The rule: a remote writes nothing but commands, so every change to a run is
its owner's, durable and applied once.
"""

from __future__ import annotations

import asyncio
import time
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, cast

from fusee import _codec
from fusee._payloads import payloads_of
from fusee._status import FINISHED_STATUSES, RunStatus
from fusee.errors import FuseeError, StoreError
from fusee.record import Done
from fusee.remote._info import RunInfo, row_info
from fusee.remote._journal import decode_journal, end_value, no_run
from fusee.remote._readers import StreamReader, read_event, timed_out
from fusee.remote._token import CompletionToken
from fusee.remote._wire import answer_fields, encode_payload
from fusee.store import Answer, Command, RunRow, Store

if TYPE_CHECKING:
    from fusee._definitions import WorkflowDef
    from fusee._events import EventDef

__all__ = ["CLIENT_CLOSED", "Polling", "Remote"]

# How often a remote looks for an answer or a run's end: soon at first (a
# live worker answers within milliseconds), then less often.
_FIRST_POLL_S: Final = 0.002
_MAX_POLL_S: Final = 0.1
# Runs started here whose results are not read yet, remembered for read-ahead.
_STARTED_MAX: Final = 1_000
# At most this many of them read ahead in one trip.
_READ_AHEAD: Final = 500

CLIENT_CLOSED: Final = "this client is closed; connect a new one with fusee.Client.connect"


class Polling:
    """Intervals that start short and double up to a ceiling.

    Example:
        >>> asyncio.run(Polling().wait())
    """

    def __init__(self) -> None:
        self._next = _FIRST_POLL_S

    async def wait(self) -> None:
        await asyncio.sleep(self._next)
        self._next = min(self._next * 2, _MAX_POLL_S)


class Remote:
    """Talks to runs through the store's inbox (a `fusee.Client` holds one).

    Args:
        store: An open store.
        workflows: Workflows by name, whose results decode to their types
            (the dict is kept: names added to it later count too).
        closed_message: What a call after `close` raises (a closed engine
            says so in its own words).

    Example:
        >>> async def main(store: Store) -> None:
        ...     await Remote(store).cancel("order-1", "late")
    """

    def __init__(
        self,
        store: Store,
        *,
        workflows: dict[str, WorkflowDef[Any, Any]] | None = None,
        closed_message: str = CLIENT_CLOSED,
    ) -> None:
        self.store = store
        self.closed = False
        self._closed_message = closed_message
        # Workflows named by definition: their results decode to their types.
        self.workflows: dict[str, WorkflowDef[Any, Any]] = {} if workflows is None else workflows
        # Runs started through this remote whose results are not read yet,
        # with the row and end record read ahead once they ended (None before).
        self._started: dict[str, tuple[RunRow, tuple[int, bytes]] | None] = {}

    def started(self, id: str) -> None:
        """Notes that run ``id`` was started here: its result may be read ahead (`result`)."""
        started = self._started
        started.pop(id, None)
        started[id] = None
        if len(started) > _STARTED_MAX:
            del started[next(iter(started))]  # the oldest: read as any other run

    def close(self) -> None:
        """Every call from now on raises at once (the store is its owner's to close)."""
        self.closed = True

    def check_open(self) -> None:
        """Raises `fusee.FuseeError` once `close` was called."""
        if self.closed:
            raise FuseeError(self._closed_message)

    async def post(
        self,
        kind: str,
        run_id: str,
        fields: Mapping[str, Any],
        *,
        dedup: str | None = None,
        command_id: str | None = None,
    ) -> Command:
        """Posts command ``kind`` for run ``run_id``; returns it without waiting for its answer."""
        self.check_open()
        command = Command.new(kind, run_id, encode_payload(fields), dedup=dedup)
        if command_id is not None:
            # Posted again under the same id (a delivery retried), it is stored once.
            command = Command(command_id, kind, run_id, command.payload, dedup, command.created_ms)
        await self.store.post_command(command)
        return command

    async def wait_answer(self, id: str, timeout_s: float | None = None) -> Answer | None:
        """The answer to command ``id``; None when ``timeout_s`` passes first."""
        wait = getattr(self.store, "wait_answer", None)
        if wait is not None:
            # The store hears of answers (Postgres: LISTEN), polling only as a fallback.
            self.check_open()
            answer: Answer | None = await wait(id, timeout_s)
            return answer
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        polling = Polling()
        while True:
            self.check_open()
            answer = await self.store.get_answer(id)
            if answer is not None:
                return answer
            if deadline is not None and loop.time() >= deadline:
                return None
            await polling.wait()

    async def call(
        self,
        kind: str,
        run_id: str,
        fields: Mapping[str, Any],
        *,
        dedup: str | None = None,
        command_id: str | None = None,
    ) -> dict[str, Any]:
        """Posts a command and waits for its answer: its fields, or its error raised."""
        command = await self.post(kind, run_id, fields, dedup=dedup, command_id=command_id)
        answer = await self.wait_answer(command.id)
        assert answer is not None
        return answer_fields(answer)

    # --- what a `fusee.Run` handle does, for a run served elsewhere ----------------------

    async def result(self, id: str) -> Any:
        """Waits for run ``id`` to end (polling its row); its result, or its failure raised.

        On a store that reads a row with its end record in one trip
        (Postgres: ``get_ended``), a run found ended has the runs started
        here whose results are not read yet read in one more trip: started
        together, they mostly end together, and a loop awaiting their
        results one by one then reads the store twice, not once per run.
        What was read ahead is the end of the run started here, read once.
        """
        self.check_open()
        get_ended = self._ended_reader()
        known = self._started.pop(id, None)
        if known is not None:
            return self._end_value(id, known[0], [known[1]])
        polling = Polling()
        while True:
            self.check_open()
            end: tuple[int, bytes] | None = None
            if get_ended is not None:
                row, end = await get_ended(id)
            else:
                row = await self.store.get(id)
            if row is None:
                raise no_run(id)
            if row.status in FINISHED_STATUSES and row.status != RunStatus.CONTINUED:
                if end is not None:
                    if get_ended is not None and self._started:
                        await self._read_ahead(get_ended)
                    return self._end_value(id, row, [end])
                return self._end_value(id, row, await self.store.load(id, row.run))
            await polling.wait()

    def _ended_reader(
        self,
    ) -> Callable[[str], Awaitable[tuple[RunRow | None, tuple[int, bytes] | None]]] | None:
        # The store's `get_ended`, its end record's payloads opened as
        # `load` opens them (a codec chain, blobs), since it reads the
        # journal past the store's payload door.
        read = getattr(self.store, "get_ended", None)
        payloads = payloads_of(self.store)
        if read is None or payloads is None:
            return read

        async def opened(id: str) -> tuple[RunRow | None, tuple[int, bytes] | None]:
            row, end = await read(id)
            if end is not None:
                end = (await payloads.open_entries(id, [end]))[0]
            return row, end

        return opened

    async def _read_ahead(
        self,
        get_ended: Callable[[str], Awaitable[tuple[RunRow | None, tuple[int, bytes] | None]]],
    ) -> None:
        ids = [id for id, known in self._started.items() if known is None][:_READ_AHEAD]
        if not ids:
            return
        # Made at once: the store reads them in one trip.
        found = await asyncio.gather(*(get_ended(id) for id in ids))
        for id, (row, end) in zip(ids, found, strict=True):
            # Not ended yet: read again with the next run found ended (a
            # trip at most per result read from the store).
            if row is None or end is None or row.status == RunStatus.CONTINUED:
                continue
            if id in self._started:  # not read meanwhile
                self._started[id] = (row, end)

    def _end_value(self, id: str, row: RunRow, entries: Sequence[tuple[int, bytes]]) -> Any:
        """The result of ended run ``row`` from its journal's last record, or its failure raised."""
        done = decode_journal(id, row.run, entries[-1:])[0]
        if not isinstance(done, Done):
            raise StoreError(f"run '{id}' is marked {row.status} but its journal has no end record")
        return end_value(self.decoder(row.workflow), done)

    def decoder(self, workflow: str) -> WorkflowDef[Any, Any]:
        """How a result of ``workflow`` decodes: its definition's, else to plain values."""
        wf = self.workflows.get(workflow)
        if wf is not None:
            return wf
        # A workflow known by name only: its result decodes to plain values.
        return cast("WorkflowDef[Any, Any]", types.SimpleNamespace(decode_result=_codec.decode))

    async def signal(
        self, id: str, name: str, payload: bytes, dedup: int, by: bytes | None
    ) -> None:
        """Has the run's owner record signal ``name`` (``dedup``: 0 for none)."""
        fields: dict[str, Any] = {"name": name, "payload": payload, "dedup": dedup}
        if by is not None:
            fields["by"] = by
        await self.call("signal", id, fields, dedup=str(dedup) if dedup else None)

    async def query(self, id: str, name: str, arg: bytes) -> Any:
        """The answer of the run's query handler ``name``, as plain values."""
        fields = await self.call("query", id, {"name": name, "arg": arg})
        return _codec.decode(fields["value"])

    async def update(self, id: str, name: str, update_id: str | None, payload: bytes) -> Any:
        """Has the run's owner apply update ``name``; the handler's result, as plain values."""
        fields = await self.call(
            "update", id, {"name": name, "payload": payload, "update_id": update_id}
        )
        return _codec.decode(fields["value"])

    async def cancel(self, id: str, reason: str) -> None:
        """Has the run's owner cancel it."""
        await self.call("cancel", id, {"reason": reason})

    async def resume(self, id: str) -> None:
        """Has the run's owner resume its paused steps."""
        await self.call("resume", id, {})

    async def delete(self, id: str) -> None:
        """Has the run's owner delete the finished run ``id``."""
        await self.call("delete", id, {})

    async def start_now(self, id: str) -> None:
        """Has the run's owner start delayed run ``id`` now."""
        await self.call("start_now", id, {})

    async def complete(self, token: str, data: bytes) -> None:
        """Has the owner of ``token``'s run resolve its ``await_completion`` with ``data``."""
        await self.call("complete", CompletionToken.run_id(token), {"token": token, "value": data})

    async def stream(self, id: str, name: str) -> AsyncIterator[Any]:
        """Stream ``name`` of run ``id`` from its start, polled, until it ends."""
        reader = StreamReader(self.store, id, name)
        polling = Polling()
        while True:
            self.check_open()
            chunks = await reader.read()
            if chunks:
                polling = Polling()
            for c in chunks:
                yield _codec.decode(c)
            if reader.ended:
                return
            await polling.wait()

    async def fork(self, id: str, new_id: str, at: int | str, input: bytes | None) -> None:
        """Has the owner of ``new_id`` fork it from run ``id`` before ``at``."""
        # Addressed to the new run: the worker that will serve it writes it.
        fields: dict[str, Any] = {"from": id, "new_id": new_id, "at": at}
        if input is not None:
            fields["input"] = input
        await self.call("fork", new_id, fields)

    async def get_event(self, id: str, key: EventDef[Any], timeout_s: float | None) -> Any:
        """Run ``id``'s latest value of ``key``, polled until it is set."""
        # The journal is read: polled, as for a result or a stream.
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        polling = Polling()
        while True:
            self.check_open()
            found, value = await read_event(self.store, id, key)
            if found:
                return value
            if deadline is not None and time.monotonic() >= deadline:
                assert timeout_s is not None
                raise timed_out(id, key.name, timeout_s)
            await polling.wait()

    async def describe(self, id: str) -> RunInfo:
        """What run ``id``'s row tells (`fusee.RunInfo`)."""
        self.check_open()
        row = await self.store.get(id)
        if row is None:
            raise no_run(id)
        return row_info(row)
