# mypy: disable-error-code="import-not-found, untyped-decorator"
# The two codes above are for the project's mypy run only, where dbos is not
# installed: this module runs in bench/.venv-dbos and nothing in the
# project's venv imports it. Checked against dbos's own types with:
#   .venv/bin/mypy --python-executable bench/.venv-dbos/bin/python bench/peers/dbos_workloads.py
"""The DBOS side of the peer benchmark: W1, W2 (with W5's timings) and W3.

Runs in bench/.venv-dbos (DBOS Transact, pinned by compare.py), one workload
per process, on a SQLite system database in the directory it is given, the
way DBOS ships: its own SQLite settings (a rollback journal with
synchronous=FULL, so every commit is fsynced), its own pool and threads.
Only logging is turned down. Network: no Conductor key, no OTLP, no DBOS
Cloud variables (the harness strips DBOS* from the environment), and DBOS
3.4 has no admin server; the audit-hook guard from `_common` would stop
anything that still tried.

With ``--store postgres --url URL`` it runs on a Postgres system database
instead (DBOS's ``system_database_url``; DBOS creates the database if it
is not there, and talks to it through psycopg 3, which it installs), with
its own pool and settings.

    bench/.venv-dbos/bin/python -m peers.dbos_workloads W1 --store sqlite --dir DIR --steps 1000
    bench/.venv-dbos/bin/python -m peers.dbos_workloads W2 --store postgres --dir DIR \
        --url postgresql://user:secret@127.0.0.1:5432/dbos_sys --steps 10 --workflows 200
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from dbos import DBOS, DBOSConfig, SetWorkflowID, WorkflowHandleAsync

from peers._common import (
    WARMUP_PREFIX,
    WARMUP_STEPS,
    WARMUP_WORKFLOWS,
    Args,
    StepClock,
    check_calls,
    emit,
    install_network_guard,
    latency_figures,
    parse_args,
)

WORKLOADS = ("W1", "W2", "W3")
STORES = ("sqlite", "postgres")
DB_FILE = "dbos.sqlite"

# Replaced after the warm-up, so only the timed run is counted.
clock = StepClock()


@DBOS.step()
async def add_one(i: int) -> int:
    clock.tick()
    return i + 1


@DBOS.step()
async def add_one_timed(k: int, i: int) -> int:
    clock.mark(k)
    return i + 1


@DBOS.workflow()
async def w1(n: int) -> int:
    x = 0
    for i in range(n):
        x = await add_one(i)
    return x


@DBOS.workflow()
async def w2(k: int, n: int) -> int:
    x = 0
    for i in range(n):
        x = await add_one_timed(k, i)
    return x


@DBOS.workflow()
async def w3(n: int) -> list[int]:
    # DBOS numbers a step when its coroutine first runs, which gather does in
    # argument order, so this is a deterministic workflow in DBOS's terms.
    return list(await asyncio.gather(*(add_one(i) for i in range(n))))


async def run_w1(n: int, prefix: str) -> None:
    with SetWorkflowID(f"{prefix}w1"):
        handle = await DBOS.start_workflow_async(w1, n)
    result: int = await handle.get_result()
    if result != n:
        raise RuntimeError(f"W1 returned {result}, expected {n}")


async def start_w2(k: int, n: int, prefix: str) -> WorkflowHandleAsync[int]:
    # Each start in its own task: SetWorkflowID lives in a context variable.
    with SetWorkflowID(f"{prefix}w2-{k}"):
        return await DBOS.start_workflow_async(w2, k, n)


async def run_w2(workflows: int, n: int, prefix: str) -> None:
    # "Started at once": all starts issued together, as fusee's side does.
    handles = await asyncio.gather(*(start_w2(k, n, prefix) for k in range(workflows)))
    for handle in handles:
        result: int = await handle.get_result()
        if result != n:
            raise RuntimeError(f"W2 returned {result}, expected {n}")


async def run_w3(n: int, prefix: str) -> None:
    with SetWorkflowID(f"{prefix}w3"):
        handle = await DBOS.start_workflow_async(w3, n)
    result: list[int] = await handle.get_result()
    if result != list(range(1, n + 1)):
        raise RuntimeError(f"W3 returned a wrong list (first items {result[:5]})")


async def workload(args: Args, prefix: str, workflows: int, steps: int) -> None:
    if args.workload == "W1":
        await run_w1(steps, prefix)
    elif args.workload == "W2":
        await run_w2(workflows, steps, prefix)
    else:
        await run_w3(steps, prefix)


def recorded_steps(db: Path) -> int:
    """Step records the timed run left in DBOS's system database."""
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT count(*) FROM operation_outputs WHERE workflow_uuid NOT LIKE ?",
            (WARMUP_PREFIX + "%",),
        ).fetchone()
    return int(row[0])


def recorded_steps_postgres(url: str) -> int:
    """Step records the timed run left in DBOS's Postgres system database."""
    import psycopg  # DBOS's own driver, installed with it

    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM dbos.operation_outputs WHERE workflow_uuid NOT LIKE %s",
            (WARMUP_PREFIX + "%",),
        ).fetchone()
    assert row is not None
    return int(row[0])


def sqlite_settings(db: Path) -> str:
    # DBOS sets neither pragma, so a fresh connection shows what its own get.
    with sqlite3.connect(db) as conn:
        journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
        sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    return f"journal_mode={journal}, synchronous={names.get(sync, sync)}"


async def main(argv: list[str]) -> None:
    global clock
    install_network_guard()
    args = parse_args(argv, workloads=WORKLOADS, stores=STORES)
    db = Path(args.directory).resolve() / DB_FILE
    config: DBOSConfig = {
        "name": "fusee-peers-bench",
        "system_database_url": args.url if args.store == "postgres" else f"sqlite:///{db}",
        # INFO logs a line per launch and recovery, never per step; turned
        # down anyway so neither side pays for console output.
        "log_level": "WARNING",
        "enable_otlp": False,
        # Fixed, so launch does not hash the workflows' source into a version.
        "application_version": "bench",
    }
    DBOS(config=config)
    DBOS.launch()
    try:
        warm_steps = min(WARMUP_STEPS, args.steps)
        await workload(args, WARMUP_PREFIX, min(WARMUP_WORKFLOWS, args.workflows), warm_steps)
        clock = StepClock()
        t0, c0 = time.perf_counter(), time.process_time()
        await workload(args, "", args.workflows, args.steps)
        seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    finally:
        DBOS.destroy()
    total = args.steps * args.workflows
    extra: dict[str, float] = {}
    if args.workload == "W2":
        extra = latency_figures(clock.gaps_ms(args.workflows, args.steps))
    check_calls(clock, total)
    postgres = args.store == "postgres"
    recorded = recorded_steps_postgres(args.url) if postgres else recorded_steps(db)
    if recorded != total:
        raise RuntimeError(f"DBOS recorded {recorded} steps, expected {total}")
    meta: dict[str, Any] = {
        "system": "dbos",
        "version": importlib.metadata.version("dbos"),
        "sqlalchemy": importlib.metadata.version("sqlalchemy"),
        "python": sys.version.split()[0],
    }
    if postgres:
        meta["psycopg"] = importlib.metadata.version("psycopg")
    else:
        meta["sqlite"] = f"{sqlite3.sqlite_version}, {sqlite_settings(db)}"
    emit(args, seconds, cpu_seconds, total, extra, meta)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
