"""The router: the one place that decides where an operation on a run is served.

A run is served by the engine that holds its shard (every run, on a store
no worker shares). An operation on a run this engine serves is applied here
(`Messages`); on any other, it is posted to the store's inbox (`Remote`),
which the run's engine applies. A run whose shard moved while the operation
was under way (its lease ran out, nothing of it written) is reached there
too, and the caller never hears of the move.

The rule: the local parts never touch `Remote` for these operations; they
ask the router, which asks `owns` once per operation.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from fusee import _codec
from fusee.engine._leases import APPLYING, forwards
from fusee.errors import StaleLease
from fusee.remote import CompletionToken

if TYPE_CHECKING:
    from fusee.engine._leases import Leases
    from fusee.engine._messages import Messages
    from fusee.engine._runs import Runs
    from fusee.remote import Remote

__all__ = ["Router"]

T = TypeVar("T")


class Router:
    """Serves each operation on a run here or reaches the run through the store's inbox.

    Args:
        messages: The local operations (a run this engine serves).
        remote: The store's inbox (a run another worker serves).
        runs: The run table (a refused command names its run's shard).
        leases: The engine's shard leases (None on a store no worker shares).
        owns: Whether this engine serves a run.
        check_open: Raises if the engine is closed.

    Example:
        See `fusee.engine.Engine`, which makes one and routes ``Run`` calls through it.
    """

    def __init__(
        self,
        *,
        messages: Messages,
        remote: Remote,
        runs: Runs,
        leases: Leases | None,
        owns: Callable[[str], bool],
        check_open: Callable[[], None],
    ) -> None:
        self._messages = messages
        self._remote = remote
        self._runs = runs
        # Read by `forwards`: None on a store no worker shares.
        self.leases = leases
        self._owns = owns
        self._check_open = check_open

    async def routed(
        self, id: str, here: Callable[[], Awaitable[T]], there: Callable[[], Awaitable[T]]
    ) -> T:
        """``here()`` if this engine serves run ``id``, else (or once it moved) ``there()``."""
        self._check_open()
        if self._owns(id):
            try:
                return await here()
            except StaleLease:
                # Its shard's lease ran out meanwhile, and nothing of this was
                # written: the store's inbox takes it to whoever holds the
                # shard now (this engine too, under a lease taken again), and
                # the caller never hears of the move.
                if not forwards(self):
                    raise
        elif APPLYING.get():
            raise StaleLease([self._runs.shard_index(id)])
        return await there()

    async def signal(
        self, id: str, name: str, payload: bytes, dedup: int, by: bytes | None
    ) -> None:
        """Records signal ``name`` for run ``id``; returns once it is durable.

        Raises:
            fusee.PayloadError: The payload does not fit the signal's known
                definition (nothing is recorded).
            fusee.RunFinished: The run has ended (or its end is being recorded).
        """
        self._messages.known.check(id, name, payload)
        await self.routed(
            id,
            lambda: self._messages.signal_here(id, name, payload, dedup, by),
            lambda: self._remote.signal(id, name, payload, dedup, by),
        )

    async def query(self, id: str, name: str, arg: bytes) -> Any:
        """Asks run ``id``'s query handler (a finished run is replayed to ask it)."""
        return await self.routed(
            id,
            lambda: self._messages.query_here(id, name, arg),
            lambda: self._remote.query(id, name, arg),
        )

    async def update(self, id: str, name: str, update_id: str | None, payload: bytes) -> Any:
        """Offers update ``name`` to run ``id``; returns the handler's result once durable.

        An update with an ``update_id`` is applied at most once: a repeat
        returns (or raises) what the first did.

        Raises:
            fusee.UpdateRejected: The validator refused it (nothing recorded).
            fusee.UpdateFailed: The handler raised.
            fusee.RunFinished: The run has ended.
        """
        if update_id is None and self.leases is not None:
            # On a shared store a move of the run's shard mid-update offers it
            # again to the new holder: under one id, it is applied once.
            update_id = f"{id}/update/{uuid.uuid4().hex}"
        return await self.routed(
            id,
            lambda: self._messages.update_here(id, name, update_id, payload),
            lambda: self._remote.update(id, name, update_id, payload),
        )

    async def cancel(self, id: str, reason: str) -> None:
        """Cancels run ``id``; returns once the request is durable."""
        await self.routed(
            id,
            lambda: self._messages.cancel_here(id, reason),
            lambda: self._remote.cancel(id, reason),
        )

    async def resume(self, id: str) -> None:
        """Gives run ``id``'s paused steps a fresh retry budget."""
        await self.routed(
            id, lambda: self._messages.resume_here(id), lambda: self._remote.resume(id)
        )

    async def complete(self, token: str, value: Any = None) -> None:
        """Resolves the ``ctx.await_completion`` that handed out ``token``."""
        id = CompletionToken.run_id(token)
        data = _codec.encode(value, name="the completion's value")
        await self.routed(
            id,
            lambda: self._messages.complete_here(token, value),
            lambda: self._remote.complete(token, data),
        )
