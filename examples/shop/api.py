"""The shop's web front: FastAPI, holding one `fusee.Client` for its life.

The front runs no workflow code and has no engine: it starts, signals,
queries and updates runs through the store, and the workers run them. Run
as many copies of it as you like:

    SHOP_STORE=./data uvicorn examples.shop.api:app

A request that waits for an order's end (``GET /orders/{id}/receipt``)
waits at most ``timeout`` seconds and answers 504 past it: a worker that
died holding the order's shard leaves it waiting until its lease runs out
(``fusee worker --lease``, 10 s by default), and a web request should not
hang that long without saying so.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request

import fusee
from examples.shop.models import Address, Approval, Order, OrderView, Receipt
from examples.shop.workflows import approval, change_address, order, orders, status
from fusee.store import Store

__all__ = ["app", "create_app"]


def create_app(store: str | Store | None = None) -> FastAPI:
    """The web app on ``store`` (default: ``SHOP_STORE``, else ``./data``).

    Example:
        >>> create_app("./data").title
        'shop'
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        target = store if store is not None else os.environ.get("SHOP_STORE", "./data")
        async with await fusee.Client.connect(target) as client:
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
            run = await client_of(request).start(order, o.id, o, queue=orders, key=o.customer)
        except fusee.AlreadyExists:
            raise HTTPException(409, f"order {o.id} exists") from None
        return {"id": run.id, "status": (await run.describe()).status}

    @app.post("/orders/{id}/approval")
    async def approve(id: str, decision: Approval, request: Request) -> dict[str, str]:
        try:
            # The reviewer as the dedup id: a retried request decides once.
            await client_of(request).get(id).signal(approval, decision, dedup=f"{id}/{decision.by}")
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
            view = OrderView.model_validate(await run.query(status))
        except fusee.NotFound:
            raise HTTPException(404, f"no order {id}") from None
        return view.model_dump()

    @app.patch("/orders/{id}/address")
    async def move(id: str, address: Address, request: Request) -> OrderView:
        try:
            view: OrderView = await client_of(request).get(id).update(change_address, address)
        except fusee.NotFound:
            raise HTTPException(404, f"no order {id}") from None
        except (fusee.UpdateRejected, fusee.RunFinished, fusee.RunQueued) as e:
            raise HTTPException(409, str(e)) from None
        return view

    @app.get("/orders/{id}/receipt")
    async def receipt(id: str, request: Request, timeout: float = 10.0) -> Receipt:
        run = client_of(request).get(id)
        try:
            result = await asyncio.wait_for(run.result(), timeout)
        except fusee.NotFound:
            raise HTTPException(404, f"no order {id}") from None
        except TimeoutError:
            raise HTTPException(
                504,
                f"order {id} has not ended within {timeout:g}s; ask again later",
                headers={"Retry-After": "5"},
            ) from None
        return Receipt.model_validate(result)

    return app


app = create_app()
