"""The disk's flush floor, and W1 under fsync against it, in one run.

Under ``durability="fsync"`` a sequential step waits for one flush (its
gate), so 1 / the flush p50 (`fusee disk-check`) is the ceiling of W1 on
this disk; the goal is W1 at 80% of it at least. The disk's speed moves
by the minute on a shared VM, so each repetition measures the flush
floor and then W1 right after, and the ratio is the median of the
repetitions' ratios. Prints JSON lines.

Each repetition also runs W1 on a probe of the issue's journal-file option
(`w1_on_a_log_file`): the memory store, plus one CRC-framed ``os.write``
and ``os.fdatasync`` of each append's records to a file, on the loop's
thread. It has no index, no recovery and no torn-tail check, so it is an
upper bound of what a journal file beside SQLite could give W1, not a
store: the figure to weigh that option by.

    python bench/disk.py [--steps N] [--repeat R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Sequence
from typing import Any

from _workloads import sequential

import fusee
from fusee.store import Entry, MemoryStore, RunRow


def flush_check() -> dict[str, float]:
    """One `fusee disk-check` in a fresh directory: its p50, p99 and max, µs."""
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run(
            [sys.executable, "-m", "fusee", "disk-check", d, "--json"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    report: dict[str, float] = json.loads(out)
    return report


async def w1(steps: int) -> float:
    """W1 on SQLite under fsync in a fresh directory, steps/s."""
    with tempfile.TemporaryDirectory() as d:
        async with await fusee.Engine.open(d, workflows=[sequential], durability="fsync") as engine:
            await engine.execute(sequential, "warm", 10)
            t0 = time.perf_counter()
            await engine.execute(sequential, "w1", steps)
            return steps / (time.perf_counter() - t0)


class _LogFileProbe(MemoryStore):
    """The memory store, plus each append's records written to a file and flushed."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    async def append(
        self, entries: Sequence[Entry], runs: Sequence[RunRow] = (), **changes: Any
    ) -> None:
        await super().append(entries, runs, **changes)
        frame = b"".join(struct.pack("<QI", e.lsn, len(e.data)) + e.data for e in entries)
        os.write(self._fd, frame + struct.pack("<I", zlib.crc32(frame)))
        os.fdatasync(self._fd)

    async def close(self) -> None:
        os.close(self._fd)
        await super().close()


async def w1_on_a_log_file(steps: int) -> float:
    """W1 on `_LogFileProbe` in a fresh directory, steps/s."""
    with tempfile.TemporaryDirectory() as d:
        probe = _LogFileProbe(os.path.join(d, "journal"))
        await probe.open()
        # What Engine.open does, on a store of our own.
        engine = fusee.Engine(probe, [sequential])
        await engine.recover()
        async with engine:
            await engine.execute(sequential, "warm", 10)
            t0 = time.perf_counter()
            await engine.execute(sequential, "w1", steps)
            return steps / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    reports, speeds, probes = [], [], []
    for _ in range(args.repeat):
        reports.append(flush_check())
        speeds.append(asyncio.run(w1(args.steps)))
        probes.append(asyncio.run(w1_on_a_log_file(args.steps)))
    ceilings = [1e6 / r["p50_us"] for r in reports]
    mid = sorted(reports, key=lambda r: r["p50_us"])[len(reports) // 2]
    rows: list[tuple[str, float, str]] = [
        ("flush latency p50, µs", mid["p50_us"], ""),
        ("flush latency p99, µs", mid["p99_us"], ""),
        ("flush latency max, µs", mid["max_us"], ""),
        ("W1 ceiling under fsync (1 flush per sequential step), steps/s", 1e6 / mid["p50_us"], ""),
        ("W1 steps/s (fusee sqlite fsync), after each flush check", statistics.median(speeds), ""),
        (
            "W1 under fsync / its ceiling in the same repetition (ratio)",
            statistics.median(s / c for s, c in zip(speeds, ceilings, strict=True)),
            ">= 0.8",
        ),
        ("W1 steps/s on a journal file (probe, see NOTES)", statistics.median(probes), ""),
        (
            "W1 on a journal file (probe) / the ceiling in the same repetition (ratio)",
            statistics.median(p / c for p, c in zip(probes, ceilings, strict=True)),
            "",
        ),
    ]
    for name, value, goal in rows:
        row: dict[str, object] = {
            "bench": "disk",
            "figure": name,
            "value": round(value, 2) if value < 10 else round(value),
            "repeat": args.repeat,
        }
        if goal:
            row["goal"] = goal
        print(json.dumps(row))


if __name__ == "__main__":
    main()
