"""``fusee cancel|resume`` over a filter: a change to many runs at once.

``fusee cancel --status running --workflow x`` cancels every run the filters
match (`fusee.Client.cancel_many`), ``fusee resume --status paused ...``
resumes them; ``--dry-run`` lists them and changes nothing. With a run ID
instead of filters, each acts on that run alone (`fusee.cli._commands`).

The rule, as for every changing command: the CLI posts commands; the worker
serving the store applies them.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
from typing import Any

from fusee.cli._commands import _attr_filters, _time_bound, cancel_command, resume_command
from fusee.cli._inbox import _served
from fusee.cli._output import CliError, Output
from fusee.cli._reading import store_shown, store_target
from fusee.client import Client
from fusee.engine import BulkResult
from fusee.store import RUN_STATUSES

__all__ = ["add_filters", "cancel_runs", "resume_runs"]


def add_filters(p: argparse.ArgumentParser, verb: str) -> None:
    """The filters of a bulk ``cancel`` or ``resume`` (as ``fusee list``), and ``--dry-run``."""
    group = p.add_argument_group(f"{verb} every run that matches (instead of one ID)")
    group.add_argument("--status", help=f"one of {', '.join(sorted(RUN_STATUSES))}")
    group.add_argument("--workflow", metavar="W", help="a workflow name")
    group.add_argument(
        "--attr", metavar="K=V", action="append", default=[], help="a search attribute (repeat)"
    )
    group.add_argument(
        "--since", metavar="WHEN", help="runs started at or after WHEN (as for `fusee list`)"
    )
    group.add_argument("--until", metavar="WHEN", help="runs started at or before WHEN")
    group.add_argument(
        "--dry-run", action="store_true", help=f"list the runs it would {verb}; change nothing"
    )


def _has_filters(args: argparse.Namespace) -> bool:
    return bool(
        args.status or args.workflow or args.attr or args.since or args.until or args.dry_run
    )


async def cancel_runs(args: argparse.Namespace, out: Output) -> int:
    """``fusee cancel ID``, or ``fusee cancel`` of every run the filters match."""
    if args.id is not None and not _has_filters(args):
        return await cancel_command(args, out)
    return await _bulk_command(args, out, "cancel")


async def resume_runs(args: argparse.Namespace, out: Output) -> int:
    """``fusee resume ID``, or ``fusee resume`` of every run the filters match."""
    if args.id is not None and not _has_filters(args):
        return await resume_command(args, out)
    return await _bulk_command(args, out, "resume")


def _when(ms: int | None) -> datetime.datetime | None:
    return None if ms is None else datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


async def _bulk_command(args: argparse.Namespace, out: Output, verb: str) -> int:
    if args.id is not None:
        raise CliError(
            f"give a run ID or filters (--status, --workflow, --attr, --since, --until), "
            f"not both: `fusee {verb} {args.id}` acts on that run alone"
        )
    if not _has_filters(args):
        raise CliError(
            f"give a run ID, or filters for every run to {verb} (--status, --workflow, "
            "--attr, --since, --until; --dry-run lists them)"
        )
    if args.status is not None and args.status not in RUN_STATUSES:
        raise CliError(
            f"--status {args.status!r} is not a status; "
            f"use one of {', '.join(sorted(RUN_STATUSES))}"
        )
    filters: dict[str, Any] = {
        "status": args.status,
        "workflow": args.workflow,
        "attributes": _attr_filters(args.attr) or None,
        "started_from": _when(_time_bound(args.since, "--since")),
        "started_to": _when(_time_bound(args.until, "--until")),
        "dry_run": args.dry_run,
    }
    target, shown = store_target(args), store_shown(args)
    served = _served(target)
    if served is False and not args.dry_run:
        raise CliError(
            f"no worker is running on {shown}; a bulk {verb} is applied by one: start "
            f"`fusee worker MODULE --store {shown}` (or list the runs with --dry-run)"
        )
    if verb == "cancel":
        filters["reason"] = args.reason
    async with await Client.connect(target) as client:
        act = client.cancel_many if verb == "cancel" else client.resume_many
        try:
            result: BulkResult = await asyncio.wait_for(act(**filters), args.timeout)
        except TimeoutError:
            raise CliError(
                f"the worker on {shown} did not answer every {verb} within {args.timeout:g}s; "
                "those posted stay queued and are applied when it takes them"
            ) from None
    return _report(out, verb, result, args.dry_run)


def _report(out: Output, verb: str, result: BulkResult, dry_run: bool) -> int:
    past = {"cancel": "cancelled", "resume": "resumed"}[verb]
    if out.json:
        out.emit(
            {
                "action": verb,
                "dry_run": dry_run,
                "count": len(result.done),
                "ids": list(result.done),
                "skipped": dict(result.skipped),
            }
        )
        return 0
    if dry_run:
        out.say(f"would {verb} {len(result.done)} run(s)")
    else:
        out.say(f"{past} {len(result.done)} run(s)")
    for id in result.done:
        out.say(("  ", ""), id)
    for id, why in result.skipped.items():
        out.warn(f"skipped {id}: {why}")
    return 0
