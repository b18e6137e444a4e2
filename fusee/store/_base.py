"""The store's value types, the `Store` protocol, and the checks every backend shares.

`fusee.store` re-exports the public names; the backends (memory, SQLite,
Postgres) build on this module, never on `fusee.store` itself, so that the
package loads them by name without an import cycle.

The rule: what every backend must check (a batch's LSNs, a row's status, a
listing's arguments) is checked here once, so the backends agree.
"""

from __future__ import annotations

import builtins
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Protocol, runtime_checkable

import msgpack

from fusee._codegen import fast_init
from fusee._status import UNFINISHED_STATUSES, RunStatus
from fusee.errors import NotFound
from fusee.store._queues import Admission, QueueItem, QueueLimits
from fusee.store._schedules import ScheduleStore

__all__ = [
    "COMMAND_KINDS",
    "RUN_STATUSES",
    "UNFINISHED_STATUSES",
    "Admission",
    "Answer",
    "Command",
    "Entry",
    "QueueItem",
    "QueueLimits",
    "RunRow",
    "Store",
]

RUN_STATUSES: Final = frozenset(RunStatus)
"""Every value `RunRow.status` may take (`fusee.RunStatus`)."""

COMMAND_KINDS: Final = frozenset(
    {
        "start",
        "signal",
        "update",
        "query",
        "cancel",
        "resume",
        "start_now",
        "complete",
        "deliver",
        "fork",
        "delete",
        "prune",
        "schedule",
        "stop",
        "version",
    }
)
"""Every value `Command.kind` may take."""

_DURABILITIES: Final = ("fsync", "none")

# Shared by every RunRow without attributes: read-only, so sharing is safe.
_NO_ATTRIBUTES: Final[Mapping[str, Any]] = MappingProxyType({})


def _no_attributes() -> Mapping[str, Any]:
    return _NO_ATTRIBUTES


# Made for every record the engine appends: its __init__ sets the slots
# directly (`fast_init`), not through `object.__setattr__`.
@fast_init
@dataclass(frozen=True, slots=True)
class Entry:
    """One journal record to append.

    Attributes:
        lsn: The log sequence number, assigned by the engine; strictly
            increasing across all appends to one store.
        id: The workflow id.
        run: The run number (one id can have several runs over time:
            continue-as-new, replace).
        data: The encoded record (`fusee.record.encode`), stored as is.

    Example:
        >>> Entry(lsn=1, id="order-1", run=1, data=b"\\x01").lsn
        1
    """

    lsn: int
    id: str
    run: int
    data: bytes


@fast_init
@dataclass(frozen=True, slots=True)
class RunRow:
    """What a store keeps about a run besides its journal.

    Attributes:
        id: The workflow id (a store keeps one row per id: its latest run).
        run: The run number.
        workflow: The workflow type name.
        status: One of `RUN_STATUSES`.
        started_ms: When the run started (Unix time, milliseconds).
        finished_ms: When it finished, or None while it has not.
        wake_ms: For a parked (suspended) run, the earliest time it must be
            woken (a timer, a wait's deadline); None when only a signal, an
            update, a cancel or a child's result can wake it.
        attributes: Search attributes, plain msgpack-able data. Kept
            read-only: a mapping passed in is copied behind a read-only view.
        parent: The parent's workflow id, for a child run.
        version: The version of the engine the run started on (``describe().version``;
            "" for a run started before versions were recorded, or not yet started).
        error: For a run paused by a bug in its code (``on_error="pause"``), the
            error and its traceback (``describe().error`` in any process); None
            otherwise, and again once the run is resumed.

    Example:
        >>> row = RunRow("order-1", 1, "checkout", "running", 1_700_000_000_000,
        ...              attributes={"customer": "ada"})
        >>> (row.status, row.attributes["customer"], row.finished_ms)
        ('running', 'ada', None)
    """

    id: str
    run: int
    workflow: str
    status: str
    started_ms: int
    finished_ms: int | None = None
    wake_ms: int | None = None
    attributes: Mapping[str, Any] = field(default_factory=_no_attributes)
    parent: str | None = None
    version: str = ""
    error: str | None = None

    def __post_init__(self) -> None:
        # Rows are shared between the store and its callers (a MemoryStore
        # hands back the very object): a caller's dict must not change them.
        # An empty one becomes the one shared empty view: most runs have none.
        if type(self.attributes) is not MappingProxyType:
            view = MappingProxyType(dict(self.attributes)) if self.attributes else _NO_ATTRIBUTES
            object.__setattr__(self, "attributes", view)


@dataclass(frozen=True, slots=True)
class Command:
    """A request for the engine that serves a store, posted to the store's inbox.

    Attributes:
        id: Unique per command (`Command.new` makes a random one); posting
            one id twice stores it once, and the engine applies it once.
        kind: One of `COMMAND_KINDS`.
        run_id: The workflow id it is about ("" for a ``stop``).
        payload: Its arguments, encoded by the poster (opaque to the store).
        dedup: A dedup id the poster gave (a signal's), or None.
        created_ms: When it was posted (Unix time, milliseconds).
        attempt: How many times a serving engine has taken it, this time
            included (set by `Store.take_commands`; 0 in a posted command).
            Above 1, an engine took it before and stopped before answering.

    Example:
        >>> c = Command.new("cancel", "order-1", b"\\x90")
        >>> (c.kind, c.run_id, len(c.id), c.attempt)
        ('cancel', 'order-1', 32, 0)
    """

    id: str
    kind: str
    run_id: str
    payload: bytes = b""
    dedup: str | None = None
    created_ms: int = 0
    attempt: int = 0

    @classmethod
    def new(
        cls, kind: str, run_id: str, payload: bytes = b"", *, dedup: str | None = None
    ) -> Command:
        """A command with a fresh random id, created now.

        Raises:
            ValueError: ``kind`` is not one of `COMMAND_KINDS`.

        Example:
            >>> Command.new("resume", "r-1").payload
            b''
        """
        _check_command_kind(kind)
        return cls(uuid.uuid4().hex, kind, run_id, payload, dedup, time.time_ns() // 1_000_000)


@dataclass(frozen=True, slots=True)
class Answer:
    """The serving engine's answer to a `Command`.

    Attributes:
        ok: Whether the command was applied.
        payload: Its result, or its error, encoded by the engine.
        answered_ms: When it was answered (Unix time, milliseconds).

    Example:
        >>> Answer(True, b"", 0).ok
        True
    """

    ok: bool
    payload: bytes
    answered_ms: int


def _check_command_kind(kind: str) -> None:
    if kind not in COMMAND_KINDS:
        raise ValueError(f"command kind {kind!r} is not one of {', '.join(sorted(COMMAND_KINDS))}")


def _check_command(command: Command) -> None:
    """Checks a command before it is posted (a bad one is refused, nothing stored)."""
    _check_command_kind(command.kind)
    if not isinstance(command.id, str) or not command.id:
        raise ValueError(f"a command needs a non-empty string id, not {command.id!r}")
    if type(command.payload) is not bytes:
        raise TypeError(f"command payload must be bytes, not {type(command.payload).__name__}")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@runtime_checkable
class Store(ScheduleStore, Protocol):
    """Durable storage for journals and run rows; what the engine writes to.

    One store object serves one event loop. `open` before anything else;
    `close` when done (it waits for writes in flight).

    Example:
        >>> import asyncio
        >>> from fusee.store.memory import MemoryStore
        >>> async def demo(store: Store) -> list[tuple[int, bytes]]:
        ...     await store.open()
        ...     await store.append([Entry(1, "a", 1, b"x"), Entry(2, "a", 1, b"y")],
        ...                        [RunRow("a", 1, "wf", "running", 0)])
        ...     records = await store.load("a")
        ...     await store.close()
        ...     return records
        >>> asyncio.run(demo(MemoryStore()))
        [(1, b'x'), (2, b'y')]
    """

    async def open(self) -> None:
        """Creates the store, or checks the one there; raises `StoreError`."""
        ...

    async def close(self) -> None:
        """Waits for writes in flight, then closes; closing twice is harmless."""
        ...

    @property
    def last_lsn(self) -> int:
        """The highest LSN stored (0 for an empty store); valid after `open`."""
        ...

    async def append(
        self,
        entries: Sequence[Entry],
        runs: Sequence[RunRow] = (),
        *,
        items: Sequence[QueueItem] = (),
        forget: Sequence[int] = (),
    ) -> None:
        """Stores ``entries`` and ``runs`` in one durable write, or none of them.

        ``entries`` may belong to many runs; each row in ``runs`` replaces the
        row of its id. Under ``durability="fsync"`` the write is on disk when
        this returns. Appends may overlap (the engine calls the next one
        before the last returns): they are stored in call order, and one
        called before an earlier one's failure was reported fails too, so a
        journal never has a hole.

        ``items`` and ``forget`` are an engine's own queue admissions, made
        in memory on a store it writes alone and stored with the records
        they go with (a run's `Done` and the slot it frees): each item
        replaces the item of its `QueueItem.seq` (deleted ones first). A
        store several workers share admits inside the database (`admit`)
        and takes none.

        Raises:
            ValueError: LSNs do not increase, or do not exceed every LSN
                appended before (a bug in the caller); queue items given to
                a store workers share; nothing is stored.
            StoreError: The write failed (disk full, locked, read-only);
                nothing of the batch is stored.
        """
        ...

    async def load(
        self, id: str, run: int | None = None, *, after_lsn: int = 0
    ) -> builtins.list[tuple[int, bytes]]:
        """Returns a run's journal as ``(lsn, data)`` pairs in LSN order.

        ``run`` defaults to the id's latest run (from its `RunRow`); only
        records with an LSN above ``after_lsn`` are returned.

        Raises:
            NotFound: No run with that id (or that run of it) in this store.
        """
        ...

    async def get(self, id: str) -> RunRow | None:
        """Returns the row of ``id`` (its latest run), or None."""
        ...

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
        """Returns the rows that match every filter given, by start time then id.

        ``attributes`` matches a row when each given key is there with an equal
        value (compared as msgpack gives them back: tuples as lists).
        ``newest_first`` reverses the order. ``after`` is a page's cursor: the
        ``(started_ms, id)`` of the last row of the page before, so that only
        rows after it in the chosen order are returned (pages stay stable
        while runs start). ``started_from_ms`` and ``started_to_ms`` bound the
        start time (both inclusive).
        """
        ...

    async def unfinished(self) -> builtins.list[RunRow]:
        """Returns the rows whose status is in `UNFINISHED_STATUSES`."""
        ...

    async def next_run(self) -> int:
        """Returns a run number never used before in this store (from 1 up)."""
        ...

    async def delete_runs(
        self,
        ids: Collection[str] | None = None,
        *,
        finished_before_ms: int | None = None,
        limit: int = 100,
    ) -> builtins.list[str]:
        """Deletes up to ``limit`` finished runs whole, in one write; returns their ids.

        A run goes with its row and the journal records of every run of its
        id (its events, streams and attributes live there). Only a row that
        says completed, failed or cancelled, and with ``finished_before_ms``
        one that ended before it, is deleted: checked inside the write, so a
        run started again under its id meanwhile stays. ``ids``: only these
        (None: any, oldest start first). The store's next LSNs stay above
        every LSN it held.

        Raises:
            ValueError: A ``limit`` below 1.
            StoreError: The write failed (nothing is deleted), or the store is
                read-only or a client's.
        """
        ...

    # --- the commands inbox ----------------------------------------------------------------

    async def post_command(self, command: Command) -> str:
        """Stores ``command`` in the inbox, durably; returns its id.

        A client store (``open_store(..., client=True)``) may post; so may the
        engine's own. Posting an id already there stores nothing new.

        Raises:
            ValueError: An unknown kind or an empty id; nothing is stored.
            StoreError: The write failed, or the store is read-only.
        """
        ...

    async def take_commands(self, limit: int = 100) -> builtins.list[Command]:
        """The serving engine's next unanswered commands, oldest first, at most ``limit``.

        Each comes back once per opening of the store (with its `Command.attempt`
        counted up, durably, before it is returned): an engine that stopped
        before answering takes it again after it opens the store again.

        Raises:
            StoreError: The store is read-only or a client's.
        """
        ...

    async def wait_commands(self, timeout_s: float) -> None:
        """Returns when commands may have been posted, or after ``timeout_s``.

        A hint, never a promise: the caller takes commands after it returns.
        """
        ...

    async def answer_command(self, id: str, ok: bool, payload: bytes) -> None:
        """Stores the answer to command ``id``, durably; it is not taken again."""
        ...

    async def get_answer(self, id: str) -> Answer | None:
        """The answer to command ``id``, or None while it has none (or no such command)."""
        ...

    async def forget_commands(self, answered_before_ms: int) -> int:
        """Deletes the commands answered before that time; returns how many."""
        ...

    # --- queue admission (`fusee.store._queues`) -------------------------------------------

    async def enqueue(self, item: QueueItem, row: RunRow) -> QueueItem | None:
        """Stores queued ``item`` and its run's ``row`` (status ``"queued"``) in one write.

        Returns the item as stored (its `QueueItem.seq` assigned), or None,
        storing nothing, when ``item.id`` has a queued or admitted item already.
        """
        ...

    async def debounce_queued(self, id: str, input: bytes, not_before_ms: int) -> bool:
        """Replaces queued ``id``'s input and holds it back until ``not_before_ms``.

        Returns False, changing nothing, when ``id`` has no item still queued.
        """
        ...

    async def start_queued(self, id: str, now_ms: int) -> str | None:
        """Lets queued ``id`` in from ``now_ms`` on, its input untouched: ``run.start_now()``.

        One conditional write: a debounce that replaces the item's input at
        the same time is never undone by it. Its row's ``wake_ms`` is
        cleared. Returns the item's queue, or None, changing nothing, when
        ``id`` has no item still queued.
        """
        ...

    async def signal_queued(self, id: str, signal: bytes) -> bool:
        """Adds ``signal`` (encoded by the engine) to queued ``id``'s `QueueItem.signals`.

        Returns False, changing nothing, when ``id`` has no item still queued.
        """
        ...

    async def admit(
        self,
        limits: QueueLimits,
        now_ms: int,
        runnable: Callable[[QueueItem], bool] | None = None,
        released: Collection[str] = (),
    ) -> Admission:
        """Admits, in one atomic write, what ``limits`` allow at ``now_ms``.

        The limits hold across every engine on the store: the items counted
        are read inside the write that marks the admitted ones (see
        `fusee.store._queues.plan_admission`). ``runnable``: admit only
        the items it accepts (those the caller can run: its workflows, its
        shards).
        ``released``: ids of runs of this queue that ended, whose slots the
        same write frees first (`release_queued` of each, without a write
        of its own).
        """
        ...

    async def release_queued(self, id: str) -> str | None:
        """Run ``id`` ended: its admitted item frees its slot; returns its queue, or None."""
        ...

    async def unqueue(self, id: str) -> QueueItem | None:
        """Removes ``id``'s item if it is still queued (not admitted); returns it, or None."""
        ...

    async def queue_items(self, *, done: bool = False) -> builtins.list[QueueItem]:
        """Every queued or admitted item of every queue, in arrival order.

        ``done``: every done item the store keeps too (those a rate window
        still counts).
        """
        ...


def _check_durability(durability: str) -> None:
    if durability not in _DURABILITIES:
        raise ValueError(
            f"durability must be 'fsync' (on disk when append returns) or 'none' "
            f"(for tests and demos), not {durability!r}"
        )


def _check_batch(
    entries: Sequence[Entry], runs: Sequence[RunRow], floor: int
) -> tuple[int, builtins.list[bytes | None]]:
    """Checks an append before anything is stored; both stores share it.

    Returns the batch's highest LSN (``floor`` when it has no entries) and
    each row's attributes packed as msgpack (None when empty), so that a
    value msgpack refuses fails the call that passed it, not a later write.
    """
    last = floor
    for e in entries:
        lsn = e.lsn
        if lsn <= last:
            if last == floor:
                raise ValueError(
                    f"entry LSN {lsn} does not exceed the store's last LSN {floor}; the "
                    "engine must assign increasing LSNs above every one appended before"
                )
            raise ValueError(f"entry LSNs must increase within a batch: {lsn} after {last}")
        if type(e.data) is not bytes:
            raise TypeError(f"entry data must be bytes, not {type(e.data).__name__}")
        last = lsn
    packed: builtins.list[bytes | None] = []
    for row in runs:
        if row.status not in RUN_STATUSES:
            raise ValueError(
                f"run status {row.status!r} of {row.id!r} is not one of "
                f"{', '.join(sorted(RUN_STATUSES))}"
            )
        packed.append(_pack_attributes(row) if row.attributes else None)
    return last, packed


def _pack_attributes(row: RunRow) -> bytes:
    for key in row.attributes:
        if type(key) is not str:
            raise TypeError(f"search attribute names of {row.id!r} must be str, not {key!r}")
    try:
        return msgpack.packb(dict(row.attributes), use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError(
            f"search attributes of {row.id!r} must be plain msgpack data "
            f"(str, int, float, bool, None, bytes, lists and dicts of them): {e}"
        ) from e


def _unpack_attributes(data: bytes | None) -> Mapping[str, Any]:
    if not data:
        return _NO_ATTRIBUTES
    value: dict[str, Any] = msgpack.unpackb(data, raw=False, strict_map_key=False)
    return MappingProxyType(value)


def _normalize_filter(attributes: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """Returns a filter's values as stored values come back (tuples as lists)."""
    if not attributes:
        return None
    try:
        value: dict[str, Any] = msgpack.unpackb(
            msgpack.packb(dict(attributes), use_bin_type=True), raw=False, strict_map_key=False
        )
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError(f"attribute filters must be plain msgpack data: {e}") from e
    return value


def _matches(row: RunRow, attributes: Mapping[str, Any]) -> bool:
    have = row.attributes
    return all(key in have and have[key] == want for key, want in attributes.items())


def _check_list_args(
    status: str | None, limit: int | None, after: tuple[int, str] | None = None
) -> None:
    if status is not None and status not in RUN_STATUSES:
        raise ValueError(f"status {status!r} is not one of {', '.join(sorted(RUN_STATUSES))}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be 0 or more, not {limit}")
    if after is not None and not (
        isinstance(after, tuple)
        and len(after) == 2
        and type(after[0]) is int
        and isinstance(after[1], str)
    ):
        raise ValueError(
            f"after must be the (started_ms, id) of the last row of the page before, not {after!r}"
        )


def _in_page(
    row: RunRow,
    newest_first: bool,
    after: tuple[int, str] | None,
    started_from_ms: int | None,
    started_to_ms: int | None,
) -> bool:
    """Whether ``row`` passes a listing's cursor and time bounds (the memory store's check)."""
    key = (row.started_ms, row.id)
    if after is not None and (key >= after if newest_first else key <= after):
        return False
    if started_from_ms is not None and row.started_ms < started_from_ms:
        return False
    return started_to_ms is None or row.started_ms <= started_to_ms


async def load_journal(
    store: Store, row: RunRow, run: int | None = None, *, after_lsn: int = 0
) -> builtins.list[tuple[int, bytes]]:
    """``store.load`` for a reader that has read ``row``: a queued run's journal is empty.

    A queued run has no journal until its queue admits it, and ``load``
    raises `fusee.NotFound` for it; a reader (an event, a stream, ``fusee
    show``, the UI) sees it as a run with nothing recorded yet.

    Example:
        >>> async def demo(store: Store) -> int:
        ...     row = await store.get("mail-1")
        ...     return 0 if row is None else len(await load_journal(store, row))
    """
    run = row.run if run is None else run
    if row.status == RunStatus.QUEUED and run == row.run:
        return []
    return await store.load(row.id, run, after_lsn=after_lsn)


def _queued(id: str) -> NotFound:
    """What reading the journal of a queued run raises: it has none until its queue admits it."""
    return NotFound(
        f"run {id!r} is queued: it has no journal until its queue admits it "
        "(`fusee queues` shows the queues)"
    )


def _not_found(id: str, run: int | None = None) -> NotFound:
    if run is None:
        return NotFound(f"no run {id!r} in this store; `fusee list` shows the runs there are")
    return NotFound(
        f"run {run} of {id!r} has no records in this store; `fusee list` shows the runs "
        "there are (omit the run number for the latest)"
    )
