"""The demo: a checkout that survives being killed.

A checkout workflow quotes an order, charges the card (a flaky step that
fails once and is retried), waits for a manager's approval (a signal, with a
timeout), sleeps through a cool-off, ships the order in a child workflow and
emails a receipt. Each step prints a line when its function really runs.

Run it (``make demo``), kill it during the cool-off (Ctrl-C, or ``kill -9``),
and run it again: it attaches to the same run (`fusee.IdPolicy.ATTACH`, a
fixed order id), replays the journal in ``./data``, and carries on. The
steps that ran before the kill print nothing the second time: their results
come from the journal.

    python examples/checkout.py               # ./data, approves after ~1 s
    python examples/checkout.py --no-approve  # the approval times out: refund
    python examples/checkout.py --fresh       # forget ./data's run, start over
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import fusee
from fusee.cli import writer_lock
from fusee.record import Done, Fired, Step, Timer, decode

approval = fusee.signal("approval", bool)
phase = fusee.query("phase")

ORDER_ID = "order-42"


@dataclass(frozen=True)
class Item:
    sku: str
    quantity: int
    price_cents: int


@dataclass(frozen=True)
class Order:
    id: str
    customer: str
    items: list[Item]
    cool_off_s: float = 8.0
    approval_timeout_s: float = 10.0


@dataclass(frozen=True)
class Receipt:
    order: str
    charge: str
    tracking: str | None
    status: str


def say(text: str) -> None:
    """Prints a line at once (the demo's test reads it from a pipe)."""
    print(text, flush=True)


def euros(cents: int) -> str:
    return f"{cents / 100:.2f} EUR"


# --- the step functions: what really happens, once ----------------------------------------------


def quote(order: Order) -> int:
    total = sum(i.quantity * i.price_cents for i in order.items)
    say(f"  step quote       {len(order.items)} items, {euros(total)}")
    return total


def charge(s: fusee.StepCtx, order: Order, total: int) -> str:
    # Flaky on purpose: the first attempt fails; fusee retries it.
    if s.attempt == 1:
        say(f"  step charge      attempt {s.attempt} failed: card network timeout (retried)")
        raise ConnectionError("card network timeout")
    say(f"  step charge      attempt {s.attempt}: charged {euros(total)} (key {s.key})")
    return f"ch_{order.id}"


def announce_cool_off(order: Order) -> None:
    say(
        f"  step notify      cool-off: sleeping {order.cool_off_s:g}s "
        f"-- kill me now (Ctrl-C or kill -9 {os.getpid()}), then run me again"
    )


def refund(order: Order, charge_id: str) -> str:
    say(f"  step refund      no approval: refunded {charge_id}")
    return f"re_{order.id}"


def pack(order: Order) -> int:
    say(f"  step pack        (child ship-{order.id}) {len(order.items)} parcels")
    return len(order.items)


def label(order: Order) -> str:
    say(f"  step label       (child ship-{order.id}) tracking FR-{order.id.upper()}")
    return f"FR-{order.id.upper()}"


def email(order: Order, tracking: str) -> None:
    say(f"  step email       receipt sent to {order.customer} (tracking {tracking})")


# --- the workflows: plain async code, replayed after a crash ------------------------------------


@fusee.workflow("ship")
async def ship(ctx: fusee.Ctx, order: Order) -> str:
    """The child workflow: pack the parcels, print the label."""
    await ctx.step("pack", lambda: pack(order))
    return await ctx.step("label", lambda: label(order))


@fusee.workflow("checkout")
async def checkout(ctx: fusee.Ctx, order: Order) -> Receipt:
    """Quote, charge (retried), await approval, cool off, ship (a child), email."""
    where = ["quoting"]
    ctx.on_query(phase, lambda _: where[0])
    ctx.set_attributes({"customer": order.customer})

    total = await ctx.step("quote", lambda: quote(order))
    where[0] = "charging"
    charge_id = await ctx.step(
        "charge",
        lambda s: charge(s, order, total),
        retry=fusee.Retry(attempts=5, initial="500ms", backoff=2.0),
    )

    where[0] = "awaiting approval"
    approved = await ctx.wait_for(approval, timeout=order.approval_timeout_s)
    if not approved:
        await ctx.step("refund", lambda: refund(order, charge_id))
        return Receipt(order.id, charge_id, None, "refunded")

    where[0] = "cool-off"
    await ctx.step("notify", lambda: announce_cool_off(order))
    await ctx.sleep("cool-off", order.cool_off_s)

    where[0] = "shipping"
    tracking = await ctx.child(ship, f"ship-{order.id}", order)
    await ctx.step("email", lambda: email(order, tracking))
    where[0] = "done"
    return Receipt(order.id, charge_id, tracking, "shipped")


# --- the program: start or attach, approve, wait -----------------------------------------------


async def manager(run: fusee.Run[Receipt], *, approve: bool, timeout_s: float) -> None:
    """The manager: approves once the run waits for it (and only then), or never."""
    while True:
        try:
            where = await run.query(phase)
        except fusee.FuseeError:
            return
        if where == "awaiting approval":
            break
        if where not in ("quoting", "charging"):
            return
        await asyncio.sleep(0.2)
    if not approve:
        say(f"  waiting          for signal 'approval': nobody sends it ({timeout_s:g}s)")
        return
    say(f"  waiting          for signal 'approval' (timeout {timeout_s:g}s)")
    await asyncio.sleep(1.0)
    say("  manager          approves: sends signal 'approval'")
    await run.signal(approval, True, dedup=f"approval-{run.id}")


async def journal_summary(engine: fusee.Engine, id: str) -> str:
    """What the journal of ``id`` already holds: its steps and its pending timer."""
    steps: list[str] = []
    timer_at: dict[int, int] = {}
    ended = False
    for _, data in await engine.store.load(id):
        rec = decode(data)
        if isinstance(rec, Step):
            steps.append(rec.name)
        elif isinstance(rec, Timer):
            timer_at[rec.seq] = rec.fire_at_ms
        elif isinstance(rec, Fired):
            timer_at.pop(rec.seq, None)
        elif isinstance(rec, Done):
            ended = True
    text = f"recorded steps: {', '.join(steps) or 'none'}"
    if timer_at and not ended:
        left_s = max(0.0, min(timer_at.values()) / 1000 - datetime.datetime.now().timestamp())
        text += f"; the cool-off timer fires in {left_s:.1f}s"
    return text


async def demo(data: Path, *, approve: bool, cool_off_s: float, approval_timeout_s: float) -> int:
    order = Order(
        ORDER_ID,
        "ada@example.com",
        [Item("mug", 2, 1290), Item("tea", 3, 1100)],
        cool_off_s,
        approval_timeout_s,
    )
    resumed = (data / "fusee.db").exists()
    async with await fusee.Engine.open(data, workflows=[checkout, ship]) as engine:
        row = await engine.store.get(ORDER_ID)
        if row is None:
            say(f"fusee demo: checkout of {ORDER_ID}, journaled in {data}/ (SQLite)")
        else:
            say(f"fusee demo: {ORDER_ID} is already in {data}/ ({row.status}): attaching to it")
            say(f"  {await journal_summary(engine, ORDER_ID)}")
            if row.status not in ("completed", "failed", "cancelled"):
                say("  (recorded steps are not run again: their results come from the journal)")
        run = await engine.start(checkout, ORDER_ID, order, id_policy=fusee.IdPolicy.ATTACH)
        timeout_s = order.approval_timeout_s
        approver = asyncio.create_task(manager(run, approve=approve, timeout_s=timeout_s))
        try:
            receipt = await run.result()
        finally:
            approver.cancel()
            await asyncio.gather(approver, return_exceptions=True)
        say(f"done: {receipt}")
        if resumed or row is not None:
            say(f"(--fresh starts over; `fusee show {ORDER_ID}` shows the journal)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--data", default="data", help="the store's directory (default ./data)")
    parser.add_argument("--no-approve", action="store_true", help="let the approval time out")
    parser.add_argument("--fresh", action="store_true", help="delete the store first")
    parser.add_argument("--cool-off", type=float, default=8.0, help="seconds (default 8)")
    parser.add_argument("--approval-timeout", type=float, default=10.0, help="seconds (default 10)")
    args = parser.parse_args(argv)
    data = Path(args.data)
    try:
        # One process writes a store: a second copy of the demo is refused.
        with writer_lock(data):
            if args.fresh:
                for path in data.glob("fusee.db*"):
                    path.unlink()
            return asyncio.run(
                demo(
                    data,
                    approve=not args.no_approve,
                    cool_off_s=args.cool_off,
                    approval_timeout_s=args.approval_timeout,
                )
            )
    except fusee.StoreError as e:
        print(f"checkout demo: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        say(f"\ninterrupted: the run is safe in {data}/; run me again to resume it")
        return 130


if __name__ == "__main__":
    sys.exit(main())
