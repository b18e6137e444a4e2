"""``fusee worker``: serve modules' workflows on a store and apply its inbox.

The rule: the worker is the store's one writer (on SQLite; on Postgres, one
of its workers). It holds the writer lock for as long as its engine is
open, and everything else changes runs by posting commands to the store's
inbox, which its engine applies.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from fusee._definitions import WorkflowDef
from fusee._jsonview import payload as payload_json
from fusee._queue import Queue
from fusee._schedule import Schedule
from fusee.cli._inbox import answer_printer, signal_checker, writer_lock
from fusee.cli._modules import import_module, workflows_of
from fusee.cli._output import CliError, Output, short
from fusee.cli._reading import FINISHED, codecs_of, done_record, outcome_of, store_target
from fusee.engine import Engine, RunInfo
from fusee.errors import FuseeError
from fusee.record import PAUSED, Attempt, decode
from fusee.store._redact import shown_target


class _Reporter:
    """Prints each run that finishes or pauses, once, from the engine's listing."""

    def __init__(self, engine: Engine, out: Output) -> None:
        self.engine = engine
        self.out = out
        self.finished: set[tuple[str, int]] = set()
        # Runs reported paused and not resumed since: a run that pauses
        # again after a resume is reported again.
        self.paused: set[tuple[str, int]] = set()

    async def start(self) -> None:
        """Takes the runs finished before the worker started as reported."""
        async for info in self.engine.list():
            if info.status in FINISHED:
                self.finished.add((info.id, info.run))

    async def scan(self) -> None:
        paused_now: set[tuple[str, int]] = set()
        async for info in self.engine.list():
            key = (info.id, info.run)
            if info.status in FINISHED and key not in self.finished:
                self.finished.add(key)
                await self._finished(info)
            elif info.status == "paused":
                paused_now.add(key)
                if key not in self.paused:
                    await self._paused(info)
        self.paused = paused_now

    async def _finished(self, info: RunInfo) -> None:
        done = done_record(await self.engine.store.load(info.id, info.run))
        if done is None:
            return
        outcome = outcome_of(done)
        if outcome["status"] == "completed":
            detail = short(outcome["result"], 160)
            self.out.say(("  ✓ ", "green"), f"{info.id} ({info.workflow}) completed: {detail}")
        else:
            err = outcome["error"]
            self.out.say(
                ("  ✗ ", "red"),
                f"{info.id} ({info.workflow}) {outcome['status']}: {err['type']}: "
                + short(err["message"], 160),
            )

    async def _paused(self, info: RunInfo) -> None:
        # The last failed attempt of each paused step says why it paused.
        why: dict[str, str] = {}
        for _, data in await self.engine.store.load(info.id, info.run):
            try:
                rec = decode(data)
            except FuseeError:
                continue
            if isinstance(rec, Attempt) and rec.retry_at_ms == PAUSED:
                error = payload_json(rec.error)
                text = ": ".join(str(e) for e in error[:2]) if isinstance(error, list) else error
                why[rec.name] = f"after {rec.attempt} attempt(s): {short(text, 160)}"
        steps = info.paused_steps or tuple(why)
        detail = "; ".join(f"step {name!r} failed {why.get(name, '')}".rstrip() for name in steps)
        self.out.say(
            ("  ‖ ", "yellow"),
            f"{info.id} ({info.workflow}) paused: {detail or 'a step ran out of attempts'}; "
            f"`fusee resume {info.id}` retries it",
        )


class _LogLines(logging.Handler):
    """Prints the engine's log records (logger "fusee") on the worker's output."""

    _STYLE: Final = {"WARNING": "yellow", "ERROR": "red", "CRITICAL": "bold red"}

    def __init__(self, out: Output) -> None:
        super().__init__(logging.INFO)
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
            level = record.levelname.lower()
            self.out.say((f"  {level}: ", self._STYLE.get(record.levelname, "dim")), text)
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def _showing_logs(out: Output) -> Iterator[None]:
    """Shows the "fusee" logger's records at INFO and above on ``out`` (a pause, a stopped run)."""
    logger = logging.getLogger("fusee")
    handler = _LogLines(out)
    level = logger.level
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def worker_command(args: argparse.Namespace, out: Output) -> int:
    target = store_target(args)
    modules = [import_module(spec) for spec in args.modules]
    workflows = workflows_of(modules, " and ".join(repr(m) for m in args.modules))
    schedules = [v for m in modules for v in vars(m).values() if isinstance(v, Schedule)]
    queues = _queues_of(modules)
    lock: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if "://" not in target:
        Path(target).mkdir(parents=True, exist_ok=True)
        lock = writer_lock(target, commands=True)
    setup = _setup_of(args.setup)
    with lock, _showing_logs(out):
        try:
            async with contextlib.AsyncExitStack() as resources:
                # Entered before the engine opens and left after it closes:
                # recovered runs' steps find what it builds, and none runs
                # once it is torn down.
                if setup is not None:
                    await resources.enter_async_context(_entered(setup, args.setup))
                engine = await resources.enter_async_context(
                    await Engine.open(
                        target,
                        workflows=workflows,
                        durability=args.durability,
                        lease=args.lease,
                        worker=args.name,
                        schedules=schedules,
                        queues=queues,
                        codecs=codecs_of(args),
                        version=args.version,
                        retention=args.retention,
                    )
                )
                # Before the first await: the inbox's first command sees them,
                # and every signal the engine records is checked against them.
                engine.messages.known.learn(vars(m) for m in modules)
                engine.inbox.check_signal = signal_checker(engine.messages.known)
                engine.inbox.on_answer = answer_printer(out)
                await _serve(engine, target, workflows, args, out, schedules, queues)
        finally:
            out.say(("fusee worker stopped; unfinished runs resume when a worker starts", "dim"))
    return 0


def _setup_of(spec: str | None) -> Callable[[], Any] | None:
    """The ``--setup MODULE:FUNCTION`` function, imported (None without one)."""
    if spec is None:
        return None
    module_spec, sep, name = spec.rpartition(":")
    if not sep or not module_spec or not name:
        raise CliError(
            f"--setup expects MODULE:FUNCTION (like examples.shop.services:connected), not {spec!r}"
        )
    fn = getattr(import_module(module_spec), name, None)
    if not callable(fn):
        raise CliError(f"--setup {spec}: module {module_spec!r} has no function {name!r}")
    return fn  # type: ignore[no-any-return]


def _entered(setup: Callable[[], Any], spec: str) -> contextlib.AbstractAsyncContextManager[Any]:
    made = setup()
    if not isinstance(made, contextlib.AbstractAsyncContextManager):
        raise CliError(
            f"--setup {spec}: it returned {type(made).__name__}, not an async context manager; "
            "decorate it with @contextlib.asynccontextmanager"
        )
    return made


async def _serve(
    engine: Engine,
    target: str,
    workflows: Sequence[WorkflowDef[Any, Any]],
    args: argparse.Namespace,
    out: Output,
    schedules: Sequence[Schedule] = (),
    queues: Sequence[Queue] = (),
) -> None:
    loop = asyncio.get_running_loop()
    deadline = None if args.max_seconds is None else loop.time() + args.max_seconds
    # SIGTERM (a process manager's stop) ends the worker as Ctrl-C does.
    terminated = asyncio.Event()
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGTERM, terminated.set)
    leases = engine.leases
    if leases is None:
        recovered = f"{len(await engine.store.unfinished())} unfinished run(s) recovered"
    else:
        recovered = f"worker {leases.owner} holds {len(leases.held)} of {leases.count} shards"
        if len(leases.held) < leases.count:
            recovered += " (other workers serve the rest, or take them once their leases end)"
    out.say(
        ("fusee worker", "bold"),
        f" (pid {os.getpid()}) on {shown_target(target)}: workflows "
        + ", ".join(wf.name for wf in workflows)
        + ("; queues " + ", ".join(q.name for q in queues) if queues else "")
        + ("; schedules " + ", ".join(s.name for s in schedules) if schedules else "")
        + (f"; version {args.version}" if args.version is not None else "")
        + f"; {recovered}; Ctrl-C stops it",
    )
    reporter = _Reporter(engine, out)
    await reporter.start()
    stopping = (engine.inbox.stop_requested, terminated)
    while True:
        waits = [asyncio.ensure_future(event.wait()) for event in stopping]
        try:
            await asyncio.wait(waits, timeout=_SCAN_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        await reporter.scan()
        now = loop.time()
        if any(e.is_set() for e in stopping) or (deadline is not None and now >= deadline):
            return


# How often the worker looks for runs that finished or paused, to print them.
_SCAN_S: Final = 0.5


def _queues_of(modules: Sequence[ModuleType]) -> list[Queue]:
    """The queues (every `fusee.Queue`) that ``modules`` define, one per name."""
    queues: dict[str, Queue] = {}
    for m in modules:
        for value in vars(m).values():
            if not isinstance(value, Queue):
                continue
            other = queues.setdefault(value.name, value)
            if other != value:
                raise CliError(
                    f"two different queues are named {value.name!r} ({other!r} and {value!r}); "
                    "give each queue its own name"
                )
    return list(queues.values())
