"""Where a W1 step's time goes under fsync: the commit, the two thread hand-offs, the loop.

W1 (one workflow, sequential steps) on SQLite with ``durability="fsync"``,
with timestamps taken where a group commit is handed to the store's writer
thread (`SqliteStore._submit`), where the writer starts and ends its
transaction (`_commit`), and where the event loop hears of it (`_finish`).
Each sequential step makes one group commit, so the medians of the four
gaps add up to a step:

- commit: the writer thread's transaction, with its WAL fsync;
- wake the loop: from the commit's end to the loop running `_finish`;
- the loop: from `_finish` to the next `_submit` (releasing the step, running
  it, delivering its result, the workflow's next `ctx.step`), wall and CPU;
- wake the writer: from `_submit` to the writer starting the transaction.

A lone append finds the writer idle and commits on the loop's thread
(`_write_here`): then both wake-ups are the few microseconds between the
calls, and the step is the commit and the loop's work.

Private hooks, for measuring only. Prints JSON lines (medians of each gap
over all steps of the median repetition by step time).

    python bench/anatomy.py [--steps N] [--repeat R]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from _workloads import sequential

import fusee
from fusee.store import sqlite

Event = tuple[str, float, float]  # what, perf_counter, thread CPU time


def _timed(name: str, fn: Callable[..., Any], events: list[Event]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kw: Any) -> Any:
        events.append((name, time.perf_counter(), time.thread_time()))
        try:
            return fn(*args, **kw)
        finally:
            if name == "begin":
                events.append(("end", time.perf_counter(), time.thread_time()))

    return wrapper


async def one(steps: int) -> dict[str, float]:
    events: list[Event] = []
    store = sqlite.SqliteStore
    saved = store._submit, store._commit, store._finish
    with tempfile.TemporaryDirectory() as d:
        async with await fusee.Engine.open(d, workflows=[sequential], durability="fsync") as engine:
            await engine.execute(sequential, "warm", 10)
            store._submit = _timed("submit", saved[0], events)  # type: ignore[method-assign]
            store._commit = _timed("begin", saved[1], events)  # type: ignore[method-assign]
            store._finish = _timed("finish", saved[2], events)  # type: ignore[method-assign]
            try:
                t0 = time.perf_counter()
                await engine.execute(sequential, "w1", steps)
                step_us = (time.perf_counter() - t0) / steps * 1e6
            finally:
                store._submit, store._commit, store._finish = saved  # type: ignore[method-assign]
    gaps: dict[tuple[str, str], list[float]] = {}
    loop_cpu: list[float] = []
    for (a, ta, ca), (b, tb, cb) in itertools.pairwise(events):
        gaps.setdefault((a, b), []).append((tb - ta) * 1e6)
        if (a, b) == ("finish", "submit"):
            loop_cpu.append((cb - ca) * 1e6)

    def median(a: str, b: str) -> float:
        return statistics.median(gaps.get((a, b), [0.0]))

    return {
        "step": step_us,
        "commit": median("begin", "end"),
        "wake the loop": median("end", "finish"),
        "the loop": median("finish", "submit"),
        "the loop, CPU": statistics.median(loop_cpu) if loop_cpu else 0.0,
        "wake the writer": median("submit", "begin"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    runs = sorted(
        (asyncio.run(one(args.steps)) for _ in range(args.repeat)), key=lambda r: r["step"]
    )
    mid = runs[len(runs) // 2]
    for part, value in mid.items():
        figure = "W1 step under fsync, µs" if part == "step" else f"W1 step under fsync: {part}, µs"
        row = {
            "bench": "anatomy",
            "figure": figure,
            "value": round(value, 1),
            "repeat": args.repeat,
            "steps": args.steps,
        }
        print(json.dumps(row))


if __name__ == "__main__":
    main()
