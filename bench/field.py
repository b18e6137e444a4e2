"""Step shapes in the field: W2 with steps written the ways users write them (issue 33, W8).

W2 (200 workflows x 10 steps, all started at once) on the memory store, once
per shape, in one process, the shapes in rotating order each repetition:

- bare: ``lambda i=i: add_one(i)``, an int (W2 itself: the reference);
- partial: ``functools.partial(svc.inc, i)`` of an async method annotated ``-> int``;
- method: a bound async method, ``Adder(i).run``;
- closure: an annotated ``async def`` closure made in the loop;
- thread: ``functools.partial(svc.inc_sync, i)``, a sync method, run in a worker thread;
- dataclass: the W7 `Order` (a dataclass), built in the step, from a lambda
  with ``result_type=Order``;
- pydantic: the same order as a pydantic v2 model, built in the step, from a
  lambda with its ``result_type``;
- dataclass-ahead, pydantic-ahead: the same, the step returning a value built
  ahead (as W7's steps do): what the engine and the codec cost, without the
  user code that builds the value.

Each figure is the median over the repetitions of the shape's time over bare
W2's in the same repetition (the machine's drift cancels out), with goals
for the partial (1.1x), the dataclass (1.25x) and the pydantic model (1.5x).

With ``--instructions``, the figures are callgrind's instead (noise-free up to
a few per cent, see bench/instructions.py): each of bare, dataclass,
dataclass-ahead, pydantic and pydantic-ahead runs under valgrind with N and 3N
workflows; the difference over 2N workflows is what a step costs, and each
shape's is given over bare's.

    python bench/field.py [--workflows N] [--steps S] [--repeat R]
    python bench/field.py --instructions [--workflows N] [--steps S]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import datetime as dt
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pydantic
from _workloads import Order, add_one, order

import fusee

SHAPES = (
    "bare",
    "partial",
    "method",
    "closure",
    "thread",
    "dataclass",
    "pydantic",
    "dataclass-ahead",
    "pydantic-ahead",
)
GOALS = {
    "partial": "<= 1.1",
    "dataclass": "<= 1.25",
    "pydantic": "<= 1.5",
    "dataclass-ahead": "<= 1.25",
    "pydantic-ahead": "<= 1.5",
}
# The shapes callgrind counts (`--instructions`): the results' costs.
COUNTED = ("bare", "dataclass", "dataclass-ahead", "pydantic", "pydantic-ahead")


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


def _model(o: Order) -> OrderModel:
    items = [ItemModel(sku=x.sku, qty=x.qty, price=x.price) for x in o.items]
    return OrderModel(id=o.id, placed=o.placed, customer=o.customer, items=items, total=o.total)


# Built ahead, for the -ahead shapes: W7's orders, and the same as models.
ORDERS_AHEAD = [order(i) for i in range(64)]
MODELS_AHEAD = [_model(o) for o in ORDERS_AHEAD]


async def order_ahead(i: int) -> Order:
    return ORDERS_AHEAD[i % len(ORDERS_AHEAD)]


async def model_ahead(i: int) -> OrderModel:
    return MODELS_AHEAD[i % len(MODELS_AHEAD)]


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
    if shape == "dataclass-ahead":
        return (lambda: order_ahead(i)), Order
    if shape == "pydantic-ahead":
        return (lambda: model_ahead(i)), OrderModel
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


def instructions(valgrind: str, shape: str, workflows: int, steps: int) -> int:
    """Instructions callgrind counts for a child process running W2 of ``shape``."""
    out = subprocess.run(
        [
            valgrind,
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            __file__,
            "--child",
            shape,
            "--workflows",
            str(workflows),
            "--steps",
            str(steps),
        ],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    found = re.search(r"Collected\s*:\s*(\d+)", out.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no total:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def counted(workflows: int, steps: int) -> None:
    """Prints the `COUNTED` shapes' instructions per step, and each over bare's."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print("field: valgrind is not installed; no figures", file=sys.stderr)
        return
    jobs = [(shape, k) for shape in COUNTED for k in (workflows, 3 * workflows)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        totals = dict(
            zip(
                jobs,
                pool.map(lambda j: instructions(valgrind, j[0], j[1], steps), jobs),
                strict=True,
            )
        )
    per_step = {
        shape: (totals[(shape, 3 * workflows)] - totals[(shape, workflows)])
        / (2 * workflows * steps)
        for shape in COUNTED
    }
    print(
        json.dumps(
            {
                "bench": "field",
                "figure": "W8 bare W2 step, instructions (callgrind)",
                "value": round(per_step["bare"]),
                "steps": [workflows * steps, 3 * workflows * steps],
            }
        )
    )
    for shape in COUNTED[1:]:
        row = {
            "bench": "field",
            "figure": f"W8 {shape} / bare W2, instructions per step (callgrind)",
            "value": round(per_step[shape] / per_step["bare"], 3),
            **({"goal": GOALS[shape]} if shape in GOALS else {}),
            "instructions": round(per_step[shape]),
        }
        print(json.dumps(row))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=200)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--instructions", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(once(args.child, args.workflows, args.steps))
        return
    if args.instructions:
        counted(args.workflows, args.steps)
        return
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
