"""The embedded engine: `Engine`, its opening, recovery and closing, and the run API.

It hosts runs (`_runs`), makes their journals durable by group commit
(`_commit`), runs their steps (`_steps`), fires their timers (`_timers`),
delivers messages to them (`_messages`), serves their streams (`_streams`)
and watches their code (`_watchdog`); `_host` is what their drivers call.

The rule: what leaves the process (a step function's run, a result handed
to a caller, a signal sent, a child started) waits until the records it
depends on are durable; nothing else waits for the disk.
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import AsyncIterator, Collection, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final

from fusee import _codec
from fusee._definitions import check_on_error, checked
from fusee._durations import deadline_after, duration_ms, not_before, parse_duration
from fusee._payloads import (
    DEFAULT_MAX_PAYLOAD,
    DEFAULT_OFFLOAD_OVER,
    DEFAULT_WARN_RECORDS,
    Payloads,
    RecordWatch,
    default_blobs,
    install,
)
from fusee._status import FINISHED_STATUSES, RunStatus
from fusee.engine import _bulk
from fusee.engine._bulk import BulkActions, BulkResult, Filters
from fusee.engine._carry import carried_from_records, carried_from_state
from fusee.engine._clock import Clock, WallClock
from fusee.engine._commit import Committer
from fusee.engine._deadlines import Deadlines
from fusee.engine._events import Events
from fusee.engine._fork import fork
from fusee.engine._hooks import Hooks
from fusee.engine._host import EngineHost
from fusee.engine._inbox import Inbox
from fusee.engine._leases import Leases, default_worker, forwards, is_shared
from fusee.engine._messages import Messages
from fusee.engine._queues import Queues
from fusee.engine._retention import Retention, retention_ms
from fusee.engine._router import Router
from fusee.engine._run import IdPolicy, Run, RunInfo, check_id, check_workflow, info_of
from fusee.engine._runs import Runs, unknown_workflow
from fusee.engine._schedules import Scheduler, check_schedules
from fusee.engine._starts import Executes, StartOptions
from fusee.engine._state import RunState
from fusee.engine._steps import StepExecutor
from fusee.engine._streams import Streams
from fusee.engine._telemetry import Telemetry
from fusee.engine._timers import Timers
from fusee.engine._watchdog import Watchdog
from fusee.errors import (
    AlreadyExists,
    DeterminismError,
    FuseeError,
    StaleLease,
    StoreError,
    UnknownWorkflow,
)
from fusee.machine import ChildCompleted
from fusee.record import (
    DETACHED,
    Done,
    Handled,
    Meta,
    Parent,
    Record,
    Signal,
    Start,
    Status,
    Waited,
    encode,
)
from fusee.remote import CompletionToken, Remote
from fusee.remote._journal import decode_journal, end_record, end_value, no_run
from fusee.remote._versions import check_version, derived_version, version_number
from fusee.remote._wire import deliver_command
from fusee.store import RunRow, Store, open_store

if TYPE_CHECKING:
    from types import TracebackType

    from fusee._definitions import WorkflowDef
    from fusee._events import EventDef
    from fusee._queue import Queue, QueueStats
    from fusee._schedule import Schedule
    from fusee.blobs import BlobStore
    from fusee.codecs import PayloadCodec

__all__ = ["Engine"]

log = logging.getLogger("fusee")

ENGINE_CLOSED: Final = "this engine is closed; open a new one with fusee.Engine.open(...)"

_STATUS_OF_END = {
    Status.OK: RunStatus.COMPLETED,
    Status.FAILED: RunStatus.FAILED,
    Status.CANCELLED: RunStatus.CANCELLED,
    Status.TIMED_OUT: RunStatus.FAILED,
    Status.CONTINUED: RunStatus.CONTINUED,
}

# Ended runs whose end `Run.result` answers from memory (`Engine._ends`),
# and runs this engine continued as new (`Engine._continued`): the newest kept.
_ENDS_KEPT = 1024
# How many rows `Engine.list` reads at a time while it filters by status.
_LIST_PAGE = 100


class Engine(BulkActions, Executes):
    """The embedded durable execution engine.

    Open it with `Engine.open` and use it as an async context manager.

    Example:
        >>> import asyncio, fusee
        >>> @fusee.workflow("add")
        ... async def add(ctx, n: int) -> int:
        ...     return await ctx.step("plus-one", lambda: n + 1)
        >>> async def main() -> int:
        ...     async with await fusee.Engine.open("memory", workflows=[add]) as engine:
        ...         return await engine.execute(add, "add-1", 41)
        >>> asyncio.run(main())
        42
    """

    def __init__(
        self,
        store: Store,
        workflows: Iterable[WorkflowDef[Any, Any]],
        *,
        shards: int = 4,
        park_after: Any = "5s",
        clock: Clock | None = None,
        profile: str | None = None,
        watchdog: Any = "2s",
        hooks: Hooks | None = None,
        lease: Any = "10s",
        worker: str | None = None,
        queues: Iterable[Queue] = (),
        schedules: Iterable[Schedule] = (),
        tracer_provider: Any = None,
        meter_provider: Any = None,
        write_timeout: Any = "5s",
        retention: Any = None,
        codecs: Iterable[PayloadCodec] = (),
        blobs: BlobStore | None = None,
        offload_over: Any = DEFAULT_OFFLOAD_OVER,
        max_payload: Any = DEFAULT_MAX_PAYLOAD,
        warn_records: int | None = DEFAULT_WARN_RECORDS,
        on_error: str = "fail",
        version: str | None = None,
    ) -> None:
        check_on_error(on_error, "Engine's")
        # What a bug in a workflow's code does when its workflow does not say.
        self.on_error = on_error
        if warn_records is not None and (type(warn_records) is not int or warn_records < 1):
            raise ValueError(f"warn_records must be an int >= 1 or None, got {warn_records!r}")
        self.payloads = Payloads(
            codecs, blobs=blobs, offload_over=offload_over, max_payload=max_payload
        )
        self.record_watch = RecordWatch(warn_records)
        # Always a door: without codecs it still reads what an earlier chain
        # wrote as an error saying which codec each payload needs.
        self.store = install(store, self.payloads, always=True)
        self.workflows: dict[str, WorkflowDef[Any, Any]] = {}
        for wf in workflows:
            if wf.name in self.workflows and self.workflows[wf.name] is not wf:
                raise ValueError(f"two workflows named '{wf.name}' were given to one engine")
            self.workflows[wf.name] = wf
        # The version its runs start on and run on (fusee.remote._versions).
        self.version = (
            check_version(version)
            if version is not None
            else derived_version(self.workflows.values())
        )
        self.version_number = version_number(self.version)
        # Whether a pinned run of another version waits for a worker of its
        # own: only under a version given to it (a release, a commit). A
        # derived version changes with every edit of a workflow: under one,
        # runs move to the code the engine has, under the patching rules, as
        # they did before versions were recorded.
        self.pins = version is not None
        if type(shards) is not int or shards < 1:
            raise ValueError(f"shards must be an int >= 1, got {shards!r}")
        self.park_after_ms = duration_ms(park_after)
        self.clock: Clock = clock if clock is not None else WallClock()
        given = "profile" if profile is not None else "FUSEE_PROFILE"
        profile = profile if profile is not None else os.environ.get("FUSEE_PROFILE")
        if profile not in (None, "", "dev"):
            raise ValueError(
                f"{given} must be 'dev' (strict replay, step timings) or unset for the "
                f"default, which is what production runs; got {profile!r}"
            )
        self.strict = profile == "dev"
        self.watchdog_s = parse_duration(watchdog) if watchdog is not None else None
        self.hooks = hooks if hooks is not None else Hooks()
        # The engine's own loop. Host callbacks run inside workflow turns,
        # where the running loop is the run's WorkflowLoop: never ask asyncio.
        self.loop: asyncio.AbstractEventLoop = asyncio.get_running_loop()
        if isinstance(self.clock, WallClock):
            self.clock.loop = self.loop
        self.committer = Committer(
            store,
            on_fail=self._store_failed,
            clock=self.clock,
            write_timeout_s=parse_duration(write_timeout) if write_timeout is not None else None,
        )
        # On a store several workers share, this engine serves the runs of the
        # shards it leases (the store's shards, then), and reaches the others
        # through the store's inbox.
        self.leases: Leases | None = None
        if is_shared(store):
            self.leases = Leases(
                store,  # type: ignore[arg-type]
                lease_s=parse_duration(lease),
                owner=worker if worker is not None else default_worker(),
                committer=self.committer,
                version=self.version,
                lost_shards=self.lost_shards,
                recover_shards=self.recover_shards,
                drop_shards=self.drop_shards,
                pins=self.pins,
                lanes_changed=lambda shards: self.spawn(self.lanes_changed(shards)),
                look_again=lambda: self.queues.look_again(),
            )
            shards = self.leases.count
            self.committer.fenced(self.leases.fence, self.leases.shard_of, self.lost_shards)
        self.remote = Remote(store, workflows=self.workflows, closed_message=ENGINE_CLOSED)
        self.host = EngineHost(
            committer=self.committer,
            clock=self.clock,
            hooks=self.hooks,
            payloads=self.payloads,
            strict=self.strict,
            park_after_ms=self.park_after_ms,
            spawn=self.spawn,
            parts=self,
            record_watch=self.record_watch,
        )
        self.runs = Runs(
            shards,
            store=self.store,
            committer=self.committer,
            clock=self.clock,
            loop=self.loop,
            host=self.host,
            workflows=self.workflows,
            version=self.version,
            version_number=self.version_number,
            pins=self.pins,
            strict=self.strict,
            on_error=self.on_error,
            record_watch=self.record_watch,
            spawn=self.spawn,
            check_open=self.check_open,
            closed=lambda: self.closed,
            owns=self.owns,
            stuck_error=self.stuck_error,
            fail_waiters=self.fail_waiters,
            parts=self,
        )
        self.timers = Timers(
            self.clock,
            self.loop,
            self.runs.shard,
            self.runs.fire,
            self.runs.wake_soon,
            lambda id, run: self.deadlines.expire(id, run),
        )
        self.messages = Messages(
            store=self.store,
            committer=self.committer,
            clock=self.clock,
            loop=self.loop,
            runs=self.runs,
            timers=self.timers,
            host=self.host,
            remote=self.remote,
            leases=self.leases,
            workflows=self.workflows,
            workflow=self.workflow,
            spawn=self.spawn,
            check_open=self.check_open,
            closed=lambda: self.closed,
            owns=self.owns,
            create_run=self.create_run,
            outbox_done=self.outbox_done,
            continue_run=self._continue,
            parts=self,
        )
        self.router = Router(
            messages=self.messages,
            remote=self.remote,
            runs=self.runs,
            leases=self.leases,
            owns=self.owns,
            check_open=self.check_open,
        )
        self.deadlines: Deadlines = Deadlines(
            timers=self.timers,
            spawn=self.spawn,
            cancel=self.router.cancel,
            loaded_run=self._loaded_run,
        )
        self.streams = Streams(store, self.committer, self.check_open)
        self.events = Events(store, self.committer, self.clock, self.loop, self.check_open)
        self.events.wait = self.hooks.wait_result
        self.steps = StepExecutor(self.host, self.loop)
        self.steps.max_payload = self.payloads.max_payload
        self.telemetry = Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)
        self.closed: bool = False
        self._results: dict[str, list[asyncio.Future[None]]] = {}
        # Starts in flight, by id: an ATTACH to one returns once it is durable.
        self._starting: dict[str, list[asyncio.Future[None]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stuck: dict[str, DeterminismError] = {}
        # How the last runs to end ended: `Run.result` soon after the end
        # (a caller that started many runs, then asks each) reads no store.
        # The runs (id, run) this engine continued as new, newest last: a
        # "continued" row read before the next run started (and, maybe,
        # ended) is never continued twice.
        self._continued: collections.OrderedDict[tuple[str, int], None] = collections.OrderedDict()
        self._ends: collections.OrderedDict[str, tuple[WorkflowDef[Any, Any], Done]] = (
            collections.OrderedDict()
        )
        self._watchdog: Watchdog | None = None
        self.queues: Queues = Queues(
            queues,
            store=self.store,
            committer=self.committer,
            clock=self.clock,
            loop=self.loop,
            runs=self.runs,
            leases=self.leases,
            workflows=self.workflows,
            version=self.version,
            version_number=self.version_number,
            spawn=self.spawn,
            closed=lambda: self.closed,
            owns=self.owns,
            result_ready=self.result_ready,
            attached=self.attached,
            create_run=self.create_run,
        )
        self.schedules = Scheduler(
            schedules,
            store=self.store,
            clock=self.clock,
            workflows=self.workflows,
            workflow=self.workflow,
            resolve_queue=self.queues.resolve,
            spawn=self.spawn,
            closed=lambda: self.closed,
            check_open=self.check_open,
            start_tick=self.start_tick,
            cancel=self._cancel,
            describe=self._describe,
            handle=lambda id: Run(self, id),
        )
        self.retention = Retention(
            retention_ms(retention),
            store=self.store,
            committer=self.committer,
            clock=self.clock,
            runs=self.runs,
            spawn=self.spawn,
            closed=lambda: self.closed,
            check_open=self.check_open,
            status_of=lambda state: self._info_of(self.runs.row(state)).status,
            forget_runs=self.forget_runs,
        )
        self.inbox = Inbox(
            store=self.store,
            committer=self.committer,
            runs=self.runs,
            loop=self.loop,
            leases=self.leases,
            version=self.version,
            closed=lambda: self.closed,
            owns=self.owns,
            telemetry=self.telemetry,
            messages=self.messages,
            retention=self.retention,
            schedules=self.schedules,
            operations=self,
        )

    # --- opening and closing -----------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        target: str | os.PathLike[str],
        *,
        workflows: Iterable[WorkflowDef[Any, Any]],
        shards: int = 4,
        park_after: Any = "5s",
        durability: str = "fsync",
        profile: str | None = None,
        watchdog: Any = "2s",
        lease: Any = "10s",
        worker: str | None = None,
        queues: Iterable[Queue] = (),
        schedules: Iterable[Schedule] = (),
        tracer_provider: Any = None,
        meter_provider: Any = None,
        write_timeout: Any = "5s",
        accept_loss: bool = False,
        retention: Any = None,
        codecs: Iterable[PayloadCodec] = (),
        blobs: BlobStore | None = None,
        offload_over: Any = DEFAULT_OFFLOAD_OVER,
        max_payload: Any = DEFAULT_MAX_PAYLOAD,
        warn_records: int | None = DEFAULT_WARN_RECORDS,
        on_error: str = "fail",
        version: str | None = None,
    ) -> Engine:
        """Opens an engine on ``target`` and recovers its unfinished runs.

        Args:
            target: A directory (SQLite in that directory, the embedded
                default), ``"memory"`` (keeps nothing) or a
                ``postgresql://`` URL (a store several workers share).
            workflows: The workflows this engine runs.
            shards: How many shards the runs are spread over.
            park_after: How long a suspended run stays in memory.
            durability: ``"fsync"`` (default) or ``"none"`` (tests, demos).
            profile: ``"dev"`` replays each run's journal against the code
                when it waits or ends, reporting a difference at once; None
                (default, for production) reads ``FUSEE_PROFILE``, and
                unset there too, does not. No other value is accepted.
            watchdog: Report workflow code that runs this long without
                yielding (None: never).
            lease: On a shared store, how long a shard lease lasts: a dead
                worker's runs move to the others once it runs out.
            worker: On a shared store, this worker's name (default: host,
                process and a random part); a worker started again under
                the same name takes its shards back at once.
            queues: The `fusee.Queue` values runs may be started through.
            schedules: The `fusee.Schedule` values this engine ticks
                (reconciled with the store's on open; see ``engine.schedules``).
            tracer_provider: The OpenTelemetry tracer provider its spans go
                to (default: the global one, as set when the engine opens).
            meter_provider: The OpenTelemetry meter provider its metrics go
                to (default: the global one).
            write_timeout: While the store takes no writes (a full disk, a
                lost connection), how long a call waits for its own write
                before it raises `fusee.StoreError` (None: as long as the
                outage lasts). Nothing acknowledged is lost either way, and
                the engine resumes by itself once the store takes writes.
            accept_loss: Open an SQLite store that is behind its high-water
                mark (its write-ahead log lost acknowledged records, which
                the open otherwise refuses with `fusee.StoreError`): the
                loss is logged at WARNING and recorded in the store.
            retention: Delete finished runs (completed, failed, cancelled)
                that ended longer ago than this duration (``"30d"``), whole:
                journal, row, events, streams. In small batches, off the hot
                path, from the open on (None, the default: keep every run).
            codecs: The payload codec chain (`fusee.PayloadCodec` values, e.g.
                ``[fusee.codecs.Zstd(), fusee.codecs.Encrypt(...)]``), applied
                in list order to every payload before it is journaled.
            blobs: Where payloads over ``offload_over`` are kept (a
                `fusee.BlobStore`); by default, for an SQLite directory,
                `fusee.blobs.Directory` in its ``blobs`` subdirectory; for
                the other stores none (payloads stay in the journal).
            offload_over: The size (after the codecs) above which a payload
                goes to ``blobs``: bytes, or text such as ``"256KiB"``.
            max_payload: The largest payload accepted (``"4MiB"`` by default;
                None: no limit): a start, signal, update or completion over it
                raises `fusee.PayloadTooLarge`, a step's result over it fails
                the step with it; nothing over it is recorded.
            warn_records: Past this many records in one run's journal, the
                engine logs one warning naming the run and suggesting
                continue-as-new (None: never).
            on_error: What a bug escaping a workflow's code does to its run
                when the workflow does not say (``@fusee.workflow(on_error=)``):
                ``"fail"`` (default) or ``"pause"`` (it waits, with its
                traceback, for a fix and ``run.resume()``).
            version: The engine's version (a release name, a git commit):
                every run records the one it started on, and a run of a
                ``versioning="pinned"`` workflow runs on its version only
                (see ``docs/deploys``). None: derived from the workflows'
                source (`fusee.remote._versions.derived_version`), recorded
                but pinning nothing: every run goes on with this code.

        Example:
            >>> async def main() -> None:
            ...     async with await Engine.open("./data", workflows=[]) as engine:
            ...         ...
        """
        path = os.fspath(target)
        if not isinstance(path, str) or not path:
            raise ValueError(
                "Engine.open needs a target: a directory path, 'memory' or a postgresql:// URL"
            )
        if "://" not in path and path != "memory" and os.path.isfile(path):
            raise ValueError(
                f"Engine.open({path!r}): that is a file, not a directory; pass the directory "
                "that holds (or will hold) fusee's database"
            )
        check_on_error(on_error, "Engine.open's")
        workflows, schedules = list(workflows), list(schedules)
        check_schedules(workflows, schedules)  # before the store opens: a bad list opens nothing
        retention_ms(retention)  # likewise
        if version is not None:
            check_version(version)
        store = open_store(path, durability=durability, accept_loss=accept_loss)
        await store.open()
        engine = cls(
            store,
            workflows,
            shards=shards,
            park_after=park_after,
            profile=profile,
            watchdog=watchdog,
            lease=lease,
            worker=worker,
            queues=queues,
            schedules=schedules,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            write_timeout=write_timeout,
            retention=retention,
            codecs=codecs,
            blobs=blobs if blobs is not None else default_blobs(path),
            offload_over=offload_over,
            max_payload=max_payload,
            warn_records=warn_records,
            on_error=on_error,
            version=version,
        )
        try:
            await engine.recover()
        except BaseException:
            await engine.close()
            raise
        return engine

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def recover(self) -> None:
        """Starts the engine's writers and picks up every unfinished run of its store."""
        self.committer.on_write = self.telemetry.commit_hook()
        self.committer.start()
        if self.watchdog_s is not None and sys.gettrace() is None:
            self._watchdog = Watchdog(
                self.runs.all,
                self.watchdog_s,
                self._watchdog_report,
                lambda: self.steps.inline_running,
            )
        if self.leases is not None:
            # Recovers the shards it takes, now and whenever it takes more.
            await self.leases.start()
        else:
            # Before any run loads: a recovered run's end frees its slot there.
            await self.queues.load()
            await self.recover_shards(None)
        self.inbox.start()
        await self.schedules.open()
        self.retention.start()

    async def recover_shards(self, shards: set[int] | None) -> None:
        """Picks up the unfinished runs and queue items of ``shards`` (None: the whole store)."""
        await self.recover_runs(shards)
        # A run that ended in continue-as-new starts its next run once its
        # `Done` is durable, in a later write: a row still "continued" at
        # open lost that write in a crash, so its next run starts now.
        for row in await self.store.list(status=RunStatus.CONTINUED):
            if shards is not None and self.runs.shard_index(row.id) not in shards:
                continue
            # Before anything else is served: a message to the id goes to
            # that next run.
            await self._continue(row)
        # In the background, as the runs above load: admitting queued runs
        # needs no unfinished run loaded first.
        self.spawn(self.queues.recover(shards))

    async def recover_runs(self, shards: set[int] | None, *, orphans: bool = False) -> None:
        """Picks up the unfinished runs of ``shards`` this engine serves and has not loaded.

        On a shared store, those of its lane, and those of lanes with no
        live worker when its lane is the newest with one (`Leases.serving`);
        with ``orphans``, only the latter (the live lanes changed).
        """
        if shards is None:
            rows = await self.store.unfinished()
        else:
            rows = await self.store.unfinished(shards=shards)  # type: ignore[call-arg]
        leases = self.leases
        elsewhere: dict[str, int] = {}
        for row in rows:
            if self.runs.loaded(row.id) is not None or self.runs.is_loading(row.id):
                continue
            if row.status == RunStatus.QUEUED:
                continue  # no code yet: `Queues.recover` admits it
            if leases is not None:
                lane = await leases.lane_of(row.version)
                if leases.serving(lane) != leases.lane or (orphans and lane == leases.lane):
                    continue  # its lane's workers run it, or this one already does
            wf = self.workflows.get(row.workflow)
            if (
                self.pins
                and row.version not in ("", self.version)
                and wf is not None
                and wf.versioning != "auto"
            ):
                # Pinned to the version it started on: a worker of that version runs it.
                elsewhere[row.version] = elsewhere.get(row.version, 0) + 1
                continue
            if row.status == RunStatus.SUSPENDED:
                self.runs.arm_wake(row)
            else:
                # Loaded by recovery: its outbox (sends, children) is
                # delivered again, as the crash may have lost it.
                self.spawn(self.runs.wake(row.id, row, recovering=True))
        for version, count in sorted(elsewhere.items()):
            log.warning(
                "%d unfinished run(s) started on version %r, pinned to it, are left to a worker "
                "of that version; this engine runs version %r (`fusee versions` lists them)",
                count,
                version,
                self.version,
            )

    async def lanes_changed(self, shards: set[int]) -> None:
        """The lanes with a live worker changed: what this engine serves of ``shards`` may have."""
        assert self.leases is not None
        await self.leases.reroute()
        await self.recover_runs(shards, orphans=True)
        await self.queues.recover(shards)

    def owns(self, id: str) -> bool:
        """Whether this engine serves run ``id`` (alone on its store: every run, until it closes).

        A closed engine serves no run: a handle's call goes to its `Remote`,
        closed with it, which says the engine is closed.
        """
        return not self.closed and (self.leases is None or self.leases.owns(id))

    def lost_shards(self, shards: list[int]) -> None:
        """Another worker took ``shards`` over: their runs are dropped at once."""
        assert self.leases is not None
        lost = self.leases.lose(shards)
        if lost:
            log.warning(
                "worker %s lost shards %s to another worker; their runs move there",
                self.leases.owner,
                ", ".join(str(s) for s in sorted(lost)),
            )
        # A run loaded while its shard was being given back is dropped too.
        self.drop_shards(shards)

    def drop_shards(self, shards: Collection[int]) -> None:
        """Unloads the runs of ``shards`` (this engine no longer serves them).

        Their steps in flight are abandoned (the next holder runs them again),
        their records not yet handed to the store are never written, and
        whoever waits here for their results goes on waiting through the
        store.
        """
        self.committer.drop(shards)
        for index in shards:
            shard = self.runs.shards[index]
            for state in list(shard.runs.values()):
                # An end not durable yet is lost with the shard: its row,
                # held back for the outbox, must never be written.
                state.take_final_row()
                self.runs.ending.pop(state.id, None)
                for t in state.steps:
                    t.cancel()
                if state.park_handle is not None:
                    state.park_handle.cancel()
                state.driver.close()
                self.messages.release_updates_of(state)
            shard.clear()
        # Whoever waits here for a result of those shards' runs waits through
        # the store from now on (`_result` looks again).
        dropped = set(shards)
        for id in [id for id in self.runs.ending if self.runs.shard_index(id) in dropped]:
            self.runs.ending.pop(id).final_row = None
        for id in [id for id in self._results if self.runs.shard_index(id) in dropped]:
            for fut in self._results.pop(id):
                if not fut.done():
                    fut.set_result(None)

    def _watchdog_report(self, text: str) -> None:
        self.hooks.watchdog_reports.append(text)

    async def _continue(self, row: RunRow) -> None:
        entries = await self.store.load(row.id, row.run)
        (start,) = decode_journal(row.id, row.run, entries[:1])
        done = end_record(row.id, row.run, entries)
        wf = self.workflows.get(row.workflow)
        if not isinstance(start, Start) or not isinstance(done, Done) or wf is None:
            log.warning("run %r continued as new but cannot be continued here", row.id)
            return
        runs = self.runs
        while True:
            # A load under way (a message to the id, which finds it continued)
            # may yet end: the next run starts once none is, unless it is there.
            await runs.loading_settled(row.id)
            # `row` may be old news: the next run may have started since it was
            # read, and even parked (not loaded, its row no longer "continued").
            latest = await self.store.get(row.id)
            if latest is None or latest.run != row.run or latest.status != RunStatus.CONTINUED:
                return
            if runs.loaded(row.id) is not None or (row.id, row.run) in self._continued:
                return
            if not runs.is_loading(row.id):
                break
            # Another message began loading it while the row was read: many
            # messages at once must not each leave the next run to another.
        records = decode_journal(row.id, row.run, entries)
        self._continue_as_new(
            wf,
            row.id,
            row.run,
            done.payload,
            start.parent,
            start.policy,
            unconsumed_signals(records),
            carried_from_records(records),
            start.meta.trace if start.meta is not None else None,
            start.deadline_ms,
            _scheduled_ms(start),
        )

    async def close(self) -> None:
        """Stops the engine: waits for in-flight writes, leaves every run to recover."""
        if self.closed:
            return
        self._stop()
        for task in list(self._tasks):
            task.cancel()
        states = self.runs.all()
        for state in states:
            for t in state.steps:
                t.cancel()
        tasks = list(self._tasks) + [t for st in states for t in st.steps]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await self.committer.close()
        self.runs.close_all()
        if self.leases is not None:
            await self.leases.stop()
        await self.store.close()

    def abandon(self) -> None:
        """Drops everything but the store, as a crash would (the test host's ``crash``)."""
        self._stop()
        self.committer.abandon()
        if self.leases is not None:
            self.leases.abandon()
        for task in list(self._tasks):
            task.cancel()
        for state in self.runs.all():
            if state.telemetry is not None:
                state.telemetry.lose()  # a crash loses the spans in flight
            for t in state.steps:
                t.cancel()
        self.runs.close_all()

    def _stop(self) -> None:
        self.closed = True
        self.host.closed = True
        self.remote.close()
        self.inbox.stop()
        # Stream readers and update callers of this engine hear that it
        # closed instead of waiting forever.
        self.streams.release_all()
        self.events.release_all()
        self.schedules.stop()
        self.retention.stop()
        self.messages.release_updates()
        if self._watchdog is not None:
            self._watchdog.stop()

    def check_open(self) -> None:
        """Raises if the engine is closed or its store failed."""
        if self.closed:
            raise FuseeError(ENGINE_CLOSED)
        if self.committer.failed is not None:
            raise self.committer.failed

    # --- tasks, divergence, waiters ----------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Runs ``coro`` as an engine task (kept referenced, its failure logged)."""
        task: asyncio.Task[Any] = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            if error is not None and (
                error is self.committer.failed or self.closed or isinstance(error, StaleLease)
            ):
                # The store's failure, reported once already; a task the
                # engine's stop cut short (a caller's call still in it); or
                # one whose run moved to another worker (it goes on there).
                return
            log.error("fusee engine task failed", exc_info=error)

    @property
    def tasks_in_flight(self) -> int:
        """How many engine tasks (waking runs, starting children) are running."""
        return len(self._tasks)

    def stuck_error(self, id: str) -> DeterminismError | None:
        """Why run ``id`` stopped, if its code diverged from its journal."""
        return self._stuck.get(id)

    def diverged(self, id: str, error: DeterminismError) -> None:
        """Run ``id``'s code diverged: it stops, and its result's waiters hear why."""
        self._stuck[id] = error
        log.error("run %r stopped: %s", id, error)
        state = self.runs.loaded(id)
        if state is not None and state.driver.end is None:
            state.mark(RunStatus.DIVERGED)
            self.runs.put_row(state)
        for fut in self._results.pop(id, []):
            if not fut.done():
                fut.set_result(None)

    def result_ready(self, id: str) -> None:
        """Run ``id``'s end changed outside a driver (a queued run cancelled, or a run queued).

        The end it remembers is forgotten, and its result's waiters look again.
        """
        self._ends.pop(id, None)
        for fut in self._results.pop(id, []):
            if not fut.done():
                fut.set_result(None)

    def fail_waiters(self, id: str, error: BaseException) -> None:
        """The waiters of run ``id``'s result get ``error`` (it cannot be loaded)."""
        for waiter in self._results.pop(id, []):
            if not waiter.done():
                waiter.set_exception(error)

    def _store_failed(self, error: StoreError) -> None:
        log.error("the store failed; runs stop until the engine is reopened: %s", error)
        # An update's answer waits for its outcome to be durable, which it
        # now never is: its caller hears why instead of waiting forever.
        self.messages.release_updates(f"the store failed before the update's answer: {error}")
        for futs in self._results.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(error)
        self._results.clear()

    # --- starting runs -----------------------------------------------------------------------

    def workflow(self, workflow: WorkflowDef[Any, Any] | str) -> WorkflowDef[Any, Any]:
        """The engine's workflow of that name.

        Raises:
            fusee.UnknownWorkflow: The engine was not given it.
        """
        name = workflow if isinstance(workflow, str) else workflow.name
        wf = self.workflows.get(name)
        if wf is None:
            raise UnknownWorkflow(unknown_workflow(name, self.workflows))
        return wf

    async def _start(
        self,
        workflow: WorkflowDef[Any, Any] | str,
        id: str,
        input: Any,
        options: StartOptions,
    ) -> Run[Any]:
        """`start` on this engine: the input checked and encoded, its times made absolute."""
        self.check_open()
        wf = self.workflow(check_workflow(workflow))
        check_id(id, "a run")
        data = checked(input, wf.decode_input, f"the input of run '{id}'", wf.input_type)
        now = self.clock.now_ms()
        return await self.begin(
            wf,
            id,
            data,
            id_policy=options.id_policy,
            queue=options.queue,
            key=options.key,
            priority=options.priority,
            debounce=options.debounce,
            deadline_ms=deadline_after(now, options.timeout),
            not_before_ms=not_before(now, options.delay, options.start_at),
        )

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
    ) -> Run[Any]:
        """`start` with its input encoded and its times in Unix milliseconds (0: none).

        The inbox applies a start sent from elsewhere with this: its deadline
        and delay are when its sender said, not that long after it arrives.
        """
        self.check_open()
        self.payloads.check_size(data, f"the input of run '{id}'")
        # What a start sent to the shard's owner carries besides these.
        queued: dict[str, Any] = {}
        if queue is not None or debounce is not None or not_before_ms:
            q = self.queues.resolve(queue, True)
            if self.owns(id):
                try:
                    await self.queues.start(
                        wf,
                        id,
                        data,
                        queue=q,
                        key=key,
                        priority=priority,
                        id_policy=IdPolicy(id_policy),
                        debounce=debounce,
                        trace=self.telemetry.caller_trace(),
                        deadline_ms=deadline_ms,
                        not_before_ms=not_before_ms,
                    )
                    return Run(self, id)
                except StaleLease:
                    # Nothing was written: the shard's holder queues it.
                    if not forwards(self):
                        raise
            # Queued by its shard's owner, who admits it: at once when the
            # queue allows (a worker that queued it elsewhere would not tell it).
            queued.update(
                queue=q.name,
                key=key,
                priority=priority,
                debounce_ms=None if debounce is None else duration_ms(debounce),
            )
        elif self.owns(id):
            try:
                return await self._start_here(wf, id, data, id_policy, deadline_ms)
            except StaleLease:
                # Its shard's lease ran out meanwhile (nothing of the start was
                # written): whoever holds the shard now starts it, through
                # the store's inbox.
                if not forwards(self):
                    raise
        fields: dict[str, Any] = {
            "workflow": wf.name,
            "input": data,
            "id_policy": id_policy.value,
            **queued,
        }
        # Times as this worker's clock has them: its owner applies them as they are.
        if deadline_ms:
            fields["deadline_ms"] = deadline_ms
        if not_before_ms:
            fields["not_before_ms"] = not_before_ms
        trace = self.telemetry.caller_trace()
        if trace is not None:
            fields["trace"] = trace
        await self.remote.call("start", id, fields)
        return Run(self, id)

    async def start_tick(
        self, wf: WorkflowDef[Any, Any], id: str, data: bytes, *, queue: str | None, tick_ms: int
    ) -> None:
        """Starts run ``id`` of a schedule's tick ``tick_ms`` (`IdPolicy.REJECT`), on ``queue``.

        Its `Start` carries the tick (``ctx.info.scheduled_at``), wherever
        it starts: here, queued, or on the worker that owns its shard.

        Raises:
            fusee.AlreadyExists: The tick's run started already.
            fusee.UnknownQueue: The engine was not given ``queue``.
        """
        self.check_open()
        fields: dict[str, Any] = {
            "workflow": wf.name,
            "input": data,
            "id_policy": IdPolicy.REJECT.value,
            "scheduled_ms": tick_ms,
        }
        trace = self.telemetry.caller_trace()
        if queue is not None:
            q = self.queues.resolve(queue, False)
            if self.owns(id):
                try:
                    await self.queues.start(
                        wf,
                        id,
                        data,
                        queue=q,
                        key=None,
                        priority=0,
                        id_policy=IdPolicy.REJECT,
                        debounce=None,
                        trace=trace,
                        scheduled_ms=tick_ms,
                    )
                    return
                except StaleLease:
                    if not forwards(self):
                        raise
            fields.update(queue=q.name, key=None, priority=0, debounce_ms=None)
        elif self.owns(id):
            try:
                await self._start_here(wf, id, data, IdPolicy.REJECT, scheduled_ms=tick_ms)
                return
            except StaleLease:
                if not forwards(self):
                    raise
        if trace is not None:
            fields["trace"] = trace
        await self.remote.call("start", id, fields)

    async def _start_here(
        self,
        wf: WorkflowDef[Any, Any],
        id: str,
        data: bytes,
        id_policy: IdPolicy,
        deadline_ms: int = 0,
        scheduled_ms: int = 0,
    ) -> Run[Any]:
        starting = self._starting.get(id)
        if starting is not None:
            if id_policy is IdPolicy.ATTACH:
                # Acknowledged only once that start is durable, as it is.
                waiter: asyncio.Future[None] = self.loop.create_future()
                starting.append(waiter)
                await waiter
                return Run(self, id)
            raise AlreadyExists(f"run '{id}' is being started; {_policy_hint()}")
        # Futures of ATTACH callers waiting for this start: none, mostly.
        waiters: list[asyncio.Future[None]] = []
        self._starting[id] = waiters
        try:
            # A load under way (a message to the id) may yet find no run.
            await self.runs.loading_settled(id)
            loaded = self.runs.loaded(id)
            existing = loaded is not None
            row = None if existing else await self.store.get(id)
            if existing or row is not None:
                status = row.status if row is not None else RunStatus.RUNNING
                if id_policy is IdPolicy.ATTACH:
                    await self.attached(loaded)
                    _settle_all(waiters, None)
                    return Run(self, id)
                if id_policy is IdPolicy.REJECT or status not in FINISHED_STATUSES:
                    raise AlreadyExists(f"run '{id}' exists ({status}); {_policy_hint()}")
            # The engine may have stopped while the store read: a run made
            # now would never be closed, its code left to the garbage collector.
            self.check_open()
            lsn = self.create_run(
                wf,
                id,
                data,
                parent=None,
                policy=0,
                run=row.run + 1 if row is not None else 1,
                trace=self.telemetry.caller_trace(),
                deadline_ms=deadline_ms,
                meta=Meta(scheduled_ms=scheduled_ms) if scheduled_ms else None,
            )
            await self.committer.durable(lsn)
            _settle_all(waiters, None)
        except BaseException as e:
            _settle_all(waiters, e)
            raise
        finally:
            del self._starting[id]
        return Run(self, id)

    async def attached(self, loaded: RunState | None) -> None:
        """Returns once the run an ATTACH start found (``loaded``, or a row read) is durable.

        A store reads what it is still writing (`SqliteStore.get` answers from
        a write under way), so a row read may belong to a start another
        caller made a moment ago: the answer "it exists" waits for every
        write handed over so far, as that start's own caller does.
        """
        if loaded is not None:
            await self.committer.durable(loaded.start_lsn)
        else:
            await self.committer.stored()

    def create_run(
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
    ) -> int:
        """Appends run ``run`` of ``id``'s `Start`, loads it and runs its first turn.

        Run numbers count the runs of one id: 1, then one more for each
        continue-as-new or replace. ``signals`` are recorded for the new run
        before its code starts (the previous run's unconsumed ones).
        ``trace`` is the ``traceparent`` its `Start` carries (telemetry).
        ``deadline_ms`` (0: none) is when the run is cancelled if still going.

        Returns:
            The LSN of its last record.
        """
        self._ends.pop(id, None)
        start = Start(
            run=run,
            id=id,
            wtype=wf.name,
            version=self.version_number,
            started_ms=self.clock.now_ms(),
            deadline_ms=deadline_ms,
            policy=policy,
            parent=parent,
            input=data,
            meta=_start_meta(trace, meta),
        )
        telemetry = self.telemetry.run(start, "started")
        if telemetry is not None and (start.meta is None or start.meta.trace is None):
            # Started outside any span, the run's first span roots its trace:
            # its Start records that span, so that every later stay (woken,
            # recovered, on another worker) joins the same trace.
            trace = telemetry.traceparent()
            if trace is not None:
                start = dataclasses.replace(start, meta=_start_meta(trace, start.meta))
        lsn = self.committer.append(id, run, encode(start))
        state = self.runs.make_state(wf, [start], lsn, telemetry=telemetry, start_lsn=lsn)
        state.shard.add(state)
        self.runs.put_row(state)
        self.deadlines.arm(state)
        for sig in signals:
            carried = Signal(run, sig.name, sig.dedup, sig.payload, sig.by)
            state.add_signal(carried)
            state.driver.append_signal(carried)
        state.driver.start()
        return state.driver.machine.gate

    def get(self, id: str) -> Run[Any]:
        """A handle on the run with id ``id`` (checked when used).

        Raises:
            ValueError: ``id`` is empty or not valid text.

        Example:
            >>> async def main(engine: Engine) -> None:
            ...     await engine.get("order-1").cancel("customer asked")
        """
        check_id(id, "a run")
        return Run(self, id)

    async def list(
        self,
        *,
        status: str | None = None,
        workflow: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[RunInfo]:
        """The runs of the store, filtered.

        Example:
            >>> async def main(engine: Engine) -> None:
            ...     async for info in engine.list(status="running", workflow="checkout"):
            ...         print(info.id)
        """
        # A read: during a write outage it answers from what the store holds.
        await self.committer.readable()
        # The status is filtered here, on what describe says (a loaded run's
        # state), so rows are read a page at a time until ``limit`` match:
        # without a status every row matches and a page is ``limit`` rows.
        page = None if limit is None else (limit if status is None else max(limit, _LIST_PAGE))
        after: tuple[int, str] | None = None
        count = 0
        while True:
            rows = await self.store.list(
                workflow=workflow, attributes=attributes, limit=page, after=after
            )
            for row in rows:
                info = self._info_of(row)
                if status is not None and info.status != status:
                    continue
                yield info
                count += 1
                if limit is not None and count >= limit:
                    return
            if page is None or len(rows) < page or not rows:
                return
            after = (rows[-1].started_ms, rows[-1].id)

    async def _bulk(self, filters: Filters, act: _bulk.Act, dry_run: bool) -> BulkResult:
        self.check_open()
        await self.committer.readable()
        return await _bulk.bulk(
            self,
            self.store,
            filters,
            act,
            now_ms=self.clock.now_ms(),
            status_of=lambda row: self._info_of(row).status,
            dry_run=dry_run,
        )

    async def queue_stats(self) -> builtins.list[QueueStats]:
        """Queued and running runs per queue and per key, by queue name.

        Example:
            >>> async def main(engine: Engine) -> None:
            ...     for q in await engine.queue_stats():
            ...         print(q.queue, q.queued, q.running)
        """
        self.check_open()
        return await self.queues.stats()

    async def complete(self, token: str, value: Any = None) -> None:
        """Resolves the ``ctx.await_completion`` that handed out ``token``.

        Raises:
            ValueError: ``token`` is not a token fusee handed out.
            fusee.NotFound: Its run does not exist.

        Example:
            >>> async def main(engine: Engine, token: str) -> None:
            ...     await engine.complete(token, {"approved": True})
        """
        run_id = CompletionToken.run_id(token)
        data = _codec.encode(value, name="the completion's value")
        self.payloads.check_size(data, "the completion's value")
        if run_id and not self.owns(run_id):
            await self.remote.complete(token, data)
            return
        try:
            await self._check_completion(token, value)
        except StaleLease:
            # Its run is another lane's, or moved as it loaded: served there.
            if not forwards(self):
                raise
            await self.remote.complete(token, data)
            return
        await self.router.complete(token, value)

    async def _check_completion(self, token: str, value: Any) -> None:
        # The value must fit the await_completion's declared result_type,
        # checked before anything is recorded. A token that does not parse,
        # or whose run is gone, is left to `Messages.complete` to judge.
        try:
            parsed = CompletionToken.parse(token)
        except ValueError:
            return
        state = await self.runs.wake(parsed.id)
        if state is None:
            return
        op = state.driver._ops.get(parsed.seq)
        if op is None or op.kind != "await" or op.decode is None:
            return
        checked(value, op.decode, f"the completion of '{op.name}'", "its result_type")

    # --- run handle operations (`Run` calls these) -------------------------------------------

    async def _loaded_run(self, id: str) -> int | None:
        """The run number of id ``id``'s unfinished run, loading it if parked (None: finished)."""
        state = await self.runs.wake(id)
        if state is None or state.driver.end is not None:
            return None
        return state.run

    async def _result(self, id: str) -> Any:
        while True:
            if not self.owns(id):
                return await self.remote.result(id)
            stuck = self._stuck.get(id)
            if stuck is not None:
                raise stuck
            if self.committer.failed is not None:
                raise self.committer.failed
            # Its end is durable (and told its waiters), even while its state
            # is still loaded: a waiter registered now would never hear it.
            ended = self._ends.get(id)
            if ended is not None:
                return end_value(*ended)
            state = self.runs.loaded(id)
            if state is None and not self.runs.is_loading(id):
                self.check_open()
                row = await self.store.get(id)
                if row is None:
                    raise no_run(id)
                if row.status in FINISHED_STATUSES and row.status != RunStatus.CONTINUED:
                    return await self._finished_result(id, row)
                if self.leases is not None and await self.leases.foreign(row.version):
                    # A run of another version's lane: its end is told there,
                    # and read from the store here.
                    return await self.remote.result(id)
                # A run this engine cannot host would wait forever: say so.
                self.workflow(row.workflow)
                if row.status in (RunStatus.RUNNING, RunStatus.PAUSED, RunStatus.DIVERGED) or (
                    self.strict and row.status == RunStatus.SUSPENDED
                ):
                    # An unfinished run neither loaded nor parked failed to
                    # load (a damaged journal, a workflow this engine was not
                    # given): loading it here gives the caller that error.
                    # The dev profile loads a parked one too, so that a
                    # journal its code no longer replays is reported at once.
                    # StaleLease: it moved to another worker while it loaded
                    # (the loop then waits for it there), or another lane
                    # serves it (waited for through the store).
                    try:
                        if await self.runs.wake(id) is None:
                            # It had ended after all; its row is on its way.
                            await self.committer.flush()
                    except StaleLease:
                        if self.owns(id):
                            return await self.remote.result(id)
                    continue
                if id in self._ends or self.runs.loaded(id) is not None or self.runs.is_loading(id):
                    # It woke, or ended, while the store was read: its end's
                    # waiters were told before this one would be there.
                    continue
            if not self.owns(id):
                # It moved while the store was read (`drop_shards` released
                # the waiters it had then, not this one): waited for there.
                continue
            fut: asyncio.Future[None] = self.loop.create_future()
            self._results.setdefault(id, []).append(fut)
            wait = self.hooks.wait_result
            await (fut if wait is None else wait(fut))
            fut.result()  # a store failure ends the wait with its error

    async def _finished_result(self, id: str, row: RunRow) -> Any:
        entries = await self.store.load(id, row.run)
        done = end_record(id, row.run, entries)
        if done is None:
            raise StoreError(f"run '{id}' is marked {row.status} but its journal has no end record")
        return end_value(self.workflow(row.workflow), done)

    async def _signal(
        self, id: str, name: str, payload: bytes, dedup: int, by: bytes | None
    ) -> None:
        self.payloads.check_size(payload, f"signal '{name}' to run '{id}'")
        await self.router.signal(id, name, payload, dedup, by)

    async def _query(self, id: str, name: str, arg: bytes) -> Any:
        return await self.router.query(id, name, arg)

    async def _update(self, id: str, name: str, update_id: str | None, payload: bytes) -> Any:
        self.payloads.check_size(payload, f"update '{name}' of run '{id}'")
        return await self.router.update(id, name, update_id, payload)

    async def _cancel(self, id: str, reason: str) -> None:
        await self.router.cancel(id, reason)

    async def _resume(self, id: str) -> None:
        await self.router.resume(id)

    async def _start_now(self, id: str) -> None:
        self.check_open()
        if self.owns(id):
            try:
                if await self.queues.start_now(id):
                    return
            except StaleLease:
                if self.owns(id):
                    raise
            else:
                if await self.store.get(id) is None and self.runs.loaded(id) is None:
                    raise no_run(id)
                return
        await self.remote.start_now(id)

    def _stream(self, id: str, name: str) -> AsyncIterator[Any]:
        if not self.owns(id):
            return self.remote.stream(id, name)
        return self.streams.read(id, name)

    async def _get_event(self, id: str, key: EventDef[Any], timeout_s: float | None) -> Any:
        if not self.owns(id):
            return await self.remote.get_event(id, key, timeout_s)
        return await self.events.get(id, key, timeout_s)

    async def _describe(self, id: str) -> RunInfo:
        if not self.owns(id):
            return await self.remote.describe(id)
        state = self.runs.loaded(id)
        if state is None:
            # A read: during a write outage it answers from what the store holds.
            await self.committer.readable()
            row = await self.store.get(id)
            if row is None:
                raise no_run(id)
            return self._info_of(row)
        return self._info_of(self.runs.row(state))

    async def _delete(self, id: str) -> None:
        if not self.owns(id):
            await self.remote.delete(id)
            return
        await self.retention.delete(id)

    def forget_runs(self, ids: Iterable[str]) -> None:
        """Runs ``ids`` were deleted from the store: what the engine kept of them goes too."""
        for id in ids:
            self._ends.pop(id, None)
            self._stuck.pop(id, None)

    async def _fork(self, id: str, new_id: str, at: int | str, input: bytes | None) -> None:
        if not self.owns(new_id):
            await self.remote.fork(id, new_id, at, input)
            return
        await fork(
            id,
            new_id,
            at,
            input,
            store=self.store,
            committer=self.committer,
            runs=self.runs,
            clock=self.clock,
            workflow=self.workflow,
            starting=self._starting,
            version=self.version,
            version_number=self.version_number,
            check_open=self.check_open,
        )

    def _info_of(self, row: RunRow) -> RunInfo:
        return info_of(row, self.runs.loaded(row.id), self._stuck.get(row.id))

    # --- a run's end -------------------------------------------------------------------------

    def ended(self, state: RunState, done: Done, lsn: int) -> None:
        """Run ``state`` appended its `Done`: its row now, the rest once it is durable.

        The row says the run ended only once its outbox is empty (every send
        and child start it recorded confirmed): until then recovery picks it
        up again and delivers what a crash may have lost.
        """
        state.end(_STATUS_OF_END.get(done.status, RunStatus.FAILED))
        self.record_watch.ended(state.id, state.run)
        if state.telemetry is not None:
            state.telemetry.ended(state.row_status.value)
        final = self.runs.row(state, finished_ms=done.finished_ms)
        if state.outbox:
            state.hold_final_row(final)
            self.runs.ending[state.id] = state
            # Until then it says "running" (a row saying "suspended", written
            # before the turn that ended it, would keep recovery from loading
            # it and re-deriving its outbox).
            self.committer.put_row(
                dataclasses.replace(final, status=RunStatus.RUNNING, finished_ms=None)
            )
        else:
            self.committer.put_row(final)
        self.timers.disarm_waits(state)
        self.queues.ending(state.id, done.status)
        # The parent this end goes to once it is durable (None: none, or
        # another worker's, which the delivery is posted to with the `Done`,
        # in its transaction, so that no crash between the two loses it).
        deliver_to = state.parent
        if state.policy & DETACHED or done.status is Status.CONTINUED:
            deliver_to = None
        elif deliver_to is not None and not self.owns(deliver_to.id):
            completion = ChildCompleted(done.status, done.payload)
            self.committer.post(
                state.id,
                deliver_command(deliver_to.id, deliver_to.run, deliver_to.seq, completion),
            )
            deliver_to = None
        # A signal a handler of the code got was heard: not carried to a next run.
        handled = state.driver.signals_handled
        unconsumed = (
            [s for i, s in enumerate(state.signals) if i not in state.consumed and i not in handled]
            if state.signals
            else []
        )
        # Set-aside signals were logged when a wait refused them.
        heard = state.consumed | state.set_aside if state.set_aside else state.consumed
        if handled:
            heard = heard | handled
        unheard = [s for i, s in enumerate(state.signals) if i not in heard] if unconsumed else []
        if unheard and done.status is not Status.CONTINUED:
            log.warning(
                "run %r ended with signals nobody waited for: %s",
                state.id,
                ", ".join(sorted({s.name for s in unheard})),
            )

        def durable() -> None:
            if state.updates:
                ended = _codec.encode(
                    ["RunEnded", f"run '{state.id}' ended before the update's handler finished"]
                )
                for caller in list(state.updates):
                    if not caller.done():
                        caller.set_result((Status.CANCELLED, ended))
            if self.strict:
                self.runs.check_replay(state)
            shard = state.shard
            mine = shard.runs.get(state.id) is state
            if mine:
                shard.remove(state)
                state.driver.close()
            shard.drop_timers_of(state)
            if done.status is Status.CONTINUED:
                if not mine:
                    # Dropped with its shard meanwhile: the shard's next owner
                    # continues it from its "continued" row (`recover_shards`).
                    return
                self._continue_as_new(
                    state.workflow,
                    state.id,
                    state.run,
                    done.payload,
                    state.parent,
                    state.policy,
                    unconsumed,
                    carried_from_state(state),
                    state.driver.machine.info().trace,
                    state.driver.machine.info().deadline_ms,
                    _scheduled_ms(state.driver.start_record),
                )
                return
            self.queues.ended(state.id)
            ends = self._ends
            ends[state.id] = (state.workflow, done)
            if len(ends) > _ENDS_KEPT:
                ends.popitem(last=False)
            self.streams.notify(state.id)
            self.events.notify(state.id)
            self.schedules.ended(state.id)
            for fut in self._results.pop(state.id, []):
                if not fut.done():
                    fut.set_result(None)
            if deliver_to is not None:
                self.spawn(
                    self.runs.deliver(
                        deliver_to.id,
                        deliver_to.run,
                        deliver_to.seq,
                        ChildCompleted(done.status, done.payload),
                    )
                )

        self.committer.on_durable(lsn, durable)

    def _continue_as_new(
        self,
        wf: WorkflowDef[Any, Any],
        id: str,
        run: int,
        input: bytes,
        parent: Parent | None,
        policy: int,
        signals: Iterable[Signal],
        meta: Meta | None,
        trace: bytes | None,
        deadline_ms: int = 0,
        scheduled_ms: int = 0,
    ) -> None:
        """Starts run ``run + 1`` of ``id``, carrying the signals its last run left unconsumed.

        The id's deadline, if any, holds for its next runs too (a timeout
        bounds the whole chain, as Temporal's execution timeout does), and so
        does the tick of the schedule that started the chain
        (``ctx.info.scheduled_at``): the runs of one tick's id say which
        tick they serve, as Temporal's continued runs keep the schedule's
        ``TemporalScheduledStartTime``.

        ``meta`` carries the messages the id's runs took (fusee.engine._carry),
        so that a resend counts once in the next run too; ``trace`` is the
        last run's ``traceparent``, so that the runs of one id share a trace.
        """
        if scheduled_ms:
            meta = (
                Meta(scheduled_ms=scheduled_ms)
                if meta is None
                else dataclasses.replace(meta, scheduled_ms=scheduled_ms)
            )
        continued = self._continued
        continued[(id, run)] = None
        if len(continued) > _ENDS_KEPT:
            continued.popitem(last=False)
        self.create_run(
            wf,
            id,
            input,
            parent=parent,
            policy=policy,
            run=run + 1,
            signals=signals,
            trace=trace,
            meta=meta,
            deadline_ms=deadline_ms,
        )

    async def _ended_row_stored(self, state: RunState) -> None:
        """Forgets ended ``state`` once its row says so (a load finds it running before)."""
        try:
            # A failed store stops every run: the error is the committer's to report.
            with contextlib.suppress(StoreError):
                await self.committer.stored()
        finally:
            if self.runs.ending.get(state.id) is state:
                del self.runs.ending[state.id]

    def outbox_done(self, state: RunState, seq: int) -> None:
        """A send or child start of ``state``'s run was delivered (or given up)."""
        state.outbox.discard(seq)
        if state.outbox:
            return
        row = state.take_final_row()
        if row is not None:
            self.committer.put_row(row)
            self.spawn(self._ended_row_stored(state))
        elif state.loaded and state.driver.end is None:
            # It may be idle now: its row and its parking follow (`turned`).
            self.host.turned(state.driver)


def unconsumed_signals(records: Iterable[Record]) -> list[Signal]:
    """The signals a journal recorded that no wait took and no handler got, oldest first."""
    signals: list[Signal] = []
    consumed: set[int] = set()
    for rec in records:
        if isinstance(rec, Signal):
            signals.append(rec)
        elif isinstance(rec, Waited) and rec.outcome.is_signal:
            consumed.add(rec.outcome.ordinal)
        elif isinstance(rec, Handled):
            consumed.add(rec.ordinal)
    return [s for i, s in enumerate(signals) if i not in consumed]


def _scheduled_ms(start: Start) -> int:
    """The schedule tick ``start`` carries (0: none)."""
    return start.meta.scheduled_ms if start.meta is not None else 0


def _start_meta(trace: bytes | None, meta: Meta | None) -> Meta | None:
    """A `Start`'s meta: the ``traceparent`` it starts under, and what it carries."""
    if meta is None:
        return Meta(trace) if trace is not None else None
    if trace is None or meta.trace is not None:
        return meta
    return dataclasses.replace(meta, trace=trace)


def _settle_all(futures: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for fut in futures:
        if fut.done():
            continue
        if error is None:
            fut.set_result(None)
        else:
            fut.set_exception(error)


def _policy_hint() -> str:
    return (
        "pass id_policy=fusee.IdPolicy.ATTACH to get its handle, "
        "or IdPolicy.REPLACE to start over once it has finished"
    )
