"""The shop's workflows: an order, its shipment (a child), refunds, reviews, reports, settlement.

An order reserves its stock, waits for a reviewer's approval when it is
large (two days at most; an order placed but not charged within a week is
cancelled by its deadline, and its stock released), charges the customer through the payment API
(retried: the API fails often, and the step's idempotency key makes every
retry charge once), bills it (an invoice PDF, large enough that it goes to
the blob store, see `examples.shop.settings`), then ships it in a child run,
and asks for a review seven days later (a run of its own, started with a
delay). Its ``status`` query shows where it is; its ``change_address``
update moves the parcel while it has not left; its ``note`` signals go on
the parcel. A bug in its code pauses it (``on_error="pause"``) until a fix
is deployed and it is resumed. A refund (``refund``) pays the customer back
and cancels the review request still waiting. Orders go through the
``orders`` queue, one at a time per customer. The ``nightly-settlement``
schedule asks the payment API for the day's total at 02:00 UTC; sales
reports (``sales_report``) run on schedules made at run time (the front's
``POST /reports``).

Steps are the services' methods (`examples.shop.services`), given their
arguments with `functools.partial`.

    fusee worker examples.shop.workflows --setup examples.shop.services:connected \
        --codecs examples.shop.settings:codecs
"""

from __future__ import annotations

import datetime
from functools import partial

import fusee
from examples.shop.models import (
    Address,
    Approval,
    Note,
    Order,
    OrderView,
    Receipt,
    Refund,
    Report,
    Settlement,
    Shipment,
)
from examples.shop.services import billing, mailer, payments, warehouse

__all__ = [
    "APPROVAL_FROM_CENTS",
    "ORDER_WITHIN",
    "REVIEW_AFTER",
    "approval",
    "change_address",
    "needs_approval",
    "nightly",
    "note",
    "order",
    "orders",
    "refund",
    "review_request",
    "sales_report",
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

# A shipped order's customer is asked for a review this long after.
REVIEW_AFTER = "7d"

# The payment API fails about a request in three: enough attempts that a
# run of bad luck does not pause an order, spaced so a busy API recovers.
PAYMENT_RETRY = fusee.Retry(attempts=12, initial="200ms", backoff=2.0, max_interval="5s")

orders = fusee.Queue("orders", per_key=1)
approval = fusee.signal("approval", Approval)
status = fusee.query("status", OrderView)
change_address = fusee.update("change_address", Address, OrderView)
note = fusee.signal("note", Note)


def needs_approval(o: Order) -> bool:
    """Whether a reviewer must approve ``o`` before it is charged."""
    return o.total_cents >= APPROVAL_FROM_CENTS


@fusee.workflow("ship")
async def ship(ctx: fusee.Ctx, o: Order) -> Shipment:
    """Labels the parcel and hands it to the carrier."""
    tracking = await ctx.step("label", partial(warehouse.label, o.id))
    parcel = Shipment(order_id=o.id, tracking=tracking, address=o.address, notes=o.notes)
    return await ctx.step("dispatch", partial(warehouse.dispatch, parcel))


# A bug in the order's code (a bad deploy) pauses the order instead of
# failing it: the customer's order and its charge stay as they are until the
# fix is deployed and `fusee resume` (or the UI) replays it on the new code.
@fusee.workflow("order", on_error="pause")
async def order(ctx: fusee.Ctx, o: Order) -> Receipt:
    """Reserves, waits for approval if large, charges, bills, ships (a child run)."""
    view = OrderView(id=o.id, stage="reserving", address=o.address, notes=list(o.notes))
    ctx.on_query(status, lambda _: view)
    # Notes come at any time: each goes on the parcel if it has not left yet.
    ctx.on_signal(note, lambda n: view.notes.append(n.text))

    def not_shipped(address: Address) -> None:
        if view.stage in ("shipping", "done"):
            raise ValueError(f"order {o.id} has left the warehouse; its address stays")

    def move(address: Address) -> OrderView:
        view.address = address
        # The update's id: the front passes the request's Idempotency-Key.
        update = ctx.current_update()
        view.address_changed_by = update.id if update is not None else None
        return view

    ctx.on_update(change_address, move, validator=not_shipped)

    await ctx.step("reserve", partial(warehouse.reserve, o))
    if needs_approval(o):
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
    # Some 300 KB: recorded in the blob store, its digest in the journal.
    pdf = await ctx.step("invoice", partial(billing.invoice, o, charge.id))
    await ctx.step("email invoice", partial(mailer.send, o.customer, f"invoice {o.id}", pdf))
    view.stage = "shipping"
    shipped = o.model_copy(update={"address": view.address, "notes": view.notes})
    parcel = await ctx.child(ship, f"{o.id}-ship", shipped)
    view.stage = "done"
    # A run of its own, queued until its day, outliving the order (detached);
    # a refund cancels it meanwhile.
    await ctx.child(review_request, f"{o.id}-review", o, detached=True, delay=REVIEW_AFTER)
    return Receipt(
        order_id=o.id,
        outcome="shipped",
        charge_id=charge.id,
        tracking=parcel.tracking,
        invoice_bytes=len(pdf),
    )


@fusee.workflow("review_request")
async def review_request(ctx: fusee.Ctx, o: Order) -> str:
    """Asks the customer how the order went; the mail's id."""
    return await ctx.step("email", partial(mailer.send, o.customer, f"how was order {o.id}?"))


@fusee.workflow("refund")
async def refund(ctx: fusee.Ctx, r: Refund) -> str:
    """Pays a shipped order back; the refund's id."""
    refund_id = await ctx.step("refund", partial(payments.refund, r), retry=PAYMENT_RETRY)
    # A refunded customer is not asked for a review: the request, queued
    # until its day, is dropped (once, across crashes; left alone if sent).
    ctx.cancel(f"{r.order_id}-review", reason=f"order refunded: {r.reason}")
    return refund_id


# Short and stateless: a run in flight during a deploy moves to the new code.
@fusee.workflow("settle", versioning="auto")
async def settle(ctx: fusee.Ctx) -> Settlement:
    """The day's settlement, as the payment API counts it."""
    return await ctx.step("settlement", payments.settlement, retry=PAYMENT_RETRY)


@fusee.workflow("sales_report", versioning="auto")
async def sales_report(ctx: fusee.Ctx, to: str) -> Report:
    """Mails ``to`` the sales of the day before the schedule's tick.

    Its schedules are made at run time (the front's ``POST /reports``). The
    tick, not the time the run began, names the day: a run a late worker or
    a backfill starts reports the day it stands for.
    """
    tick = ctx.info.scheduled_at or ctx.now()  # started by hand: the day before now
    day = (tick - datetime.timedelta(days=1)).date().isoformat()
    totals = await ctx.step("totals", payments.settlement, retry=PAYMENT_RETRY)
    text = f"sales of {day}: {totals.charges} charge(s), {totals.total_cents} cents"
    await ctx.step("email", partial(mailer.send, to, text))
    return Report(day=day, charges=totals.charges, total_cents=totals.total_cents, sent_to=to)


nightly = fusee.Schedule("nightly-settlement", settle, cron="0 2 * * *")
