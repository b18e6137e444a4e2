"""Runs served elsewhere: commands posted to the store's inbox, answered by the run's owner.

`Remote` is the run-handle side of a process that does not host a run:
`fusee.Client` is one (it hosts none), and an engine on a store shared by
several workers (Postgres) uses one for runs of shards it does not hold.
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
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any, Final, cast

from fusee import _codec
from fusee._status import FINISHED_STATUSES, RunStatus
from fusee.engine._events import read_event, timed_out
from fusee.engine._inbox import decode_error, decode_payload, encode_payload
from fusee.engine._journal import decode_journal, end_value, no_run
from fusee.engine._run import RunInfo, info_of
from fusee.engine._streams import read_stream
from fusee.errors import FuseeError, StoreError
from fusee.record import Done
from fusee.store import Answer, Command, Store

if TYPE_CHECKING:
    from fusee._definitions import WorkflowDef
    from fusee._events import EventDef

__all__ = ["Polling", "Remote", "answer_fields"]

# How often a remote looks for an answer or a run's end: soon at first (a
# live worker answers within milliseconds), then less often.
_FIRST_POLL_S: Final = 0.002
_MAX_POLL_S: Final = 0.1


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


def answer_fields(answer: Answer) -> dict[str, Any]:
    """An answer's fields; raises the error of a command that failed, with its type.

    Example:
        >>> answer_fields(Answer(True, encode_payload({"message": "ok"}), 0))
        {'message': 'ok'}
    """
    fields = decode_payload(answer.payload)
    if not answer.ok:
        raise decode_error(bytes(fields.get("error") or b""))
    return fields


class Remote:
    """Talks to runs through the store's inbox (`fusee.Client` is one).

    Args:
        store: An open store.

    Example:
        >>> async def main(store: Store) -> None:
        ...     await Remote(store)._cancel("order-1", "late")
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._closed = False
        # Workflows named by definition: their results decode to their types.
        self._workflows: dict[str, WorkflowDef[Any, Any]] = {}

    def _check_open(self) -> None:
        if self._closed:
            raise FuseeError("this client is closed; connect a new one with fusee.Client.connect")

    async def _post(
        self,
        kind: str,
        run_id: str,
        fields: Mapping[str, Any],
        *,
        dedup: str | None = None,
        command_id: str | None = None,
    ) -> Command:
        self._check_open()
        command = Command.new(kind, run_id, encode_payload(fields), dedup=dedup)
        if command_id is not None:
            # Posted again under the same id (a delivery retried), it is stored once.
            command = Command(command_id, kind, run_id, command.payload, dedup, command.created_ms)
        await self.store.post_command(command)
        return command

    async def _wait_answer(self, id: str, timeout_s: float | None = None) -> Answer | None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        polling = Polling()
        while True:
            self._check_open()
            answer = await self.store.get_answer(id)
            if answer is not None:
                return answer
            if deadline is not None and loop.time() >= deadline:
                return None
            await polling.wait()

    async def _call(
        self,
        kind: str,
        run_id: str,
        fields: Mapping[str, Any],
        *,
        dedup: str | None = None,
        command_id: str | None = None,
    ) -> dict[str, Any]:
        command = await self._post(kind, run_id, fields, dedup=dedup, command_id=command_id)
        answer = await self._wait_answer(command.id)
        assert answer is not None
        return answer_fields(answer)

    # --- run handle operations (`Run` calls these) --------------------------------------

    async def _result(self, id: str) -> Any:
        polling = Polling()
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
        fields: dict[str, Any] = {"name": name, "payload": payload, "dedup": dedup}
        if by is not None:
            fields["by"] = by
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

    async def _start_now(self, id: str) -> None:
        await self._call("start_now", id, {})

    async def _complete(self, token: str, data: bytes) -> None:
        run_id = token.rsplit("/", 3)[0] if isinstance(token, str) else ""
        await self._call("complete", run_id, {"token": token, "value": data})

    async def _stream(self, id: str, name: str) -> AsyncIterator[Any]:
        sent = 0
        polling = Polling()
        while True:
            self._check_open()
            chunks, ended = await read_stream(self.store, id, name)
            if len(chunks) > sent:
                polling = Polling()
            for c in chunks[sent:]:
                yield _codec.decode(c)
            sent = len(chunks)
            if ended:
                return
            await polling.wait()

    async def _fork(self, id: str, new_id: str, at: int | str, input: bytes | None) -> None:
        # Addressed to the new run: the worker that will serve it writes it.
        fields: dict[str, Any] = {"from": id, "new_id": new_id, "at": at}
        if input is not None:
            fields["input"] = input
        await self._call("fork", new_id, fields)

    async def _get_event(self, id: str, key: EventDef[Any], timeout_s: float | None) -> Any:
        # The journal is read: polled, as for a result or a stream.
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        polling = Polling()
        while True:
            self._check_open()
            found, value = await read_event(self.store, id, key)
            if found:
                return value
            if deadline is not None and time.monotonic() >= deadline:
                assert timeout_s is not None
                raise timed_out(id, key.name, timeout_s)
            await polling.wait()

    async def _describe(self, id: str) -> RunInfo:
        row = await self.store.get(id)
        if row is None:
            raise no_run(id)
        return info_of(row, None, None)
