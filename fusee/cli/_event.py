"""``fusee event ID KEY [--wait] [--timeout S]``: a run's latest value of an event.

The rule: it reads the store read-only (the run's journal), as the other
reading commands do, so it works while an engine writes the store.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from fusee._jsonview import payload as payload_json
from fusee.cli._output import CliError, Output
from fusee.cli._reading import POLL_S, get_row, reading, store_shown
from fusee.remote import decode_journal, latest_event, never_set
from fusee.store import load_journal

__all__ = ["event_command"]


async def event_command(args: argparse.Namespace, out: Output) -> int:
    """Prints the latest value of event ``args.key`` of run ``args.id`` (waiting with --wait)."""
    where = store_shown(args)
    loop = asyncio.get_running_loop()
    deadline = None if args.timeout is None else loop.time() + args.timeout
    async with reading(args) as store:
        while True:
            row = await get_row(store, args.id, where)
            entries = await load_journal(store, row)
            found = latest_event(decode_journal(args.id, row.run, entries), args.key)
            if found is not None:
                break
            ended = never_set(row, args.key)
            if ended is not None:
                raise CliError(str(ended))
            if not args.wait:
                raise CliError(
                    f"run {args.id!r} has not set event {args.key!r} yet ({row.status}); "
                    "pass --wait to wait for it"
                )
            if deadline is not None and loop.time() >= deadline:
                raise CliError(
                    f"run {args.id!r} did not set event {args.key!r} within {args.timeout:g}s"
                )
            await asyncio.sleep(POLL_S)
    value = payload_json(found)
    if out.json:
        out.emit({"id": row.id, "run": row.run, "key": args.key, "value": value})
    else:
        out.console.print(json.dumps(value, ensure_ascii=False, indent=2))
    return 0
