"""The engine's inbox: the commands clients post to its store, applied and answered.

`fusee.Client` and the ``fusee`` CLI post `fusee.store.Command` rows; the
engine that serves the store takes them (`Store.take_commands`, woken by
`Store.wait_commands`), applies each through the engine's own API (`start`,
a run's signal, update, query, cancel, resume and fork, `complete`) and answers it
with the result or the error, which the poster raises again with its type
(the wire format both sides share: `fusee.remote._wire`).

The rule: a command takes effect at most once. A command is taken again
only by an engine's next life (it stopped before answering), and each kind
is applied so that a second time changes nothing: a signal carries the
command's id as its dedup id, an update its id, a start taken again that
finds its run answers as applied (a fork too), and cancel, resume and complete are
idempotent. A signal whose dedup id the run's journal holds already is
answered as applied, even once the run has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

from fusee import _codec
from fusee import errors as _errors
from fusee._definitions import checked
from fusee._status import RunStatus
from fusee.engine._leases import APPLYING
from fusee.engine._run import IdPolicy, dedup_key
from fusee.errors import AlreadyExists, FuseeError, NotFound, PayloadError, StaleLease
from fusee.machine import ChildCompleted
from fusee.record import Child, Parent, Signal, Status
from fusee.remote._journal import decode_journal
from fusee.remote._wire import decode_payload, encode_error, encode_payload
from fusee.store import Command

if TYPE_CHECKING:
    from fusee._definitions import WorkflowDef
    from fusee._queue import Queue
    from fusee.engine._commit import Committer
    from fusee.engine._leases import Leases
    from fusee.engine._messages import Messages
    from fusee.engine._retention import Retention
    from fusee.engine._runs import Runs
    from fusee.engine._schedules import Scheduler
    from fusee.engine._telemetry import Telemetry
    from fusee.store import Store

__all__ = ["Inbox"]

log = logging.getLogger("fusee")

# How long the inbox waits for a wake-up before it looks anyway (the
# fallback when a store's hint is lost: a dropped LISTEN connection).
_IDLE_S: Final = 1.0
# Commands taken per trip to the store.
_BATCH: Final = 100
# Answers are kept this long for their posters, then forgotten.
_KEEP_ANSWERS_MS: Final = 3_600_000
_FORGET_EVERY_S: Final = 600.0
# Kinds that wait for the run (an update's handler, a query of a parked
# run): they follow the commands before them to their run, but the next
# ones do not wait for them.
_NOT_CHAINED: Final = frozenset({"update", "query"})


class Operations(Protocol):
    """The engine's operations on runs that the inbox applies commands through (`Engine`'s)."""

    def workflow(self, workflow: WorkflowDef[Any, Any] | str) -> WorkflowDef[Any, Any]: ...

    async def begin(
        self,
        wf: WorkflowDef[Any, Any],
        id: str,
        data: bytes,
        *,
        id_policy: IdPolicy,
        queue: Queue | str | None,
        key: str | None,
        priority: int,
        debounce: Any,
        deadline_ms: int,
        not_before_ms: int,
    ) -> Any: ...

    async def start_tick(
        self, wf: WorkflowDef[Any, Any], id: str, data: bytes, *, queue: str | None, tick_ms: int
    ) -> None: ...

    async def complete(self, token: str, value: Any = None) -> None: ...

    async def _signal(
        self, id: str, name: str, payload: bytes, dedup: int, by: bytes | None
    ) -> None: ...

    async def _update(self, id: str, name: str, update_id: str | None, payload: bytes) -> Any: ...

    async def _query(self, id: str, name: str, arg: bytes) -> Any: ...

    async def _cancel(self, id: str, reason: str) -> None: ...

    async def _resume(self, id: str) -> None: ...

    async def _delete(self, id: str) -> None: ...

    async def _start_now(self, id: str) -> None: ...

    async def _fork(self, id: str, new_id: str, at: int | str, input: bytes | None) -> None: ...


class Inbox:
    """Serves one engine's inbox: a task from `start` (``Engine.recover``) to `stop`.

    Attributes:
        check_signal: Called with a signal's run id, name and payload before it is
            delivered (the ``fusee worker`` checks it against the signals its
            modules declare): returns a warning for the answer, or None;
            raises `fusee.PayloadError` to refuse it.
        on_answer: Called with each command applied, whether it succeeded,
            and the answer's fields (``message``, ``warning``, ``type``).
        stop_requested: Set by a ``stop`` command (the CLI's worker stops).

    Example:
        >>> async def main(engine: Engine) -> None:
        ...     engine.inbox.on_answer = lambda command, ok, fields: print(command.kind, ok)
    """

    def __init__(
        self,
        *,
        store: Store,
        committer: Committer,
        runs: Runs,
        loop: asyncio.AbstractEventLoop,
        leases: Leases | None,
        version: str,
        closed: Callable[[], bool],
        owns: Callable[[str], bool],
        telemetry: Telemetry,
        messages: Messages,
        retention: Retention,
        schedules: Scheduler,
        operations: Operations,
    ) -> None:
        self._store = store
        self._committer = committer
        self._runs = runs
        self._loop = loop
        self._leases = leases
        self._version = version
        self._closed = closed
        self._owns = owns
        self._telemetry = telemetry
        self._messages = messages
        self._retention = retention
        self._schedules = schedules
        self._operations = operations
        self._task: asyncio.Task[None] | None = None
        self._applying: set[asyncio.Task[None]] = set()
        # The last command applied to each run: the next one to it waits for it.
        self._chains: dict[str, asyncio.Task[None]] = {}
        self.check_signal: Callable[[str, str, bytes], str | None] | None = None
        self.on_answer: Callable[[Command, bool, dict[str, Any]], None] | None = None
        self.stop_requested = asyncio.Event()

    def start(self) -> None:
        """Starts serving, if the store keeps an inbox (every fusee store does)."""
        if self._task is None and hasattr(self._store, "take_commands"):
            # Not an engine task: the test host waits for those to finish,
            # and this one never does.
            self._task = self._loop.create_task(self._serve(), name="fusee-inbox")

    def stop(self) -> None:
        """Stops serving; commands being applied are left to the next life to take again."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        for applying in list(self._applying):
            applying.cancel()

    @property
    def applying(self) -> int:
        """How many commands are being applied now."""
        return len(self._applying)

    async def _serve(self) -> None:
        store = self._store
        next_forget = time.monotonic() + _FORGET_EVERY_S
        while not self._closed():
            leases = self._leases
            try:
                if leases is None:
                    commands = await store.take_commands(_BATCH)
                else:
                    # Only those for runs this worker serves (and stops).
                    commands = await store.take_commands(  # type: ignore[call-arg]
                        _BATCH, shards=list(leases.held)
                    )
            except Exception as e:  # the inbox outlives any one failure of its store
                if self._closed():
                    return
                log.warning("taking commands from the store failed; retrying: %s", e)
                await asyncio.sleep(_IDLE_S)
                continue
            for command in commands:
                self._dispatch(command)
            if len(commands) >= _BATCH:
                continue
            if time.monotonic() >= next_forget:
                next_forget = time.monotonic() + _FORGET_EVERY_S
                with contextlib.suppress(FuseeError):
                    await store.forget_commands(_now_ms() - _KEEP_ANSWERS_MS)
            try:
                await store.wait_commands(_IDLE_S)
            except Exception:
                if self._closed():
                    return
                await asyncio.sleep(_IDLE_S)

    def _dispatch(self, command: Command) -> None:
        before = self._chains.get(command.run_id)
        task = self._loop.create_task(self._run(command, before))
        self._applying.add(task)
        task.add_done_callback(self._applying.discard)
        if command.kind not in _NOT_CHAINED:
            self._chains[command.run_id] = task
            task.add_done_callback(lambda t: self._unchain(command.run_id, t))

    def _unchain(self, run_id: str, task: asyncio.Task[None]) -> None:
        if self._chains.get(run_id) is task:
            del self._chains[run_id]

    async def _run(self, command: Command, before: asyncio.Task[None] | None) -> None:
        id = command.run_id
        if before is not None:
            await asyncio.wait((before,))
        if command.kind != "stop" and not self._owns(id):
            # Its shard moved to another worker since it was taken: that
            # worker takes it (unanswered) and applies it.
            self._untake(command)
            return
        fields: dict[str, Any]
        APPLYING.set(True)  # this task's own context: the command's run is served here
        try:
            try:
                fields = await self._apply(command)
            except StaleLease:
                # The lease of its run's shard ran out while it was applied,
                # and nothing of it was written: whoever holds the shard now
                # takes it and applies it (this worker too, should it hold the
                # shard again), and its poster never hears of the move.
                self._untake(command)
                return
            ok = True
        except asyncio.CancelledError:
            if self._task is None:
                raise  # the engine stops: the next life takes the command again
            cancelled = _errors.Cancelled("cancelled")
            fields = {"error": encode_error(cancelled), "type": "Cancelled", "message": "cancelled"}
            ok = False
        except Exception as e:  # every command is answered: its poster waits for one
            if not isinstance(e, FuseeError | ValueError | TypeError | KeyError):
                log.exception("applying command %s (%s) failed", command.id, command.kind)
            error = e if not isinstance(e, KeyError) else PayloadError(f"missing field {e}")
            fields = {
                "error": encode_error(error),
                "type": type(error).__name__,
                "message": f"{command.kind} of run {id!r} failed: {error}"
                if command.kind != "signal" or not isinstance(error, PayloadError)
                else str(error),
            }
            ok = False
        try:
            await self._store.answer_command(command.id, ok, encode_payload(fields))
        except FuseeError as e:
            log.error("answering command %s (%s) failed: %s", command.id, command.kind, e)
            return
        if self.on_answer is not None:
            try:
                self.on_answer(command, ok, fields)
            except Exception:
                log.exception("the inbox's on_answer hook failed")

    def _untake(self, command: Command) -> None:
        # Taken again by this engine too, should its shard come back.
        untake = getattr(self._store, "untake_command", None)
        if untake is not None:
            untake(command.id)

    async def _apply(self, command: Command) -> dict[str, Any]:
        ops = self._operations
        p = decode_payload(command.payload)
        id = command.run_id
        kind = command.kind
        if kind == "start" and "parent" in p:
            parent_id, parent_run, seq = p["parent"]
            link = Parent(str(parent_id), int(parent_run), int(seq))
            child = Child(
                int(parent_run),
                int(seq),
                str(p["workflow"]),
                id,
                int(p.get("flags") or 0),
                int(p.get("deadline_ms") or 0),
                bytes(p["input"]),
            )
            queued = p.get("queued")
            await self._messages.start_child_of(
                link,
                child,
                dropped=bool(p.get("dropped")),
                queued=(str(queued[0]), queued[1]) if queued else None,
                trace=bytes(p["trace"]) if p.get("trace") else None,
                not_before_ms=int(p.get("not_before_ms") or 0),
            )
            return {"message": f"started child run {id!r} of {link.id!r}"}
        if kind == "deliver":
            completion = ChildCompleted(Status(int(p["status"])), bytes(p["payload"]))
            await self._runs.deliver(id, int(p["run"]), int(p["seq"]), completion, settle=True)
            return {"message": f"delivered a child's end to run {id!r}"}
        if kind == "start" and p.get("scheduled_ms"):
            wf = ops.workflow(str(p["workflow"]))
            queue = p.get("queue")
            try:
                await ops.start_tick(
                    wf,
                    id,
                    bytes(p["input"]),
                    queue=None if queue is None else str(queue),
                    tick_ms=int(p["scheduled_ms"]),
                )
            except AlreadyExists:
                if command.attempt <= 1 or not await self._started_by_us(id, wf.name):
                    raise
            return {"message": f"started run {id!r} ({wf.name}) of a schedule's tick"}
        if kind == "start":
            wf = ops.workflow(str(p["workflow"]))
            value = wf.decode_input(bytes(p["input"]))
            policy = IdPolicy(p.get("id_policy") or IdPolicy.REJECT.value)
            debounce_ms = p.get("debounce_ms")
            try:
                trace = p.get("trace")
                with self._telemetry.attached(bytes(trace) if trace else None):
                    await ops.begin(
                        wf,
                        id,
                        checked(value, wf.decode_input, f"the input of run '{id}'", wf.input_type),
                        id_policy=policy,
                        queue=p.get("queue"),
                        key=p.get("key"),
                        priority=int(p.get("priority") or 0),
                        debounce=None if debounce_ms is None else int(debounce_ms) / 1000,
                        deadline_ms=int(p.get("deadline_ms") or 0),
                        not_before_ms=int(p.get("not_before_ms") or 0),
                    )
            except AlreadyExists:
                if command.attempt <= 1 or not await self._started_by_us(id, wf.name):
                    raise
            return {"message": f"started run {id!r} ({wf.name})"}
        if kind == "signal":
            name = str(p["name"])
            payload = bytes(p.get("payload") or _codec.encode(None))
            check = self.check_signal
            warning = check(id, name, payload) if check is not None else None
            # Without a dedup id of its own, the command's id is one: a command
            # applied again by the engine's next life signals once.
            dedup = int(p.get("dedup") or 0) or dedup_key(command.dedup or f"command/{command.id}")
            try:
                by = p.get("by")
                await ops._signal(id, name, payload, dedup, bytes(by) if by else None)
            except FuseeError as e:
                # A retry (the poster's, or this command taken again) after the
                # run ended: delivered already, so applied, as a retry is.
                if isinstance(e, NotFound) or not await self._delivered(id, dedup):
                    raise
            fields: dict[str, Any] = {"message": f"signal {name!r} delivered to run {id!r}"}
            if warning is not None:
                fields["warning"] = warning
            return fields
        if kind == "update":
            name = str(p["name"])
            update_id = p.get("update_id") or f"command/{command.id}"
            value = await ops._update(id, name, str(update_id), bytes(p["payload"]))
            return {"value": _codec.encode(value), "message": f"update {name!r} of run {id!r}"}
        if kind == "query":
            name = str(p["name"])
            value = await ops._query(id, name, bytes(p.get("arg") or _codec.encode(None)))
            return {"value": _codec.encode(value), "message": f"query {name!r} of run {id!r}"}
        if kind == "cancel":
            await ops._cancel(id, str(p.get("reason") or "cancelled"))
            return {"message": f"run {id!r} cancelled"}
        if kind == "resume":
            await ops._resume(id)
            return {"message": f"run {id!r} resumed"}
        if kind == "delete":
            await ops._delete(id)
            return {"message": f"run {id!r} deleted"}
        if kind == "prune":
            count = await self._retention.prune(int(p["before_ms"]))
            return {"message": f"deleted {count} finished run(s)", "deleted": count}
        if kind == "start_now":
            await ops._start_now(id)
            return {"message": f"run {id!r} starts now"}
        if kind == "complete":
            await ops.complete(str(p["token"]), _codec.decode(bytes(p["value"])))
            return {"message": f"completed {p['token']!r}"}
        if kind == "fork":
            # Posted to the new run's id, from the old one's.
            id = str(p.get("from") or id)
            new_id = str(p["new_id"])
            at = p["at"]
            input = p.get("input")
            try:
                await ops._fork(id, new_id, at, None if input is None else bytes(input))
            except AlreadyExists:
                # Taken again after the engine's last life forked but did not
                # answer: the fork is one write, so a run under the new id
                # of the old run's workflow is this command's own.
                if command.attempt <= 1 or not await self._forked_by_us(id, new_id):
                    raise
            return {"message": f"run {id!r} forked as {new_id!r}"}
        if kind == "schedule":
            return await self._schedules.apply(id, str(p["action"]), p)
        if kind == "stop":
            self.stop_requested.set()
            return {"message": "worker stopping"}
        if kind == "version":
            # Which version serves the store (`fusee versions` on SQLite, one engine).
            return {"message": f"version {self._version!r}", "version": self._version}
        raise ValueError(f"command kind {kind!r} is not one this engine applies")

    async def _delivered(self, id: str, dedup: int) -> bool:
        """Whether run ``id``'s journal holds a signal with dedup key ``dedup``."""
        state = self._runs.loaded(id)
        if state is not None:
            # Ended here a moment ago (its journal not all in the store yet:
            # a queued run started and ended by a signal it held, say).
            await self._committer.durable(state.driver.machine.gate)
            return dedup in state.dedups
        store = self._store
        row = await store.get(id)
        if row is None or row.status == RunStatus.QUEUED:
            return False
        records = decode_journal(id, row.run, await store.load(id, row.run))
        return any(isinstance(rec, Signal) and rec.dedup == dedup for rec in records)

    async def _forked_by_us(self, id: str, new_id: str) -> bool:
        row = await self._store.get(id)
        return row is not None and await self._started_by_us(new_id, row.workflow)

    async def _started_by_us(self, id: str, workflow: str) -> bool:
        # Taken again after the engine's last life stopped before answering:
        # a run of that workflow under that id is this command's own start.
        await self._runs.loading_settled(id)
        loaded = self._runs.loaded(id)
        if loaded is not None:
            # Answered only once its start is durable: a crash would lose it.
            await self._committer.durable(loaded.start_lsn)
            return loaded.workflow.name == workflow
        row = await self._store.get(id)
        return row is not None and row.workflow == workflow


def _now_ms() -> int:
    return time.time_ns() // 1_000_000
