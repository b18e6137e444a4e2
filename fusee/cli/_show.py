"""``fusee show``: a run's journal as a timeline, and ``--follow`` as it grows.

The rule: it only reads (the store opened read-only), polling for records
past the last one it printed, so it runs beside the engine that writes.
"""

from __future__ import annotations

import argparse
import asyncio

from fusee._status import RunStatus
from fusee.cli._output import CliError, Output, row_json
from fusee.cli._progress import Bars
from fusee.cli._reading import FINISHED, POLL_S, get_row, reading, store_shown
from fusee.cli._timeline import (
    Line,
    Timeline,
    print_bug,
    print_failure,
    print_header,
    timeline_table,
)
from fusee.errors import NotFound
from fusee.store import RunRow, Store, load_journal

_QUEUED = "queued: its journal starts when its queue admits it (`fusee queues` shows the queues)"


async def show_command(args: argparse.Namespace, out: Output) -> int:
    where = store_shown(args)
    async with reading(args) as store:
        row = await get_row(store, args.id, where)
        run = args.run if args.run is not None else row.run
        try:
            entries = await load_journal(store, row, run)
        except NotFound:
            raise CliError(
                f"run {run} of {args.id!r} has no records in {where}; its latest run is {row.run}"
            ) from None
        timeline = Timeline()
        lines = [timeline.line(lsn, data) for lsn, data in entries]
        if not args.follow:
            if out.json:
                out.emit({"run": row_json(row), "records": [ln.json() for ln in lines]})
            else:
                print_header(out, row, where)
                out.table(timeline_table(lines, header=True, full=args.full))
                print_failure(out, lines, args.id, full=args.full)
                if run == row.run:
                    print_bug(out, row, full=args.full)
                if row.status == RunStatus.QUEUED and run == row.run:
                    out.say((_QUEUED, "dim"))
            return 0
        bars = None if out.json else Bars(out)
        try:
            return await _follow(args, out, store, row, run, timeline, lines, bars)
        finally:
            if bars is not None:
                bars.close()


async def _follow(
    args: argparse.Namespace,
    out: Output,
    store: Store,
    row: RunRow,
    run: int,
    timeline: Timeline,
    lines: list[Line],
    bars: Bars | None,
) -> int:
    """Prints records as they land, until the run ends (or Ctrl-C, or --max-seconds)."""
    loop = asyncio.get_running_loop()
    deadline = None if args.max_seconds is None else loop.time() + args.max_seconds

    def show(batch: list[Line], *, header: bool) -> None:
        if out.json:
            for ln in batch:
                out.emit({"id": args.id, "run": run, **ln.json()}, compact=True)
        elif batch or header:
            out.table(timeline_table(batch, header=header, full=args.full))
        if bars is not None:
            bars.draw(timeline.progress)

    if not out.json:
        print_header(out, row, store_shown(args))
    show(lines, header=True)
    last = lines[-1].lsn if lines else 0
    following_latest = args.run is None
    while True:
        ended = row.run == run and row.status in FINISHED
        if ended and (any(ln.kind == "done" for ln in lines) or not following_latest):
            if not out.json:
                print_failure(out, lines, args.id, full=args.full)
                out.say((f"run {args.id!r} {row.status}", "bold"))
            return 0
        if deadline is not None and loop.time() >= deadline:
            return 0
        await asyncio.sleep(POLL_S)
        latest = await store.get(args.id)
        if latest is None:
            raise CliError(f"run {args.id!r} is no longer in the store")
        landed = await load_journal(store, latest, run, after_lsn=last)
        fresh = [timeline.line(lsn, data) for lsn, data in landed]
        if fresh:
            last = fresh[-1].lsn
            lines.extend(fresh)
            show(fresh, header=False)
        if following_latest and latest.run != run and latest.status != "continued":
            # Continued as new: follow the new run from its start.
            run, timeline, lines, last = latest.run, Timeline(), [], 0
            if not out.json:
                out.say((f"continued as new: run {run}", "bold"))
        row = latest
