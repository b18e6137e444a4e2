"""Queues: W2 (200 workflows x 10 steps, all started at once) through a queue, and without.

Each repetition runs W2 twice on SQLite (durability="fsync", a fresh
temporary directory each), in alternating order: once started plainly,
once through ``fusee.Queue("w2", concurrency=50)``. The figures are the
median wall times, their ratio (the goal: the queue costs at most 1.3x),
and the most runs the queued side ever had between their first and last
step (at most 50, or the limit did not hold).

    python bench/queues.py [--workflows N] [--steps S] [--repeat R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time

import fusee

CONCURRENCY = 50


class Gauge:
    """Runs between their first and last step: the most at once."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0

    def enter(self) -> None:
        self.now += 1
        self.most = max(self.most, self.now)

    def leave(self) -> None:
        self.now -= 1


def define(gauge: Gauge) -> fusee.WorkflowDef[int, int]:
    async def add_one(i: int) -> int:
        return i + 1

    @fusee.workflow("w2")
    async def w2(ctx: fusee.Ctx, steps: int) -> int:
        x = 0
        for i in range(steps):
            if i == 0:
                gauge.enter()
            x = await ctx.step("s", lambda i=i: add_one(i))
        gauge.leave()
        return x

    return w2


async def once(queued: bool, workflows: int, steps: int) -> tuple[float, int]:
    gauge = Gauge()
    w2 = define(gauge)
    q = fusee.Queue("w2", concurrency=CONCURRENCY)
    with tempfile.TemporaryDirectory() as directory:
        async with await fusee.Engine.open(
            directory, workflows=[w2], durability="fsync", queues=[q]
        ) as engine:
            t0 = time.perf_counter()
            runs = await asyncio.gather(
                *(
                    engine.start(w2, f"w2-{k}", steps, queue=q if queued else None)
                    for k in range(workflows)
                )
            )
            for run in runs:
                if await run.result() != steps:
                    raise RuntimeError(f"run {run.id} returned a wrong result")
            seconds = time.perf_counter() - t0
    return seconds, gauge.most


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    plain: list[float] = []
    through: list[float] = []
    most = 0
    for r in range(args.repeat):
        # Alternating which goes first, so the VM's drift hits both alike.
        for queued in (r % 2 == 1, r % 2 == 0):
            seconds, at_once = asyncio.run(once(queued, args.workflows, args.steps))
            if queued:
                through.append(seconds)
                most = max(most, at_once)
            else:
                plain.append(seconds)
    ratio = statistics.median(t / p for t, p in zip(through, plain, strict=True))
    rows = [
        ("W2 without a queue (s)", statistics.median(plain), "", plain),
        (
            f"W2 through a queue, concurrency={CONCURRENCY} (s)",
            statistics.median(through),
            "",
            through,
        ),
        ("W2 through a queue / without (ratio)", ratio, "<= 1.3", []),
        (f"most queued runs running at once (limit {CONCURRENCY})", most, f"<= {CONCURRENCY}", []),
    ]
    for figure, value, goal, values in rows:
        row = {
            "bench": "queues",
            "figure": figure,
            "value": round(value, 3) if isinstance(value, float) else value,
            **({"goal": goal} if goal else {}),
            "repeat": args.repeat,
            **({"values": [round(v, 3) for v in values]} if values else {}),
        }
        print(json.dumps(row))


if __name__ == "__main__":
    main()
