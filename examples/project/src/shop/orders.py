"""The order workflow: charge the card, wait for the warehouse, ship or refund.

The rule: workflow code only decides; everything that touches the outside
world (the card, the email) runs in a step, whose result is journaled.
"""

from __future__ import annotations

from dataclasses import dataclass

import fusee

# Sent by the warehouse once the parcel is packed: its tracking number.
packed = fusee.signal("packed", str)


@dataclass(frozen=True)
class Order:
    id: str
    customer: str
    amount_cents: int


@dataclass(frozen=True)
class Outcome:
    order: str
    status: str  # "shipped" or "refunded"
    detail: str


def charge_card(s: fusee.StepCtx, order: Order) -> str:
    # Your payment provider goes here, given s.key as the idempotency key:
    # the key is the same on every attempt and after a crash.
    return f"ch_{order.id}"


@fusee.workflow("notify")
async def notify(ctx: fusee.Ctx, message: str) -> str:
    return await ctx.step("email", lambda: f"sent to {message}")


@fusee.workflow("order")
async def process_order(ctx: fusee.Ctx, order: Order) -> Outcome:
    charge = await ctx.step("charge", lambda s: charge_card(s, order))
    tracking = await ctx.wait_for(packed, timeout="2d")
    if tracking is None:
        refund = await ctx.step("refund", lambda: f"re_{charge}")
        return Outcome(order.id, "refunded", refund)
    await ctx.sleep("cancel-window", "1h")  # the customer may still cancel
    sent = await ctx.child(notify, f"notify-{order.id}", f"{order.customer}: {tracking}")
    return Outcome(order.id, "shipped", sent)
