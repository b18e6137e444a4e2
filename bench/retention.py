"""Retention: what deleting 100,000 finished runs costs the runs that go on meanwhile.

An SQLite store (durability="fsync") holds N finished runs of W1's shape
(a Start, 10 steps, a Done; 100,000 by default) that ended two days ago.
An engine opens it with ``retention="1d"``: its sweep starts deleting them
at once, 100 runs per write, while W2 (200 workflows of 10 sequential steps,
started at once) runs. The figure is W2's steps/s then, over W2's steps/s on
the same store opened without retention, in the same repetition (the
machine's drift cancels out): the goal is at least 0.9 (W2 pays at most
10%). Also: how many runs the sweep had deleted when W2 ended (it must
still be at work, or the figure says nothing), and the sweep's runs/s.

Each measurement opens a fresh copy of the store. Prints JSON lines
(medians).

    python bench/retention.py [--runs N] [--repeat R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _workloads import sequential

import fusee
from fusee import _codec
from fusee.record import Done, Record, Start, Status, Step, encode
from fusee.store import Entry, RunRow, SqliteStore

W2_RUNS = 200
STEPS = 10
DAY_MS = 86_400_000
# Runs appended per write while the store is built.
BUILD_BATCH = 2_000


async def build(directory: Path, n: int) -> None:
    """Writes ``n`` finished runs that ended two days ago into a new store."""
    store = SqliteStore(directory, durability="none")
    await store.open()
    ended = time.time_ns() // 1_000_000 - 2 * DAY_MS
    lsn = 0
    try:
        for first in range(0, n, BUILD_BATCH):
            entries: list[Entry] = []
            rows: list[RunRow] = []
            for k in range(first, min(n, first + BUILD_BATCH)):
                id = f"old-{k}"
                started = ended - 50
                records: list[Record] = [
                    Start(1, id, "sequential", started_ms=started, input=_codec.encode(STEPS)),
                    *(Step(1, s, "s", 1, Status.OK, _codec.encode(s + 1)) for s in range(STEPS)),
                    Done(1, Status.OK, ended, _codec.encode(STEPS)),
                ]
                for rec in records:
                    lsn += 1
                    entries.append(Entry(lsn, id, 1, encode(rec)))
                rows.append(RunRow(id, 1, "sequential", "completed", started, ended))
            await store.append(entries, rows)
    finally:
        await store.close()


async def w2(directory: Path, retention: str | None) -> tuple[float, int]:
    """W2's steps/s on an engine opened on ``directory``; runs deleted by its end."""
    engine = await fusee.Engine.open(
        directory, workflows=[sequential], retention=retention, watchdog=None
    )
    try:
        deleted_before = await _old_left(engine)
        t0 = time.perf_counter()
        runs = await asyncio.gather(
            *(engine.start(sequential, f"w2-{k}", STEPS) for k in range(W2_RUNS))
        )
        for run in runs:
            await run.result()
        rate = W2_RUNS * STEPS / (time.perf_counter() - t0)
        return rate, deleted_before - await _old_left(engine)
    finally:
        await engine.close()


async def _old_left(engine: fusee.Engine) -> int:
    rows = await engine.store.list(workflow="sequential", status="completed")
    return sum(r.id.startswith("old-") for r in rows)


async def sweep_rate(directory: Path, n: int) -> float:
    """Runs deleted per second by an engine's sweep alone, until all ``n`` are gone."""
    t0 = time.perf_counter()
    engine = await fusee.Engine.open(
        directory, workflows=[sequential], retention="1d", watchdog=None
    )
    try:
        while await engine.store.list(limit=1, status="completed"):
            await asyncio.sleep(0.05)
        return n / (time.perf_counter() - t0)
    finally:
        await engine.close()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    ratios: list[float] = []
    alone: list[float] = []
    deleted: list[int] = []
    sweeps: list[float] = []
    with tempfile.TemporaryDirectory(prefix="fusee-retention-") as tmp:
        original = Path(tmp) / "original"
        await build(original, args.runs)
        for r in range(args.repeat):
            base, during, sweep = (
                Path(tmp) / f"{name}-{r}" for name in ("base", "during", "sweep")
            )
            for copy in (base, during, sweep):
                shutil.copytree(original, copy)
            plain, _ = await w2(base, None)
            busy, gone = await w2(during, "1d")
            alone.append(plain)
            ratios.append(busy / plain)
            deleted.append(gone)
            sweeps.append(await sweep_rate(sweep, args.runs))
            for copy in (base, during, sweep):
                shutil.rmtree(copy)
            print(
                f"repeat {r + 1}: W2 {plain:,.0f} steps/s alone, {busy:,.0f} while the sweep "
                f"deleted {gone:,} runs",
                file=sys.stderr,
            )
    common = {"bench": "retention", "runs": args.runs, "repeat": args.repeat}
    figures = [
        {
            "figure": f"W2 while {args.runs:,} finished runs go / W2 alone (ratio, SQLite)",
            "value": round(statistics.median(ratios), 3),
            "goal": ">= 0.9",
        },
        {"figure": "W2 alone (steps/s, SQLite)", "value": round(statistics.median(alone))},
        {
            "figure": "runs the sweep deleted while W2 ran",
            "value": int(statistics.median(deleted)),
        },
        {"figure": "sweep alone (runs deleted/s)", "value": round(statistics.median(sweeps))},
    ]
    for f in figures:
        print(json.dumps({**common, **f}))


if __name__ == "__main__":
    asyncio.run(main())
