"""A worker process for bench/postgres.py: ``python bench/_pg_worker.py URL NAME LEASE LOG``.

Serves ``w2`` (W2's workflow: sequential steps returning ``i + 1``) and
``park`` (a step, a wait for the signal ``go``, a step) on the Postgres
database at URL as worker NAME, with shard leases of LEASE and
``durability="fsync"``, until its stdin closes (then it stops, giving its
shards back); prints ``ready`` once its engine is open. Given the line
``w2 PREFIX RUNS STEPS`` on stdin, it starts those of the runs
``PREFIX``w2-0 ... that are of its shards (the others are another worker's
share), awaits their results and prints ``{"t0_ns", "t1_ns", "cpu_ns", "runs"}``:
its first start and its last result by the wall clock, and its CPU time
between them. Each step of
``park`` appends ``NAME ID STEP TIME_NS`` to the file LOG when it ends, so
the benchmark can tell when, and on which worker, each run moved on.

The rule: a line is written by one ``os.write`` on an ``O_APPEND`` file,
so the lines of several workers never interleave.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import fusee

go = fusee.signal("go", int)
NAME = sys.argv[2] if len(sys.argv) > 2 else "worker"
LOG = sys.argv[4] if len(sys.argv) > 4 else os.devnull


def note(id: str, step: str) -> str:
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{NAME} {id} {step} {time.time_ns()}\n".encode())
    finally:
        os.close(fd)
    return step


async def add_one(i: int) -> int:
    return i + 1


@fusee.workflow("w2")
async def w2(ctx: fusee.Ctx, job: list[int]) -> int:
    _, n = job
    x = 0
    for i in range(n):
        x = await ctx.step("s", lambda i=i: add_one(i))
    return x


@fusee.workflow("park")
async def park(ctx: fusee.Ctx, n: int) -> int:
    id = ctx.info.id
    await ctx.step("a", lambda: note(id, "a"))
    got = await ctx.wait_for(go, timeout="10m") or 0
    await ctx.step("b", lambda: note(id, "b"))
    return n + got


async def my_share(engine: fusee.Engine, prefix: str, runs: int, steps: int) -> dict[str, int]:
    ids = [(k, f"{prefix}w2-{k}") for k in range(runs)]
    mine = [(k, id) for k, id in ids if engine.owns(id)]
    t0, c0 = time.time_ns(), time.process_time_ns()
    started = await asyncio.gather(*(engine.start(w2, id, [k, steps]) for k, id in mine))
    for run in started:
        if (got := await run.result()) != steps:
            raise RuntimeError(f"W2 returned {got!r}, expected {steps}")
    cpu_ns = time.process_time_ns() - c0
    return {"t0_ns": t0, "t1_ns": time.time_ns(), "cpu_ns": cpu_ns, "runs": len(mine)}


async def main(url: str, lease: str) -> None:
    async with await fusee.Engine.open(
        url, workflows=[w2, park], durability="fsync", lease=lease, worker=NAME
    ) as engine:
        print("ready", flush=True)
        while line := await asyncio.to_thread(sys.stdin.readline):
            order, prefix, runs, steps = line.split()
            if order != "w2":
                raise ValueError(f"unknown order {line.strip()!r}: w2 PREFIX RUNS STEPS")
            print(json.dumps(await my_share(engine, prefix, int(runs), int(steps))), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[3]))
