"""`FaultyStore`: a `Store` around a real one that fails, holds and tears appends on command.

It wraps a `MemoryStore` (the same object across crashes: it is the "disk")
or an SQLite directory (a new `SqliteStore` on each open, as a restarted
process would make). The simulator arms one fault at a time:

- `fail_appends`: the next append raises `StoreError` and stores nothing, and
  so does every append after it until the store is reopened (a store keeps
  no hole behind a failed write).
- `hold`: appends wait, in call order, until `release` (a delayed flush); a
  crash meanwhile loses them (the unflushed tail).
- ``late_reads`` (given at construction, a random of its own): the answer of
  each read of a run's row (`get`) reaches its caller a seed-chosen number of
  loop turns late, as one from a starved reader thread does (SQLite's): a
  crash meanwhile hands it to the dead engine, which must not acknowledge
  anything on its strength.
- `tear_next`: the next append stores only a prefix of its entries and no
  rows, then raises `StoreError`. The engine's contract says an append is all
  or nothing, so this models a store bug (or a disk that lies); the simulator
  crashes at once, as the power cut that tore the write would. The prefix is
  what a smaller batch would have stored, so nothing acknowledged depends on
  the torn part and every checker still applies: the engine must survive it.

The rule: the wrapper keeps a shadow of what it handed on (`journals`,
`durable_steps`) only once the real store said it stored it, so the
checkers built on it can miss a record but never invent one.
"""

from __future__ import annotations

import asyncio
import builtins
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from fusee._status import RunStatus
from fusee.errors import StoreError
from fusee.record import Step, decode
from fusee.store import Answer, Command, Entry, RunRow, ScheduleRow, Store
from fusee.store._queues import Admission, QueueItem, QueueLimits

__all__ = ["FaultyStore"]


class FaultyStore:
    """A `fusee.store.Store` that delegates to a real store and injects faults."""

    def __init__(self, make: Callable[[], Store], late_reads: random.Random | None = None) -> None:
        self._make = make
        self._late = late_reads
        self.inner = make()
        self._closed = False
        self._order: asyncio.Lock | None = None
        self._flowing: asyncio.Event | None = None
        self._failing: StoreError | None = None
        self._tear: float | None = None
        # Every (id, run) an append was handed, stored or not: the checkers
        # load each from the real store.
        self.journals: set[tuple[str, int]] = set()
        # (id, run, seq) of each step result stored, as far as this wrapper knows.
        self.durable_steps: set[tuple[str, int, int]] = set()
        self.faults: dict[str, int] = {}
        # Told what each append stored or refused (the simulator's event log).
        self.note: Callable[[str], None] | None = None

    def _count(self, fault: str) -> None:
        self.faults[fault] = self.faults.get(fault, 0) + 1

    # --- arming faults ----------------------------------------------------------------------

    def fail_appends(self) -> None:
        """Every append from now on raises `StoreError` until the store is reopened."""
        self._failing = StoreError("simulated write failure (the disk refused the append)")
        self._count("fail_append")

    def hold(self) -> None:
        """Appends wait (in call order) until `release`."""
        self._events()[1].clear()
        self._count("hold")

    def release(self) -> None:
        """Lets held appends go on, in the order they were called."""
        self._events()[1].set()

    @property
    def holding(self) -> bool:
        """Whether appends are held now."""
        return not self._events()[1].is_set()

    def tear_next(self, keep: float) -> None:
        """The next append stores the first ``keep`` fraction (rounded down) of its entries."""
        self._tear = keep

    def _events(self) -> tuple[asyncio.Lock, asyncio.Event]:
        if self._order is None or self._flowing is None:
            self._order = asyncio.Lock()
            self._flowing = asyncio.Event()
            self._flowing.set()
        return self._order, self._flowing

    # --- the Store protocol -----------------------------------------------------------------

    async def open(self) -> None:
        if self._closed:
            self.inner = self._make()
            self._closed = False
        # A reopened store is a restarted process: no fault carries over.
        self._failing = None
        self._tear = None
        self._order = None
        self._flowing = None
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()
        self._closed = True

    @property
    def last_lsn(self) -> int:
        return self.inner.last_lsn

    @property
    def reading(self) -> bool:
        # `TestEngine.settle` waits for the real store's reads (SQLite's thread).
        return bool(getattr(self.inner, "reading", False))

    async def append(
        self,
        entries: Sequence[Entry],
        runs: Sequence[RunRow] = (),
        *,
        items: Sequence[QueueItem] = (),
        forget: Sequence[int] = (),
    ) -> None:
        order, flowing = self._events()
        async with order:
            if not flowing.is_set():
                self._count("held_append")
                await flowing.wait()
            for e in entries:
                self.journals.add((e.id, e.run))
            if self._failing is not None:
                self._tell("refused", entries, runs)
                raise self._failing
            if self._tear is not None and entries:
                keep = int(len(entries) * self._tear)
                self._tear = None
                self._failing = StoreError("simulated torn write")
                self._count("torn_append")
                if keep:
                    await self.inner.append(entries[:keep], ())
                    self._stored(entries[:keep])
                self._tell(f"tore after {keep}", entries, runs)
                raise self._failing
            await self.inner.append(entries, runs, items=items, forget=forget)
            self._stored(entries)
            self._tell("stored", entries, runs, items)

    def _tell(
        self,
        what: str,
        entries: Sequence[Entry],
        runs: Sequence[RunRow],
        items: Sequence[QueueItem] = (),
    ) -> None:
        if self.note is None:
            return
        records = " ".join(f"{e.lsn}:{e.id}/{type(decode(e.data)).__name__}" for e in entries)
        rows = " ".join(f"{r.id}={RunStatus(r.status).name}" for r in runs)
        queued = " ".join(f"{i.id}={i.state}" for i in items)
        self.note(f"append {what}: records [{records}] rows [{rows}] items [{queued}]")

    def _stored(self, entries: Sequence[Entry]) -> None:
        for e in entries:
            rec = decode(e.data)
            if isinstance(rec, Step):
                self.durable_steps.add((e.id, e.run, rec.seq))

    async def load(
        self, id: str, run: int | None = None, *, after_lsn: int = 0
    ) -> builtins.list[tuple[int, bytes]]:
        return await self.inner.load(id, run, after_lsn=after_lsn)

    async def get(self, id: str) -> RunRow | None:
        row = await self.inner.get(id)
        if self._late is not None:
            for _ in range(self._late.randint(0, 6)):
                await asyncio.sleep(0)
        return row

    async def list(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        limit: int | None = None,
        newest_first: bool = False,
        after: tuple[int, str] | None = None,
        started_from_ms: int | None = None,
        started_to_ms: int | None = None,
    ) -> builtins.list[RunRow]:
        return await self.inner.list(
            status=status,
            workflow=workflow,
            attributes=attributes,
            limit=limit,
            newest_first=newest_first,
            after=after,
            started_from_ms=started_from_ms,
            started_to_ms=started_to_ms,
        )

    async def unfinished(self) -> builtins.list[RunRow]:
        return await self.inner.unfinished()

    async def next_run(self) -> int:
        return await self.inner.next_run()

    # The commands inbox passes through: the simulator's callers use the
    # engine directly, so no fault is injected there.
    async def post_command(self, command: Command) -> str:
        return await self.inner.post_command(command)

    async def take_commands(self, limit: int = 100) -> builtins.list[Command]:
        return await self.inner.take_commands(limit)

    async def wait_commands(self, timeout_s: float) -> None:
        await self.inner.wait_commands(timeout_s)

    async def answer_command(self, id: str, ok: bool, payload: bytes) -> None:
        await self.inner.answer_command(id, ok, payload)

    async def get_answer(self, id: str) -> Answer | None:
        return await self.inner.get_answer(id)

    async def forget_commands(self, answered_before_ms: int) -> int:
        return await self.inner.forget_commands(answered_before_ms)

    async def delete_runs(
        self,
        ids: Collection[str] | None = None,
        *,
        finished_before_ms: int | None = None,
        limit: int = 100,
    ) -> builtins.list[str]:
        return await self.inner.delete_runs(ids, finished_before_ms=finished_before_ms, limit=limit)

    # Queue admission is passed through untouched: the simulation starts no queued run.
    async def enqueue(self, item: QueueItem, row: RunRow) -> QueueItem | None:
        return await self.inner.enqueue(item, row)

    async def debounce_queued(self, id: str, input: bytes, not_before_ms: int) -> bool:
        return await self.inner.debounce_queued(id, input, not_before_ms)

    async def start_queued(self, id: str, now_ms: int) -> str | None:
        return await self.inner.start_queued(id, now_ms)

    async def signal_queued(self, id: str, signal: bytes) -> bool:
        return await self.inner.signal_queued(id, signal)

    async def admit(
        self,
        limits: QueueLimits,
        now_ms: int,
        runnable: Callable[[QueueItem], bool] | None = None,
        released: Collection[str] = (),
    ) -> Admission:
        return await self.inner.admit(limits, now_ms, runnable, released)

    async def release_queued(self, id: str) -> str | None:
        return await self.inner.release_queued(id)

    async def unqueue(self, id: str) -> QueueItem | None:
        return await self.inner.unqueue(id)

    async def queue_items(self, *, done: bool = False) -> builtins.list[QueueItem]:
        return await self.inner.queue_items(done=done)

    async def schedules(self) -> builtins.list[ScheduleRow]:
        return await self.inner.schedules()

    async def put_schedule(self, row: ScheduleRow) -> None:
        await self.inner.put_schedule(row)

    async def set_schedule(self, name: str, changes: Mapping[str, Any]) -> None:
        await self.inner.set_schedule(name, changes)

    async def claim_tick(self, name: str, tick_ms: int) -> bool:
        return await self.inner.claim_tick(name, tick_ms)

    async def delete_schedule(self, name: str) -> None:
        await self.inner.delete_schedule(name)
