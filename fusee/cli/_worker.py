"""``fusee worker``: serve modules' workflows on a store and apply its inbox.

The rule: the worker is the store's one writer. It holds the writer lock
for as long as its engine is open, and everything else changes runs by
posting to its inbox.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from fusee._definitions import SignalDef, WorkflowDef
from fusee.cli._inbox import INBOX, REPLIES, drain_inbox, prune_replies, writer_lock
from fusee.cli._modules import import_module, signals_of, workflows_of
from fusee.cli._output import Output, payload_json, short
from fusee.cli._reading import FINISHED, POLL_S, data_dir, done_record, outcome_of
from fusee.engine import Engine, RunInfo
from fusee.errors import FuseeError
from fusee.record import PAUSED, Attempt, decode


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
    data = data_dir(args)
    modules = [import_module(spec) for spec in args.modules]
    workflows = workflows_of(modules, " and ".join(repr(m) for m in args.modules))
    data.mkdir(parents=True, exist_ok=True)
    (data / INBOX / REPLIES).mkdir(parents=True, exist_ok=True)
    signals = signals_of(modules, workflows)
    with writer_lock(data, commands=True), _showing_logs(out):
        try:
            async with await Engine.open(
                data, workflows=workflows, durability=args.durability
            ) as engine:
                await _serve(engine, data, workflows, signals, args, out)
        finally:
            out.say(("fusee worker stopped; unfinished runs resume when a worker starts", "dim"))
    return 0


async def _serve(
    engine: Engine,
    data: Path,
    workflows: Sequence[WorkflowDef[Any, Any]],
    signals: Mapping[str, SignalDef[Any] | None],
    args: argparse.Namespace,
    out: Output,
) -> None:
    loop = asyncio.get_running_loop()
    deadline = None if args.max_seconds is None else loop.time() + args.max_seconds
    # SIGTERM (a process manager's stop) ends the worker as Ctrl-C does.
    terminated = asyncio.Event()
    if threading.current_thread() is threading.main_thread():
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGTERM, terminated.set)
    unfinished = len(await engine.store.unfinished())
    out.say(
        ("fusee worker", "bold"),
        f" (pid {os.getpid()}) on {data}: workflows "
        + ", ".join(wf.name for wf in workflows)
        + f"; {unfinished} unfinished run(s) recovered; Ctrl-C stops it",
    )
    reporter = _Reporter(engine, out)
    await reporter.start()
    prune_replies(data)
    next_scan = loop.time()
    while True:
        stop = await drain_inbox(engine, data, out, signals)
        now = loop.time()
        if stop or now >= next_scan:
            await reporter.scan()
            next_scan = now + 0.5
        if stop or terminated.is_set() or (deadline is not None and now >= deadline):
            return
        await asyncio.sleep(POLL_S)
