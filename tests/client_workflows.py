"""Workflows the Client tests run, in-process and in a worker process (`client_worker.py`)."""

from __future__ import annotations

import fusee

add = fusee.signal("add", int)
total = fusee.query("total")
bump = fusee.update("bump", int)


@fusee.workflow("tally")
async def tally(ctx: fusee.Ctx, start: int) -> int:
    """Adds each ``add`` signal's number to ``start`` until one is 0; ``bump`` adds too."""
    state = {"total": start}

    def bumped(by: int) -> int:
        if by < 0:
            raise ValueError("bump by a positive number")
        state["total"] += by
        return state["total"]

    # Before the first await: an update sent as soon as the start returns
    # finds its handler (one sent earlier than that is refused as unknown).
    ctx.on_query(total, lambda _: state["total"])
    ctx.on_update(bump, bumped)
    await ctx.step("first", lambda: start)
    while n := await ctx.wait_for(add):
        state["total"] += n
    async with ctx.stream("log") as out:
        await out.append(f"total {state['total']}")
    return state["total"]


@fusee.workflow("echo")
async def echo(ctx: fusee.Ctx, text: str) -> str:
    return await ctx.step("echo", lambda: text)
