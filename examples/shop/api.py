"""The shop's web front: FastAPI, holding one `fusee.Client` for its life.

The front runs no workflow code and has no engine: it starts, signals,
queries and updates runs through the store, and the workers run them. Run
as many copies of it as you like:

    SHOP_STORE=./data uvicorn examples.shop.api:app

Every call that the run's worker answers waits at most a bound and answers
504 past it: a worker that died holding the order's shard leaves its runs
unanswered until its lease runs out (``fusee worker --lease``, 10 s by
default), and a web request should not hang that long without saying so.
What the request posted is stored meanwhile, and the next worker applies it.

It reads and writes payloads with the workers' codecs (`examples.shop.settings`).
Its admin routes make sales-report schedules at run time (``POST /reports``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI, Header, HTTPException, Request
from pydantic import BaseModel

import fusee
from examples.shop import settings
from examples.shop.models import Address, Approval, Note, Order, OrderView, Receipt, Refund
from examples.shop.workflows import (
    ORDER_WITHIN,
    approval,
    change_address,
    note,
    order,
    orders,
    refund,
    sales_report,
    status,
)
from fusee.store import Store

T = TypeVar("T")

# How long a request waits for the worker serving an order.
ANSWER_WITHIN_S = 10.0


async def bounded(call: Awaitable[T], what: str, timeout: float = ANSWER_WITHIN_S) -> T:
    """``call``'s value, or a 504 once ``timeout`` seconds have gone by without one."""
    try:
        return await asyncio.wait_for(call, timeout)
    except TimeoutError:
        raise HTTPException(
            504, f"{what}: no answer within {timeout:g}s; ask again later", {"Retry-After": "5"}
        ) from None


__all__ = ["RefundAsked", "ReportSchedule", "app", "create_app"]


class RefundAsked(BaseModel):
    reason: str


class ReportSchedule(BaseModel):
    """A sales report's schedule, made at run time: ``sales-report-{name}``."""

    name: str
    cron: str
    to: str


def create_app(store: str | Store | None = None) -> FastAPI:
    """The web app on ``store`` (default: ``SHOP_STORE``, else ``./data``).

    Example:
        >>> create_app("./data").title
        'shop'
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        target = store if store is not None else os.environ.get("SHOP_STORE", "./data")
        # The workers' codecs and blob store; a store object (tests) is read
        # as its engine reads it.
        if isinstance(target, Store):
            connecting = fusee.Client.connect(target)
        else:
            connecting = fusee.Client.connect(
                target, codecs=settings.codecs(), blobs=settings.blob_store(target)
            )
        async with await connecting as client:
            app.state.client = client
            yield

    app = FastAPI(title="shop", lifespan=lifespan)

    def client_of(request: Request) -> fusee.Client:
        client: fusee.Client = request.app.state.client
        return client

    @app.post("/orders", status_code=201)
    async def place(o: Order, request: Request) -> dict[str, str]:
        try:
            # One order at a time per customer: the queue's key.
            run = await bounded(
                client_of(request).start(
                    order, o.id, o, queue=orders, key=o.customer, timeout=ORDER_WITHIN
                ),
                f"order {o.id} is stored and will be placed",
            )
        except fusee.AlreadyExists:
            raise HTTPException(409, f"order {o.id} exists") from None
        return {"id": run.id, "status": (await run.describe()).status}

    @app.post("/orders/{id}/approval")
    async def approve(id: str, decision: Approval, request: Request) -> dict[str, str]:
        try:
            # The reviewer as the dedup id: a retried request decides once.
            run = client_of(request).get(id)
            await bounded(
                run.signal(approval, decision, dedup=f"{id}/{decision.by}"),
                f"the decision on order {id} is stored and will be applied",
            )
        except fusee.NotFound:
            raise HTTPException(404, f"no order {id}") from None
        except fusee.RunFinished:
            raise HTTPException(409, f"order {id} is closed") from None
        return {"id": id}

    @app.get("/orders/{id}")
    async def show(id: str, request: Request) -> dict[str, Any]:
        run = client_of(request).get(id)
        try:
            info = await run.describe()
            if info.status == "queued":
                return {"id": id, "stage": "queued"}
            view = await bounded(run.query(status), f"order {id}")
        except fusee.NotFound:
            raise HTTPException(404, f"no order {id}") from None
        return view.model_dump()

    @app.post("/orders/{id}/notes")
    async def add_note(
        id: str,
        n: Note,
        request: Request,
        idempotency_key: str | None = Header(default=None),
    ) -> dict[str, str]:
        try:
            run = client_of(request).get(id)
            # A retried request (same Idempotency-Key) adds its note once.
            await bounded(
                run.signal(note, n, dedup=idempotency_key),
                f"the note on order {id} is stored and will be applied",
            )
        except fusee.NotFound:
            raise HTTPException(404, f"no order {id}") from None
        except fusee.RunFinished:
            raise HTTPException(409, f"order {id} is closed") from None
        except ValueError as e:  # an Idempotency-Key fusee cannot take as a dedup id
            raise HTTPException(422, str(e)) from None
        return {"id": id}

    @app.patch("/orders/{id}/address")
    async def move(
        id: str,
        address: Address,
        request: Request,
        idempotency_key: str | None = Header(default=None),
    ) -> OrderView:
        try:
            run = client_of(request).get(id)
            # The update's id: a retried request is applied once, and the
            # order's view names the request that moved it.
            view: OrderView = await bounded(
                run.update(change_address, address, id=idempotency_key),
                f"the address of order {id} is stored and will be applied",
            )
        except fusee.NotFound:
            raise HTTPException(404, f"no order {id}") from None
        except (fusee.UpdateRejected, fusee.RunFinished, fusee.RunQueued) as e:
            raise HTTPException(409, str(e)) from None
        except ValueError as e:  # an Idempotency-Key fusee cannot take as an update id
            raise HTTPException(422, str(e)) from None
        return view

    @app.get("/orders/{id}/receipt")
    async def receipt(id: str, request: Request, timeout: float = ANSWER_WITHIN_S) -> Receipt:
        try:
            result = await bounded(client_of(request).get(id).result(), f"order {id}", timeout)
        except fusee.NotFound:
            raise HTTPException(404, f"no order {id}") from None
        return Receipt.model_validate(result)

    @app.post("/orders/{id}/refund", status_code=201)
    async def pay_back(id: str, asked: RefundAsked, request: Request) -> dict[str, str]:
        client = client_of(request)
        try:
            done = (await client.get(id).describe()).status == "completed"
            got = Receipt.model_validate(await client.get(id).result()) if done else None
        except fusee.NotFound:
            raise HTTPException(404, f"no order {id}") from None
        if got is None or got.charge_id is None:
            raise HTTPException(409, f"order {id} has not shipped; cancel it instead")
        asking = Refund(order_id=id, charge_id=got.charge_id, reason=asked.reason)
        try:
            run = await bounded(client.start(refund, f"{id}-refund", asking), f"the refund of {id}")
        except fusee.AlreadyExists:
            raise HTTPException(409, f"order {id} is refunded already") from None
        refund_id: str = await bounded(run.result(), f"the refund of {id} is stored and will run")
        return {"id": run.id, "refund": refund_id}

    @app.post("/reports", status_code=201)
    async def schedule_report(s: ReportSchedule, request: Request) -> dict[str, str]:
        name = f"sales-report-{s.name}"
        try:
            await bounded(
                client_of(request).schedules.create(name, sales_report, cron=s.cron, input=s.to),
                f"schedule {name}",
            )
        except fusee.AlreadyExists:
            raise HTTPException(409, f"schedule {name} exists") from None
        except ValueError as e:
            raise HTTPException(422, str(e)) from None
        return {"schedule": name}

    return app


app = create_app()
