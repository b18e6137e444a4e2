"""`python -m tests.sim`: runs seeds of the simulator and prints one line each.

Run from the repository root: ``.venv/bin/python -m tests.sim --seeds 20``
(seeds 1 to 20), or ``--seed 1234`` for one seed. Exits 1 when a seed finds
a violation; each failing seed's line ends with the command that reproduces it.
"""

from __future__ import annotations

import argparse
import logging
import sys

from .simulator import STORES, run_seeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__)
    parser.add_argument("--seeds", type=int, default=20, help="how many seeds (from --first)")
    parser.add_argument("--first", type=int, default=1, help="the first seed")
    parser.add_argument("--seed", type=int, help="run this one seed only")
    parser.add_argument("--store", choices=[*STORES, "both"], default="memory")
    parser.add_argument(
        "--late-reads",
        action="store_true",
        help="answer reads of a run's row a few loop turns late (a starved reader thread)",
    )
    parser.add_argument(
        "--log", action="store_true", help="print each failing seed's event log (calls, crashes)"
    )
    args = parser.parse_args(argv)
    # The simulated crashes and store failures log errors by design.
    logging.disable(logging.CRITICAL)
    first = args.first
    seeds = [args.seed] if args.seed is not None else list(range(first, first + args.seeds))
    stores = list(STORES) if args.store == "both" else [args.store]
    failing = []
    for store in stores:
        reports = run_seeds(seeds, store, late_reads=args.late_reads)
        failing += [r for r in reports if r.violations]
    total = len(seeds) * len(stores)
    print(f"{total - len(failing)} of {total} seeds passed")
    for report in failing:
        print(f"  {report.command}")
        for v in report.violations:
            print(f"    {v}")
        if args.log:
            for event in report.events:
                print(f"      {event}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
