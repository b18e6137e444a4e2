"""From a Client's start to the run's first step, with the worker in another process.

A worker process (``fusee.Engine`` on the store) serves a workflow whose
first step returns the wall-clock time it ran; a `fusee.Client` in this
process starts runs one after the other and reads that time back. Figures:
the time from calling ``client.start`` to the first step running, and to
``start`` returning (the worker's answer), p50 and p99, on SQLite and, when
a PostgreSQL server is installed (tests/_postgres.py finds one), on a
throwaway Postgres. ``durability="fsync"`` on both sides. Prints JSON lines.

    python bench/client_latency.py [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import fusee

HERE = Path(__file__).resolve().parent


@fusee.workflow("first-step")
async def first_step(ctx: fusee.Ctx, n: int) -> int:
    return await ctx.step("stamp", time.time_ns)


async def serve(target: str) -> None:
    async with await fusee.Engine.open(target, workflows=[first_step], watchdog=None):
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.read)


async def measure(target: str, runs: int) -> tuple[list[float], list[float]]:
    to_step: list[float] = []
    to_ack: list[float] = []
    async with await fusee.Client.connect(target) as client:
        for i in range(runs + 5):
            began = time.time_ns()
            run = await client.start(first_step, f"latency-{i}", i)
            acked = time.time_ns()
            stamp = await run.result()
            if i >= 5:  # the first few warm the caches and the connections up
                to_step.append((stamp - began) / 1e6)
                to_ack.append((acked - began) / 1e6)
    return to_step, to_ack


def figures(store: str, target: str, runs: int) -> list[dict[str, Any]]:
    worker = subprocess.Popen(
        [sys.executable, __file__, "--serve", target],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        if worker.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the worker on {store} did not start")
        to_step, to_ack = asyncio.run(measure(target, runs))
    finally:
        assert worker.stdin is not None
        worker.stdin.close()
        worker.wait(60)
        assert worker.stdout is not None
        worker.stdout.close()
    rows = []
    for what, values, goal in (
        ("Client start to the run's first step", to_step, "<= 50"),
        ("Client start to its answer", to_ack, ""),
    ):
        q = statistics.quantiles(values, n=100)
        for name, value in (("p50", statistics.median(values)), ("p99", q[98])):
            rows.append(
                {
                    "bench": "client_latency",
                    "figure": f"{what}, {store}, {name}, ms",
                    "value": round(value, 2),
                    **({"goal": goal} if goal and name == "p50" else {}),
                    "runs": runs,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        for row in figures("SQLite", d, args.runs):
            print(json.dumps(row), flush=True)
    sys.path.insert(0, str(HERE.parent / "tests"))
    try:
        from _postgres import Cluster

        cluster = Cluster()
    except (ImportError, RuntimeError) as e:
        print(f"client_latency: no Postgres figures: {e}", file=sys.stderr)
        return
    with cluster:
        for row in figures("Postgres", cluster.dsn, args.runs):
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        asyncio.run(serve(sys.argv[2]))
    else:
        main()
    os._exit(0)
