"""Runs the benchmarks and writes their figures to bench/RESULTS.md.

Each ``bench/NAME.py`` (other than this file) prints one JSON line per
figure: ``{"bench", "figure", "value", "goal", ...}``. This collects them,
with the command, the machine and the time of the run, into a table.

    python bench/run.py [NAME ...]

With no NAME it runs every benchmark but the OPTIONAL ones (``_*.py`` are helpers).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# Run only when named (`python bench/run.py restate_compare`, `make bench-restate`;
# `python bench/run.py postgres_clients`).
OPTIONAL = {"restate_compare", "postgres_clients"}


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
    args = sys.argv[1:]
    saved = HERE / "results.json"
    # Rows per benchmark, with when and how each ran: running some benchmarks
    # replaces their rows and keeps the others'; --render only rewrites the page.
    state: dict[str, Any] = json.loads(saved.read_text()) if saved.exists() else {}
    if args != ["--render"]:
        names = args or sorted(
            p.stem
            for p in HERE.glob("*.py")
            if p.stem not in {"run", *OPTIONAL} and not p.stem.startswith("_")
        )
        failed: list[str] = []
        when = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC"
        for name in names:
            print(f"== bench/{name}.py", flush=True)
            # stderr goes to the terminal: a benchmark's notes (a peer that
            # could not be installed, say) must reach whoever runs it.
            proc = subprocess.run(
                [sys.executable, str(HERE / f"{name}.py")], stdout=subprocess.PIPE, text=True
            )
            rows = []
            for line in proc.stdout.splitlines():
                if line.startswith("{"):
                    row = json.loads(line)
                    rows.append(row)
                    print(f"   {row['figure']}: {row['value']} (goal {row.get('goal', '-')})")
            state[name] = {
                "when": when,
                "machine": machine(),
                "rows": rows,
                "error": f"exited with {proc.returncode}" if proc.returncode else None,
            }
            if proc.returncode:
                failed.append(name)
        saved.write_text(json.dumps(state, indent=1) + "\n")
        render(state)
        if failed:
            sys.exit(1)
    else:
        render(state)


TORTURE_HEADING = "\n## Torture\n"


def render(state: dict[str, Any]) -> None:
    lines = [
        "# Benchmark results",
        "",
        "Written by `make bench` (`python bench/run.py`, all benchmarks in one run;",
        "`python bench/run.py NAME...` reruns some, `--render` rewrites this page);",
        "do not edit by hand. Figures are medians of the repetitions each states;",
        "peers are measured in the same run as fusee, one after the other.",
        "",
        "| benchmark | run | machine |",
        "|---|---|---|",
    ]
    for name, entry in sorted(state.items()):
        error = f" ({entry['error']})" if entry.get("error") else ""
        lines.append(f"| {name}{error} | {entry['when']} | {entry['machine']} |")
    lines += [
        "",
        "| benchmark | figure | value | goal | repetitions |",
        "|---|---|---:|---|---:|",
    ]
    for name, entry in sorted(state.items()):
        for r in entry["rows"]:
            value = r["value"]
            shown = f"{value:,}" if isinstance(value, int | float) else str(value)
            lines.append(
                f"| {name} | {r['figure']} | {shown} | {r.get('goal', '')} "
                f"| {r.get('repeat', '')} |"
            )
    notes = HERE / "NOTES.md"
    if notes.exists():
        lines += ["", notes.read_text().rstrip()]
    # `make torture` appends its runs under this heading (tests/sim/torture.py);
    # a render keeps them.
    page = HERE / "RESULTS.md"
    old = page.read_text() if page.exists() else ""
    at = old.find(TORTURE_HEADING)
    if at >= 0:
        lines += ["", old[at:].rstrip()]
    page.write_text("\n".join(lines) + "\n")
    print(f"wrote {HERE / 'RESULTS.md'}")


if __name__ == "__main__":
    main()
