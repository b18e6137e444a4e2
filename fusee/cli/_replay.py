"""``fusee replay``: replay journals against the current code, before a deploy.

The rule: replay runs no step and writes nothing: each journal is fed to a
driver with a host that records nothing (`fusee._driver.ReplayHost`).

An unfinished run pinned to another version than the code's (``--version``,
or the one derived from the modules' workflows, as ``Engine.open`` derives
it) is skipped: the new code never runs it (`fusee.remote._versions`). The
runs of ``versioning="auto"`` workflows, which the new code takes over, are
the ones its replay must pass.
"""

from __future__ import annotations

import argparse
from typing import Any, Final

from fusee._definitions import WorkflowDef
from fusee._driver import ReplayHost, RunDriver
from fusee.cli._modules import import_module, workflows_of
from fusee.cli._output import Output
from fusee.cli._reading import FINISHED, get_row, reading, store_shown
from fusee.errors import DeterminismError, FuseeError
from fusee.record import decode
from fusee.remote._versions import check_version, derived_version
from fusee.store import RunRow

# Runs that never replay again: their journal ends with Done.
_ENDED: Final = FINISHED | {"continued"}


def _replay_one(
    wf: WorkflowDef[Any, Any], entries: list[tuple[int, bytes]]
) -> str | DeterminismError:
    """Replays one journal against ``wf``; "ok", a problem, or the divergence."""
    try:
        records = [decode(data) for _, data in entries]
    except FuseeError as e:
        return f"unreadable journal: {e}"
    driver = RunDriver(ReplayHost(), wf, records, entries[-1][0])
    try:
        driver.start()
    except Exception as e:
        return f"replay raised {type(e).__name__}: {e}"
    finally:
        driver.close()
    return driver.error if driver.error is not None else "ok"


def _replayed(rows: list[RunRow], every: bool) -> tuple[list[RunRow], int]:
    """The rows to replay, and how many finished ones are left out."""
    if every:
        return rows, 0
    counted = [row for row in rows if row.status not in _ENDED]
    return counted, len(rows) - len(counted)


async def replay_command(args: argparse.Namespace, out: Output) -> int:
    modules = [import_module(spec) for spec in args.modules]
    workflows = {
        wf.name: wf for wf in workflows_of(modules, " and ".join(repr(m) for m in args.modules))
    }
    where = store_shown(args)
    version = (
        check_version(args.version)
        if args.version is not None
        else derived_version(workflows.values())
    )
    results: list[dict[str, Any]] = []
    async with reading(args, strict=True) as store:
        if args.id:
            # A run asked for by name is replayed whatever its status.
            rows, left_out = [await get_row(store, args.id, where)], 0
        else:
            rows, left_out = _replayed(await store.list(), args.all)
        for row in rows:
            item: dict[str, Any] = {
                "id": row.id,
                "run": row.run,
                "workflow": row.workflow,
                "status": row.status,
                "outcome": "ok",
                "seq": None,
                "message": None,
                "location": None,
            }
            wf = workflows.get(row.workflow)
            if wf is None:
                # A finished run needs no code; an unfinished one cannot go on without it.
                item["outcome"] = "skipped" if row.status in _ENDED else "unknown workflow"
                item["message"] = f"workflow {row.workflow!r} is not in {', '.join(args.modules)}"
            elif (
                wf.versioning == "pinned"
                and row.version not in ("", version)
                and row.status not in _ENDED
            ):
                item["outcome"] = "skipped"
                item["message"] = (
                    f"pinned to version {row.version!r}: it runs to its end on that version, "
                    f"not on this code ({version!r})"
                )
            else:
                got = _replay_one(wf, await store.load(row.id, row.run))
                if isinstance(got, DeterminismError):
                    item.update(
                        outcome="diverged",
                        seq=got.seq,
                        message=got.message,
                        location=got.location,
                    )
                elif got != "ok":
                    item.update(outcome="error", message=got)
            results.append(item)
    bad = [r for r in results if r["outcome"] not in ("ok", "skipped")]
    if out.json:
        out.emit({"runs": results, "problems": len(bad), "not_replayed": left_out})
        return 1 if bad else 0
    for r in results:
        run = f"{r['id']} (run {r['run']}, {r['workflow']}, {r['status']})"
        if r["outcome"] == "ok":
            out.say(("  ok        ", "green"), run)
        elif r["outcome"] == "skipped":
            out.say(("  skipped   ", "dim"), f"{run}: {r['message']}")
        else:
            where_ = f" at journal position {r['seq']}" if r["seq"] is not None else ""
            at = f"\n              at {r['location']}" if r["location"] else ""
            out.say((f"  {r['outcome']:<9} ", "bold red"), f"{run}{where_}: {r['message']}{at}")
    what = "run(s)" if args.all or args.id else "unfinished run(s)"
    verdict = (
        f"{len(results)} {what} replayed: {len(bad)} problem(s)"
        if bad
        else f"{len(results)} {what} replayed against the code: no divergence"
    )
    out.say((verdict, "bold red" if bad else "bold green"))
    if left_out:
        out.say(
            (
                f"{left_out} finished run(s) not replayed: a finished run never replays; "
                "--all replays them too",
                "dim",
            )
        )
    return 1 if bad else 0
