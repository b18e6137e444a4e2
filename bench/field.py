"""Step shapes in the field: W2 with steps written the ways users write them (issue 33, W8).

W2 (200 workflows x 10 steps, all started at once) on the memory store, once
per shape, in one process, the shapes in rotating order each repetition:

- bare: ``lambda i=i: add_one(i)``, an int (W2 itself: the reference);
- partial: ``functools.partial(svc.inc, i)`` of an async method annotated ``-> int``;
- method: a bound async method, ``Adder(i).run``;
- closure: an annotated ``async def`` closure made in the loop;
- thread: ``functools.partial(svc.inc_sync, i)``, a sync method, run in a worker thread;
- dataclass: the W7 `Order` (a dataclass) from a lambda with ``result_type=Order``;
- pydantic: the same order as a pydantic v2 model, from a lambda with its ``result_type``.

Each figure is the median over the repetitions of the shape's time over bare
W2's in the same repetition (the machine's drift cancels out), with goals
for the partial (1.1x), the dataclass (1.25x) and the pydantic model (1.5x).

    python bench/field.py [--workflows N] [--steps S] [--repeat R]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import functools
import json
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pydantic
from _workloads import Order, add_one, order

import fusee

SHAPES = ("bare", "partial", "method", "closure", "thread", "dataclass", "pydantic")
GOALS = {"partial": "<= 1.1", "dataclass": "<= 1.25", "pydantic": "<= 1.5"}


class Service:
    """What a step calls a method of, as application code does."""

    async def inc(self, v: int) -> int:
        return v + 1

    def inc_sync(self, v: int) -> int:
        return v + 1


class Adder:
    """A bound method's object: one per step."""

    def __init__(self, i: int) -> None:
        self.i = i

    async def run(self) -> int:
        return self.i + 1


class ItemModel(pydantic.BaseModel):
    sku: str
    qty: int
    price: float


class OrderModel(pydantic.BaseModel):
    """`Order` as a pydantic v2 model."""

    id: uuid.UUID
    placed: dt.datetime
    customer: str
    items: list[ItemModel]
    total: float


async def make_order(i: int) -> Order:
    return order(i)


async def make_model(i: int) -> OrderModel:
    o = order(i)
    items = [ItemModel(sku=x.sku, qty=x.qty, price=x.price) for x in o.items]
    return OrderModel(id=o.id, placed=o.placed, customer=o.customer, items=items, total=o.total)


def step_of(shape: str, svc: Service, i: int) -> tuple[Callable[[], Awaitable[Any] | Any], Any]:
    """The step function of ``shape`` for the ``i``-th step, and its result_type (or None)."""
    if shape == "bare":
        return (lambda: add_one(i)), None
    if shape == "partial":
        return functools.partial(svc.inc, i), None
    if shape == "method":
        return Adder(i).run, None
    if shape == "closure":

        async def closure() -> int:
            return i + 1

        return closure, None
    if shape == "thread":
        return functools.partial(svc.inc_sync, i), None
    if shape == "dataclass":
        return (lambda: make_order(i)), Order
    return (lambda: make_model(i)), OrderModel


def define(shape: str) -> fusee.WorkflowDef[int, int]:
    svc = Service()

    @fusee.workflow(f"w8-{shape}")
    async def w8(ctx: fusee.Ctx, steps: int) -> int:
        for i in range(steps):
            fn, result_type = step_of(shape, svc, i)
            if result_type is None:
                await ctx.step("s", fn)
            else:
                await ctx.step("s", fn, result_type=result_type)
        return steps

    return w8


async def once(shape: str, workflows: int, steps: int) -> float:
    """Seconds of one W2 of ``shape`` on the memory store."""
    w8 = define(shape)
    async with await fusee.Engine.open("memory", workflows=[w8]) as engine:
        await engine.execute(w8, "warm-up", 5)
        t0 = time.perf_counter()
        runs = [await engine.start(w8, f"r{k}", steps) for k in range(workflows)]
        for run in runs:
            if await run.result() != steps:
                raise RuntimeError(f"run {run.id} returned a wrong result")
        return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    times: dict[str, list[float]] = {shape: [] for shape in SHAPES}
    for r in range(args.repeat):
        # Rotating which goes first, so the VM's drift hits all alike.
        for shape in SHAPES[r % len(SHAPES) :] + SHAPES[: r % len(SHAPES)]:
            times[shape].append(asyncio.run(once(shape, args.workflows, args.steps)))
    steps = args.workflows * args.steps
    bare = times["bare"]
    print(
        json.dumps(
            {
                "bench": "field",
                "figure": "W8 bare W2 on the memory store (steps/s)",
                "value": round(steps / statistics.median(bare)),
                "repeat": args.repeat,
            }
        )
    )
    for shape in SHAPES[1:]:
        ratios = [t / b for t, b in zip(times[shape], bare, strict=True)]
        row = {
            "bench": "field",
            "figure": f"W8 {shape} / bare W2 (ratio)",
            "value": round(statistics.median(ratios), 3),
            **({"goal": GOALS[shape]} if shape in GOALS else {}),
            "repeat": args.repeat,
            "values": [round(x, 3) for x in ratios],
        }
        print(json.dumps(row))


if __name__ == "__main__":
    main()
