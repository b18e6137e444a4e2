"""Calls made at once that go to the server as one statement: a group commit for one kind of call.

A Postgres store's clients post commands and read answers many at once (a
`fusee.Client` starting 200 runs); a worker answers the commands it applied
many at once. Each such call alone is a round trip and, for a write, a
commit of its own. `Batched` gathers the calls made while its last trip is
out (and those of the current loop iteration) into the next trip: one
statement, one commit, whatever their number.

The rule: each call gets its own outcome. A trip that fails for all (the
server went away) fails each call with that error; a trip that fails for
several calls is made again call by call, so a call that cannot succeed (a
bad value) fails alone and the others succeed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["Batched"]

_I = TypeVar("_I")
_O = TypeVar("_O")


class Batched(Generic[_I, _O]):
    """Gathers calls into trips of ``trip``: one trip out at a time, the calls made meanwhile next.

    Args:
        trip: Makes one trip for its items; returns one outcome per item,
            in order. Its error fails the trip.
        limit: At most this many items a trip.

    Example:
        >>> async def double(items: Sequence[int]) -> list[int]:
        ...     return [2 * i for i in items]
        >>> async def main() -> list[int]:
        ...     batched = Batched(double)
        ...     return list(await asyncio.gather(batched(1), batched(2)))
        >>> asyncio.run(main())
        [2, 4]
    """

    def __init__(
        self, trip: Callable[[Sequence[_I]], Awaitable[Sequence[_O]]], limit: int = 500
    ) -> None:
        self._trip = trip
        self._limit = limit
        self._waiting: list[tuple[_I, asyncio.Future[_O]]] = []
        self._out: asyncio.Task[None] | None = None

    async def __call__(self, item: _I) -> _O:
        """The outcome of ``item``, from the trip that carries it."""
        future: asyncio.Future[_O] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._out is None:
            self._out = asyncio.get_running_loop().create_task(self._send())
        # Shielded: a caller that gives up does not cut a trip short (the
        # statement ends on its own, as every store query does).
        return await asyncio.shield(future)

    async def _send(self) -> None:
        try:
            # The calls of this loop iteration go together.
            await asyncio.sleep(0)
            while self._waiting:
                batch, self._waiting = self._waiting[: self._limit], self._waiting[self._limit :]
                await self._carry(batch)
        except asyncio.CancelledError:
            # The loop stops: the calls still waiting would wait forever.
            waiting, self._waiting = self._waiting, []
            for _, future in waiting:
                future.cancel()
            raise
        finally:
            self._out = None
            if self._waiting:  # asked while this task was ending
                self._out = asyncio.get_running_loop().create_task(self._send())

    async def _carry(self, batch: list[tuple[_I, asyncio.Future[_O]]]) -> None:
        try:
            outcomes = await self._trip([item for item, _ in batch])
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as e:
            if len(batch) == 1:
                _settle(batch[0][1], error=e)
                return
            # Call by call: the one that fails it fails alone.
            await asyncio.gather(*(self._carry([one]) for one in batch))
            return
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            _settle(future, outcome)


def _settle(
    future: asyncio.Future[_O], outcome: _O | None = None, error: Exception | None = None
) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(outcome)  # type: ignore[arg-type]
