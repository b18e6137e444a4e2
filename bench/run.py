"""Runs the benchmarks and writes their figures to bench/RESULTS.md.

Each ``bench/NAME.py`` (other than this file) prints one JSON line per
figure: ``{"bench", "figure", "value", "goal", ...}``. This collects them,
with the command, the machine and the time of the run, into a table.

    python bench/run.py [NAME ...]
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def main() -> None:
    names = sys.argv[1:] or sorted(
        p.stem for p in HERE.glob("*.py") if p.stem not in {"run", "__init__"}
    )
    rows: list[dict[str, object]] = []
    failed: list[str] = []
    for name in names:
        print(f"== bench/{name}.py", flush=True)
        # stderr goes to the terminal: a benchmark's notes (a peer that could
        # not be installed, say) must reach whoever runs it.
        proc = subprocess.run(
            [sys.executable, str(HERE / f"{name}.py")],
            stdout=subprocess.PIPE,
            text=True,
        )
        if proc.returncode != 0:
            failed.append(f"bench/{name}.py exited with {proc.returncode}")
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                rows.append(row)
                print(f"   {row['figure']}: {row['value']} (goal {row.get('goal', '-')})")
    lines = [
        "# Benchmark results",
        "",
        "Written by `make bench` (`python bench/run.py`); do not edit by hand.",
        f"- Command: `{' '.join(['python', 'bench/run.py', *sys.argv[1:]])}`",
        "",
        f"- Run: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        f"- Machine: {machine()}",
        "- Figures are medians of the repetitions each benchmark states.",
        "",
        "| benchmark | figure | value | goal | repetitions |",
        "|---|---|---:|---|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['bench']} | {r['figure']} | {r['value']:,} | {r.get('goal', '')} "
            f"| {r.get('repeat', '')} |"
        )
    if failed:
        lines += ["", "**Failed:** " + "; ".join(failed) + " (its figures above may be partial)."]
    notes = HERE / "NOTES.md"
    if notes.exists():
        lines += ["", notes.read_text().rstrip()]
    (HERE / "RESULTS.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {HERE / 'RESULTS.md'}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
