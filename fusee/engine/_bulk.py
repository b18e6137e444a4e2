"""Bulk actions: cancel, resume or fork every run a filter matches (``cancel_many`` and kin).

The engine and the `fusee.Client` share them: the runs are read from the
store a page at a time, by start time then id (a cursor, as ``list()``
pages), and acted on through `fusee.Run` handles, a page's runs at once.

The rule: each matching run is acted on once. The page cursor never goes
back, and runs started after the call began (the forks it makes, say) are
past its time bound, so they are never matched.
"""

from __future__ import annotations

import abc
import asyncio
import datetime
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from fusee._status import FINISHED_STATUSES, RunStatus
from fusee.engine._fork import last_failure
from fusee.engine._run import Run, RunOperations
from fusee.errors import FuseeError
from fusee.remote._journal import decode_journal
from fusee.store import RUN_STATUSES, RunRow, Store

if TYPE_CHECKING:
    import builtins

__all__ = ["BATCH", "BulkActions", "BulkResult", "Filters", "bulk"]

BATCH: Final = 100
"""How many runs a bulk action reads, then acts on at once."""


@dataclass(frozen=True, slots=True)
class BulkResult:
    """What a bulk action (``cancel_many``, ``resume_many``, ``fork_many``) did.

    Attributes:
        done: The ids of the runs it acted on (with ``dry_run``: would act on),
            in start order. For ``fork_many``, the new runs' ids.
        skipped: The runs it matched but did not act on, each with why (it
            finished meanwhile, has no failed step to fork from, ...).

    Example:
        >>> result = BulkResult(("a", "b"), {"c": "run 'c' has finished"})
        >>> (len(result.done), list(result.skipped))
        (2, ['c'])
    """

    done: tuple[str, ...] = ()
    skipped: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Filters:
    """A bulk action's filters, as ``list()`` takes them, plus a start-time window."""

    status: str | None = None
    workflow: str | None = None
    attributes: Mapping[str, Any] | None = None
    started_from: datetime.datetime | None = None
    started_to: datetime.datetime | None = None

    def check(self) -> None:
        if self.status is not None and self.status not in RUN_STATUSES:
            raise ValueError(
                f"status {self.status!r} is not one of {', '.join(sorted(RUN_STATUSES))}"
            )
        for name in ("started_from", "started_to"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, datetime.datetime):
                raise TypeError(f"{name} must be a datetime.datetime, not {value!r}")


def _ms(when: datetime.datetime | None) -> int | None:
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.astimezone()  # a naive time is local time
    return int(when.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class Act:
    """What a bulk action does to one run: ``fn`` returns the id to report as done."""

    fn: Callable[[Run[Any], RunRow], Awaitable[str]]
    unfinished_only: bool = True
    """Whether it matches only runs that have not finished (a cancel, a resume)."""


async def bulk(
    ops: RunOperations,
    store: Store,
    filters: Filters,
    act: Act,
    *,
    now_ms: int,
    status_of: Callable[[RunRow], str] | None = None,
    dry_run: bool = False,
    batch: int = BATCH,
) -> BulkResult:
    """Acts with ``act`` on every run ``filters`` match, a page of ``batch`` at a time.

    ``status_of``: the status a row's run has (the engine's, from a loaded
    run; default: the row's). ``now_ms``: runs that start later are not
    matched.
    """
    filters.check()
    if type(batch) is not int or batch < 1:
        raise ValueError(f"batch must be an int of 1 or more, not {batch!r}")
    to_ms = _ms(filters.started_to)
    to_ms = now_ms if to_ms is None else min(to_ms, now_ms)
    # Without `status_of` the store filters by the rows' status.
    by_store = filters.status if status_of is None else None
    done: builtins.list[str] = []
    skipped: dict[str, str] = {}
    after: tuple[int, str] | None = None
    while True:
        rows = await store.list(
            status=by_store,
            workflow=filters.workflow,
            attributes=filters.attributes,
            limit=batch,
            after=after,
            started_from_ms=_ms(filters.started_from),
            started_to_ms=to_ms,
        )
        if not rows:
            break
        after = (rows[-1].started_ms, rows[-1].id)
        matched = []
        for r in rows:
            status = status_of(r) if status_of is not None else r.status
            if filters.status is not None and status != filters.status:
                continue
            if act.unfinished_only and status in FINISHED_STATUSES:
                continue
            matched.append(r)
        if dry_run:
            done.extend(r.id for r in matched)
        else:
            outcomes = await asyncio.gather(
                *(_one(act, Run(ops, r.id), r) for r in matched), return_exceptions=False
            )
            for r, (ok, text) in zip(matched, outcomes, strict=True):
                if ok:
                    done.append(text)
                else:
                    skipped[r.id] = text
        if len(rows) < batch:
            break
    return BulkResult(tuple(done), skipped)


async def _one(act: Act, run: Run[Any], row: RunRow) -> tuple[bool, str]:
    try:
        return True, await act.fn(run, row)
    except FuseeError as e:
        # The run changed meanwhile (it finished, or was deleted): the others go on.
        return False, str(e)


def cancel(reason: str) -> Act:
    """The act of ``cancel_many``."""

    async def act(run: Run[Any], row: RunRow) -> str:
        await run.cancel(reason)
        return run.id

    return Act(act)


async def _resume(run: Run[Any], row: RunRow) -> str:
    await run.resume()
    return run.id


resume: Final = Act(_resume)
"""The act of ``resume_many``."""


def fork_at_last_failure(store: Store, new_id: str) -> Act:
    """The act of ``fork_many``: a fork before the run's last failed step.

    ``new_id`` is a format string: ``{id}`` stands for the run's id.
    """
    if "{id}" not in new_id:
        raise ValueError(
            f"new_id must contain '{{id}}' (each fork's id is made from its run's), not {new_id!r}"
        )

    async def act(run: Run[Any], row: RunRow) -> str:
        if row.status == RunStatus.QUEUED:
            raise FuseeError(f"run {run.id!r} is queued: it has no failed step to fork from")
        records = decode_journal(run.id, row.run, await store.load(run.id, row.run))
        at = last_failure(records)
        if at is None:
            raise FuseeError(f"run {run.id!r} has no failed step to fork from")
        forked = await run.fork(new_id.replace("{id}", run.id), at=at)
        return forked.id

    return Act(act, unfinished_only=False)


class BulkActions(abc.ABC):
    """``cancel_many``, ``resume_many``, ``fork_many``: shared by `fusee.Engine` and `fusee.Client`.

    A class using it provides ``store`` and ``_bulk`` (which runs `bulk`
    with its run operations and its clock).
    """

    store: Store

    @abc.abstractmethod
    async def _bulk(self, filters: Filters, act: Act, dry_run: bool) -> BulkResult:
        """Implemented by the class that uses this one."""

    async def cancel_many(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        started_from: datetime.datetime | None = None,
        started_to: datetime.datetime | None = None,
        reason: str = "cancelled",
        dry_run: bool = False,
    ) -> BulkResult:
        """Cancels every run the filters match (as ``list()`` takes them), each once, in batches.

        Only runs that have not finished match. ``started_from`` and
        ``started_to`` bound the start time (inclusive); runs started after
        the call began are not matched. A run that ends meanwhile is
        skipped, with why (`BulkResult.skipped`). ``dry_run``: only say which
        runs it would cancel.

        Raises:
            ValueError: An unknown status.

        Example:
            >>> async def main(engine: Engine) -> None:
            ...     result = await engine.cancel_many(workflow="checkout", status="paused")
            ...     print(len(result.done), "cancelled")
        """
        filters = Filters(status, workflow, attributes, started_from, started_to)
        return await self._bulk(filters, cancel(reason), dry_run)

    async def resume_many(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        started_from: datetime.datetime | None = None,
        started_to: datetime.datetime | None = None,
        dry_run: bool = False,
    ) -> BulkResult:
        """Resumes the paused steps of every run the filters match, as ``cancel_many`` goes.

        Example:
            >>> async def main(client: Client) -> None:
            ...     await client.resume_many(status="paused", workflow="checkout")
        """
        filters = Filters(status, workflow, attributes, started_from, started_to)
        return await self._bulk(filters, resume, dry_run)

    async def fork_many(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        started_from: datetime.datetime | None = None,
        started_to: datetime.datetime | None = None,
        new_id: str = "{id}-retry",
        dry_run: bool = False,
    ) -> BulkResult:
        """Forks every run the filters match at its last failed (or paused) step.

        Each fork (``run.fork``) copies its run's journal before that step
        and goes on live from there; ``new_id`` makes its id (``{id}``
        stands for the run's). A run with no failed step is skipped.
        `BulkResult.done` lists the new runs (with ``dry_run``: the runs).

        Raises:
            ValueError: ``new_id`` without ``{id}``, or an unknown status.

        Example:
            >>> async def main(engine: Engine) -> None:
            ...     forks = await engine.fork_many(status="failed", workflow="checkout")
        """
        act = fork_at_last_failure(self.store, new_id)
        filters = Filters(status, workflow, attributes, started_from, started_to)
        return await self._bulk(filters, act, dry_run)
