"""The seeded simulator: a mixed workload under faults, checked after every recovery.

`simulate(seed)` runs one seed on a `TestEngine` (virtual clock) over a
`FaultyStore`. A `random.Random(seed)` picks everything: the runs started
(`tests.sim.workload`), the signals, updates and cancels sent from outside
(each with a dedup id, resent after a crash as a real client would), and
the faults (crashes at any point, failed, held and torn appends, clock
jumps). Completions are reordered by the workload itself (each step takes a
seed-chosen number of loop turns). After the fault phase the store behaves,
the outside callers resend whatever was not acknowledged, every inbox gets
its stop, and the clock runs until every run ends.

The checkers (`Sim.check`, after every recovery, and at the end):

- ``acked_start``: every acknowledged start has its row and exactly one
  `Start`, first in its journal as the engine reads it (a torn batch may
  leave an unacknowledged start's prefix before it, which it never reads);
- ``acked_signal`` / ``acked_update``: every acknowledged signal or update is
  in a journal of its id, and no journal holds one dedup id twice (sent
  ones that were not acknowledged: at most once per journal);
- ``result_changed``: a run's end, once seen, never changes;
- ``step_ran_again``: no step whose result was durable before a crash runs
  again afterwards (`TestEngine.step_log`, kept outside the store);
- ``never_finished``: every run ends once faults stop, within a bound;
- ``after_end``: no record follows a run's `Done`;
- ``decodes``: every journal record decodes;
- ``delivered``: each inbox returns every acknowledged item once, and
  a total its acknowledged updates account for; each other run returns what its
  input says it must;
- ``caller_error``: a caller not interrupted by a crash gets only
  `fusee.FuseeError` errors;
- ``queue_limits``: no queue's stored items exceed its concurrency,
  per-key bound or rate (some starts, and some parents' children, go
  through `workload.queues`).

Each report carries the seed's event log (`Sim.note`): every call sent and
how it was answered, with the life it was sent in; every append stored,
refused or torn; every fault and crash (``python -m tests.sim --log``).

The rule: the simulator's only randomness is its `random.Random(seed)`, so a
seed replays the same script; on the memory store the whole run is then the
same each time (SQLite adds its writer thread's timing). ``late_reads``
brings that timing's effect to the memory store deterministically: reads of
a run's row answer a few loop turns late, by a random of the seed's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import tempfile
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

import fusee
from fusee import _codec
from fusee._status import FINISHED_STATUSES, RunStatus
from fusee.engine._runs import through_end
from fusee.errors import CorruptRecord, NotFound
from fusee.record import Done, Signal, Start, Update, decode
from fusee.remote import dedup_key
from fusee.store import MemoryStore, SqliteStore, Store
from fusee.store._queues import QueueItem
from fusee.testing import TestEngine

from .faults import FaultyStore
from .workload import (
    STOP,
    WORKFLOWS,
    add,
    expected_of_sender,
    expected_of_steps,
    msg,
    queues,
    tree_ids,
)

__all__ = [
    "Report",
    "Workload",
    "behind_stops",
    "check_outcomes",
    "reproduce_command",
    "simulate",
]

STORES = ("memory", "sqlite")
_HOUR_MS = 3_600_000


def reproduce_command(seed: int, store: str, *, late_reads: bool = False) -> str:
    """The one-line command that runs ``seed`` again on ``store``."""
    late = " LATE_READS=1" if late_reads else ""
    return f"make sim SEEDS=1 SEED={seed} STORE={store}{late}"


@dataclasses.dataclass
class Report:
    """What one seed did and found."""

    seed: int
    store: str
    violations: list[str] = dataclasses.field(default_factory=list)
    figures: dict[str, int] = dataclasses.field(default_factory=dict)
    # The seed's event log (`Sim.note`): each call, its answer, each fault and crash.
    events: list[str] = dataclasses.field(default_factory=list)
    late_reads: bool = False

    @property
    def command(self) -> str:
        return reproduce_command(self.seed, self.store, late_reads=self.late_reads)

    def summary(self) -> str:
        if not self.violations:
            return f"seed {self.seed} ({self.store}): ok {self.figures}"
        first = self.violations[0]
        more = f" (+{len(self.violations) - 1} more)" if len(self.violations) > 1 else ""
        head = f"seed {self.seed} ({self.store}): VIOLATION"
        return f"{head} {first}{more}; reproduce: {self.command}"


@dataclasses.dataclass
class _Op:
    """One outside call: what it is, and whether it was acknowledged."""

    kind: str  # start, signal, update, cancel
    id: str
    key: str  # the dedup id (signals, updates); the workflow name (starts)
    value: Any
    queue: str | None = None  # a start through this queue (`workload.queues`)
    qkey: str | None = None  # its key there
    acked: bool = False
    refused: bool = False  # the run had finished (a signal or cancel)
    result: Any = None
    in_flight: bool = False
    replace: bool = False  # a start with IdPolicy.REPLACE (of an id started before)


class Workload:
    """Makes the runs' inputs: a seed's random choices, on a virtual or a real clock.

    Args:
        rng: The seed's random.
        real_time: Short sleeps and holds (the torture's processes run on the
            wall clock), instead of the simulator's minutes, hours and days.
        prefix: Put before every run id.
    """

    def __init__(self, rng: random.Random, *, real_time: bool = False, prefix: str = "") -> None:
        self.rng = rng
        self.prefix = prefix
        if real_time:
            self.sleeps: list[int | str] = [0, 0, "20ms", "100ms", "300ms"]
            self.holds = ["200ms", "1s", "3s"]
            self.fails = [0, 0, 0, 0, 1]
        else:
            self.sleeps = [0, 0, "5s", "1m", "2h"]
            self.holds = ["10m", "2h", "1d"]
            self.fails = [0, 0, 0, 1, 2]

    def new_start(self, n: int, inboxes: list[str]) -> _Op:
        """The start of a new run, number ``n``; a sender targets one of ``inboxes``."""
        rng = self.rng
        kinds = ["steps", "parent", "inbox", "cancellable", "sender", "tree"]
        kind = rng.choices(kinds, [3, 2, 3, 2, 3, 1])[0]
        if kind == "sender" and not inboxes:
            kind = "inbox"
        p = self.prefix
        # Some starts wait in a queue (a key for its per-key bound, or none).
        queue = "simq" if rng.random() < 0.3 else None
        qkey = rng.choice(["a", "b", "c", None]) if queue else None
        if kind == "steps":
            return _Op("start", f"{p}steps-{n}", "sim_steps", self.steps_spec(), queue, qkey)
        if kind == "parent":
            spec: dict[str, Any] = {
                "before": self.step_spec(),
                "child": self.steps_spec(),
                "after": self.step_spec(),
            }
            if rng.random() < 0.4:
                spec["kid_queue"] = "kidq"
            return _Op("start", f"{p}parent-{n}", "sim_parent", spec, queue, qkey)
        if kind == "inbox":
            state = {"got": [], "total": 0, "per": rng.randint(2, 5)}
            queue = "inboxq" if rng.random() < 0.3 else None
            return _Op("start", f"{p}inbox-{n}", "sim_inbox", state, queue)
        if kind == "sender":
            spec = {
                "before": self.step_spec(),
                "target": rng.choice(inboxes),
                "item": 100_000 + n,
                "after": self.step_spec(),
                # A send in the turn of the child it targets, or after a
                # child's result (the shapes of Restate's CallOrdering).
                "shape": rng.choice(["plain", "plain", "child_send", "after_child"]),
            }
            if spec["shape"] == "after_child":
                spec["child"] = self.steps_spec()
            return _Op("start", f"{p}sender-{n}", "sim_sender", spec, queue, qkey)
        spec = {
            "book": self.step_spec(),
            "hold": rng.choice(self.holds),
            "confirm": self.step_spec(),
        }
        if kind == "tree":
            # Cancelled, its cancel goes down to its branch and leaf.
            return _Op("start", f"{p}tree-{n}", "sim_tree", spec, queue, qkey)
        return _Op("start", f"{p}cancellable-{n}", "sim_cancellable", spec, queue, qkey)

    def step_spec(self) -> dict[str, int]:
        rng = self.rng
        return {
            "value": rng.randint(1, 1000),
            "fails": rng.choice(self.fails),
            "turns": rng.randint(0, 8),
        }

    def steps_spec(self) -> dict[str, Any]:
        rng = self.rng
        count = rng.randint(1, 3)
        return {
            "steps": [self.step_spec() for _ in range(count)],
            "sleeps": [rng.choice(self.sleeps) for _ in range(count)],
            "fan": [self.step_spec() for _ in range(rng.randint(0, 4))],
        }


class Sim:
    """One seed's world: the engine, its store, the outside callers and the checkers."""

    def __init__(self, seed: int, t: TestEngine, store: FaultyStore) -> None:
        self.queues = queues()
        self.rng = random.Random(seed)
        self.workload = Workload(self.rng)
        self.t = t
        self.store = store
        self.ops: list[_Op] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.violations: list[str] = []
        self.seen_ends: dict[str, tuple[int, int, bytes]] = {}  # each id's latest run's
        self.run_ends: dict[tuple[str, int], tuple[int, int, bytes]] = {}
        self.durable_at_crash: list[frozenset[tuple[str, int, int]]] = []
        self.counter = 0
        self.figures: dict[str, int] = {"crashes": 0, "jumps": 0, "checks": 0}
        self.events: list[str] = []
        store.note = self.note

    def note(self, event: str) -> None:
        """Logs ``event`` with the life and the virtual time it happened in."""
        self.events.append(f"life {self.t.crashes} t={self.t.clock.now_ms()}: {event}")

    # --- outside callers ---------------------------------------------------------------------

    def violation(self, checker: str, detail: str) -> None:
        text = f"[{checker}] {detail}"
        if text not in self.violations:
            self.violations.append(text)
            self.note(f"VIOLATION {text}")

    def _call(self, op: _Op) -> Coroutine[Any, Any, Any]:
        t = self.t
        if op.kind == "start":
            return t.start(
                op.key,
                op.id,
                op.value,
                id_policy=fusee.IdPolicy.REPLACE if op.replace else fusee.IdPolicy.ATTACH,
                queue=op.queue,
                key=op.qkey,
            )
        run = t.get(op.id)
        if op.kind == "signal":
            return run.signal(msg, op.value, dedup=op.key)
        if op.kind == "update":
            return run.update(add, op.value, id=op.key)
        return run.cancel("simulated cancel")

    def send(self, op: _Op) -> None:
        """Makes ``op``'s call as a task of its own: it may be in flight at a crash."""
        if op not in self.ops:
            self.ops.append(op)
        op.in_flight = True
        life = self.t.crashes
        self.note(f"send {_describe(op)}")
        task = asyncio.ensure_future(self._run_op(op, life))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run_op(self, op: _Op, life: int) -> None:
        try:
            result = await self._call(op)
        except (Exception, asyncio.CancelledError) as e:
            crashed = self.t.crashes != life
            self.note(f"raised {type(e).__name__} (sent in life {life}): {_describe(op)}: {e}")
            if isinstance(e, fusee.FuseeError) and _says_finished(e):
                op.refused = True
            elif not crashed and not isinstance(e, fusee.FuseeError | asyncio.CancelledError):
                self.violation(
                    "caller_error", f"{op.kind} {op.id} {op.key} raised {type(e).__name__}: {e}"
                )
        else:
            if op.kind == "update" and op.acked and op.result != result:
                self.violation(
                    "acked_update",
                    f"update {op.key} of {op.id} answered {result!r} after {op.result!r}",
                )
            op.acked = True
            op.result = result
            self.note(f"acknowledged (sent in life {life}): {_describe(op)}")
            if op.replace:
                self.figures["replaced"] = self.figures.get("replaced", 0) + 1
        finally:
            op.in_flight = False

    def _new_start(self) -> None:
        self.counter += 1
        inboxes = [op.id for op in self._started("sim_inbox") if op.acked]
        self.send(self.workload.new_start(self.counter, inboxes))

    def _started(self, workflow: str) -> list[_Op]:
        return [op for op in self.ops if op.kind == "start" and op.key == workflow]

    def _message(self, kind: str) -> None:
        rng = self.rng
        if kind == "cancel":
            targets = self._started("sim_cancellable") + self._started("sim_tree")
        else:
            targets = self._started("sim_inbox")
        if not targets:
            return
        target = rng.choice(targets).id
        self.counter += 1
        if kind == "signal":
            self.send(_Op("signal", target, f"item-{self.counter}", self.counter))
        elif kind == "update":
            self.send(_Op("update", target, f"u-{self.counter}", rng.randint(1, 9)))
        elif kind == "stop":
            # An inbox told to end while items may still be on their way:
            # each must be delivered, or refused as sent to an ended run.
            self.send(_Op("signal", target, "stop-early", STOP))
        elif not any(op.kind == "cancel" and op.id == target for op in self.ops):
            self.send(_Op("cancel", target, "cancel", None))

    def _replace(self) -> None:
        # A queued id started again with REPLACE and a new input: refused
        # while its run is running, else run 2 waits in the queue, and the
        # id's handle means that run (its result() waits for it).
        queued = [
            op
            for op in self._started("sim_steps")
            if op.acked and op.queue is not None and not op.replace
        ]
        if not queued:
            return
        first = self.rng.choice(queued)
        spec = self.workload.steps_spec()
        self.send(_Op("start", first.id, "sim_steps", spec, first.queue, first.qkey, replace=True))
        self.figures["replaces"] = self.figures.get("replaces", 0) + 1

    def _resend(self) -> None:
        # A client that resends what was already acknowledged (with its dedup id).
        done = [op for op in self.ops if op.kind in ("signal", "update") and op.acked]
        if done:
            self.send(self.rng.choice(done))
            self.figures["resends"] = self.figures.get("resends", 0) + 1

    # --- faults ------------------------------------------------------------------------------

    async def turns(self, most: int = 30) -> None:
        for _ in range(self.rng.randint(0, most)):
            await asyncio.sleep(0)

    async def crash(self) -> None:
        """Crashes wherever the engine is, recovers, and runs the checkers."""
        self.durable_at_crash.append(frozenset(self.store.durable_steps))
        self.store.release()
        self.note("crash")
        await self.t.crash()
        self.figures["crashes"] += 1
        self.note("recovered")
        await self.check()

    async def fault_phase(self, actions: int) -> None:
        rng = self.rng
        t = self.t
        store = self.store
        moves: dict[str, float] = {
            "start": 3,
            "signal": 3,
            "update": 1.5,
            "cancel": 0.8,
            "stop": 0.3,
            "resend": 0.3,
            "replace": 0.3,
            "retry": 0.5,
            "turns": 2,
            "advance": 2,
            "jump": 0.6,
            "crash": 1.2,
            "fail": 0.4,
            "hold": 0.8,
            "tear": 0.4,
        }
        names, weights = list(moves), list(moves.values())
        for _ in range(actions):
            move = rng.choices(names, weights)[0]
            failed = t.engine.committer.failed is not None
            if move in ("advance", "jump", "fail", "hold", "tear"):
                self.note(f"move {move}")
            if move == "start":
                self._new_start()
            elif move in ("signal", "update", "cancel", "stop"):
                self._message(move)
            elif move == "resend":
                self._resend()
            elif move == "replace":
                self._replace()
            elif move == "retry":
                # A client that timed out resends a call still in flight.
                waiting = [op for op in self.ops if op.in_flight]
                if waiting:
                    self.send(rng.choice(waiting))
                    self.figures["retries"] = self.figures.get("retries", 0) + 1
            elif move == "turns":
                await self.turns()
            elif move == "advance" and not store.holding and not failed:
                await t.advance(f"{rng.randint(1, 180)}s")
            elif move == "jump" and not store.holding and not failed:
                self.figures["jumps"] += 1
                t.clock.advance_to(t.clock.now_ms() + rng.randint(1, 30 * 24) * _HOUR_MS)
                await t.settle()
            elif move == "crash":
                self.note("move crash")
                await self.turns()
                await self.crash()
            elif move == "fail":
                store.fail_appends()
                await self.turns()
                await self.crash()
            elif move == "hold" and not store.holding:
                store.hold()
                await self.turns()
                if rng.random() < 0.5:
                    self.note("release")
                    store.release()  # a delayed flush
                    await self.turns()
                else:
                    await self.crash()  # the unflushed tail is lost
            elif move == "tear":
                store.tear_next(rng.random())
                for _ in range(200):
                    if t.engine.committer.failed is not None:
                        break
                    await asyncio.sleep(0)
                await self.crash()
            if t.engine.committer.failed is not None:
                # A failed store stops the engine until it is reopened.
                await self.crash()
        await self.turns()
        if store.holding or t.engine.committer.failed is not None:
            await self.crash()

    # --- the quiet phase ---------------------------------------------------------------------

    async def drain(self) -> None:
        """Waits for the calls in flight, moving time on; gives up on those that never return."""
        for _ in range(60):
            if not self.tasks:
                return
            await self.t.advance("10s")
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def resend_unacknowledged(self) -> None:
        for _ in range(4):
            await self.drain()
            todo = [op for op in self.ops if not op.acked and not op.refused]
            if not todo:
                return
            for op in todo:
                self.send(op)
        await self.drain()

    async def quiet_phase(self) -> None:
        await self.resend_unacknowledged()
        # Senders end before their inboxes are stopped, so that each send
        # finds its inbox waiting; a last item races each stop.
        await self._run_to_end([id for id in self._ids() if not id.startswith("inbox-")])
        for op in self._started("sim_inbox"):
            if op.acked:
                self.send(_Op("signal", op.id, "stop", STOP))
                if self.rng.random() < 0.3:
                    self.counter += 1
                    self.send(_Op("signal", op.id, f"item-{self.counter}", self.counter))
        await self.resend_unacknowledged()
        ids = self._ids()
        # A tree's descendants: each started one ends (a cancel reaches it).
        grown = [id for op in self._started("sim_tree") if op.acked for id in tree_ids(op.id)]
        ids += [id for id in grown if await self.store.get(id) is not None]
        await self._run_to_end(ids)
        for id in ids:
            row = await self.store.get(id)
            if row is None or row.status not in FINISHED_STATUSES:
                status = None if row is None else row.status
                self.violation("never_finished", f"run {id} is still {status} once faults stopped")
        outcomes = await self._outcomes()
        await self._check_outcomes(outcomes)
        await self.check()
        await self.crash()
        if (again := await self._outcomes()) != outcomes:
            changed = {
                id: (outcomes.get(id), v) for id, v in again.items() if v != outcomes.get(id)
            }
            self.violation("result_changed", f"results changed in a crash: {changed}")

    async def _run_to_end(self, ids: list[str]) -> None:
        for _ in range(200):
            if all([await self._finished(id) for id in ids]):
                return
            await self.t.advance("6h")

    def _ids(self) -> list[str]:
        ids = [op.id for op in self.ops if op.kind == "start" and op.acked]
        ids += [f"{op.id}-kid" for op in self._started("sim_parent") if op.acked]
        return ids

    async def _finished(self, id: str) -> bool:
        row = await self.store.get(id)
        return row is not None and row.status in FINISHED_STATUSES - {RunStatus.CONTINUED}

    async def _outcomes(self) -> dict[str, Any]:
        got: dict[str, Any] = {}
        for op in self.ops:
            if op.kind != "start" or not op.acked or not await self._finished(op.id):
                continue
            try:
                got[op.id] = await asyncio.wait_for(self.t.get(op.id).result(), 30)
            except (Exception, asyncio.CancelledError) as e:
                got[op.id] = f"raised {type(e).__name__}: {e}"
        return got

    async def _check_outcomes(self, outcomes: dict[str, Any]) -> None:
        def sender_ok(id: str) -> bool:
            return self.seen_ends.get(id, (0, -1, b""))[1] == 0

        by_id: dict[str, list[list[Any]]] = {}
        for (id, _), records in (await self._journals()).items():
            by_id.setdefault(id, []).append(records)
        check_outcomes(self.ops, outcomes, sender_ok, self.violation, behind_stops(by_id))

    # --- the checkers --------------------------------------------------------------------------

    async def check(self) -> None:
        self.figures["checks"] += 1
        journals = await self._journals()
        for (id, run), records in journals.items():
            for i, rec in enumerate(records):
                if isinstance(rec, Done) and i != len(records) - 1:
                    after = [type(r).__name__ for r in records[i + 1 :]]
                    self.violation("after_end", f"{id}/{run} has {after} after its Done")
        by_id: dict[str, list[list[Any]]] = {}
        for (id, _), records in journals.items():
            by_id.setdefault(id, []).append(records)
        # A queued run holds the signals sent to it in its queue item.
        held = {
            i.id: [_codec.decode(data)[1] for data in i.signals]
            for i in await self.store.queue_items()
            if i.state == "queued"
        }
        for op in self.ops:
            if op.kind == "start" and op.acked:
                await self._check_start(op, by_id.get(op.id, []))
            elif op.kind in ("signal", "update"):
                self._check_message(op, by_id.get(op.id, []), held.get(op.id, []))
        await self._check_ends(journals)
        self._check_steps()
        await self._check_queues()

    async def _check_queues(self) -> None:
        items = await self.store.queue_items(done=True)
        for q in self.queues:
            check_queue(q, [i for i in items if i.queue == q.name], self.violation)

    async def _journals(self) -> dict[tuple[str, int], list[Any]]:
        """Every journal as the engine reads it, by (id, run) in run order."""
        journals: dict[tuple[str, int], list[Any]] = {}
        for id, run in sorted(self.store.journals):
            try:
                entries = await self.store.load(id, run)
            except NotFound:
                continue
            records = []
            for lsn, data in entries:
                try:
                    records.append(decode(data))
                except Exception as e:
                    self.violation("decodes", f"record {lsn} of {id}/{run}: {e}")
            # What the engine reads: a torn batch (a fault this simulator
            # injects) may leave an unacknowledged start's prefix before the
            # run's real start; the engine never reads it, nor may a checker.
            records = through_end(records) if torn_prefix(records) else records
            journals[(id, run)] = records
        return journals

    async def _check_start(self, op: _Op, journals: list[list[Any]]) -> None:
        row = await self.store.get(op.id)
        if row is None:
            self.violation("acked_start", f"the acknowledged start of {op.id} has no row")
        elif row.status == RunStatus.QUEUED:
            # No journal until its queue admits it: its item stands for it.
            items = [
                i for i in await self.store.queue_items() if i.id == op.id and i.state == "queued"
            ]
            # Runs of the id before a REPLACE have journals; the queued one has none.
            mine = [j for j in journals if j and isinstance(j[0], Start) and j[0].run >= row.run]
            if len(items) != 1 or mine:
                self.violation(
                    "acked_start",
                    f"queued {op.id} has {len(items)} queue items and {len(mine)} journals",
                )
            return
        if not journals and (row is None or not await self._journal_now(op.id, row.run)):
            self.violation("acked_start", f"the acknowledged start of {op.id} has no journal")
        for records in journals:
            starts = [r for r in records if isinstance(r, Start)]
            if len(starts) != 1 or not isinstance(records[0], Start):
                self.violation("acked_start", f"a journal of {op.id} holds {len(starts)} starts")

    async def _journal_now(self, id: str, run: int) -> bool:
        """Whether run ``run`` of ``id`` has a `Start` now.

        The journals are read before the rows, while the reopened engine
        runs: a run its queue admitted before a crash may have had its
        `Start` written meanwhile, in the write that changed its row.
        """
        try:
            entries = await self.store.load(id, run)
        except (NotFound, CorruptRecord):  # CorruptRecord: a row without its journal
            return False
        return bool(entries) and isinstance(decode(entries[0][1]), Start)

    def _check_message(self, op: _Op, journals: list[list[Any]], held: list[int]) -> None:
        if op.kind == "signal":
            key = dedup_key(op.key)
            counts = [
                sum(1 for r in rs if isinstance(r, Signal) and r.dedup == key) for rs in journals
            ]
            # Held for a queued run (a repeat of one dedup id is recorded once).
            counts.append(min(1, held.count(key)))
        else:
            counts = [
                sum(1 for r in rs if isinstance(r, Update) and r.id == op.key) for rs in journals
            ]
        checker = f"acked_{op.kind}"
        if any(c > 1 for c in counts):
            times = max(counts)
            self.violation(checker, f"{op.kind} {op.key} to {op.id} is journaled {times} times")
        if op.acked and not any(counts):
            self.violation(checker, f"acknowledged {op.kind} {op.key} to {op.id} is in no journal")

    async def _check_ends(self, journals: dict[tuple[str, int], list[Any]]) -> None:
        for (id, run), records in journals.items():
            if not records or not isinstance(records[-1], Done):
                continue
            done = records[-1]
            if done.status.name == "CONTINUED":
                continue
            # Each run's end once seen stays; an id started again (REPLACE)
            # has a later run, whose end is the id's from then on.
            end = (run, int(done.status), done.payload)
            seen = self.run_ends.setdefault((id, run), end)
            if seen != end:
                self.violation("result_changed", f"the end of {id} changed: {seen} then {done}")
            if run >= self.seen_ends.get(id, end)[0]:
                self.seen_ends[id] = end

    def _check_steps(self) -> None:
        for life, key in self.t.step_log:
            if 0 < life <= len(self.durable_at_crash) and key in self.durable_at_crash[life - 1]:
                self.violation(
                    "step_ran_again", f"step {key} ran in life {life} though its result was durable"
                )


def check_queue(
    q: fusee.Queue, items: list[QueueItem], violation: Callable[[str, str], None]
) -> None:
    """The ``queue_limits`` checker: ``q``'s stored items never exceed its limits.

    At most ``concurrency`` admitted and not ended (``per_key`` of one key),
    and at most ``rate`` admissions in any window of its period (the store
    keeps ended items while a window may count them).
    """
    limits = q.limits
    admitted = [i for i in items if i.state == "admitted"]
    if limits.concurrency is not None and len(admitted) > limits.concurrency:
        ids = sorted(i.id for i in admitted)
        violation("queue_limits", f"queue {q.name} has {len(ids)} runs admitted at once: {ids}")
    keys = Counter(i.key for i in admitted if i.key is not None)
    if limits.per_key is not None and keys and max(keys.values()) > limits.per_key:
        violation("queue_limits", f"queue {q.name} admitted per key {dict(keys)}")
    if limits.rate_n is not None:
        times = sorted(i.admitted_ms for i in items if i.admitted_ms is not None)
        for n, at in enumerate(times):
            window = [t for t in times[: n + 1] if t > at - limits.rate_ms]
            if len(window) > limits.rate_n:
                violation(
                    "queue_limits",
                    f"queue {q.name} admitted {len(window)} runs within {limits.rate_ms} ms",
                )
                break


def behind_stops(by_id: Mapping[str, list[list[Any]]]) -> dict[str, set[int]]:
    """The items each inbox's journals hold behind a stop, which it never takes.

    An inbox takes its signals in the order they are journaled and returns at
    the first stop: an item acknowledged while a stop waited before it (both
    buffered while the inbox ran its checkpoint step, then carried into the
    next run) stays unconsumed, as the engine's warning says at the end.

    Args:
        by_id: Each id's journals, in run order.
    """
    behind: dict[str, set[int]] = {}
    for id, journals in by_id.items():
        stopped = False
        for records in journals:
            for rec in records:
                if not isinstance(rec, Signal) or rec.name != msg.name:
                    continue
                value = _codec.decode(rec.payload)
                if stopped:
                    behind.setdefault(id, set()).add(value)
                elif value == STOP:
                    stopped = True
    return behind


def check_outcomes(
    ops: list[_Op],
    outcomes: dict[str, Any],
    sender_ok: Callable[[str], bool],
    violation: Callable[[str, str], None],
    behind: Mapping[str, set[int]] | None = None,
) -> None:
    """The ``delivered`` checker: each run's end is what its input and its messages say.

    ``sender_ok(id)`` tells whether sender ``id`` completed (its send is
    durable); ``behind`` holds the items an inbox never takes (`behind_stops`).
    """
    replaced = {op.id for op in ops if op.kind == "start" and op.replace}
    for op in ops:
        if op.kind != "start" or op.id not in outcomes:
            continue
        got = outcomes[op.id]
        if op.id in replaced:
            if not op.replace:
                _check_replaced(ops, op.id, got, violation)
            continue
        if op.key == "sim_steps":
            want: Any = expected_of_steps(op.value)
        elif op.key == "sim_parent":
            spec = op.value
            want = (
                spec["before"]["value"] + expected_of_steps(spec["child"]) + spec["after"]["value"]
            )
        elif op.key in ("sim_cancellable", "sim_tree"):
            spec = op.value
            want = spec["book"]["value"] + spec["confirm"]["value"]
            # A cancel sent and not acknowledged may have been applied all the
            # same (its write torn after its record, or a crash before the
            # answer); a resend then finds the run ended and is refused.
            cancelled = any(c.kind == "cancel" and c.id == op.id for c in ops)
            if cancelled and isinstance(got, str) and "Cancelled" in got:
                continue
        elif op.key == "sim_sender":
            want = expected_of_sender(op.value)
        else:
            _check_inbox(ops, op.id, got, sender_ok, violation, (behind or {}).get(op.id, set()))
            continue
        if got != want:
            violation("delivered", f"{op.key} {op.id} returned {got!r}, not {want!r}")


def _check_replaced(
    ops: list[_Op], id: str, got: Any, violation: Callable[[str, str], None]
) -> None:
    """An id started again with REPLACE ends as its latest run: the last acknowledged
    start's, or a later one's that was applied without its answer."""
    starts = [op for op in ops if op.kind == "start" and op.id == id]
    acked = [n for n, op in enumerate(starts) if op.acked and not op.refused]
    later = starts[acked[-1] if acked else 0 :]
    wants = [expected_of_steps(op.value) for op in later]
    if got not in wants:
        violation("delivered", f"sim_steps {id} (replaced) returned {got!r}, not one of {wants!r}")


def _check_inbox(
    ops: list[_Op],
    id: str,
    got: Any,
    sender_ok: Callable[[str], bool],
    violation: Callable[[str, str], None],
    behind: set[int],
) -> None:
    mine = [op for op in ops if op.id == id]
    items = [op for op in mine if op.kind == "signal" and op.value != STOP]
    # Sends may find an inbox stopped early ended: only a waiting one must get them.
    early = any(op.key == "stop-early" for op in mine)
    acked = sorted(op.value for op in items if op.acked)
    sent = {op.value for op in items}
    # A sender that ended has sent its item: its `Send` was durable.
    for op in [o for o in ops if o.kind == "start" and o.key == "sim_sender"]:
        # A "child_send" sender sends its item to its own box instead.
        if op.value["target"] == id and op.value.get("shape") != "child_send":
            sent.add(op.value["item"])
            if not early and sender_ok(op.id):
                acked.append(op.value["item"])
    if not isinstance(got, dict):
        violation("delivered", f"inbox {id} ended with {got!r}")
        return
    received = got["got"]
    missing = sorted(set(acked) - set(received) - behind)
    if missing:
        violation("delivered", f"inbox {id} never received acknowledged items {missing}")
    if len(received) != len(set(received)):
        violation("delivered", f"inbox {id} received an item twice: {received}")
    if extra := sorted(set(received) - sent):
        violation("delivered", f"inbox {id} received items nobody sent: {extra}")
    updates = {op.key: op for op in mine if op.kind == "update"}
    low = sum(op.value for op in updates.values() if op.acked)
    high = sum(op.value for op in updates.values())
    if not low <= got["total"] <= high:
        violation(
            "delivered",
            f"inbox {id} totals {got['total']}; its updates account for {low} to {high}",
        )


def _describe(op: _Op) -> str:
    how = f" queue={op.queue} key={op.qkey}" if op.queue else ""
    how += " REPLACE" if op.replace else ""
    return f"{op.kind} {op.id} {op.key}{how}"


def _says_finished(e: BaseException) -> bool:
    return type(e).__name__ == "RunFinished" or "has finished" in str(e) or "ended" in str(e)


def _make_store(kind: str, directory: Path) -> Callable[[], Store]:
    if kind == "memory":
        memory = MemoryStore()
        return lambda: memory
    if kind == "sqlite":
        return lambda: SqliteStore(directory, durability="none")
    raise ValueError(f"store must be one of {', '.join(STORES)}, not {kind!r}")


def torn_prefix(records: list[Any]) -> bool:
    """Whether a journal starts over: a torn batch's start, then the run's real one."""
    return sum(1 for r in records if isinstance(r, Start)) > 1


async def simulate(
    seed: int, store: str = "memory", actions: int | None = None, *, late_reads: bool = False
) -> Report:
    """Runs one seed on ``store`` (``"memory"`` or ``"sqlite"``) and checks it.

    Args:
        seed: The seed: the same seed makes the same script.
        store: Which real store the fault wrapper wraps.
        actions: How many fault-phase moves (default: 30 to 70, chosen by the seed).
        late_reads: Answer reads of a run's row late, by turns a random of
            the seed's own chooses (`FaultyStore`): on the memory store this
            makes, deterministically, the interleavings a starved reader
            thread makes on SQLite, and leaves the seed's script as it is.

    Returns:
        The report: the violations found (none: the seed passed) and figures.
    """
    report = Report(seed, store, late_reads=late_reads)
    with tempfile.TemporaryDirectory(prefix=f"fusee-sim-{seed}-") as tmp:
        late = random.Random(f"late-reads-{seed}") if late_reads else None
        faulty = FaultyStore(_make_store(store, Path(tmp) / "store"), late)
        t = TestEngine(WORKFLOWS, faulty, queues=queues())
        sim = Sim(seed, t, faulty)
        async with t:
            try:
                await sim.fault_phase(actions or sim.rng.randint(30, 70))
                await sim.quiet_phase()
            except Exception as e:
                where = traceback.extract_tb(e.__traceback__)[-1]
                sim.violation(
                    "crashed",
                    f"the simulator stopped: {type(e).__name__}: {e} "
                    f"({Path(where.filename).name}:{where.lineno})",
                )
            finally:
                for task in list(sim.tasks):
                    task.cancel()
                with contextlib.suppress(Exception):
                    await asyncio.gather(*sim.tasks, return_exceptions=True)
        report.violations = sim.violations
        report.events = sim.events
        report.figures = {
            **sim.figures,
            **faulty.faults,
            "runs": sum(1 for op in sim.ops if op.kind == "start" and op.acked),
            "acked": sum(1 for op in sim.ops if op.acked),
            "steps_run": len(t.step_log),
        }
    return report


def run_seeds(
    seeds: list[int],
    store: str,
    say: Callable[[str], Awaitable[None] | None] = print,
    *,
    late_reads: bool = False,
) -> list[Report]:
    """Runs each seed in a fresh event loop, printing a line per seed."""
    reports = []
    for seed in seeds:
        report = asyncio.run(simulate(seed, store, late_reads=late_reads))
        say(report.summary())
        reports.append(report)
    return reports
