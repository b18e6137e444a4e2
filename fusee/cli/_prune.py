"""``fusee prune --older-than 30d [--dry-run]``: delete the finished runs that ended long ago.

It posts a ``prune`` command: the worker serving the store deletes the runs
in batches (as ``Engine.open(..., retention=)`` does on its own) and answers
with how many went. ``--dry-run`` counts them from the store, read-only.
"""

from __future__ import annotations

import argparse
import time

from fusee._durations import duration_ms
from fusee.cli._inbox import send_command
from fusee.cli._output import CliError, Output
from fusee.cli._reading import reading
from fusee.store import RunRow, Store

__all__ = ["prune_command"]

_DELETABLE = ("cancelled", "completed", "failed")
# Rows read per page while counting.
_PAGE = 500


async def prune_command(args: argparse.Namespace, out: Output) -> int:
    """``fusee prune --older-than 30d [--dry-run]``."""
    try:
        older_ms = duration_ms(args.older_than)
    except (TypeError, ValueError):
        raise CliError(
            f"--older-than takes a duration (30d, 12h, 90m), not {args.older_than!r}"
        ) from None
    if older_ms <= 0:
        raise CliError(f"--older-than must be a positive duration, not {args.older_than!r}")
    before_ms = time.time_ns() // 1_000_000 - older_ms
    if args.dry_run:
        async with reading(args) as store:
            ids = await _due(store, before_ms)
        if out.json:
            out.emit({"action": "prune", "dry_run": True, "count": len(ids), "ids": ids})
        else:
            out.say(
                f"would delete {len(ids)} finished run(s) that ended over {args.older_than} ago"
            )
        return 0
    what = f"prune of the runs that ended over {args.older_than} ago"
    return await send_command(args, out, "prune", "", {"before_ms": before_ms}, what)


async def _due(store: Store, before_ms: int) -> list[str]:
    """The ids of the finished runs that ended before ``before_ms``, oldest start first."""
    rows: list[RunRow] = []
    for status in _DELETABLE:
        after: tuple[int, str] | None = None
        while True:
            page = await store.list(
                status=status, started_to_ms=before_ms, limit=_PAGE, after=after
            )
            rows.extend(r for r in page if r.finished_ms is not None and r.finished_ms < before_ms)
            if len(page) < _PAGE:
                break
            after = (page[-1].started_ms, page[-1].id)
    rows.sort(key=lambda r: (r.started_ms, r.id))
    return [r.id for r in rows]
