"""The shop's demo: the payment API, a worker and the web front, in one process, on SQLite.

    python -m examples.shop            # in a temporary directory
    python -m examples.shop ./data     # or in ./data (run it again: the orders exist)

It places three orders through the web front: a small one that ships, a
large one a reviewer approves (after its address changed) and a large one
a reviewer rejects; then prints each receipt and what the payment API
counted: one charge per shipped order, however often it failed.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from typing import Any

import httpx

import fusee
from examples.shop import services
from examples.shop.api import create_app
from examples.shop.payment_server import PaymentServer
from examples.shop.workflows import nightly, order, orders, settle, ship

WORKFLOWS: list[fusee.WorkflowDef[Any, Any]] = [order, ship, settle]


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
            store, workflows=WORKFLOWS, queues=[orders], schedules=[nightly], durability="none"
        ),
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
        moved = await http.patch("/orders/o-2/address", json={"name": "bo", "city": "Nantes"})
        print(f"PATCH /orders/o-2/address: {moved.status_code} {moved.json()['address']}")
        await http.post("/orders/o-2/approval", json={"approved": True, "by": "rev-1"})
        await wait_for_stage(http, "o-3", "awaiting approval")
        await http.post("/orders/o-3/approval", json={"approved": False, "by": "rev-1"})
        for body in placed:
            got = (await http.get(f"/orders/{body['id']}/receipt?timeout=60")).json()
            print(f"{body['id']}: {got['outcome']} {got['charge_id']} {got['tracking']}")
        late = await http.patch("/orders/o-1/address", json={"name": "ana", "city": "Paris"})
        print(f"PATCH /orders/o-1/address: {late.status_code}")


async def wait_for_stage(http: httpx.AsyncClient, id: str, stage: str) -> None:
    while (await http.get(f"/orders/{id}")).json().get("stage") != stage:
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
