"""Run state and shards: what the engine keeps beside each loaded run's driver.

A shard owns a share of the runs (by ``crc32(id) % shards``): its loaded
runs and their timers. A `RunState` is one loaded run.

The rule: a run is loaded in at most one `RunState` at a time, and
`RunState.loaded` says whether a state is that one (parked, ended and
replaced states answer False and must not act). Other modules read a
state's fields and change them through its methods only, which keep what
belongs together together (a signal and its dedup id, an end and its
held-back row); scripts/check_layers.py refuses an assignment to a field
from outside this module.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fusee._status import RunStatus

if TYPE_CHECKING:
    from fusee._definitions import WorkflowDef
    from fusee._driver import RunDriver
    from fusee.engine._clock import TimerHandle
    from fusee.engine._telemetry import RunTelemetry
    from fusee.engine._timers import Alarm
    from fusee.record import Parent, Record, Signal, Status
    from fusee.store import RunRow

__all__ = ["Alarms", "RunState", "Shard", "cancel_key", "shard_index"]

# A global: an enum member read from its class goes through the enum's slow
# class attribute hook (Python 3.11).
_RUNNING = RunStatus.RUNNING


def shard_index(id: str, shards: int) -> int:
    """The shard of run ``id`` among ``shards``.

    crc32, not hash(): the same id maps to the same shard in every process.

    Example:
        >>> shard_index("order-1", 4) == shard_index("order-1", 4)
        True
    """
    return zlib.crc32(id.encode()) % shards


def cancel_key(seq: int) -> int:
    """The outbox key of the cancel of the attached child started at position ``seq``.

    Negative, so that it never meets a position (the child's start, at
    ``seq``, may still be in the outbox beside it).

    Example:
        >>> cancel_key(0), cancel_key(4)
        (-1, -5)
    """
    return -1 - seq


@dataclass(eq=False, slots=True, init=False)
class RunState:
    """A loaded run: its driver and what the host keeps beside it."""

    driver: RunDriver
    # Its driver's, kept here: asked by most host callbacks.
    id: str
    run: int
    workflow: WorkflowDef[Any, Any]
    started_ms: int
    parent: Parent | None
    policy: int
    # Signals by ordinal, the ones consumed, and open waits by position.
    signals: list[Signal]
    consumed: set[int]
    # Signals a wait set aside (their payload does not fit its type), by
    # ordinal: logged once each. Memory only: the journal decides the rest
    # (a set-aside signal stays unconsumed, and the wait's type refuses it
    # again after a crash).
    set_aside: set[int] | None
    dedups: set[int]
    waits: dict[int, str]
    # Whether the run was asked to cancel (its journal has a `Cancel`): a
    # second request is a no-op, so compensation runs to its end.
    cancelled: bool
    # Updates by id (their ordinal) and their recorded outcomes by ordinal:
    # an update id is applied once, and a repeat answers the first's outcome.
    update_ids: dict[str, int]
    update_outcomes: dict[int, tuple[Status, bytes]]
    # What its `Start` carried from the id's earlier runs (continue-as-new):
    # their signals' dedup ids, oldest first, and their updates' outcomes by
    # id (see fusee.engine._carry).
    carried_dedups: list[int]
    carried_updates: dict[str, tuple[Status, bytes]]
    # Callers waiting for an update id's outcome that is not recorded yet.
    update_waiters: dict[str, asyncio.Future[tuple[Status, bytes]]]
    # What the run's durable records make it owe other runs, not confirmed
    # yet: the positions of its `Send`s and `Child`s (the target's signal,
    # the child's start durable), and `cancel_key(seq)` of each attached
    # child it dropped (the child's cancel durable): the outbox. The run
    # neither parks nor says it is suspended or ended before it is empty, so
    # that a crash meanwhile leaves its row saying "running" and recovery
    # re-derives the outbox from its journal (`Runs.rebuild`).
    outbox: set[int]
    # Its children whose start is in the outbox, by id, each set once the
    # start is done: a send to one waits for it (made when first needed).
    starting: dict[str, asyncio.Event] | None
    # The latest of its sends under way to each run id, set once it is done:
    # the next send to that id waits for it, so that one run's messages to
    # another are applied in the order its journal records them.
    sending: dict[str, asyncio.Event] | None
    # Attached children whose wait the code dropped (cancelled): cancelled
    # with it, and never started if they were not yet.
    dropped_children: set[int]
    # The LSN of its run's `Start` when this engine appended it (0: loaded
    # from the store, durable already): an ATTACH returns once it is durable.
    start_lsn: int
    # The ended run's row, held back while its outbox is not empty.
    final_row: RunRow | None
    attributes: dict[str, Any]
    # Set by a resume of its paused steps (`resumed`); made when first asked.
    resumed_event: asyncio.Event | None
    park_handle: TimerHandle | None
    steps: set[asyncio.Task[None]]
    heartbeat_due: dict[int, bytes]
    # Due times of the run's armed timers and wait deadlines, by position:
    # a parked run is woken at the earliest.
    due: dict[int, int]
    records: list[Record] | None
    # How many records its journal holds (loaded and appended since): the
    # engine's `warn_records` watch reads it once a turn.
    journal_len: int
    row_status: RunStatus
    # Its shard, found once (a crc32 of its id).
    shard: Shard
    # Whether this state is its run's loaded one (not parked, ended or
    # replaced): kept by `Shard.add` and `Shard.remove`, and asked several
    # times a step, so a flag rather than a lookup.
    loaded: bool
    # Callers of `Run.update` waiting for the handler's answer.
    updates: set[asyncio.Future[tuple[Status, bytes]]]
    # Its spans and metrics; None (the step executor's one check) when off.
    telemetry: RunTelemetry | None

    def __init__(
        self,
        driver: RunDriver,
        workflow: WorkflowDef[Any, Any],
        started_ms: int,
        parent: Parent | None,
        policy: int,
        shard: Shard,
        *,
        telemetry: RunTelemetry | None = None,
        start_lsn: int = 0,
        records: list[Record] | None = None,
        journal_len: int = 0,
    ) -> None:
        # Written out: one is made for every run started or loaded, and the
        # __init__ a dataclass writes calls a factory for each container.
        self.driver = driver
        self.id = driver.id
        self.run = driver.run
        self.workflow = workflow
        self.started_ms = started_ms
        self.parent = parent
        self.policy = policy
        self.signals = []
        self.consumed = set()
        self.set_aside = None
        self.dedups = set()
        self.waits = {}
        self.cancelled = False
        self.update_ids = {}
        self.update_outcomes = {}
        self.carried_dedups = []
        self.carried_updates = {}
        self.update_waiters = {}
        self.outbox = set()
        self.starting = None
        self.sending = None
        self.dropped_children = set()
        self.start_lsn = start_lsn
        self.final_row = None
        self.attributes = {}
        self.resumed_event = None
        self.park_handle = None
        self.steps = set()
        self.heartbeat_due = {}
        self.due = {}
        self.records = records
        self.journal_len = journal_len
        self.row_status = _RUNNING
        self.shard = shard
        self.loaded = False
        self.updates = set()
        self.telemetry = telemetry

    @property
    def resumed(self) -> asyncio.Event:
        """Set when the run's paused steps are resumed (made when first asked: few runs pause)."""
        event = self.resumed_event
        if event is None:
            event = self.resumed_event = asyncio.Event()
        return event

    def count_record(self) -> None:
        """One more record in the run's journal (the `warn_records` watch reads the count)."""
        self.journal_len += 1

    def add_signal(self, sig: Signal) -> None:
        """Records ``sig`` as the run's next signal (its ordinal: its place); its dedup id is seen.

        Every way a signal reaches a loaded run comes here: a live delivery,
        one carried over by a continue-as-new, one read back from the journal.
        """
        self.signals.append(sig)
        if sig.dedup:
            self.dedups.add(sig.dedup)

    def carry(self, dedups: list[int], updates: Iterable[tuple[str, Status, bytes]]) -> None:
        """Seeds the dedup ids and update outcomes its `Start` carried from earlier runs."""
        self.carried_dedups = dedups
        self.dedups.update(dedups)
        for update_id, status, payload in updates:
            self.carried_updates[update_id] = (status, payload)

    def set_aside_once(self, ordinal: int) -> bool:
        """Notes that a wait set signal ``ordinal`` aside; False if it was noted already."""
        set_aside = self.set_aside
        if set_aside is None:
            set_aside = self.set_aside = set()
        elif ordinal in set_aside:
            return False
        set_aside.add(ordinal)
        return True

    def mark_cancelled(self) -> bool:
        """Notes that the run was asked to cancel; False if it was already (a no-op then)."""
        if self.cancelled:
            return False
        self.cancelled = True
        return True

    def mark(self, status: RunStatus) -> None:
        """Sets the status its row says (written by the caller)."""
        self.row_status = status

    def pause(self) -> bool:
        """Marks the run paused; False if its row says so already."""
        if self.row_status is RunStatus.PAUSED:
            return False
        self.row_status = RunStatus.PAUSED
        return True

    def end(self, status: RunStatus) -> None:
        """Marks the run ended with ``status``: it is never parked from now on."""
        self.row_status = status
        handle = self.park_handle
        if handle is not None:
            handle.cancel()
            self.park_handle = None

    def hold_final_row(self, row: RunRow) -> None:
        """Holds back the ended run's ``row`` until its outbox is empty."""
        self.final_row = row

    def take_final_row(self) -> RunRow | None:
        """The held-back row of the ended run (None if none), given once."""
        row, self.final_row = self.final_row, None
        return row

    def idle(self, arm: Callable[[], TimerHandle]) -> None:
        """The run is idle: its park timer is armed by ``arm`` unless it is already."""
        if self.park_handle is None:
            self.park_handle = arm()

    def busy(self) -> None:
        """The run is not idle: its park timer, if armed, is disarmed."""
        handle = self.park_handle
        if handle is not None:
            handle.cancel()
            self.park_handle = None

    def park_timer_fired(self) -> None:
        """Its park timer fired: a later idle turn arms a new one."""
        self.park_handle = None

    def child_starting(self, id: str) -> None:
        """Marks the start of its child ``id`` as under way (in the outbox)."""
        starting = self.starting
        if starting is None:
            starting = self.starting = {}
        starting[id] = asyncio.Event()

    def sending_to(self, target: str) -> tuple[asyncio.Event | None, asyncio.Event]:
        """Marks a send to ``target`` as under way: (the one before it, if any; this one).

        The send waits for the one before it, so that one run's messages to
        another are applied in the order its journal records them.
        """
        sending = self.sending
        if sending is None:
            sending = self.sending = {}
        before = sending.get(target)
        sent = sending[target] = asyncio.Event()
        return before, sent

    def unload(self) -> None:
        """Makes this state no longer its run's loaded one; its driver forgets it.

        Nothing the driver reports after this reaches the host (`RunHost`
        takes a driver with no state as one not loaded), and the cycle between
        state and driver is cut, so that an ended or parked run is freed by
        reference counting rather than by the cyclic garbage collector.
        """
        self.loaded = False
        self.driver.host_data = None


class Alarms(Mapping[tuple[str, int], "Alarm"]):
    """A shard's armed alarms by (run id, position): one per key, the latest run's.

    Position -1 is a parked run's wake-up. Most runs have one alarm armed
    at a time (a parked run: its sleep or its wake-up), so an id maps to its
    lone alarm itself, and to a dict by position only while it has more: a
    tuple key per alarm would cost every parked run 56 bytes more.

    Example:
        >>> from fusee.engine._timers import TIMER, Alarm
        >>> alarms = Alarms()
        >>> alarms.put(Alarm(None, "r-1", 1, 4, TIMER))  # type: ignore[arg-type]
        >>> list(alarms), alarms.pop("r-1", 4) is not None, len(alarms)
        ([('r-1', 4)], True, 0)
    """

    __slots__ = ("_by_id",)

    def __init__(self) -> None:
        self._by_id: dict[str, Alarm | dict[int, Alarm]] = {}

    def at(self, id: str, seq: int) -> Alarm | None:
        """The alarm at (``id``, ``seq``), or None."""
        found = self._by_id.get(id)
        if isinstance(found, dict):
            return found.get(seq)
        return found if found is not None and found.seq == seq else None

    def __getitem__(self, key: tuple[str, int]) -> Alarm:
        alarm = self.at(*key)
        if alarm is None:
            raise KeyError(key)
        return alarm

    def __iter__(self) -> Iterator[tuple[str, int]]:
        for id, found in self._by_id.items():
            if isinstance(found, dict):
                for seq in found:
                    yield id, seq
            else:
                yield id, found.seq

    def __len__(self) -> int:
        return sum(len(f) if isinstance(f, dict) else 1 for f in self._by_id.values())

    def put(self, alarm: Alarm) -> None:
        """Arms ``alarm`` at its (id, position), in place of the one there."""
        by_id, id, seq = self._by_id, alarm.id, alarm.seq
        found = by_id.get(id)
        if found is None or (not isinstance(found, dict) and found.seq == seq):
            by_id[id] = alarm
        elif isinstance(found, dict):
            found[seq] = alarm
        else:
            by_id[id] = {found.seq: found, seq: alarm}

    def pop(self, id: str, seq: int) -> Alarm | None:
        """Removes and returns the alarm at (``id``, ``seq``), or None."""
        by_id = self._by_id
        found = by_id.get(id)
        if found is None:
            return None
        if not isinstance(found, dict):
            if found.seq != seq:
                return None
            del by_id[id]
            return found
        alarm = found.pop(seq, None)
        if len(found) == 1:
            by_id[id] = next(iter(found.values()))
        return alarm

    def cancel_all(self) -> None:
        """Cancels every alarm and forgets it."""
        for found in self._by_id.values():
            for alarm in found.values() if isinstance(found, dict) else (found,):
                alarm.cancel()
        self._by_id.clear()


class Shard:
    """A share of the runs: its loaded runs and its timers."""

    __slots__ = ("runs", "timers")

    def __init__(self) -> None:
        self.runs: dict[str, RunState] = {}
        self.timers = Alarms()

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
        self.timers.cancel_all()
        for state in self.runs.values():
            state.unload()
        self.runs.clear()

    def drop_timers_of(self, state: RunState) -> None:
        """Cancels every timer of ``state``'s run (its end).

        Those are its armed timers and deadlines, which its `due` lists, and
        a wake-up: looked up by key, not found among the shard's timers,
        which are mostly parked runs' (thousands of them).
        """
        timers, id, run = self.timers, state.id, state.run
        for seq in (*state.due, -1):
            alarm = timers.at(id, seq)
            # Not a later run's timer at the same position (a replace).
            if alarm is not None and alarm.run == run:
                timers.pop(id, seq)
                alarm.cancel()
        state.due.clear()
