"""Run state and shards: what the engine keeps beside each loaded run's driver.

A shard owns a share of the runs (by ``crc32(id) % shards``): its loaded
runs and their timers. A `RunState` is one loaded run.

The rule: a run is loaded in at most one `RunState` at a time, and
`RunState.loaded` says whether a state is that one (parked, ended and
replaced states answer False and must not act).
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fusee._status import RunStatus

if TYPE_CHECKING:
    from fusee._definitions import WorkflowDef
    from fusee._driver import RunDriver
    from fusee.engine._clock import TimerHandle
    from fusee.engine._telemetry import RunTelemetry
    from fusee.record import Parent, Record, Signal, Status
    from fusee.store import RunRow

__all__ = ["RunState", "Shard", "shard_index"]


def shard_index(id: str, shards: int) -> int:
    """The shard of run ``id`` among ``shards``.

    crc32, not hash(): the same id maps to the same shard in every process.

    Example:
        >>> shard_index("order-1", 4) == shard_index("order-1", 4)
        True
    """
    return zlib.crc32(id.encode()) % shards


@dataclass(eq=False)
class RunState:
    """A loaded run: its driver and what the host keeps beside it."""

    driver: RunDriver
    workflow: WorkflowDef[Any, Any]
    started_ms: int
    parent: Parent | None
    policy: int
    # Signals by ordinal, the ones consumed, and open waits by position.
    signals: list[Signal] = field(default_factory=list)
    consumed: set[int] = field(default_factory=set)
    dedups: set[int] = field(default_factory=set)
    waits: dict[int, str] = field(default_factory=dict)
    # Whether the run was asked to cancel (its journal has a `Cancel`): a
    # second request is a no-op, so compensation runs to its end.
    cancelled: bool = False
    # Updates by id (their ordinal) and their recorded outcomes by ordinal:
    # an update id is applied once, and a repeat answers the first's outcome.
    update_ids: dict[str, int] = field(default_factory=dict)
    update_outcomes: dict[int, tuple[Status, bytes]] = field(default_factory=dict)
    # What its `Start` carried from the id's earlier runs (continue-as-new):
    # their signals' dedup ids, oldest first, and their updates' outcomes by
    # id (see fusee.engine._carry).
    carried_dedups: list[int] = field(default_factory=list)
    carried_updates: dict[str, tuple[Status, bytes]] = field(default_factory=dict)
    # Callers waiting for an update id's outcome that is not recorded yet.
    update_waiters: dict[str, asyncio.Future[tuple[Status, bytes]]] = field(default_factory=dict)
    # The positions of `Send`s and `Child`s whose delivery is not confirmed
    # yet (the target's signal, the child's start durable): the outbox. The
    # run does not park, nor does its row say it ended, before it is empty.
    outbox: set[int] = field(default_factory=set)
    # Attached children whose wait the code dropped (cancelled): cancelled
    # with it, and never started if they were not yet.
    dropped_children: set[int] = field(default_factory=set)
    # The LSN of its run's `Start` when this engine appended it (0: loaded
    # from the store, durable already): an ATTACH returns once it is durable.
    start_lsn: int = 0
    # The ended run's row, held back while its outbox is not empty.
    final_row: RunRow | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    resumed: asyncio.Event = field(default_factory=asyncio.Event)
    park_handle: TimerHandle | None = None
    steps: set[asyncio.Task[None]] = field(default_factory=set)
    heartbeat_due: dict[int, bytes] = field(default_factory=dict)
    # Due times of the run's armed timers and wait deadlines, by position:
    # a parked run is woken at the earliest.
    due: dict[int, int] = field(default_factory=dict)
    records: list[Record] | None = None
    row_status: RunStatus = RunStatus.RUNNING
    # Its shard, found once: host callbacks run for every record and step.
    shard: Shard | None = None
    # Whether this state is its run's loaded one (not parked, ended or
    # replaced): kept by `Shard.add` and `Shard.remove`, and asked several
    # times a step, so a flag rather than a lookup.
    loaded: bool = False
    # Callers of `Run.update` waiting for the handler's answer.
    updates: set[asyncio.Future[tuple[Status, bytes]]] = field(default_factory=set)
    # Its spans and metrics; None (the step executor's one check) when off.
    telemetry: RunTelemetry | None = None

    @property
    def id(self) -> str:
        return self.driver.id

    @property
    def run(self) -> int:
        return self.driver.run

    def unload(self) -> None:
        """Makes this state no longer its run's loaded one; its driver forgets it.

        Nothing the driver reports after this reaches the host (`RunHost`
        takes a driver with no state as one not loaded), and the cycle between
        state and driver is cut, so that an ended or parked run is freed by
        reference counting rather than by the cyclic garbage collector.
        """
        self.loaded = False
        self.driver.host_data = None


class Shard:
    """A share of the runs: its loaded runs and its timers."""

    __slots__ = ("runs", "timers")

    def __init__(self) -> None:
        self.runs: dict[str, RunState] = {}
        # (id, seq) -> handle; seq -1 is a parked run's wake-up.
        self.timers: dict[tuple[str, int], TimerHandle] = {}

    def add(self, state: RunState) -> None:
        """Makes ``state`` its run's loaded one (a state it replaces is ended)."""
        old = self.runs.get(state.id)
        if old is not None and old is not state:
            old.unload()
            # A state replaced while loaded was cut short (its store failed
            # in the middle of a turn): its code is ended here, not left to
            # the garbage collector.
            old.driver.close()
        self.runs[state.id] = state
        state.loaded = True

    def remove(self, state: RunState) -> None:
        """Unloads ``state`` if it is its run's loaded one."""
        if self.runs.get(state.id) is state:
            del self.runs[state.id]
        state.unload()

    def clear(self) -> None:
        """Unloads every run and cancels every timer."""
        for h in self.timers.values():
            h.cancel()
        self.timers.clear()
        for state in self.runs.values():
            state.unload()
        self.runs.clear()

    def drop_timers_of(self, id: str) -> None:
        """Cancels every timer of run ``id`` (its end)."""
        for key in [k for k in self.timers if k[0] == id]:
            self.timers.pop(key).cancel()
