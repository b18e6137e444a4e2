"""Retention: deleting finished runs, by age (``Engine.open(..., retention=)``) or by hand.

The sweep runs off the hot path: a timer on the engine's clock (so a test's
virtual clock moves it) starts one engine task, which deletes the runs that
ended more than ``retention`` ago in small batches (`Store.delete_runs`, one
write each), yielding to the event loop between them, then arms the next
sweep. ``run.delete()`` and ``fusee prune`` go through `Retention.delete`
and `Retention.prune`.

The rule: the store decides, inside the write that deletes it, whether a run
may go (finished, and old enough); the engine then forgets what it kept in
memory about it and hands its id to `Retention.delete_blobs`. A deleted run
is gone for good: nothing the engine holds writes it back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final

from fusee._durations import duration_ms
from fusee._payloads import delete_blobs_of
from fusee._status import RunStatus
from fusee.errors import FuseeError, RunNotFinished
from fusee.remote._journal import no_run

if TYPE_CHECKING:
    from fusee.engine._clock import Clock, TimerHandle
    from fusee.engine._commit import Committer
    from fusee.engine._runs import Runs
    from fusee.engine._state import RunState
    from fusee.store import Store

__all__ = ["BATCH", "Retention", "retention_ms"]

log = logging.getLogger("fusee")

BATCH: Final = 100
"""How many runs one write of a sweep or a prune deletes."""

# Before each batch a sweep waits this long at most for the runs' own writes
# to drain (checking every _QUIET_POLL_S): under steady load it goes on anyway.
_QUIET_MAX_S: Final = 0.05
_QUIET_POLL_S: Final = 0.002
# A sweep runs this often (a fraction of the retention, within bounds): a
# run is deleted at most that long after it becomes due.
_SWEEPS_PER_PERIOD: Final = 24
_MIN_EVERY_MS: Final = 1_000
_MAX_EVERY_MS: Final = 3_600_000


def retention_ms(value: Any, what: str = "retention") -> int | None:
    """A retention (a duration: ``"30d"``, seconds, a ``timedelta``) in ms; None stays None.

    Example:
        >>> retention_ms("2d")
        172800000
    """
    if value is None:
        return None
    try:
        ms = duration_ms(value)
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"{what} must be a duration such as '30d', '12h' or a number of seconds, "
            f"not {value!r} ({e})"
        ) from None
    if ms <= 0:
        raise ValueError(f"{what} must be a positive duration such as '30d', not {value!r}")
    return ms


class Retention:
    """An engine's deletes of finished runs: the periodic sweep, ``run.delete()``, prunes.

    Args:
        after_ms: Delete runs that ended this long ago (None: no sweep).
        store: The engine's store.
        committer: The engine's committer (a batch waits for it to go idle).
        clock: The engine's clock (the sweep's timer).
        runs: The engine's loaded runs (a loaded run is not finished).
        spawn: Starts an engine task.
        closed: Whether the engine is closed.
        check_open: Raises if the engine is closed.
        status_of: The status of a loaded run (the one a refusal names).
        forget_runs: Drops what the engine keeps of deleted runs.
    """

    def __init__(
        self,
        after_ms: int | None,
        *,
        store: Store,
        committer: Committer,
        clock: Clock,
        runs: Runs,
        spawn: Callable[[Coroutine[Any, Any, Any]], object],
        closed: Callable[[], bool],
        check_open: Callable[[], None],
        status_of: Callable[[RunState], RunStatus],
        forget_runs: Callable[[Iterable[str]], None],
    ) -> None:
        self._store = store
        self._committer = committer
        self._clock = clock
        self._runs = runs
        self._spawn = spawn
        self._closed = closed
        self._check_open = check_open
        self._status_of = status_of
        self._forget_runs = forget_runs
        self.after_ms = after_ms
        self._every_ms = (
            0
            if after_ms is None
            else min(max(after_ms // _SWEEPS_PER_PERIOD, _MIN_EVERY_MS), _MAX_EVERY_MS)
        )
        self._timer: TimerHandle | None = None
        self._stopped = False

    def start(self) -> None:
        """Sweeps now (what came due while no engine ran), then every so often."""
        if self.after_ms is not None:
            self._spawn(self._sweep())

    def stop(self) -> None:
        """Disarms the next sweep (one under way is cancelled with the engine's tasks)."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        if self._stopped:
            return
        clock = self._clock
        self._timer = clock.call_at(
            clock.now_ms() + self._every_ms, lambda: self._spawn(self._sweep())
        )

    async def _sweep(self) -> None:
        self._timer = None
        assert self.after_ms is not None
        try:
            await self.prune(self._clock.now_ms() - self.after_ms)
        except FuseeError as e:
            # A store outage: the next sweep tries again; nothing is lost.
            if not self._closed():
                log.warning("fusee retention: deleting finished runs failed (%s); will retry", e)
        finally:
            self._arm()

    async def prune(self, before_ms: int) -> int:
        """Deletes every run that ended before ``before_ms``, a batch per write; returns how many.

        On a store workers share, every worker may prune at once: each run
        is deleted by one of them.
        """
        total = 0
        while True:
            self._check_open()
            await self._quiet()
            gone = await self._store.delete_runs(finished_before_ms=before_ms, limit=BATCH)
            if gone:
                await self._forget(gone)
                total += len(gone)
            if len(gone) < BATCH:
                return total
            # Off the hot path: runs' writes go first between batches.
            await asyncio.sleep(0)

    async def _quiet(self) -> None:
        """Waits a little for the committer to go idle: a batch then delays no run's write."""
        committer = self._committer
        waited = 0.0
        while not committer.idle and waited < _QUIET_MAX_S:
            await asyncio.sleep(_QUIET_POLL_S)
            waited += _QUIET_POLL_S

    async def delete(self, id: str) -> None:
        """Deletes finished run ``id`` now (``run.delete()``).

        Raises:
            fusee.NotFound: No run has this id.
            fusee.RunNotFinished: It has not finished (cancel it first).
        """
        runs = self._runs
        self._check_open()
        await runs.loading_settled(id)
        # What was handed to the store about it (its end, its last row) is
        # stored first: the store then decides on what the engine knows.
        await self._committer.stored()
        state = runs.loaded(id)
        if state is not None:
            raise RunNotFinished(id, self._status_of(state))
        if id in runs.ending:
            # Ended, its sends and child starts not all delivered yet.
            raise RunNotFinished(id, RunStatus.RUNNING)
        gone = await self._store.delete_runs([id])
        if not gone:
            row = await self._store.get(id)
            if row is None:
                raise no_run(id)
            raise RunNotFinished(id, row.status)
        await self._forget(gone)

    async def _forget(self, ids: Sequence[str]) -> None:
        self._forget_runs(ids)
        await self.delete_blobs(ids)

    async def delete_blobs(self, ids: Sequence[str]) -> None:
        """The hook where the blobs of deleted runs ``ids`` are deleted (offloaded payloads).

        Called after the store deleted the runs: a crash in between leaves
        blobs no run refers to (space, never a run without its data).
        """
        try:
            await delete_blobs_of(self._store, ids)
        except Exception as e:  # the blob store's own errors: the runs are gone already
            log.warning("fusee retention: deleting the blobs of %d runs failed: %s", len(ids), e)
