"""``fusee worker``: serve modules' workflows on a store and apply its inbox.

The rule: the worker is the store's one writer. It holds the writer lock
for as long as its engine is open, and everything else changes runs by
posting to its inbox.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fusee._definitions import WorkflowDef
from fusee.cli._inbox import INBOX, REPLIES, drain_inbox, prune_replies, writer_lock
from fusee.cli._modules import import_module, workflows_of
from fusee.cli._output import Output, short
from fusee.cli._reading import FINISHED, POLL_S, data_dir, done_record, outcome_of
from fusee.engine import Engine


async def _report_finished(engine: Engine, reported: set[tuple[str, int]], out: Output) -> None:
    for status in sorted(FINISHED):
        async for info in engine.list(status=status):
            if (info.id, info.run) in reported:
                continue
            reported.add((info.id, info.run))
            done = done_record(await engine.store.load(info.id, info.run))
            if done is None:
                continue
            outcome = outcome_of(done)
            if outcome["status"] == "completed":
                detail = short(outcome["result"], 160)
                out.say(("  ✓ ", "green"), f"{info.id} ({info.workflow}) completed: {detail}")
            else:
                err = outcome["error"]
                out.say(
                    ("  ✗ ", "red"),
                    f"{info.id} ({info.workflow}) {outcome['status']}: {err['type']}: "
                    + short(err["message"], 160),
                )


async def worker_command(args: argparse.Namespace, out: Output) -> int:
    data = data_dir(args)
    modules = [import_module(spec) for spec in args.modules]
    workflows = workflows_of(modules, " and ".join(repr(m) for m in args.modules))
    data.mkdir(parents=True, exist_ok=True)
    (data / INBOX / REPLIES).mkdir(parents=True, exist_ok=True)
    with writer_lock(data, commands=True):
        try:
            async with await Engine.open(
                data, workflows=workflows, durability=args.durability
            ) as engine:
                await _serve(engine, data, workflows, args, out)
        finally:
            out.say(("fusee worker stopped; unfinished runs resume when a worker starts", "dim"))
    return 0


async def _serve(
    engine: Engine,
    data: Path,
    workflows: Sequence[WorkflowDef[Any, Any]],
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
    reported: set[tuple[str, int]] = set()
    for status in FINISHED:
        async for info in engine.list(status=status):
            reported.add((info.id, info.run))
    prune_replies(data)
    next_scan = loop.time()
    while True:
        stop = await drain_inbox(engine, data, out)
        now = loop.time()
        if stop or now >= next_scan:
            await _report_finished(engine, reported, out)
            next_scan = now + 0.5
        if stop or terminated.is_set() or (deadline is not None and now >= deadline):
            return
        await asyncio.sleep(POLL_S)
