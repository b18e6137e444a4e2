"""Workflows the CLI tests run: `fusee worker` imports this file by its path."""

from __future__ import annotations

import asyncio
import dataclasses

import fusee

go = fusee.signal("go", bool)
phase = fusee.query("phase")

# `fusee worker` serves the queues a module defines, as its workflows.
orders = fusee.Queue("orders", concurrency=1)

# A step of `flaky` fails while this is False: the tests flip it, then resume.
FLAKY_OK = {"ok": False}


@dataclasses.dataclass(frozen=True)
class Order:
    id: str
    amount: int


@fusee.workflow("greet")
async def greet(ctx: fusee.Ctx, name: str) -> str:
    ctx.set_attributes({"customer": name})
    return await ctx.step("greet", lambda: f"hello {name}")


@fusee.workflow("ship")
async def ship(ctx: fusee.Ctx, order: Order) -> str:
    return await ctx.step("label", lambda: f"FR-{order.id}")


@fusee.workflow("gated")
async def gated(ctx: fusee.Ctx, order: Order) -> str:
    """Records most kinds of records: steps, a retry, values, a timer, a wait, a child."""
    ctx.set_attributes({"customer": "ada", "amount": order.amount})
    ctx.on_query(phase, lambda _: "waiting")
    tries = {"n": 0}

    def flaky_once() -> int:
        tries["n"] += 1
        if tries["n"] == 1:
            raise ConnectionError("first try fails")
        return order.amount

    await ctx.step("charge", flaky_once, retry=fusee.Retry(attempts=3, initial="10ms"))
    ctx.now()
    await ctx.sleep("nap", "20ms")
    ok = await ctx.wait_for(go, timeout="1h")
    if not ok:
        return "rejected"
    label = await ctx.child(ship, f"ship-{order.id}", order)
    async with ctx.stream("log") as out:
        await out.append(f"shipped {label}")
    return f"shipped {label}"


@fusee.workflow("boom")
async def boom(ctx: fusee.Ctx) -> None:
    await ctx.step("ok", lambda: 1)
    raise KeyError("sku")


def _check_parts_list_before_anything_else(parts: list[str]) -> None:
    if not parts:
        raise ValueError("the parts list is empty")


def _prepare_the_shipment_of_every_part(parts: list[str]) -> None:
    _check_parts_list_before_anything_else(parts)


@fusee.workflow("deep_boom")
async def deep_boom(ctx: fusee.Ctx) -> None:
    """Fails a few calls deep: its traceback is longer than a terminal line."""
    await ctx.step("ok", lambda: 1)
    _prepare_the_shipment_of_every_part([])


@fusee.workflow("flaky")
async def flaky(ctx: fusee.Ctx) -> str:
    def attempt() -> str:
        if not FLAKY_OK["ok"]:
            raise ConnectionError("still down")
        return "up"

    return await ctx.step("call", attempt, retry=fusee.Retry(attempts=1, initial="10ms"))


@fusee.workflow("looper")
async def looper(ctx: fusee.Ctx, n: int) -> int:
    await ctx.step("tick", lambda: n)
    if n < 2:
        ctx.continue_as_new(n + 1)
    return n


# The test sets these to let `download`'s step go on (made in the test's loop).
GATES: dict[str, asyncio.Event] = {}


@fusee.workflow("download")
async def download(ctx: fusee.Ctx, parts: int) -> int:
    """One step that reports its progress by heartbeat, in both shapes a bar reads."""

    async def fetch(s: fusee.StepCtx) -> int:
        s.heartbeat({"done": 1, "total": parts})
        await GATES["half"].wait()
        s.heartbeat({"pct": 75})
        await GATES["done"].wait()
        return parts

    return await ctx.step("fetch", fetch)
