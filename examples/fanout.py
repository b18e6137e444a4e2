"""Fan-out, fan-in: 100 steps at once, gathered, then one step on their results.

Workflow code may use ``asyncio.gather``: the steps start together and their
results are journaled one at a time, in delivery order, so a replay after a
crash sees the same interleaving.

    python examples/fanout.py
"""

from __future__ import annotations

import asyncio
import time

import fusee


async def score(i: int) -> int:
    await asyncio.sleep(0.01)  # an I/O-bound call: async steps run on the engine's loop
    return i * i


def report(total: int, n: int) -> str:
    return f"{n} scores, total {total}"


@fusee.workflow("fanout")
async def fanout(ctx: fusee.Ctx, n: int) -> str:
    """Scores ``n`` items in parallel, then reports their sum."""
    scores = await asyncio.gather(*(ctx.step(f"score-{i}", lambda i=i: score(i)) for i in range(n)))
    return await ctx.step("report", lambda: report(sum(scores), len(scores)))


async def main() -> None:
    async with await fusee.Engine.open("memory", workflows=[fanout]) as engine:
        t0 = time.perf_counter()
        summary = await engine.execute(fanout, "fan-1", 100)
        elapsed_ms = (time.perf_counter() - t0) * 1000
        print(f"fan-out of 100 steps: {summary} in {elapsed_ms:.0f} ms")


if __name__ == "__main__":
    asyncio.run(main())
