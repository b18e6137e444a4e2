"""``fusee disk-check``: the flush latency of a disk, which bounds group commits.

The rule: it writes only its own temporary file, and removes it.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from fusee.cli._output import CliError, Output


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    i = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[i]


def disk_check_command(args: argparse.Namespace, out: Output) -> int:
    if args.dir is not None:
        directory = Path(args.dir)
    else:
        data = Path(args.store or args.data or "data")
        directory = data if data.is_dir() else Path(".")
    if not directory.is_dir():
        raise CliError(f"no directory {str(directory)!r} to measure")
    if args.count < 1 or args.size < 1:
        raise CliError("--count and --size must be 1 or more")
    block = os.urandom(args.size)
    fd, path = tempfile.mkstemp(prefix=".fusee-disk-check-", dir=directory)
    latencies: list[float] = []
    try:
        for _ in range(args.count):
            t0 = time.perf_counter_ns()
            os.write(fd, block)
            os.fsync(fd)
            latencies.append((time.perf_counter_ns() - t0) / 1000)
    finally:
        os.close(fd)
        os.unlink(path)
    latencies.sort()
    p50, p99, worst = _quantile(latencies, 0.5), _quantile(latencies, 0.99), latencies[-1]
    report = {
        "dir": str(directory.resolve()),
        "count": args.count,
        "size": args.size,
        "p50_us": round(p50, 1),
        "p99_us": round(p99, 1),
        "max_us": round(worst, 1),
        "commits_per_s": round(1e6 / p50) if p50 > 0 else None,
    }
    if out.json:
        out.emit(report)
        return 0
    out.say(
        ("flush latency ", "bold"),
        f"of {report['dir']} ({args.count} x {args.size} B write + fsync): ",
        (f"p50 {p50:,.0f} µs  p99 {p99:,.0f} µs  max {worst:,.0f} µs", "bold"),
    )
    out.say(
        (
            f"  durability='fsync' pays one flush per group commit: at most about "
            f"{report['commits_per_s']:,} commits/s on this disk, each carrying every record "
            "appended meanwhile",
            "dim",
        )
    )
    return 0
