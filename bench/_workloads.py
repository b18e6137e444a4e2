"""What the benchmarks that run fusee alone share: the steps, the payload and the workflows.

A module of helpers, not a benchmark: bench/run.py runs no ``_*.py`` file.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid

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


@dataclasses.dataclass
class Item:
    """A line of W7's order."""

    sku: str
    qty: int
    price: float


@dataclasses.dataclass
class Order:
    """W7's payload: a realistic step result (5 items, a datetime, a UUID)."""

    id: uuid.UUID
    placed: dt.datetime
    customer: str
    items: list[Item]
    total: float


def order(i: int) -> Order:
    """The ``i``-th order: the same shape and sizes for every ``i``."""
    items = [Item(f"sku-{i}-{k}", k + 1, 9.99 + k) for k in range(5)]
    return Order(
        id=uuid.UUID(int=i),
        placed=dt.datetime(2026, 12, 1, 9, 30, i % 60, 250_000, tzinfo=dt.UTC),
        customer=f"customer-{i}",
        items=items,
        total=sum(x.qty * x.price for x in items),
    )


# Built ahead: W7 measures what a payload costs the engine and the codec, not
# the user code that builds it.
ORDERS = [order(i) for i in range(64)]


async def place_order(i: int) -> Order:
    """W7's step: returns an `Order`, journaled and decoded back to its type."""
    return ORDERS[i % len(ORDERS)]


@fusee.workflow("orders")
async def orders(ctx: fusee.Ctx, n: int) -> int:
    """W7's shape: W1 with steps whose results are `Order` values."""
    count = 0
    for i in range(n):
        placed = await ctx.step("order", lambda i=i: place_order(i), result_type=Order)
        count += len(placed.items)
    return count
