"""``fusee schedules [list | pause NAME | resume NAME | trigger NAME]``: a store's schedules.

The rule: ``list`` reads the store read-only; ``pause``, ``resume`` and
``trigger`` open no engine: they post a ``schedule`` command to the store's
inbox, which the serving worker applies and answers (`fusee.cli._inbox`).
"""

from __future__ import annotations

import argparse

from rich.table import Table

from fusee._schedule import spec_text
from fusee.cli._inbox import send_command
from fusee.cli._output import CliError, Output, local_time
from fusee.cli._reading import reading

__all__ = ["ACTIONS", "schedules_command"]

ACTIONS = ("list", "pause", "resume", "trigger")


async def schedules_command(args: argparse.Namespace, out: Output) -> int:
    """Lists the store's schedules, or asks the worker to pause, resume or trigger one."""
    action: str = args.action
    if action == "list":
        if args.name is not None:
            raise CliError("`fusee schedules list` takes no name; it lists every schedule")
        return await _list(args, out)
    if args.name is None:
        raise CliError(f"`fusee schedules {action}` needs the schedule's NAME")
    what = f"{action} of schedule {args.name!r}"
    return await send_command(args, out, "schedule", args.name, {"action": action}, what)


async def _list(args: argparse.Namespace, out: Output) -> int:
    async with reading(args) as store:
        rows = await store.schedules()
    if out.json:
        out.emit([row.as_json() for row in rows])
        return 0
    if not rows:
        out.say(("no schedules in this store", "dim"))
        return 0
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("name", "workflow", "state", "last tick", "next tick", "last run"):
        table.add_column(name, no_wrap=True)
    table.add_column("spec", overflow="fold", ratio=1)
    for r in rows:
        state = "removed" if r.removed else ("paused" if r.paused else "active")
        table.add_row(
            r.name,
            r.workflow,
            state,
            local_time(r.ticked_ms or None),
            local_time(r.next_ms or None) if not r.removed else "",
            r.last_run,
            spec_text(r.spec),
        )
    out.table(table)
    return 0
