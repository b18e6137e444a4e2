"""The shop's workflows: an order, its shipment (a child), and the nightly settlement.

An order reserves its stock, waits for a reviewer's approval when it is
large (two days at most; an order placed but not charged within a week is
cancelled by its deadline, and its stock released), charges the customer through the payment API
(retried: the API fails often, and the step's idempotency key makes every
retry charge once), then ships it in a child run. Its ``status`` query
shows where it is; its ``change_address`` update moves the parcel while it
has not left. Orders go through the ``orders`` queue, one at a time per
customer. The ``nightly-settlement`` schedule asks the payment API for the
day's total at 02:00 UTC.

Steps are the services' methods (`examples.shop.services`), given their
arguments with `functools.partial`.

    fusee worker examples.shop.workflows --setup examples.shop.services:connected
"""

from __future__ import annotations

from functools import partial

import fusee
from examples.shop.models import (
    Address,
    Approval,
    Order,
    OrderView,
    Receipt,
    Settlement,
    Shipment,
)
from examples.shop.services import payments, warehouse

__all__ = [
    "APPROVAL_FROM_CENTS",
    "ORDER_WITHIN",
    "approval",
    "change_address",
    "nightly",
    "order",
    "orders",
    "settle",
    "ship",
    "status",
]

# Orders of this total and more wait for a reviewer's approval.
APPROVAL_FROM_CENTS = 100_000

# An order's deadline (`start(..., timeout=ORDER_WITHIN)`): one still not
# charged by then (queued behind the customer's others, its approval lost)
# is cancelled and its stock released.
ORDER_WITHIN = "7d"

# The payment API fails about a request in three: enough attempts that a
# run of bad luck does not pause an order, spaced so a busy API recovers.
PAYMENT_RETRY = fusee.Retry(attempts=12, initial="200ms", backoff=2.0, max_interval="5s")

orders = fusee.Queue("orders", per_key=1)
approval = fusee.signal("approval", Approval)
status = fusee.query("status", OrderView)
change_address = fusee.update("change_address", Address, OrderView)


@fusee.workflow("ship")
async def ship(ctx: fusee.Ctx, o: Order) -> Shipment:
    """Labels the parcel and hands it to the carrier."""
    tracking = await ctx.step("label", partial(warehouse.label, o.id))
    parcel = Shipment(order_id=o.id, tracking=tracking, address=o.address)
    return await ctx.step("dispatch", partial(warehouse.dispatch, parcel))


@fusee.workflow("order")
async def order(ctx: fusee.Ctx, o: Order) -> Receipt:
    """Reserves, waits for approval if large, charges, ships (a child run)."""
    view = OrderView(id=o.id, stage="reserving", address=o.address)
    ctx.on_query(status, lambda _: view)

    def not_shipped(address: Address) -> None:
        if view.stage in ("shipping", "done"):
            raise ValueError(f"order {o.id} has left the warehouse; its address stays")

    def move(address: Address) -> OrderView:
        view.address = address
        return view

    ctx.on_update(change_address, move, validator=not_shipped)

    await ctx.step("reserve", partial(warehouse.reserve, o))
    if o.total_cents >= APPROVAL_FROM_CENTS:
        view.stage = "awaiting approval"
        try:
            decision = await ctx.wait_for(approval, timeout="2d")
        except fusee.Cancelled:
            # Its deadline passed (or it was cancelled): the stock goes back.
            await ctx.step("release", partial(warehouse.release, o))
            raise
        if decision is None or not decision.approved:
            await ctx.step("release", partial(warehouse.release, o))
            view.stage = "done"
            outcome = "expired" if decision is None else "rejected"
            return Receipt(order_id=o.id, outcome=outcome)
    view.stage = "charging"
    charge = await ctx.step(
        "charge",
        partial(payments.charge, o),
        retry=PAYMENT_RETRY,
    )
    view.charge_id = charge.id
    view.stage = "shipping"
    parcel = await ctx.child(ship, f"{o.id}-ship", o.model_copy(update={"address": view.address}))
    view.stage = "done"
    return Receipt(order_id=o.id, outcome="shipped", charge_id=charge.id, tracking=parcel.tracking)


@fusee.workflow("settle")
async def settle(ctx: fusee.Ctx) -> Settlement:
    """The day's settlement, as the payment API counts it."""
    return await ctx.step("settlement", payments.settlement, retry=PAYMENT_RETRY)


nightly = fusee.Schedule("nightly-settlement", settle, cron="0 2 * * *")
