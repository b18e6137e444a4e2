"""Queued starts: `Queues` enqueues runs, admits them when their queue allows, and frees slots.

A start with ``queue=`` stores a queue item and a ``queued`` row (no journal
yet); an admission turns items into runs through `Engine.create_run`.
Admission is tried on a queued start, on the end of a run the queue
admitted, when the engine's clock reaches the time a rate window or a
debounce frees (`Admission.wake_ms`), on recovery and, on a store several
engines share, every `_POLL_S` while items wait (another worker's run may
have ended).

Where admission is decided depends on the store:

- On a store several engines share (Postgres), in the store (`Store.admit`,
  atomic, so the limits hold across every engine on it); a slot is freed
  once its run's end is durable (`Queues.ended`).
- On a store this engine writes alone (memory, SQLite), in memory
  (`_Book`, loaded at open): each change is written with the committer's
  next batch. A run's end frees its slot and admits the next run in the
  batch of its `Done`, with the new run's `Start`, so a queue costs no
  write of its own.

The rule: an item is admitted by one decider (the store, or the book of
the one engine writing it), and its slot is freed in the same durable
write as its run's end or after it, so a crash never frees a slot whose
run goes on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

from fusee import _codec
from fusee._durations import duration_ms
from fusee._queue import Queue, QueueStats
from fusee._status import FINISHED_STATUSES, RunStatus
from fusee.engine._run import IdPolicy
from fusee.errors import AlreadyExists, UnknownQueue
from fusee.machine import ChildCompleted
from fusee.record import DETACHED, Child, Done, Meta, Parent, Signal, Start, Status, encode
from fusee.remote._readers import queue_stats
from fusee.store import RunRow
from fusee.store._queues import ItemBook, QueueItem

if TYPE_CHECKING:
    from fusee._definitions import WorkflowDef
    from fusee.engine._clock import Clock, TimerHandle
    from fusee.engine._commit import Committer
    from fusee.engine._leases import Leases
    from fusee.engine._runs import Runs
    from fusee.engine._state import RunState
    from fusee.store import Store

__all__ = ["Queues"]

log = logging.getLogger("fusee")

# How often an engine on a shared store (Postgres) looks again at a queue
# with waiting items: a slot another worker's run freed has no local event.
_POLL_S: Final = 0.05

# The queue `start(..., debounce=...)` uses when given no queue: no limits.
_DEBOUNCE_QUEUE: Final = "fusee.debounce"


class _Book(ItemBook):
    """The queue items of an engine alone on its store: decided here, written with its batches.

    Example:
        >>> import asyncio
        >>> from fusee.engine._commit import Committer
        >>> from fusee.store import MemoryStore
        >>> async def demo() -> int:
        ...     store = MemoryStore()
        ...     await store.open()
        ...     committer = Committer(store)
        ...     committer.start()
        ...     _Book(committer).add(QueueItem("q", "a", 1, "wf", b""))
        ...     await committer.stored()
        ...     await committer.close()
        ...     return len(await store.queue_items())
        >>> asyncio.run(demo())
        1
    """

    def __init__(self, committer: Committer) -> None:
        super().__init__()
        self._committer = committer

    def _put(self, item: QueueItem) -> None:
        self._committer.put_item(item)

    def _drop(self, seq: int) -> None:
        self._committer.forget_item(seq)


class CreateRun(Protocol):
    """Appends a run's `Start`, loads it and runs its first turn; returns its LSN.

    `Engine.create_run`: an admitted item's run starts this way.
    """

    def __call__(
        self,
        wf: WorkflowDef[Any, Any],
        id: str,
        data: bytes,
        *,
        parent: Parent | None,
        policy: int,
        run: int,
        signals: Iterable[Signal] = (),
        trace: bytes | None = None,
        meta: Meta | None = None,
        deadline_ms: int = 0,
    ) -> int: ...


class Queues:
    """An engine's queues: enqueueing, admission, slot release, cancels and figures.

    Example:
        >>> import asyncio, fusee
        >>> @fusee.workflow("hello")
        ... async def hello(ctx) -> str:
        ...     return "hi"
        >>> async def main() -> str:
        ...     q = fusee.Queue("q", concurrency=1)
        ...     async with await fusee.Engine.open("memory", workflows=[hello], queues=[q]) as e:
        ...         run = await e.start(hello, "h-1", queue=q)
        ...         return await run.result()
        >>> asyncio.run(main())
        'hi'
    """

    def __init__(
        self,
        queues: Iterable[Queue],
        *,
        store: Store,
        committer: Committer,
        clock: Clock,
        loop: asyncio.AbstractEventLoop,
        runs: Runs,
        leases: Leases | None,
        workflows: Mapping[str, WorkflowDef[Any, Any]],
        version: str,
        version_number: int,
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
        closed: Callable[[], bool],
        owns: Callable[[str], bool],
        result_ready: Callable[[str], None],
        attached: Callable[[RunState | None], Awaitable[None]],
        create_run: CreateRun,
    ) -> None:
        self._store = store
        self._committer = committer
        self._clock = clock
        self._loop = loop
        self._runs = runs
        self._leases = leases
        self._workflows = workflows
        self._version = version
        self._version_number = version_number
        self._spawn = spawn
        self._closed = closed
        self._owns = owns
        self._result_ready = result_ready
        self._attached = attached
        self._create_run = create_run
        self.queues: dict[str, Queue] = {}
        for q in queues:
            if not isinstance(q, Queue):
                raise TypeError(f"queues must be fusee.Queue values, not {q!r}")
            if q.name in self.queues and self.queues[q.name] != q:
                raise ValueError(f"two different queues named '{q.name}' were given to one engine")
            self.queues[q.name] = q
        # Figures and cancels leave out the debounce queue, which every engine has.
        self.named = bool(self.queues)
        self.queues.setdefault(_DEBOUNCE_QUEUE, Queue(_DEBOUNCE_QUEUE))
        # Runs this engine admitted (or recovered admitted) whose end frees a slot.
        self.admitted: dict[str, str] = {}
        self._admitting: set[str] = set()
        # The admission task of each queue with one under way.
        self._rounds: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._wakes: dict[str, tuple[int, TimerHandle]] = {}
        # Ended runs whose slots the next admission of their queue frees.
        self._released: dict[str, set[str]] = {}
        self._polls: set[str] = set()
        self.shared = leases is not None
        # Alone on its store, the engine decides admissions itself (None: the store does).
        self.book = None if self.shared else _Book(committer)
        # Items the book admitted whose runs are not started yet, and whether
        # they are being started (a run that ends at once admits the next
        # one: started by the loop below, not by recursion).
        self._admitted_now: deque[QueueItem] = deque()
        self._starting = False
        # Runs being cancelled while queued, on a store workers share, each
        # with a future its cancel's end resolves.
        self._cancelling: dict[str, asyncio.Future[None]] = {}

    def resolve(self, queue: Queue | str | None, debounce: bool) -> Queue:
        """The engine's queue ``queue`` names (the debounce queue for None).

        Raises:
            fusee.UnknownQueue: The engine was not given it.
        """
        if queue is None:
            if not debounce:
                raise ValueError("a queued start needs a queue")
            return self.queues[_DEBOUNCE_QUEUE]
        name = queue.name if isinstance(queue, Queue) else queue
        if not isinstance(name, str):
            raise TypeError(f"queue must be a fusee.Queue or a queue's name, not {queue!r}")
        q = self.queues.get(name)
        if q is not None and isinstance(queue, Queue) and queue != q:
            raise UnknownQueue(
                f"{queue!r} differs from the engine's queue '{name}' ({q!r}); pass the "
                "Queue given to Engine.open(..., queues=[...]), or its name"
            )
        if q is None:
            known = ", ".join(repr(n) for n in sorted(self.queues) if n != _DEBOUNCE_QUEUE)
            raise UnknownQueue(
                f"queue '{name}' is not one of this engine's queues ({known or 'none'}); "
                "pass it in Engine.open(..., queues=[...])"
            )
        return q

    # --- starting through a queue -------------------------------------------------------

    async def start(
        self,
        wf: WorkflowDef[Any, Any],
        id: str,
        data: bytes,
        *,
        queue: Queue | str | None,
        key: str | None,
        priority: int,
        id_policy: IdPolicy,
        debounce: Any,
        trace: bytes | None = None,
        deadline_ms: int = 0,
        not_before_ms: int = 0,
        scheduled_ms: int = 0,
    ) -> None:
        """Queues run ``id`` (or, debounced, replaces the queued one's input); returns once durable.

        ``trace`` is the caller's ``traceparent``: its `Start` carries it once
        admitted, as it carries ``deadline_ms`` (0: none). It is not admitted
        before ``not_before_ms`` (a delayed start). ``scheduled_ms``
        is the schedule tick that started it (0: none).

        Raises:
            fusee.AlreadyExists: The id is taken (see `fusee.IdPolicy`).
        """
        if key is not None and not isinstance(key, str):
            raise TypeError(f"a queue key must be a string or None, not {key!r}")
        if type(priority) is not int:
            raise TypeError(f"priority must be an int, not {priority!r}")
        debounce_ms = duration_ms(debounce) if debounce is not None else 0
        q = self.resolve(queue, debounce is not None or not_before_ms > 0)
        now = self._clock.now_ms()
        book = self.book
        if debounce is not None:
            if book is not None:
                debounced = book.debounce(id, data, now + debounce_ms)
                if debounced:
                    await self._committer.stored()
            else:
                debounced = await self._store.debounce_queued(id, data, now + debounce_ms)
            if debounced:
                self.kick(q.name)
                return
        # A load under way (a message to the id) may yet find no run.
        await self._runs.loading_settled(id)
        loaded = self._runs.loaded(id)
        row = None if loaded is not None else await self._store.get(id)
        if loaded is not None or row is not None:
            status = row.status if row is not None else RunStatus.RUNNING
            if id_policy is IdPolicy.ATTACH:
                await self._attached(loaded)
                return
            if id_policy is IdPolicy.REJECT or status not in FINISHED_STATUSES:
                raise AlreadyExists(f"run '{id}' exists ({status}); {_policy_hint()}")
        run = row.run + 1 if row is not None else 1
        item = QueueItem(
            q.name,
            id,
            run,
            wf.name,
            data,
            key,
            priority,
            not_before_ms=max(now + debounce_ms, not_before_ms),
            origin=_origin_of(None, 0, trace, deadline_ms, scheduled_ms),
        )
        # A delayed run's row says when it starts (`describe().wake_at`).
        wake_ms = not_before_ms if not_before_ms > now else None
        row = RunRow(id, run, wf.name, RunStatus.QUEUED, now, wake_ms=wake_ms)
        stored = await self._enqueue(item, row)
        if stored is None:
            if id_policy is IdPolicy.ATTACH:
                return
            raise AlreadyExists(f"run '{id}' exists (queued); {_policy_hint()}")

    async def _enqueue(self, item: QueueItem, row: RunRow) -> QueueItem | None:
        """Stores ``item`` with ``row`` and tries its queue; returns once durable (None: taken)."""
        # A handle means the id's latest run: the end of an earlier one (a
        # REPLACE) no longer answers its `result()`.
        self._result_ready(item.id)
        book = self.book
        if book is None:
            stored = await self._store.enqueue(item, row)
            if stored is not None:
                self.kick(item.queue)
            return stored
        stored = book.add(item)
        if stored is None:
            # The id's item may be on its way to the store still: a caller
            # told it exists (ATTACH) relies on it.
            await self._committer.stored()
            return None
        self._committer.put_row(row)
        # Admitted at once when the queue allows: its `Start` goes in the
        # same write as its item, and a queue costs a start no write of its own.
        self.kick(item.queue)
        await self._committer.stored()
        return stored

    # --- admission ----------------------------------------------------------------------

    def kick(self, name: str) -> None:
        """Tries an admission of queue ``name``: now in a book; soon in a store (one at a time)."""
        if self._closed():
            return
        if self.book is not None:
            self._admit_now(name)
            self.start_admitted()
            return
        if name in self._admitting:
            self._again.add(name)
            return
        self._admitting.add(name)
        self._rounds[name] = self._spawn(self._admit(name))

    def _admit_now(self, name: str) -> None:
        """Admits what queue ``name`` allows, in the book; their runs start in `start_admitted`."""
        q = self.queues.get(name)
        assert self.book is not None
        if q is None:
            return
        admission = self.book.admit_now(
            q.limits, self._clock.now_ms(), self._runnable, count_left=False
        )
        self._admitted_now.extend(admission.items)
        if admission.wake_ms is not None:
            self._wake_at(name, admission.wake_ms)

    def start_admitted(self) -> None:
        """Starts the runs the book admitted and has not started yet."""
        if self._starting:
            return  # the loop further up the stack starts them
        self._starting = True
        try:
            pending = self._admitted_now
            while pending and not self._closed():
                self._run(pending.popleft())
        finally:
            self._starting = False

    def ending(self, id: str, status: Status) -> None:
        """Run ``id`` appended its `Done` (not yet durable): in the book, its slot goes with it.

        The slot is freed, and the next runs admitted, in the write that
        holds the `Done`; their runs start once the ending run's turn is
        over (`start_admitted`, from the host), so their `Start`s go in that
        write too.
        """
        book = self.book
        if book is None or status is Status.CONTINUED:
            return  # a continued run keeps its slot for its next run
        name = book.release(id)
        if name is None:
            return
        self._admit_now(name)
        if self._admitted_now:
            # Ended outside a run's turn (found ended in its journal): nobody
            # else starts them soon.
            self._loop.call_soon(self.start_admitted)

    async def _admit(self, name: str) -> None:
        q = self.queues.get(name)
        try:
            if q is None:
                return
            while True:
                self._again.discard(name)
                released = self._released.pop(name, set())
                try:
                    if self._leases is not None:
                        # Fenced: an item is admitted only while its shard is
                        # this worker's (`PostgresStore.admit`).
                        admission = await self._store.admit(  # type: ignore[call-arg]
                            q.limits,
                            self._clock.now_ms(),
                            self._runnable,
                            released,
                            fence=dict(self._leases.held),
                        )
                    else:
                        admission = await self._store.admit(
                            q.limits, self._clock.now_ms(), self._runnable, released
                        )
                except BaseException:
                    # Freed by the next admission, or by recovery after a crash.
                    self._released.setdefault(name, set()).update(released)
                    raise
                rows = await asyncio.gather(*(self._store.get(i.id) for i in admission.items))
                for item, row in zip(admission.items, rows, strict=True):
                    if not self._owns(item.id):
                        continue  # its shard moved meanwhile: its next owner starts it
                    if row is not None and row.run == item.run and row.status != RunStatus.QUEUED:
                        # Its run has a journal already: never started twice.
                        if row.status in FINISHED_STATUSES:
                            # It ended meanwhile (cancelled while queued, then a
                            # crash before its item went): its slot is freed.
                            await self._store.release_queued(item.id)
                        continue
                    self._run(item)
                if admission.wake_ms is not None:
                    self._wake_at(name, admission.wake_ms)
                if admission.left and self.shared:
                    self._poll(name)
                if name not in self._again or self._closed():
                    return
        finally:
            self._admitting.discard(name)
            self._rounds.pop(name, None)

    async def start_child(
        self,
        wf: WorkflowDef[Any, Any],
        rec: Child,
        link: Parent,
        queue: str | None,
        key: str | None,
        trace: bytes | None = None,
        not_before_ms: int = 0,
    ) -> None:
        """Queues child ``rec`` of the run ``link`` names, under ``key``; returns once durable.

        ``trace`` is the parent run's ``traceparent``: the child's `Start` carries it.
        A delayed child (``not_before_ms``) with no queue of its own waits in
        the queue every engine has.

        Raises:
            fusee.UnknownQueue: The engine has no queue named ``queue``.
        """
        q = self.resolve(queue, not_before_ms > 0)
        now = self._clock.now_ms()
        origin = _origin_of(link, rec.flags, trace, rec.deadline_ms)
        item = QueueItem(
            q.name, rec.id, 1, wf.name, rec.input, key, not_before_ms=not_before_ms, origin=origin
        )
        wake_ms = not_before_ms if not_before_ms > now else None
        row = RunRow(rec.id, 1, wf.name, RunStatus.QUEUED, now, wake_ms=wake_ms, parent=link.id)
        # Already there (a start delivered again after a crash): nothing new.
        await self._enqueue(item, row)

    def _runnable(self, item: QueueItem) -> bool:
        # Its workflow is here, and so is its shard (on a store workers
        # share, in the lane that admits queued runs), and it is not being
        # cancelled.
        return (
            item.workflow in self._workflows
            and self._owns(item.id)
            and self.admits()
            and item.id not in self._cancelling
        )

    def admits(self) -> bool:
        """Whether this engine admits queued runs (on a store workers share, one lane does).

        A queued run has no version until it starts: the lane serving runs
        of no version (`Leases.serving` of lane 0) admits and starts them,
        so that two lanes never both start one.
        """
        leases = self._leases
        return leases is None or leases.serving(0) == leases.lane

    def look_again(self) -> None:
        """Tries every queue's admission (workers of other lanes may have queued runs in it).

        Called at each round of the leases while several lanes have live
        workers: a run queued by a worker of a lane that does not admit
        has no event here.
        """
        if self.admits():
            for name in self.queues:
                self.kick(name)

    def _run(self, item: QueueItem) -> None:
        runs = self._runs
        loaded = runs.loaded(item.id)
        if loaded is not None and loaded.run >= item.run:
            # Started here already (an admission and a shard's recovery both
            # find it admitted with no journal): never started twice.
            return
        wf = self._workflows[item.workflow]
        if self.book is None:
            self.admitted[item.id] = item.queue
        parent, policy, trace, deadline_ms = _origin(item.origin)
        signals: list[Signal] = []
        seen: set[int] = set()
        for data in item.signals:
            name, dedup, payload, by = _codec.decode(data)
            if dedup and dedup in seen:
                continue  # a repeat of a signal it has (one dedup id counts once)
            seen.add(dedup)
            signals.append(Signal(item.run, name, dedup, payload, by))
        scheduled_ms = _scheduled_of(item.origin)
        self._create_run(
            wf,
            item.id,
            item.input,
            parent=parent,
            policy=policy,
            run=item.run,
            signals=signals,
            trace=trace,
            deadline_ms=deadline_ms,
            meta=Meta(scheduled_ms=scheduled_ms) if scheduled_ms else None,
        )

    async def signal_queued(
        self, id: str, name: str, payload: bytes, dedup: int, by: bytes | None
    ) -> bool:
        """Holds a signal for run ``id`` if it is queued (its run records it first); else False.

        Called when loading ``id`` raised `RunQueued`.
        """
        signal = _codec.encode([name, dedup, payload, by])
        if self.book is not None:
            if not self.book.add_signal(id, signal):
                return False  # admitted already: started here at once
            await self._committer.stored()
            return True
        if await self._store.signal_queued(id, signal):
            return True
        # Admitted meanwhile: once its admission has started it here, the
        # signal goes to it as to any loaded run.
        rounds = list(self._rounds.values())
        if rounds:
            await asyncio.wait(rounds)
        return False

    def _wake_at(self, name: str, at_ms: int) -> None:
        have = self._wakes.get(name)
        if have is not None:
            if have[0] <= at_ms:
                return
            have[1].cancel()

        def wake() -> None:
            self._wakes.pop(name, None)
            self.kick(name)

        self._wakes[name] = (at_ms, self._clock.call_at(at_ms, wake))

    def _poll(self, name: str) -> None:
        if name in self._polls:
            return
        self._polls.add(name)

        def poll() -> None:
            self._polls.discard(name)
            self.kick(name)

        self._loop.call_later(_POLL_S, poll)

    # --- a run's end, a cancel, recovery ------------------------------------------------

    def ended(self, id: str) -> None:
        """Run ``id``'s end is durable: the slot it held (if any) is freed."""
        if self.book is not None:
            return  # freed with its `Done` (`ending`)
        name = self.admitted.pop(id, None)
        if name is not None:
            # In the admission it makes possible: one write for both.
            self._released.setdefault(name, set()).add(id)
            self.kick(name)
        elif self.shared and self.named:
            # On a shared store another engine may have admitted it.
            self._spawn(self._release(id))

    async def _release(self, id: str) -> None:
        name = await self._store.release_queued(id)
        if name is not None:
            self.kick(name)

    async def start_now(self, id: str) -> bool:
        """Lets queued run ``id`` in at once, its delay cut short; False if it is not queued.

        Its queue's limits still hold: it is admitted as soon as they allow.
        """
        now = self._clock.now_ms()
        book = self.book
        if book is not None:
            # Its admission time only: its input stays whatever the last debounce gave.
            queue = book.start_early(id, now)
            if queue is None:
                return False
            row = await self._store.get(id)
            if row is not None and row.status == RunStatus.QUEUED:
                self._committer.put_row(dataclasses.replace(row, wake_ms=None))
            self.kick(queue)
            await self._committer.stored()
            return True
        # One conditional write in the store: a debounce landing meanwhile
        # keeps its newer input.
        queue = await self._store.start_queued(id, now)
        if queue is None:
            return False
        self.kick(queue)
        return True

    async def cancel_queued(self, id: str, reason: str) -> bool:
        """Cancels run ``id`` if it is still queued (no code runs); False if it is not.

        Called when loading ``id`` raised `RunQueued`.
        """
        if self.book is not None:
            item = self.book.remove(id)
            if item is None:
                return False  # admitted already: started here at once
            await self._finish_cancelled(item, reason)
            return True
        # On a store workers share, the cancelled run's journal is written
        # first, then its item goes: a crash between leaves an item of an
        # ended run, which recovery and admission drop, never a queued row
        # that nothing ends. Meanwhile this engine, its shard's owner, does
        # not admit it.
        while (under_way := self._cancelling.get(id)) is not None:
            # One cancel of it at a time here: the next finds it ended.
            await asyncio.wait([under_way])
        done: asyncio.Future[None] = self._loop.create_future()
        self._cancelling[id] = done
        try:
            row = await self._store.get(id)
            if row is not None and row.status in FINISHED_STATUSES:
                # Cancelled already (then, maybe, a crash before its item
                # went): it has ended, as the caller hears.
                await self._store.unqueue(id)
                return False
            items = await self._store.queue_items()
            item = next((i for i in items if i.id == id and i.state == "queued"), None)
            if item is None:
                # Admitted meanwhile: once its admission has started it here,
                # it is cancelled as any loaded run is.
                rounds = list(self._rounds.values())
                if rounds:
                    await asyncio.wait(rounds)
                return False
            await self._finish_cancelled(item, reason)
            await self._store.unqueue(id)
        finally:
            del self._cancelling[id]
            done.set_result(None)
        return True

    async def _finish_cancelled(self, item: QueueItem, reason: str) -> None:
        # Its journal says it started and was cancelled, so `result()`,
        # `fusee show` and the Client read it as any cancelled run.
        now = self._clock.now_ms()
        run, id = item.run, item.id
        start = Start(
            run=run,
            id=id,
            wtype=item.workflow,
            version=self._version_number,
            started_ms=now,
            input=item.input,
        )
        self._committer.append(id, run, encode(start))
        done = Done(run, Status.CANCELLED, now, _codec.encode(reason))
        lsn = self._committer.append(id, run, encode(done))
        self._committer.put_row(
            RunRow(id, run, item.workflow, RunStatus.CANCELLED, now, now, version=self._version)
        )
        await self._committer.durable(lsn)
        self._result_ready(id)
        parent, policy, _, _ = _origin(item.origin)
        if parent is not None and not policy & DETACHED:
            self._runs.fire(
                parent.id, parent.run, parent.seq, ChildCompleted(Status.CANCELLED, done.payload)
            )

    async def load(self) -> None:
        """Reads the store's items into the book (an engine alone on its store), before any run.

        Done items count too: a rate window remembers them.
        """
        if self.book is not None:
            self.book.take_stored(await self._store.queue_items(done=True))

    async def recover(self, shards: set[int] | None = None) -> None:
        """Picks up the items of ``shards`` (None: all): admitted ones go on or free their slot.

        Called as the engine takes shards (all of them, alone on its store):
        an item admitted by a worker that died before it started the run is
        started by the shard's next owner. Their queues are tried.
        """
        book = self.book
        items = book.items() if book is not None else await self._store.queue_items()
        names: set[str] = set()
        runs = self._runs
        for item in items:
            if shards is not None and runs.shard_index(item.id) not in shards:
                continue
            names.add(item.queue)
            if item.workflow not in self._workflows:
                continue
            if item.state == "queued":
                if book is None and item.id not in self._cancelling:
                    row = await self._store.get(item.id)
                    if row is not None and row.run == item.run and row.status in FINISHED_STATUSES:
                        # Cancelled while queued, then a crash before its item went.
                        await self._store.unqueue(item.id)
                continue
            row = await self._store.get(item.id)
            if row is None or row.run != item.run:
                continue
            if row.status == RunStatus.QUEUED:
                # Admitted, then a crash before its start was durable.
                idle = not runs.is_loading(item.id) and runs.loaded(item.id) is None
                if self._owns(item.id) and idle and self.admits():
                    self._run(item)
            elif row.status in FINISHED_STATUSES and row.status != RunStatus.CONTINUED:
                # Ended, then a crash before its slot was freed.
                if book is not None:
                    book.release(item.id)
                else:
                    await self._store.release_queued(item.id)
            elif book is None:
                self.admitted[item.id] = item.queue
        for name in sorted(names):
            if name in self.queues:
                self.kick(name)

    # --- figures ------------------------------------------------------------------------

    async def stats(self) -> list[QueueStats]:
        """Queued and running runs per queue and per key, by queue name."""
        book = self.book
        items = book.items() if book is not None else await self._store.queue_items()
        return queue_stats(items, [n for n in self.queues if n != _DEBOUNCE_QUEUE])


def _origin_of(
    parent: Parent | None,
    flags: int,
    trace: bytes | None,
    deadline_ms: int = 0,
    scheduled_ms: int = 0,
) -> bytes:
    """A queue item's origin: a child's parent link and policy flags, the trace it starts
    in, its deadline and the schedule tick that started it (0: none).

    Example:
        >>> _origin(_origin_of(None, 0, b"00-ab-cd-01"))
        (None, 0, b'00-ab-cd-01', 0)
        >>> _scheduled_of(_origin_of(None, 0, None, 0, 60_000))
        60000
    """
    if parent is None and trace is None and not deadline_ms and not scheduled_ms:
        return b""
    link = [parent.id, parent.run, parent.seq] if parent is not None else [None, 0, 0]
    tick = [scheduled_ms] if scheduled_ms else []
    return _codec.encode([*link, flags, trace, deadline_ms, *tick])


def _scheduled_of(origin: bytes) -> int:
    """The schedule tick `_origin_of` packed (0: none; an item of an earlier fusee holds none)."""
    if not origin:
        return 0
    fields = _codec.decode(origin)
    return int(fields[6]) if len(fields) > 6 else 0


def _origin(origin: bytes) -> tuple[Parent | None, int, bytes | None, int]:
    """What `_origin_of` packed: parent link (none for a run started from outside), flags,
    trace, deadline."""
    if not origin:
        return None, 0, None, 0
    # An item an earlier fusee queued holds four fields (no trace) or five
    # (no deadline).
    id, run, seq, flags, *rest = _codec.decode(origin)
    parent = Parent(str(id), int(run), int(seq)) if id is not None else None
    trace = bytes(rest[0]) if rest and rest[0] else None
    deadline_ms = int(rest[1]) if len(rest) > 1 and rest[1] else 0
    return parent, int(flags), trace, deadline_ms


def _policy_hint() -> str:
    return (
        "pass id_policy=fusee.IdPolicy.ATTACH to get its handle, "
        "or IdPolicy.REPLACE to start over once it has finished"
    )
