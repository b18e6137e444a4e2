"""The disk's flush floor, measured beside the workloads (`fusee disk-check`).

Under ``durability="fsync"`` a sequential step waits for one flush (its
gate), so this is the ceiling of W1 on this disk. Prints JSON lines.

    python bench/disk.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run(
            [sys.executable, "-m", "fusee", "disk-check", d, "--json"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    report = json.loads(out)
    p50 = report["p50_us"]
    for name, value in (
        ("flush latency p50, µs", p50),
        ("flush latency p99, µs", report["p99_us"]),
        ("flush latency max, µs", report["max_us"]),
        ("W1 ceiling under fsync (1 flush per sequential step), steps/s", 1e6 / p50),
    ):
        print(json.dumps({"bench": "disk", "figure": name, "value": round(value), "repeat": 1}))


if __name__ == "__main__":
    main()
