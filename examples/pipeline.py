"""A pipeline of child workflows: extract, transform (in parallel), load.

Each stage is a workflow of its own, started with ``ctx.child``: it has its
own journal and id (``fusee list`` shows it with its parent), it survives a
crash on its own, and its result comes back to the parent as a delivery.

    python examples/pipeline.py
"""

from __future__ import annotations

import asyncio

import fusee

# The steps: they print when they really run (workflow code prints nothing,
# since it runs again on every replay).


def read(source: str) -> list[int]:
    rows = list(range(1, 13))
    print(f"  extract    {len(rows)} rows from {source}")
    return rows


def square(rows: list[int]) -> list[int]:
    out = [r * r for r in rows]
    print(f"  transform  {rows} -> {out}")
    return out


def write(rows: list[int]) -> int:
    total = sum(rows)
    print(f"  load       {len(rows)} rows, checksum {total}")
    return total


@fusee.workflow("extract")
async def extract(ctx: fusee.Ctx, source: str) -> list[int]:
    return await ctx.step("read", lambda: read(source))


@fusee.workflow("transform")
async def transform(ctx: fusee.Ctx, rows: list[int]) -> list[int]:
    return await ctx.step("square", lambda: square(rows))


@fusee.workflow("load")
async def load(ctx: fusee.Ctx, rows: list[int]) -> int:
    return await ctx.step("write", lambda: write(rows))


@fusee.workflow("pipeline")
async def pipeline(ctx: fusee.Ctx, source: str) -> int:
    """Extracts rows, transforms them in batches of 4 in parallel, loads them."""
    me = ctx.info.id
    rows = await ctx.child(extract, f"{me}-extract", source)
    batches = [rows[i : i + 4] for i in range(0, len(rows), 4)]
    done = await asyncio.gather(
        *(ctx.child(transform, f"{me}-transform-{i}", b) for i, b in enumerate(batches))
    )
    return await ctx.child(load, f"{me}-load", [r for batch in done for r in batch])


async def main() -> None:
    async with await fusee.Engine.open(
        "memory", workflows=[pipeline, extract, transform, load]
    ) as engine:
        checksum = await engine.execute(pipeline, "etl-1", "orders.csv")
        print(f"pipeline etl-1 done: checksum {checksum}")
        async for info in engine.list():
            print(f"  run {info.id:<22} {info.workflow:<10} {info.status}")


if __name__ == "__main__":
    asyncio.run(main())
