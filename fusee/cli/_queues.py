"""``fusee queues``: queued and running runs per queue and per key, read from the store.

The rule: it only reads (the store opened read-only), so it works while
workers admit runs; the figures are those of the moment it read them.
"""

from __future__ import annotations

import argparse

from rich.table import Table

from fusee._queue import stats_json
from fusee.cli._output import Output
from fusee.cli._reading import reading
from fusee.remote import queue_stats

__all__ = ["queues_command"]


async def queues_command(args: argparse.Namespace, out: Output) -> int:
    """Prints each queue's queued and running runs, then (``--keys``) each key's."""
    async with reading(args) as store:
        stats = queue_stats(await store.queue_items())
    if out.json:
        out.emit(stats_json(stats))
        return 0
    if not stats:
        out.say(("no queued or running runs in any queue", "dim"))
        return 0
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("queue", "key", "queued", "running"):
        table.add_column(
            name, no_wrap=True, justify="right" if name in ("queued", "running") else "left"
        )
    for s in stats:
        table.add_row(s.queue, "", str(s.queued), str(s.running))
        if args.keys:
            for key, (queued, running) in s.keys.items():
                table.add_row("", key, str(queued), str(running))
    out.table(table)
    return 0
