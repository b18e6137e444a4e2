"""Events: a run's latest value per key, set by its code, read from outside.

Values are journal records (`Event`); a reader reads the run's journal and,
while the key is unset, waits for the next durable event or the run's end.

The rule: a reader registers before it reads, and reads only what is
durable, so a value that becomes durable while it reads still wakes it,
and a value is never seen that a crash could take back. It is woken by a
durable event or end of a run this engine serves, by its timeout (on the
engine's clock), and, for a run another worker serves, by a poll.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from fusee.remote._readers import read_event, timed_out

if TYPE_CHECKING:
    from fusee._events import EventDef
    from fusee.engine._clock import Clock
    from fusee.engine._commit import Committer
    from fusee.store import Store

__all__ = ["Events"]

# How often a waiting reader reads the journal again without being woken.
_POLL_S: Final = 1.0


class Events:
    """The readers of every run's events, for one engine.

    Example:
        See `fusee.Run.get_event`.
    """

    def __init__(
        self,
        store: Store,
        committer: Committer,
        clock: Clock,
        loop: asyncio.AbstractEventLoop,
        check_open: Callable[[], None],
    ) -> None:
        self._store = store
        self._committer = committer
        self._clock = clock
        self._loop = loop
        self._check_open = check_open
        # Readers waiting for a run's event, woken when one is durable.
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        # How a reader waits: the test host's hook skips idle virtual time.
        self.wait: Callable[[asyncio.Future[None]], Any] | None = None

    async def get(self, id: str, key: EventDef[Any], timeout_s: float | None) -> Any:
        """Run ``id``'s latest value of ``key``, waiting until it is set.

        Raises:
            TimeoutError: ``timeout_s`` passed first, or the run ended without it.
            fusee.NotFound: No run has this id.
        """
        deadline_ms = None if timeout_s is None else self._clock.now_ms() + round(timeout_s * 1000)
        while True:
            self._check_open()
            fut: asyncio.Future[None] = self._loop.create_future()
            waiters = self._waiters.setdefault(id, [])
            waiters.append(fut)
            handle = None
            try:
                await self._committer.readable()
                found, value = await read_event(self._store, id, key)
                if found:
                    return value
                if deadline_ms is not None:
                    if self._clock.now_ms() >= deadline_ms:
                        assert timeout_s is not None
                        raise timed_out(id, key.name, timeout_s)
                    handle = self._clock.call_at(deadline_ms, functools.partial(_settle, fut))
                if self.wait is not None:
                    await self.wait(fut)
                else:
                    # Woken by this engine's own durable events; the poll is
                    # for a run another worker serves (one store, many engines).
                    await asyncio.wait((fut,), timeout=_POLL_S)
            finally:
                if handle is not None:
                    handle.cancel()
                if fut in waiters:
                    waiters.remove(fut)
                if not waiters:
                    self._waiters.pop(id, None)

    def notify(self, id: str) -> None:
        """Wakes the readers of run ``id`` (an event or its end became durable)."""
        for fut in self._waiters.get(id, ()):
            _settle(fut)

    def release_all(self) -> None:
        """Wakes every reader (the engine closes: each hears it)."""
        for id in list(self._waiters):
            self.notify(id)


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
