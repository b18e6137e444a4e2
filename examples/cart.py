"""A shopping cart driven by updates and read by queries.

Updates change the run and answer their caller (``run.update``): each is
journaled at its turn, so a replay applies them in the same order. A
validator rejects a bad update before it is recorded. Queries read the
state without changing it. A ``checkout`` signal ends the cart.

    python examples/cart.py
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import fusee


@dataclass(frozen=True)
class Item:
    sku: str
    quantity: int


add_item = fusee.update("add_item", Item)
remove_item = fusee.update("remove_item", str)
checkout = fusee.signal("checkout", bool)
contents = fusee.query("contents")

PRICES_CENTS = {"mug": 1290, "tea": 1100, "teapot": 3490}


def price_of(sku: str) -> int:
    print(f"  (step) priced {sku}")
    return PRICES_CENTS[sku]


@fusee.workflow("cart")
async def cart(ctx: fusee.Ctx, customer: str) -> dict[str, int]:
    """Holds items until ``checkout``; returns the quantities and the total."""
    lines: dict[str, tuple[int, int]] = {}  # sku -> (quantity, unit price)

    def total() -> int:
        return sum(q * p for q, p in lines.values())

    def check(item: Item) -> None:
        if item.quantity <= 0:
            raise ValueError(f"quantity must be positive, got {item.quantity}")
        if item.sku not in PRICES_CENTS:
            raise ValueError(f"no such product: {item.sku}")

    async def add(item: Item) -> int:
        price = await ctx.step("price", lambda: price_of(item.sku))
        quantity = lines.get(item.sku, (0, price))[0] + item.quantity
        lines[item.sku] = (quantity, price)
        return total()

    def remove(sku: str) -> int:
        lines.pop(sku, None)
        return total()

    ctx.on_update(add_item, add, validator=check)
    ctx.on_update(remove_item, remove)
    ctx.on_query(contents, lambda _: {sku: q for sku, (q, _) in lines.items()})
    await ctx.wait_for(checkout, timeout="1d")
    return {**{sku: q for sku, (q, _) in lines.items()}, "total_cents": total()}


async def main() -> None:
    async with await fusee.Engine.open("memory", workflows=[cart]) as engine:
        run = await engine.start(cart, "cart-ada", "ada")
        print(f"add 2 mugs   -> total {await run.update(add_item, Item('mug', 2))} cents")
        print(f"add 1 tea    -> total {await run.update(add_item, Item('tea', 1))} cents")
        try:
            await run.update(add_item, Item("mug", -1))
        except fusee.FuseeError as e:
            print(f"add -1 mug   -> rejected: {e}")
        print(f"remove tea   -> total {await run.update(remove_item, 'tea')} cents")
        print(f"query        -> {await run.query(contents)}")
        await run.signal(checkout, True)
        print(f"checked out  -> {await run.result()}")


if __name__ == "__main__":
    asyncio.run(main())
