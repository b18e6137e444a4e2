"""The SQLite store's high-water mark: W1 under fsync with and without it, alternating.

The mark (`fusee/store/_sqlite_mark.py`) costs one ``pwrite`` of 24 bytes
after each durable commit. Each repetition runs W1 on SQLite under fsync
twice in fresh directories, once with the mark moving and once with its
``move`` a no-op (the same code otherwise), in alternating order; the
figure is the median of the repetitions' ratios (with / without), so the
shared machine's drift cancels. Prints JSON lines.

    python bench/hwm.py [--steps N] [--repeat R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics

from disk import w1

from fusee.store._sqlite_mark import Mark


def _still(self: Mark, lsn: int) -> None:
    """`Mark.move` that writes nothing: the store without the mark's cost."""


async def main(steps: int, repeat: int) -> None:
    move = Mark.move
    with_mark: list[float] = []
    without: list[float] = []
    for r in range(repeat):
        for marked in (True, False) if r % 2 == 0 else (False, True):
            Mark.move = move if marked else _still  # type: ignore[method-assign]
            (with_mark if marked else without).append(await w1(steps))
    Mark.move = move  # type: ignore[method-assign]
    ratios = [a / b for a, b in zip(with_mark, without, strict=True)]
    for name, value in (
        ("W1 steps/s under fsync, with the high-water mark", statistics.median(with_mark)),
        ("W1 steps/s under fsync, without it", statistics.median(without)),
        ("W1 under fsync with / without the mark (ratio)", statistics.median(ratios)),
    ):
        print(json.dumps({"bench": "hwm", "name": name, "value": value, "n": repeat}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.repeat))
