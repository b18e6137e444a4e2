"""What the benchmarks that run fusee alone share: the step and the sequential workflow.

A module of helpers, not a benchmark: bench/run.py runs no ``_*.py`` file.
"""

from __future__ import annotations

import fusee


async def add_one(i: int) -> int:
    """The step every workload runs: an async function returning ``i + 1``."""
    return i + 1


@fusee.workflow("sequential")
async def sequential(ctx: fusee.Ctx, n: int) -> int:
    """W1's shape: ``n`` steps, one after the other."""
    x = 0
    for i in range(n):
        x = await ctx.step("s", lambda i=i: add_one(i))
    return x
