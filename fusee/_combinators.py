"""`wait`, `as_completed` and `select`: asyncio's helpers with list order instead of set order.

Exported by `fusee`. The rule: what they return follows the order of the
awaitables given, never the order of a set or of the clock, so a workflow
that uses them takes the same path on replay; what finishes in the same
turn of a `WorkflowLoop` counts as simultaneous.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from fusee._loop import RunEvicted, WorkflowLoop

__all__ = [
    "ALL_COMPLETED",
    "FIRST_COMPLETED",
    "FIRST_EXCEPTION",
    "AsCompleted",
    "as_completed",
    "select",
    "wait",
]

_T = TypeVar("_T")
_FT = TypeVar("_FT", bound="asyncio.Future[Any]")

FIRST_COMPLETED = asyncio.FIRST_COMPLETED
FIRST_EXCEPTION = asyncio.FIRST_EXCEPTION
ALL_COMPLETED = asyncio.ALL_COMPLETED


async def wait(
    aws: Iterable[_FT],
    *,
    return_when: str = ALL_COMPLETED,
    timeout: float | None = None,
) -> tuple[list[_FT], list[_FT]]:
    """Wait for tasks or futures, like ``asyncio.wait``, but return lists in input order.

    ``asyncio.wait`` returns sets, whose iteration order differs between runs;
    replay needs the same order every time.

    Args:
        aws: Tasks or futures (not coroutines: wrap them with
            ``asyncio.create_task``, as ``asyncio.wait`` requires). Repeats
            count once.
        return_when: ``FIRST_COMPLETED``, ``FIRST_EXCEPTION`` or
            ``ALL_COMPLETED`` (default).
        timeout: Seconds to wait at most (a durable timer), or None. When it
            passes, the call returns what is done then; nothing is cancelled.

    Returns:
        ``(done, pending)``, each in the order of ``aws``. When the condition
        already holds, it returns at once without yielding.

    Raises:
        ValueError: ``aws`` is empty, or ``return_when`` is unknown.
        TypeError: ``aws`` holds something that is not a task or future.

    Example:
        >>> async def main() -> tuple[list[str], int]:
        ...     loop = asyncio.get_running_loop()
        ...     a, b, c = loop.create_future(), loop.create_future(), loop.create_future()
        ...     c.set_result("c")
        ...     a.set_result("a")
        ...     done, pending = await wait([a, b, c], return_when=FIRST_COMPLETED)
        ...     b.cancel()
        ...     return [f.result() for f in done], len(pending)
        >>> asyncio.run(main())
        (['a', 'c'], 1)
    """
    futures = list(dict.fromkeys(aws))
    if not futures:
        raise ValueError("wait() needs at least one task or future")
    for fut in futures:
        if not asyncio.isfuture(fut):
            raise TypeError(
                f"wait() takes tasks and futures, not {fut!r}; "
                "wrap a coroutine with asyncio.create_task() first"
            )
    if return_when not in (FIRST_COMPLETED, FIRST_EXCEPTION, ALL_COMPLETED):
        raise ValueError(f"Invalid return_when value: {return_when}")
    if not _wait_is_over(futures, return_when):
        await _wait_until_over(futures, return_when, timeout)
    done = [fut for fut in futures if fut.done()]
    pending = [fut for fut in futures if not fut.done()]
    return done, pending


def _fails(fut: asyncio.Future[Any]) -> bool:
    return fut.done() and not fut.cancelled() and fut.exception() is not None


def _wait_is_over(futures: list[_FT], return_when: str) -> bool:
    if return_when == FIRST_COMPLETED:
        return any(fut.done() for fut in futures)
    if return_when == FIRST_EXCEPTION and any(_fails(fut) for fut in futures):
        return True
    return all(fut.done() for fut in futures)


async def _wait_until_over(futures: list[_FT], return_when: str, timeout: float | None) -> None:
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    pending = [fut for fut in futures if not fut.done()]
    left = len(pending)

    def on_done(fut: asyncio.Future[Any]) -> None:
        nonlocal left
        left -= 1
        over = left <= 0 or return_when == FIRST_COMPLETED
        if (over or (return_when == FIRST_EXCEPTION and _fails(fut))) and not waiter.done():
            waiter.set_result(None)

    timer = loop.call_later(timeout, _release, waiter) if timeout is not None else None
    for fut in pending:
        fut.add_done_callback(on_done)
    try:
        await waiter
    finally:
        if timer is not None:
            timer.cancel()
        for fut in pending:
            fut.remove_done_callback(on_done)


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class AsCompleted(Generic[_T]):
    """What `as_completed` returns: iterate it with ``async for`` or ``for``.

    ``async for fut in as_completed(aws)`` yields each task or future (done)
    as it completes; ``for next_done in as_completed(aws)`` yields awaitables
    that return (or raise) the next result, as ``asyncio.as_completed`` does.
    It can be iterated once.

    Order: completion order, where all that complete in one turn of a
    `WorkflowLoop` (one journal delivery) count as simultaneous and come in
    the order of ``aws``. On another loop it is plain completion order.

    Example:
        >>> async def main() -> list[str]:
        ...     loop = asyncio.get_running_loop()
        ...     a, b = loop.create_future(), loop.create_future()
        ...     loop.call_soon(b.set_result, "b")
        ...     loop.call_soon(a.set_result, "a")
        ...     return [fut.result() async for fut in as_completed([a, b])]
        >>> asyncio.run(main())
        ['b', 'a']
    """

    def __init__(self, aws: Iterable[Awaitable[_T]], *, timeout: float | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._futures: list[asyncio.Future[_T]] = [
            asyncio.ensure_future(aw, loop=self._loop) for aw in dict.fromkeys(aws)
        ]
        self._left = list(self._futures)  # not handed out yet, in input order
        self._completed_at: dict[asyncio.Future[_T], int] = {}
        self._completions = 0
        self._timeout = timeout
        self._timer: asyncio.TimerHandle | None = None
        self._timed_out = False
        self._waiter: asyncio.Future[None] | None = None
        self._started = False

    def __aiter__(self) -> AsyncIterator[asyncio.Future[_T]]:
        self._start()
        return self._iterate()

    def __iter__(self) -> Iterator[Awaitable[_T]]:
        self._start()
        return self._awaitables()

    def _start(self) -> None:
        if self._started:
            raise RuntimeError("as_completed() can be iterated once")
        self._started = True
        for fut in self._futures:
            if fut.done():
                self._completed_at[fut] = self._now()
            else:
                fut.add_done_callback(self._on_done)
        if self._timeout is not None and len(self._completed_at) < len(self._futures):
            self._timer = self._loop.call_later(self._timeout, self._on_timeout)

    def _now(self) -> int:
        if isinstance(self._loop, WorkflowLoop):
            return self._loop._turn
        self._completions += 1
        return self._completions

    def _stop(self) -> None:
        # Also reached when the caller breaks out early (an async generator
        # abandoned in a workflow is closed by its loop): the durable timer
        # must not outlive the iteration.
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for fut in self._futures:
            fut.remove_done_callback(self._on_done)

    async def _iterate(self) -> AsyncIterator[asyncio.Future[_T]]:
        try:
            while self._left:
                yield await self._next_done()
        finally:
            self._stop()

    def _awaitables(self) -> Iterator[Awaitable[_T]]:
        try:
            for _ in range(len(self._left)):
                yield self._next_result()
        finally:
            self._stop()

    async def _next_result(self) -> _T:
        return (await self._next_done()).result()

    async def _next_done(self) -> asyncio.Future[_T]:
        while True:
            first: int | None = None
            first_at = 0
            for index, fut in enumerate(self._left):
                at = self._completed_at.get(fut)
                if at is not None and (first is None or at < first_at):
                    first, first_at = index, at
            if first is not None:
                return self._left.pop(first)
            if self._timed_out:
                raise TimeoutError(
                    f"as_completed() timed out after {self._timeout}s "
                    f"with {len(self._left)} not done"
                )
            waiter: asyncio.Future[None] = self._loop.create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                self._waiter = None

    def _on_done(self, fut: asyncio.Future[_T]) -> None:
        self._completed_at[fut] = self._now()
        self._wake()

    def _on_timeout(self) -> None:
        self._timer = None
        self._timed_out = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def as_completed(aws: Iterable[Awaitable[_T]], *, timeout: float | None = None) -> AsCompleted[_T]:
    """Iterate over awaitables as they complete, like ``asyncio.as_completed``, replayably.

    Coroutines are wrapped in tasks at the call. Those that complete in the
    same turn of a `WorkflowLoop` come in the order of ``aws``.

    Args:
        aws: Tasks, futures or coroutines; repeats count once.
        timeout: Seconds (a durable timer started when iteration starts), or
            None. Once it passes, asking for one that is not done raises
            ``TimeoutError``; nothing is cancelled.

    Returns:
        An `AsCompleted`: ``async for`` yields the done tasks/futures;
        ``for`` yields awaitables of the results (as ``asyncio.as_completed``).

    Example:
        >>> async def main() -> list[int]:
        ...     async def after(n: int) -> int:
        ...         for _ in range(n):
        ...             await asyncio.sleep(0)
        ...         return n
        ...     return [await next_done for next_done in as_completed([after(3), after(1)])]
        >>> asyncio.run(main())
        [1, 3]
    """
    return AsCompleted(aws, timeout=timeout)


async def select(*aws: Awaitable[_T]) -> tuple[int, _T]:
    """Race awaitables; return the winner's index and result, cancel the others.

    The losers are cancelled and awaited, so none is left pending (a loser
    that refuses cancellation keeps ``select`` waiting). When several are done
    by the time ``select`` resumes, the first in argument order wins. If the
    winner raised, ``select`` raises that. If ``select`` itself is cancelled,
    all of them are cancelled and awaited first.

    Args:
        *aws: Tasks, futures or coroutines (wrapped in tasks).

    Returns:
        ``(index, result)`` of the winner.

    Raises:
        ValueError: No awaitable was given.

    Example:
        >>> async def main() -> tuple[int, str]:
        ...     loop = asyncio.get_running_loop()
        ...     never, soon = loop.create_future(), loop.create_future()
        ...     loop.call_soon(soon.set_result, "soon")
        ...     return await select(never, soon)
        >>> asyncio.run(main())
        (1, 'soon')
    """
    if not aws:
        raise ValueError("select() needs at least one awaitable")
    loop = asyncio.get_running_loop()
    futures = [asyncio.ensure_future(aw, loop=loop) for aw in aws]
    try:
        await wait(futures, return_when=FIRST_COMPLETED)
    except RunEvicted:
        # The shutdown ends every task itself; cancelling them here would run
        # their cancellation handlers.
        raise
    except BaseException:
        await _cancel_and_wait(futures)
        raise
    index = next(i for i, fut in enumerate(futures) if fut.done())
    winner = futures[index]
    await _cancel_and_wait([fut for fut in futures if fut is not winner])
    return index, winner.result()


async def _cancel_and_wait(futures: Sequence[asyncio.Future[_T]]) -> None:
    losers = list(dict.fromkeys(futures))
    pending = [fut for fut in losers if not fut.done()]
    for fut in pending:
        fut.cancel()
    if pending:
        await wait(pending)
    for fut in losers:
        if not fut.cancelled():
            fut.exception()  # retrieved: a loser's failure is not an error
