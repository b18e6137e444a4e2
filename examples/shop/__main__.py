"""The shop's demo: the payment API, a worker and the web front, in one process, on SQLite.

    python -m examples.shop            # in a temporary directory
    python -m examples.shop ./data     # or in ./data (run it again: the orders exist)

It places three orders through the web front: a small one that ships, a
large one a reviewer approves (after its address changed and a note was
added) and a large one a reviewer rejects; then prints each receipt. It
refunds the small one (which cancels its review request, queued for seven
days later), makes a sales report's schedule and runs it once, closes the
shop (cancelling the orders still queued, as ``python -m
examples.shop.admin close`` does), and prints what the payment API counted:
one charge per shipped order, however often it failed.

Its payloads are compressed and encrypted (with the development key: see
`examples.shop.settings`), and the invoices go to the blob store, DATA/blobs.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

import fusee
from examples.shop import admin, services, settings
from examples.shop.api import create_app
from examples.shop.models import Report
from examples.shop.payment_server import PaymentServer
from examples.shop.workflows import (
    nightly,
    order,
    orders,
    refund,
    review_request,
    sales_report,
    settle,
    ship,
)

WORKFLOWS: list[fusee.WorkflowDef[Any, Any]] = [
    order,
    ship,
    settle,
    review_request,
    refund,
    sales_report,
]


def an_order(id: str, customer: str, qty: int, price_cents: int) -> dict[str, Any]:
    return {
        "id": id,
        "customer": customer,
        "items": [{"sku": "LAMP", "qty": qty, "price_cents": price_cents}],
        "address": {"name": customer, "city": "Lyon"},
    }


async def demo(store: str, payment_url: str) -> None:
    app = create_app(store)
    async with (
        services.connected(payment_url),
        await fusee.Engine.open(
            store,
            workflows=WORKFLOWS,
            queues=[orders],
            schedules=[nightly],
            durability="none",
            **settings.engine_options(store),
        ) as engine,
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://shop") as http,
    ):
        placed = [
            an_order("o-1", "ana", 2, 1_990),
            an_order("o-2", "bo", 1, 120_000),
            an_order("o-3", "cy", 3, 99_000),
        ]
        for body in placed:
            answer = await http.post("/orders", json=body)
            print(f"POST /orders {body['id']}: {answer.status_code}")
        again = await http.post("/orders", json=placed[0])
        print(f"POST /orders o-1 again: {again.status_code} {again.json()['detail']}")
        await wait_for_stage(http, "o-2", "awaiting approval")
        address = {"name": "bo", "city": "Nantes"}
        moved = await http.patch(
            "/orders/o-2/address", json=address, headers={"Idempotency-Key": "req-7"}
        )
        print(f"PATCH /orders/o-2/address: {moved.status_code} {moved.json().get('address')}")
        noted = await http.post("/orders/o-2/notes", json={"text": "leave it with the neighbour"})
        print(f"POST /orders/o-2/notes: {noted.status_code}")
        await http.post("/orders/o-2/approval", json={"approved": True, "by": "rev-1"})
        await wait_for_stage(http, "o-3", "awaiting approval")
        await http.post("/orders/o-3/approval", json={"approved": False, "by": "rev-1"})
        for body in placed:
            got = (await http.get(f"/orders/{body['id']}/receipt?timeout=60")).json()
            print(f"{body['id']}: {got['outcome']} {got['charge_id']} {got['tracking']}")
        late = await http.patch("/orders/o-1/address", json={"name": "ana", "city": "Paris"})
        print(f"PATCH /orders/o-1/address: {late.status_code}")
        await extras(http, engine, Path(store))


async def extras(http: httpx.AsyncClient, engine: fusee.Engine, data: Path) -> None:
    """Notes, refunds, delayed runs, blobs, a report's schedule, a bulk cancel."""
    view = (await http.get("/orders/o-2")).json()
    print(f"o-2: notes {view['notes']}, address changed by {view['address_changed_by']}")
    invoices = [p for p in (data / "blobs").rglob("*") if p.is_file()]
    print(f"invoices in the blob store: {len(invoices)}")
    refunded = await http.post("/orders/o-1/refund", json={"reason": "arrived broken"})
    answer = refunded.json()
    print(f"POST /orders/o-1/refund: {refunded.status_code} {answer.get('refund', answer)}")
    try:
        await engine.get("o-1-review").result()  # it ends once the refund's cancel reaches it
    except fusee.Cancelled as e:
        print(f"o-1-review: cancelled ({e})")
    print(f"o-2-review: {(await engine.get('o-2-review').describe()).status}")
    made = await http.post(
        "/reports", json={"name": "ops", "cron": "0 6 * * *", "to": "ops@shop.example"}
    )
    print(f"POST /reports ops: {made.status_code}")
    report: Report = await (await engine.schedules.trigger("sales-report-ops")).result()
    print(f"sales report to {report.sent_to}: {report.charges} charge(s)")
    for body in (an_order("o-4", "dee", 1, 150_000), an_order("o-5", "dee", 1, 500)):
        await http.post("/orders", json=body)
    await wait_for_stage(http, "o-4", "awaiting approval")
    closed = await admin.close(engine, dry_run=True)
    print(f"shop closing: would cancel queued orders {list(closed.done)}")
    closed = await admin.close(engine)
    print(f"shop closed: cancelled {list(closed.done)}")


async def wait_for_stage(http: httpx.AsyncClient, id: str, stage: str) -> None:
    """Until order ``id`` reaches ``stage``, or is done (run again on ./data, it is)."""
    while (await http.get(f"/orders/{id}")).json().get("stage") not in (stage, "done"):
        await asyncio.sleep(0.05)


def main(store: str) -> None:
    with PaymentServer().running() as server:
        asyncio.run(demo(store, server.url))
        counts = server.ledger.counts()
    print(f"payment API: {counts['requests']} requests, {counts['failures']} failed")
    print(f"charges by order: {dict(sorted(counts['by_order'].items()))}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as data:
            main(data)
