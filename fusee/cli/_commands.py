"""The commands that read runs (list, result) and ask for changes (start, signal,
cancel, resume, fork).

The rule: none of them opens an engine. They read the store read-only, and
the ones that change runs post a command to the store's inbox through a
`fusee.Client` (`fusee.cli._inbox`) after checking what they can without it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from rich.table import Table
from rich.text import Text

from fusee import _codec
from fusee._durations import parse_duration
from fusee._jsonview import jsonable
from fusee.cli._inbox import send_command
from fusee.cli._modules import import_module, pick, workflows_of
from fusee.cli._output import STATUS_STYLE, CliError, Output, local_time, row_json, short
from fusee.cli._reading import (
    FINISHED,
    POLL_S,
    done_record,
    get_row,
    outcome_of,
    reading,
    store_shown,
    store_target,
)
from fusee.errors import PayloadError
from fusee.remote import decode_journal, dedup_key, position
from fusee.store import RUN_STATUSES

NARROW: Final = 110
"""Below this many columns `fusee list` writes its times on two lines."""


def _attr_filters(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise CliError(f"--attr takes KEY=VALUE (VALUE as JSON, or text), not {pair!r}")
        try:
            out[key] = json.loads(text)
        except ValueError:
            out[key] = text
    return out


def _time_bound(text: str | None, flag: str) -> int | None:
    """A ``--since``/``--until`` value as Unix milliseconds.

    An ISO 8601 date or time (local time unless it names its zone: ``2026-01-05``,
    ``2026-01-05T14:05``, ``2026-01-05T14:05:00+00:00``), or a duration ago (``2h``,
    ``1d``, ``1h30m``).
    """
    if text is None:
        return None
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        try:
            ago_s = parse_duration(text)
        except ValueError:
            raise CliError(
                f"{flag} takes an ISO 8601 date or time (2026-01-05, 2026-01-05T14:05) or a "
                f"duration ago (2h, 1d, 1h30m), not {text!r}"
            ) from None
        return int((time.time() - ago_s) * 1000)
    if when.tzinfo is None:
        when = when.astimezone()  # a naive time is local time
    return int(when.timestamp() * 1000)


async def list_command(args: argparse.Namespace, out: Output) -> int:
    if args.status is not None and args.status not in RUN_STATUSES:
        raise CliError(
            f"--status {args.status!r} is not a status; "
            f"use one of {', '.join(sorted(RUN_STATUSES))}"
        )
    attributes = _attr_filters(args.attr)
    since_ms = _time_bound(args.since, "--since")
    until_ms = _time_bound(args.until, "--until")
    async with reading(args) as store:
        # Newest first, in the store: `--limit N` is the N latest runs, never
        # the oldest ones of a store that has grown.
        rows = await store.list(
            status=args.status,
            workflow=args.workflow,
            attributes=attributes or None,
            limit=args.limit,
            newest_first=True,
            started_from_ms=since_ms,
            started_to_ms=until_ms,
        )
    if out.json:
        out.emit([row_json(r) for r in rows])
        return 0
    if not rows:
        out.say(("no runs match", "dim"))
        return 0
    table = Table(box=None, pad_edge=False, header_style="bold")
    # A narrow terminal folds the ids, names and attributes; a status and a
    # run number are never cut (`complet…` says nothing), and a time breaks
    # at its space, into a date over a time of day.
    table.add_column("id", overflow="fold")
    table.add_column("workflow", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("run", no_wrap=True, justify="right")
    table.add_column("started", no_wrap=True)
    table.add_column("finished", no_wrap=True)
    table.add_column("attributes", overflow="fold", ratio=1)
    table.add_column("parent", overflow="fold")
    narrow = out.console.width < NARROW
    for r in rows:
        started, finished = local_time(r.started_ms), local_time(r.finished_ms)
        if narrow:
            started, finished = started.replace(" ", "\n"), finished.replace(" ", "\n")
        table.add_row(
            r.id,
            r.workflow,
            Text(r.status, style=STATUS_STYLE.get(r.status, "")),
            str(r.run),
            started,
            finished,
            short(jsonable(dict(r.attributes)), 60) if r.attributes else "",
            r.parent or "",
        )
    out.table(table)
    return 0


# --- result --------------------------------------------------------------------------------------


async def result_command(args: argparse.Namespace, out: Output) -> int:
    where = store_shown(args)
    loop = asyncio.get_running_loop()
    deadline = None if args.timeout is None else loop.time() + args.timeout
    async with reading(args) as store:
        while True:
            row = await get_row(store, args.id, where)
            if row.status in FINISHED:
                done = done_record(await store.load(args.id, row.run))
                if done is None:
                    raise CliError(f"run {args.id!r} is {row.status} but its journal has no end")
                break
            if not args.wait:
                raise CliError(
                    f"run {args.id!r} has not finished ({row.status}); "
                    "pass --wait to wait for its result"
                )
            if deadline is not None and loop.time() >= deadline:
                raise CliError(
                    f"run {args.id!r} did not finish within {args.timeout:g}s ({row.status})"
                )
            await asyncio.sleep(POLL_S)
    outcome = outcome_of(done)
    if out.json:
        out.emit({"id": row.id, "run": row.run, **outcome})
    elif outcome["status"] == "completed":
        out.console.print(json.dumps(outcome["result"], ensure_ascii=False, indent=2))
    else:
        err = outcome["error"]
        out.error(f"run {row.id!r} {outcome['status']}: {err['type']}: {err['message']}")
    return 0 if outcome["status"] == "completed" else 1


def _parse_json(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as e:
        raise CliError(f"{what} is not valid JSON ({e}): {text!r}") from None


async def _check_running(args: argparse.Namespace, id: str, verb: str) -> None:
    """Fails early, without queueing, when run ``id`` is unknown or has finished."""
    where = store_shown(args)
    async with reading(args) as store:
        row = await get_row(store, id, where)
    if row.status in FINISHED:
        raise CliError(f"run {id!r} has finished ({row.status}); there is nothing to {verb}")


async def signal_command(args: argparse.Namespace, out: Output) -> int:
    payload = _parse_json(args.payload, "the signal's payload")
    await _check_running(args, args.id, "signal")
    fields = {
        "name": args.name,
        "payload": _codec.encode(payload),
        "dedup": dedup_key(args.dedup),
    }
    what = f"signal {args.name!r} to run {args.id!r}"
    return await send_command(args, out, "signal", args.id, fields, what, dedup=args.dedup)


async def cancel_command(args: argparse.Namespace, out: Output) -> int:
    await _check_running(args, args.id, "cancel")
    fields = {"reason": args.reason}
    return await send_command(args, out, "cancel", args.id, fields, f"cancel of run {args.id!r}")


async def resume_command(args: argparse.Namespace, out: Output) -> int:
    await _check_running(args, args.id, "resume")
    return await send_command(args, out, "resume", args.id, {}, f"resume of run {args.id!r}")


async def start_command(args: argparse.Namespace, out: Output) -> int:
    module_spec, sep, wf_name = args.workflow.rpartition(":")
    if not sep or not module_spec or not wf_name:
        raise CliError(
            f"expected MODULE:WORKFLOW (like examples.checkout:checkout), not {args.workflow!r}"
        )
    value = _parse_json(args.input, "the input")
    workflows = workflows_of([import_module(module_spec)], module_spec)
    wf = pick(workflows, wf_name, module_spec)
    try:
        wf.decode_input(_codec.encode(value))
    except PayloadError as e:
        raise CliError(f"the input does not fit workflow {wf.name!r}: {e}") from None
    target = store_target(args)
    if "://" not in target and (Path(target) / "fusee.db").exists():
        async with reading(args) as store:
            row = await store.get(args.id)
        if row is not None and args.id_policy == "reject":
            raise CliError(
                f"run {args.id!r} exists ({row.status}); pass --id-policy replace to start "
                "over once it has finished"
            )
    fields = {"workflow": wf.name, "input": _codec.encode(value), "id_policy": args.id_policy}
    if args.queue is not None:
        fields.update(queue=args.queue, key=args.key, priority=args.priority)
    what = f"start of run {args.id!r} ({wf.name})"
    return await send_command(args, out, "start", args.id, fields, what)


def _fork_position(text: str) -> int | str:
    """``--at`` as a position when it is a number (``-1`` too, refused later), else a name."""
    try:
        return int(text)
    except ValueError:
        return text


async def fork_command(args: argparse.Namespace, out: Output) -> int:
    at = _fork_position(args.at)
    fields: dict[str, Any] = {"from": args.id, "new_id": args.new_id, "at": at}
    if args.input is not None:
        fields["input"] = _codec.encode(_parse_json(args.input, "the input"))
    where = store_shown(args)
    # Checked here too, so that a bad position or a taken id fails at once
    # (also with no worker running) and nothing is queued.
    async with reading(args) as store:
        row = await get_row(store, args.id, where)
        try:
            position(
                decode_journal(args.id, row.run, await store.load(args.id, row.run)), at, args.id
            )
        except (TypeError, ValueError) as e:
            raise CliError(str(e)) from None
        taken = await store.get(args.new_id)
    if taken is not None:
        raise CliError(f"run {args.new_id!r} exists ({taken.status}); fork to an id no run has")
    what = f"fork of run {args.id!r} as {args.new_id!r} at {at!r}"
    # Addressed to the new run: the worker that will serve it writes it.
    return await send_command(args, out, "fork", args.new_id, fields, what)
