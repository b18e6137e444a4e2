"""``fusee versions``: a store's unfinished runs per engine version, and the workers of each.

On Postgres the workers are the live rows of its ``workers`` table; on
SQLite, one engine serves a store, and the command asks it its version
(a ``version`` command through the inbox). A version with unfinished runs
and no worker is a warning: its pinned runs wait until a worker of it runs
(`fusee.remote._versions`).

The rule: it reads the store read-only and posts nothing but that question.
"""

from __future__ import annotations

import argparse

from rich.table import Table

from fusee.cli._inbox import _served
from fusee.cli._output import Output
from fusee.cli._reading import reading, store_target
from fusee.client import Client
from fusee.remote import answer_fields
from fusee.remote._versions import version_lines

__all__ = ["versions_command"]


async def versions_command(args: argparse.Namespace, out: Output) -> int:
    """Prints the unfinished runs per version and the workers of each; warns of orphans."""
    target = store_target(args)
    # Asked before this process opens the store (see `fusee.store.sqlite.is_served`).
    served = _served(target)
    workers: dict[str, str] | None = None
    async with reading(args) as store:
        rows = await store.unfinished()
        listed = getattr(store, "workers", None)
        if listed is not None:
            workers = dict(await listed())
    if workers is None:
        workers = {} if not served else await _serving(target, args.timeout)
    lines = version_lines(rows, workers)
    if out.json:
        out.emit([line.as_json() for line in lines])
        return 0
    if not lines:
        out.say(("no unfinished runs and no worker", "dim"))
        return 0
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("version", no_wrap=True)
    table.add_column("unfinished runs", justify="right", no_wrap=True)
    table.add_column("workers", overflow="fold", ratio=1)
    for line in lines:
        who = ", ".join(line.workers) if workers is not None else "?"
        table.add_row(line.version or "(none)", str(line.runs), who or "none")
    out.table(table)
    if workers is None:
        out.warn(f"no worker answered within {args.timeout:g}s: which version serves it is unknown")
    for line in lines:
        if line.warning is not None:
            out.warn(line.warning)
    return 0


async def _serving(target: str, timeout_s: float) -> dict[str, str] | None:
    """The serving engine's version, asked through the inbox (None: no answer in time)."""
    async with await Client.connect(target) as client:
        command = await client.post("version", "-", {})
        answer = await client.wait_answer(command.id, timeout_s=timeout_s)
    if answer is None:
        return None
    return {"the serving engine": str(answer_fields(answer)["version"])}
