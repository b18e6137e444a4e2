"""Streams: chunks a workflow or a step appends, read live from outside.

Chunks are journal records (`Chunk`, `StreamEnd`); a reader reads the
journal and waits for the next durable chunk.

The rule: a reader is woken only by a durable chunk or end, and registers
before it reads, so a chunk that becomes durable while it reads still
wakes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fusee import _codec
from fusee.remote._readers import StreamReader

if TYPE_CHECKING:
    from fusee.engine._commit import Committer
    from fusee.engine._state import RunState
    from fusee.store import Store

__all__ = ["StepStream", "Streams"]


class Streams:
    """The readers of every run's streams, for one engine.

    Example:
        See `fusee.Run.stream`.
    """

    def __init__(self, store: Store, committer: Committer, check_open: Callable[[], None]) -> None:
        self._store = store
        self._committer = committer
        self._check_open = check_open
        # Readers of a run's streams, woken when a chunk or end is durable.
        self._events: dict[str, list[asyncio.Event]] = {}

    async def read(self, id: str, name: str) -> AsyncIterator[Any]:
        """Stream ``name`` of run ``id`` from its start, live, until it ends."""
        reader = StreamReader(self._store, id, name)
        while True:
            # A reader waiting when the engine closes (or crashes, in the
            # test host) is woken by `release_all` and ends here with a
            # clear error.
            self._check_open()
            event = asyncio.Event()
            self._events.setdefault(id, []).append(event)
            try:
                await self._committer.readable()
                for c in await reader.read():
                    yield _codec.decode(c)
                if reader.ended:
                    return
                await event.wait()
            finally:
                events = self._events.get(id, [])
                if event in events:
                    events.remove(event)

    def notify(self, id: str) -> None:
        """Wakes the readers of run ``id`` (a chunk or its end became durable)."""
        for event in self._events.get(id, ()):
            event.set()

    def release_all(self) -> None:
        """Wakes every reader (the engine closes)."""
        for id in self._events:
            self.notify(id)


class StepStream:
    """A stream a step writes (``s.stream(name)``); it ends with the step's result."""

    def __init__(self, state: RunState, seq: int, name: str) -> None:
        self._state = state
        self._seq = seq
        self._name = name
        self._skip = 0

    async def __aenter__(self) -> StepStream:
        opened = self._state.driver.machine.stream_open(self._name, self._seq)
        # A step that runs again continues after what its earlier attempts recorded.
        self._skip = opened.recorded
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None:
            # Left open: the retry continues after the recorded chunks, and
            # the step's final result ends the stream (the machine ignores
            # appends to a closed stream).
            return
        driver = self._state.driver
        if driver.machine.stream_of_workflow(self._name):
            # The step appended to its workflow's stream: the workflow code
            # completes it, after its other steps appended.
            return
        driver.append(driver.machine.stream_close(self._name, self._seq))

    async def append(self, value: Any) -> None:
        """Appends ``value`` (a chunk an earlier attempt recorded is skipped)."""
        if self._skip > 0:
            self._skip -= 1
            return
        data = _codec.encode(value, name=f"a chunk of stream '{self._name}'")
        driver = self._state.driver
        driver.append(driver.machine.stream_append(self._name, self._seq, data))
