"""``fusee schedules [list | create | update | delete | backfill | pause | resume | trigger]``.

The rule: ``list`` reads the store read-only; the others open no engine:
they post a ``schedule`` command to the store's inbox, which the serving
worker applies and answers (`fusee.cli._inbox`).
"""

from __future__ import annotations

import argparse
import datetime
import json
from typing import Any

from rich.table import Table

from fusee._schedule import spec_text
from fusee.cli._inbox import send_command
from fusee.cli._output import CliError, Output, local_time
from fusee.cli._reading import reading
from fusee.client import _schedule_fields

__all__ = ["ACTIONS", "schedule_arguments", "schedules_command"]

ACTIONS = ("list", "create", "update", "delete", "backfill", "pause", "resume", "trigger")

# The options of `create` and `update`, as `fusee.Schedule` names them.
_DEFINITION = ("cron", "every", "tz", "input", "overlap", "catch_up", "queue")


def schedule_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``create``, ``update`` and ``backfill``."""
    p.add_argument("--workflow", metavar="NAME", help="create: the workflow each tick starts")
    p.add_argument("--cron", metavar="EXPR", help="create, update: a cron expression")
    p.add_argument("--every", metavar="DURATION", help="create, update: or an interval (15m)")
    p.add_argument("--tz", metavar="ZONE", help="create, update: the cron's IANA time zone")
    p.add_argument("--input", metavar="JSON", help="create, update: each run's input")
    p.add_argument(
        "--overlap", choices=("skip", "buffer_one", "allow", "cancel_other"), help="create, update"
    )
    p.add_argument("--catch-up", dest="catch_up", metavar="DURATION", help="create, update")
    p.add_argument("--queue", metavar="NAME", help="create, update: start its runs on a queue")
    p.add_argument("--from", dest="start", metavar="TIME", help="backfill: the first tick's time")
    p.add_argument("--to", dest="end", metavar="TIME", help="backfill: the last tick's time")


async def schedules_command(args: argparse.Namespace, out: Output) -> int:
    """Lists the store's schedules, or asks the worker to create, change, backfill, pause,
    resume, trigger or delete one."""
    action: str = args.action
    if action == "list":
        if args.name is not None:
            raise CliError("`fusee schedules list` takes no name; it lists every schedule")
        return await _list(args, out)
    if args.name is None:
        raise CliError(f"`fusee schedules {action}` needs the schedule's NAME")
    fields: dict[str, Any] = {"action": action}
    if action in ("create", "update"):
        fields.update(_definition(args, action))
    elif action == "backfill":
        if args.start is None or args.end is None:
            raise CliError("`fusee schedules backfill` needs --from TIME and --to TIME")
        fields["start_ms"] = _time_ms(args.start, "--from")
        fields["end_ms"] = _time_ms(args.end, "--to")
    what = f"{action} of schedule {args.name!r}"
    return await send_command(args, out, "schedule", args.name, fields, what)


def _definition(args: argparse.Namespace, action: str) -> dict[str, Any]:
    given: dict[str, Any] = {}
    for key in _DEFINITION:
        value = getattr(args, key)
        if value is None:
            continue
        if key == "input":
            try:
                value = json.loads(value)
            except ValueError as e:
                raise CliError(f"--input is not valid JSON ({e}): {value!r}") from None
        given[key] = value
    if action == "create":
        if args.workflow is None:
            raise CliError("`fusee schedules create` needs --workflow NAME")
        if ("cron" in given) == ("every" in given):
            raise CliError("`fusee schedules create` needs --cron EXPR or --every DURATION")
        fields = {"workflow": args.workflow}
    else:
        if not given:
            raise CliError(
                "`fusee schedules update` needs what to change: --cron, --every, --tz, "
                "--input, --overlap, --catch-up or --queue"
            )
        fields = {}
    try:
        return {**fields, **_schedule_fields(args.name, given)}
    except ValueError as e:
        raise CliError(str(e)) from None


def _time_ms(text: str, option: str) -> int:
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise CliError(
            f"{option} {text!r} is not an ISO 8601 time, such as 2026-03-01T00:00:00Z"
        ) from None
    # A time without a zone is local time, as `fusee schedules` shows times.
    return int(when.astimezone().timestamp() * 1000)


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
        table.add_row(
            r.name,
            r.workflow,
            r.as_json()["state"],
            local_time(r.ticked_ms or None),
            local_time(r.next_ms or None) if not r.removed else "",
            r.last_run,
            spec_text(r.spec),
        )
    out.table(table)
    return 0
