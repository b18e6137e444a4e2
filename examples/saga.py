"""A checkout saga: every step that changes the world has an undo; on failure they run in reverse.

The order is reserved, charged and shipped. When shipping fails for good (a
`fusee.Failure`: no retry) or the run is cancelled, the compensations of the
steps that succeeded run, newest first, as durable steps themselves: a crash
in the middle of compensating resumes compensating.

    python examples/saga.py
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fusee


@dataclass(frozen=True)
class Order:
    id: str
    sku: str
    amount_cents: int
    address: str


@dataclass(frozen=True)
class Outcome:
    status: str
    detail: str


def reserve(order: Order) -> str:
    print(f"  [{order.id}] reserve   1 x {order.sku}")
    return f"res-{order.id}"


def release(order: Order, reservation: str) -> None:
    print(f"  [{order.id}] release   {reservation}   (compensation)")


def charge(s: fusee.StepCtx, order: Order) -> str:
    # The key is the same on every attempt and after a crash: the payment
    # provider charges once per key.
    print(f"  [{order.id}] charge    {order.amount_cents / 100:.2f} EUR, idempotency key {s.key}")
    return f"ch-{order.id}"


def refund(order: Order, charge_id: str) -> None:
    print(f"  [{order.id}] refund    {charge_id}   (compensation)")


def ship(order: Order) -> str:
    if not order.address:
        print(f"  [{order.id}] ship      failed: no shipping address")
        raise fusee.Failure("no shipping address")
    print(f"  [{order.id}] ship      to {order.address}")
    return f"FR-{order.id}"


@fusee.workflow("saga")
async def checkout_saga(ctx: fusee.Ctx, order: Order) -> Outcome:
    """Reserve, charge, ship; on failure or cancellation, undo what was done."""
    undo: list[tuple[str, Callable[[], Any]]] = []
    try:
        reservation = await ctx.step("reserve", lambda: reserve(order))
        undo.append(("release", lambda: release(order, reservation)))
        charge_id = await ctx.step("charge", lambda s: charge(s, order))
        undo.append(("refund", lambda: refund(order, charge_id)))
        tracking = await ctx.step("ship", lambda: ship(order))
        return Outcome("shipped", tracking)
    except (fusee.StepFailed, fusee.Cancelled) as e:
        for name, compensate in reversed(undo):
            await ctx.step(name, compensate)
        return Outcome("compensated", str(e))


async def main() -> None:
    async with await fusee.Engine.open("memory", workflows=[checkout_saga]) as engine:
        for order in (
            Order("o-1", "mug", 1290, "1 rue de la Paix, Paris"),
            Order("o-2", "teapot", 3490, ""),
        ):
            print(f"order {order.id}:")
            outcome = await engine.execute(checkout_saga, order.id, order)
            print(f"  => {outcome.status}: {outcome.detail}")


if __name__ == "__main__":
    asyncio.run(main())
