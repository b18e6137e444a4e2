"""Workflows the Client tests run, in-process and in a worker process (`client_worker.py`)."""

from __future__ import annotations

import dataclasses

import pydantic

import fusee


class Summary(pydantic.BaseModel):
    total: int
    signals: int


@dataclasses.dataclass(frozen=True)
class Counts:
    signals: int
    bumps: int


add = fusee.signal("add", int)
total = fusee.query("total")
summary = fusee.query("summary", Summary)
counts = fusee.query("counts", Counts)
bump = fusee.update("bump", int)


@fusee.workflow("tally")
async def tally(ctx: fusee.Ctx, start: int) -> int:
    """Adds each ``add`` signal's number to ``start`` until one is 0; ``bump`` adds too."""
    state = {"total": start, "signals": 0, "bumps": 0}

    def bumped(by: int) -> int:
        if by < 0:
            raise ValueError("bump by a positive number")
        state["total"] += by
        state["bumps"] += 1
        return state["total"]

    # Before the first await: an update sent as soon as the start returns
    # finds its handler (one sent earlier than that is refused as unknown).
    ctx.on_query(total, lambda _: state["total"])
    ctx.on_query(summary, lambda _: Summary(total=state["total"], signals=state["signals"]))
    ctx.on_query(counts, lambda _: Counts(state["signals"], state["bumps"]))
    ctx.on_update(bump, bumped)
    await ctx.step("first", lambda: start)
    while n := await ctx.wait_for(add):
        state["total"] += n
        state["signals"] += 1
    async with ctx.stream("log") as out:
        await out.append(f"total {state['total']}")
    return state["total"]


@fusee.workflow("echo")
async def echo(ctx: fusee.Ctx, text: str) -> str:
    return await ctx.step("echo", lambda: text)


DECLINED: set[str] = set()
"""Run ids whose card is declined: their ``charge`` step fails (the tests' switch)."""


@fusee.workflow("charge")
async def charge(ctx: fusee.Ctx, amount: int) -> int:
    """Charges ``amount`` in a step that pauses the run after one failed attempt."""
    id = ctx.info.id

    def pay() -> int:
        if id in DECLINED:
            raise RuntimeError(f"card of {id} declined")
        return amount

    return await ctx.step("pay", pay, retry=fusee.Retry(attempts=1))


@fusee.workflow("ticker")
async def ticker(ctx: fusee.Ctx, _: None) -> int:
    """Appends each ``add`` signal's number to stream "ticks" until one is 0."""
    count = 0
    async with ctx.stream("ticks") as out:
        while n := await ctx.wait_for(add):
            await out.append(n)
            count += 1
    return count


# What the worker has deployed: a test ships the fix by flipping it.
FRAGILE_FIXED = {"on": False}


@fusee.workflow("fragile", on_error="pause")
async def fragile(ctx: fusee.Ctx, n: int) -> int:
    got = await ctx.step("got", lambda: n)
    if not FRAGILE_FIXED["on"]:
        raise RuntimeError("a bug in the code")
    return got * 2
