"""Messages to runs: signals, sends, queries, updates, cancels, resumes, completions, children.

Each wakes its run if it is parked, records what it carries, and returns
once that record is durable.

The rule: a message is acknowledged (its call returns) only once its record
is durable, and a signal is matched to waits in the order the journal
records them, so replay matches the same signal to the same wait.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from fusee import _codec
from fusee._driver import ReplayHost, RunDriver
from fusee._status import FINISHED_STATUSES
from fusee.engine._journal import decode_journal, error_pair
from fusee.engine._runs import unknown_workflow
from fusee.errors import FuseeError, NotFound
from fusee.machine import ChildCompleted, SignalMatched
from fusee.record import DETACHED, Child, Done, Parent, Signal, Start, Status, decode

if TYPE_CHECKING:
    from fusee.engine._engine import Engine
    from fusee.engine._state import RunState

__all__ = ["Messages"]

log = logging.getLogger("fusee")

_OK = Status.OK
_FAILED = Status.FAILED


class Messages:
    """Delivers messages to the runs of one engine.

    Example:
        See `fusee.Run.signal`, `fusee.Run.update` and friends, which call it.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._tokens = 0

    # --- signals -----------------------------------------------------------------------------

    def match(self, state: RunState) -> None:
        """Hands buffered signals to open waits, oldest wait first."""
        if not state.waits:
            return
        timers = self._engine.timers
        for seq in sorted(state.waits):
            name = state.waits[seq]
            for ordinal, (sname, payload) in enumerate(state.signals):
                if sname == name and ordinal not in state.consumed:
                    state.consumed.add(ordinal)
                    del state.waits[seq]
                    timers.disarm(state.id, seq)
                    state.driver.complete(seq, SignalMatched(ordinal, payload))
                    break

    async def signal(
        self, id: str, name: str, payload: bytes, dedup: int, by: bytes | None
    ) -> None:
        """Records signal ``name`` for run ``id``; returns once it is durable."""
        engine = self._engine
        engine.check_open()
        state = await engine.runs.wake(id)
        if state is None:
            row = await engine.store.get(id)
            raise FuseeError(
                f"run '{id}' has finished ({row.status if row else 'unknown'}); "
                f"signal '{name}' was not delivered: signals go to running runs"
            )
        if dedup and dedup in state.dedups:
            return
        if dedup:
            state.dedups.add(dedup)
        state.signals.append((name, payload))
        state.driver.append(Signal(state.run, name, dedup, payload, by))
        lsn = state.driver.machine.gate
        self.match(state)
        await engine.committer.durable(lsn)

    async def send(self, target: str, name: str, payload: bytes, sender: str) -> None:
        """A ``ctx.send`` of run ``sender``, once its record is durable."""
        try:
            await self.signal(target, name, payload, 0, _codec.encode(sender))
        except (NotFound, FuseeError) as e:
            log.warning(
                "run %r sent signal %r to %r, which was not delivered: %s", sender, name, target, e
            )

    # --- children ----------------------------------------------------------------------------

    async def start_child(self, parent: RunState, rec: Child) -> None:
        """Starts child ``rec`` of ``parent`` (or finds it started), once ``rec`` is durable."""
        engine = self._engine
        runs = engine.runs
        link = Parent(parent.id, parent.run, rec.seq)
        row = await engine.store.get(rec.id) if runs.loaded(rec.id) is None else None
        loaded = runs.loaded(rec.id)
        if loaded is not None or row is not None:
            entries: list[tuple[int, bytes]] = []
            if loaded is not None:
                # Checked from memory: a child started a moment ago (by the
                # parent's previous life, say) may not be in the store yet.
                parent_of = loaded.parent
            else:
                assert row is not None
                entries = await engine.store.load(rec.id, row.run)
                first = decode(entries[0][1]) if entries else None
                parent_of = first.parent if isinstance(first, Start) else None
            if parent_of != link:
                runs.fire(
                    parent.id,
                    parent.run,
                    rec.seq,
                    ChildCompleted(
                        _FAILED,
                        _codec.encode(
                            ["AlreadyExists", f"run id '{rec.id}' is taken by another run"]
                        ),
                    ),
                )
                return
            if row is not None and row.status in FINISHED_STATUSES and not rec.flags & DETACHED:
                done = decode(entries[-1][1])
                if isinstance(done, Done):
                    runs.fire(
                        parent.id, parent.run, rec.seq, ChildCompleted(done.status, done.payload)
                    )
            return
        wf = engine.workflows.get(rec.wtype)
        if wf is None:
            runs.fire(
                parent.id,
                parent.run,
                rec.seq,
                ChildCompleted(
                    _FAILED,
                    _codec.encode(
                        ["UnknownWorkflow", unknown_workflow(rec.wtype, engine.workflows)]
                    ),
                ),
            )
            return
        engine.create_run(wf, rec.id, rec.input, parent=link, policy=rec.flags)

    # --- queries and updates -----------------------------------------------------------------

    async def query(self, id: str, name: str, arg: bytes) -> Any:
        """Asks run ``id``'s query handler (a finished run is replayed to ask it)."""
        engine = self._engine
        engine.check_open()
        state = await engine.runs.wake(id)
        if state is not None:
            return _codec.decode(state.driver.query(name, arg))
        row = await engine.store.get(id)
        assert row is not None
        entries = await engine.store.load(id, row.run)
        records = decode_journal(id, row.run, entries)
        replay = RunDriver(ReplayHost(), engine.workflow(row.workflow), records, entries[-1][0])
        try:
            replay.start()
            return _codec.decode(replay.query(name, arg))
        finally:
            replay.close()

    async def update(self, id: str, name: str, update_id: str | None, payload: bytes) -> Any:
        """Offers update ``name`` to run ``id``; returns the handler's result once durable."""
        engine = self._engine
        engine.check_open()
        state = await engine.runs.wake(id)
        if state is None or state.driver.end is not None:
            raise FuseeError(f"run '{id}' has finished; update '{name}' was not delivered")
        self._tokens += 1
        token = self._tokens
        fut: asyncio.Future[tuple[Status, bytes]] = engine.loop.create_future()

        def answered(status: Status, out: bytes) -> None:
            lsn = state.driver.machine.gate
            engine.committer.on_durable(lsn, lambda: _settle(fut, (status, out)))

        # The run keeps its callers' futures: its end (or the engine's close)
        # answers them, and it does not park while one waits.
        state.updates.add(fut)
        try:
            state.driver.offer_update(
                token, name, update_id or f"{id}/update/{token}", payload, answered
            )
            status, out = await fut
        finally:
            state.updates.discard(fut)
        if status is _OK:
            return _codec.decode(out)
        t, m = error_pair(out)
        raise FuseeError(f"update '{name}' of run '{id}' failed: {t}: {m}")

    # --- cancel, resume, complete ------------------------------------------------------------

    async def cancel(self, id: str, reason: str) -> None:
        """Cancels run ``id``; returns once the request is durable."""
        engine = self._engine
        engine.check_open()
        state = await engine.runs.wake(id)
        if state is None:
            return
        state.driver.request_cancel(_codec.encode(reason))
        await engine.committer.durable(state.driver.machine.gate)

    async def resume(self, id: str) -> None:
        """Gives run ``id``'s paused steps a fresh retry budget."""
        engine = self._engine
        engine.check_open()
        state = await engine.runs.wake(id)
        if state is None:
            return
        for rec in state.driver.machine.resume(None):
            state.driver.append(rec)
        state.resumed.set()
        engine.host.turned(state.driver)
        await engine.committer.durable(state.driver.machine.gate)

    async def complete(self, token: str, value: Any = None) -> None:
        """Resolves the ``ctx.await_completion`` that handed out ``token``."""
        engine = self._engine
        engine.check_open()
        try:
            id, run, seq, attempt = token.rsplit("/", 3)
            run_n, seq_n, attempt_n = int(run), int(seq), int(attempt)
        except (AttributeError, ValueError):
            raise ValueError(f"{token!r} is not an await_completion token") from None
        state = await engine.runs.wake(id)
        if state is None or state.run != run_n:
            return
        data = _codec.encode(value, name="the completion's value")
        if state.driver.complete_async(seq_n, attempt_n, _OK, data):
            await engine.committer.durable(state.driver.machine.gate)

    def release_updates(self) -> None:
        """Answers every waiting update caller (the engine closes)."""
        closed = _codec.encode(["EngineClosed", "the engine closed before the update's answer"])
        for state in self._engine.runs.all():
            for fut in list(state.updates):
                _settle(fut, (Status.CANCELLED, closed))


def _settle(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)
