"""Queues: W2 (200 workflows x 10 steps, all started at once) through a queue, and without.

Each repetition runs W2 three times on SQLite (durability="fsync", a fresh
temporary directory each), in rotating order: once started plainly, once
through ``fusee.Queue("w2", concurrency=50)``, and once as four plain W2s
of 50 workflows one after another (the floor any limit of 50 sets: at most
50 runs at once, so each run's ten steps wait in line behind others'). The
figures are the median wall times, the queued side's ratio to the plain
one (the goal: at most 1.3x) and to the floor (what the queue itself
costs), and the most runs the queued side ever had between their first
and last step (at most 50, or the limit did not hold).

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


async def once(side: str, workflows: int, steps: int) -> tuple[float, int]:
    """One W2 on ``side``: "plain", "queued" or "waves" (the floor); seconds and most at once."""
    gauge = Gauge()
    w2 = define(gauge)
    q = fusee.Queue("w2", concurrency=CONCURRENCY)
    waves = CONCURRENCY if side == "waves" else workflows
    with tempfile.TemporaryDirectory() as directory:
        async with await fusee.Engine.open(
            directory, workflows=[w2], durability="fsync", queues=[q]
        ) as engine:
            t0 = time.perf_counter()
            for first in range(0, workflows, waves):
                runs = await asyncio.gather(
                    *(
                        engine.start(w2, f"w2-{k}", steps, queue=q if side == "queued" else None)
                        for k in range(first, min(first + waves, workflows))
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
    times: dict[str, list[float]] = {"plain": [], "queued": [], "waves": []}
    sides = list(times)
    most = 0
    for r in range(args.repeat):
        # Rotating which goes first, so the VM's drift hits all alike.
        for side in sides[r % 3 :] + sides[: r % 3]:
            seconds, at_once = asyncio.run(once(side, args.workflows, args.steps))
            times[side].append(seconds)
            if side == "queued":
                most = max(most, at_once)
    plain, through, waves = times["plain"], times["queued"], times["waves"]
    ratio = statistics.median(t / p for t, p in zip(through, plain, strict=True))
    to_floor = statistics.median(t / w for t, w in zip(through, waves, strict=True))
    rows = [
        ("W2 without a queue (s)", statistics.median(plain), "", plain),
        (
            f"W2 through a queue, concurrency={CONCURRENCY} (s)",
            statistics.median(through),
            "",
            through,
        ),
        (
            f"W2 as four plain W2s of {CONCURRENCY} one after another, the floor (s)",
            statistics.median(waves),
            "",
            waves,
        ),
        ("W2 through a queue / without (ratio)", ratio, "<= 1.3", []),
        ("W2 through a queue / the floor (ratio)", to_floor, "", []),
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
