"""The cost of one schedule tick, against starting the same run by hand.

A `TestEngine` on SQLite (``durability="fsync"``, a fresh temporary
directory each time) ticks an every-minute schedule of a workflow that
returns at once, over N virtual minutes: wall time per tick. The baseline
is the same engine starting N runs of that workflow with ``t.start`` and
settling after each, so the ratio is what the ticker adds to a start (its
reads of the schedule row, the claim, and the writes of its state).

    python bench/schedules.py [--ticks N] [--repeat R]

Prints JSON lines (medians).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from typing import Any

import fusee
from fusee.store import SqliteStore
from fusee.testing import TestEngine


@fusee.workflow("tick")
async def tick(ctx: fusee.Ctx) -> int:
    return 1


async def ticking(directory: str, n: int) -> float:
    s = fusee.Schedule("bench", tick, every="1m")
    store = SqliteStore(directory, durability="fsync")
    async with TestEngine([tick], store, schedules=[s], profile=None) as t:
        await t.settle()
        began = time.perf_counter()
        for _ in range(n):
            await t.advance("1m")
        took = time.perf_counter() - began
        assert len([i async for i in t.list()]) == n
    return took / n


async def starting(directory: str, n: int) -> float:
    store = SqliteStore(directory, durability="fsync")
    async with TestEngine([tick], store, profile=None) as t:
        await t.settle()
        began = time.perf_counter()
        for i in range(n):
            await t.start(tick, f"by-hand-{i}")
            await t.advance("1m")
        took = time.perf_counter() - began
    return took / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ticks", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    per_tick: list[float] = []
    per_start: list[float] = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            per_tick.append(asyncio.run(ticking(a, args.ticks)) * 1000)
            per_start.append(asyncio.run(starting(b, args.ticks)) * 1000)
    ratios = [x / y for x, y in zip(per_tick, per_start, strict=True)]
    figures: list[tuple[str, list[float], str]] = [
        ("one schedule tick (its run started), SQLite fsync, ms", per_tick, ""),
        ("the same run started by hand, SQLite fsync, ms", per_start, ""),
        ("schedule tick / start by hand", ratios, ""),
    ]
    for name, values, goal in figures:
        row: dict[str, Any] = {
            "bench": "schedules",
            "figure": name,
            "value": round(statistics.median(values), 3),
            **({"goal": goal} if goal else {}),
            "repeat": args.repeat,
            "values": [round(v, 3) for v in values],
        }
        print(json.dumps(row))


if __name__ == "__main__":
    main()
