"""What the page does to runs, through a `fusee.Client` (``fusee ui``'s actions).

The rule: the page never writes the store itself; every action is a command
the serving worker applies (on SQLite its one writer), as the CLI's are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from fusee._definitions import signal as signal_def
from fusee.client import Client
from fusee.engine import BulkResult
from fusee.remote import answer_fields

if TYPE_CHECKING:
    from fusee.codecs import PayloadCodec

__all__ = ["ClientActions"]


class ClientActions:
    """`fusee.ui.Actions` over a `fusee.Client` connected to ``target`` on first use.

    The signal's payload is checked against the signal's declared type by the
    engine that applies it (it knows its workflows' modules), before anything
    is recorded: one that does not fit raises `fusee.PayloadError` (the API's
    422).

    Example:
        >>> ClientActions("./data")  # doctest: +ELLIPSIS
        <fusee.ui._actions.ClientActions object at ...>
    """

    def __init__(self, target: str, *, codecs: Iterable[PayloadCodec] = ()) -> None:
        self._target = target
        self._codecs = list(codecs)
        self._client: Client | None = None
        self._lock: asyncio.Lock | None = None

    async def _connected(self) -> Client:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._client is None:
                self._client = await Client.connect(self._target, codecs=self._codecs)
            return self._client

    async def signal(self, id: str, name: str, payload: Any) -> None:
        client = await self._connected()
        await client.get(id).signal(signal_def(name, Any), payload)

    async def cancel(self, id: str, reason: str) -> None:
        client = await self._connected()
        await client.get(id).cancel(reason)

    async def resume(self, id: str) -> None:
        client = await self._connected()
        await client.get(id).resume()

    async def fork(self, id: str, new_id: str, at: int | str, input: Any) -> None:
        client = await self._connected()
        await client.get(id).fork(new_id, at=at, input=input)

    async def schedule(
        self, name: str, action: str, fields: Mapping[str, Any] | None = None
    ) -> str | None:
        client = await self._connected()
        if action == "create":
            args = dict(fields or {})
            workflow = args.pop("workflow", None)
            if not isinstance(workflow, str) or not workflow:
                raise ValueError('a schedule needs its workflow: {"workflow": ..., "every": ...}')
            # Empty fields of a form are arguments not given.
            args = {k: v for k, v in args.items() if v is not None and v != ""}
            try:
                await client.schedules.create(name, workflow, **args)
            except TypeError as e:
                raise ValueError(str(e)) from None
        elif action == "update":
            # Empty fields of a form are arguments not given: kept as they are.
            args = {k: v for k, v in (fields or {}).items() if v is not None and v != ""}
            if not args:
                raise ValueError(
                    "an update needs what to change: cron, every, tz, input, overlap, "
                    "catch_up or queue"
                )
            try:
                await client.schedules.update(name, **args)
            except TypeError as e:
                raise ValueError(str(e)) from None
        elif action == "delete":
            await client.schedules.delete(name)
        elif action == "pause":
            await client.schedules.pause(name)
        elif action == "resume":
            await client.schedules.resume(name)
        elif action == "trigger":
            return (await client.schedules.trigger(name)).id
        else:
            raise ValueError(
                f"a schedule takes create, update, delete, pause, resume or trigger, not {action!r}"
            )
        return None

    async def bulk(
        self, verb: str, filters: Mapping[str, Any], *, reason: str, dry_run: bool
    ) -> BulkResult:
        client = await self._connected()
        if verb == "cancel":
            return await client.cancel_many(**filters, reason=reason, dry_run=dry_run)
        if verb == "resume":
            return await client.resume_many(**filters, dry_run=dry_run)
        raise ValueError(f"a bulk action is cancel or resume, not {verb!r}")

    async def serving_version(self, timeout_s: float = 2.0) -> str | None:
        """The version of the engine serving the store, asked through its inbox (None: no answer).

        The command left unanswered (no engine serves the store) is answered by
        the next engine that does, and forgotten.
        """
        client = await self._connected()
        command = await client.post("version", "-", {})
        answer = await client.wait_answer(command.id, timeout_s=timeout_s)
        if answer is None:
            return None
        return str(answer_fields(answer)["version"])

    async def close(self) -> None:
        """Closes the client (the server stops)."""
        if self._client is not None:
            await self._client.close()
            self._client = None
