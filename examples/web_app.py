"""A web app beside a worker: the app holds a `fusee.Client`, the worker runs the workflows.

The app (Starlette; a FastAPI app's ``lifespan`` is the same) opens one
Client for its life and starts, signals and reads runs through it; it has
no engine of its own, so it can run as many processes as you like. The
worker is the one process that runs the workflow code.

    python examples/web_app.py                    # the demo: a worker, the app, three orders
    python examples/web_app.py worker ./data      # or run the two yourself:
    FUSEE_DATA=./data uvicorn examples.web_app:app
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import fusee

paid = fusee.signal("paid", str)


@dataclass(frozen=True)
class Order:
    sku: str
    qty: int


@fusee.workflow("order")
async def order(ctx: fusee.Ctx, item: Order) -> dict[str, str]:
    """Reserves the stock, waits for the payment (a day at most), then ships."""
    await ctx.step("reserve", lambda: f"reserved {item.qty} x {item.sku}")
    payment = await ctx.wait_for(paid, timeout="1d")
    if payment is None:
        await ctx.step("release", lambda: f"released {item.sku}")
        return {"status": "expired"}
    label = await ctx.step("ship", lambda: f"FR-{item.sku}-{item.qty}")
    return {"status": "shipped", "payment": payment, "label": label}


# --- the web app: a Client for its whole life ---------------------------------------------------


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    async with await fusee.Client.connect(os.environ.get("FUSEE_DATA", "./data")) as client:
        app.state.client = client
        yield


async def create_order(request: Request) -> JSONResponse:
    client: fusee.Client = request.app.state.client
    body = await request.json()
    try:
        run = await client.start(order, request.path_params["id"], Order(**body))
    except fusee.AlreadyExists:
        return JSONResponse({"error": "that order exists"}, status_code=409)
    info = await run.describe()
    return JSONResponse({"id": run.id, "status": info.status}, status_code=201)


async def pay(request: Request) -> JSONResponse:
    client: fusee.Client = request.app.state.client
    body = await request.json()
    run = client.get(request.path_params["id"])
    try:
        # The payment's id as the dedup id: a retried request pays once.
        await run.signal(paid, body["payment"], dedup=body["payment"])
    except fusee.NotFound:
        return JSONResponse({"error": "no such order"}, status_code=404)
    except fusee.FuseeError:  # the order has shipped (or expired) already
        return JSONResponse({"error": "the order is closed"}, status_code=409)
    return JSONResponse({"id": run.id, "paid": body["payment"]})


async def show_order(request: Request) -> JSONResponse:
    client: fusee.Client = request.app.state.client
    run = client.get(request.path_params["id"])
    try:
        info = await run.describe()
    except fusee.NotFound:
        return JSONResponse({"error": "no such order"}, status_code=404)
    if request.query_params.get("wait") or info.status == "completed":
        return JSONResponse({"id": run.id, "result": await run.result()})
    return JSONResponse({"id": run.id, "status": info.status})


app = Starlette(
    routes=[
        Route("/orders/{id}", create_order, methods=["POST"]),
        Route("/orders/{id}/paid", pay, methods=["POST"]),
        Route("/orders/{id}", show_order, methods=["GET"]),
    ],
    lifespan=lifespan,
)


# --- the worker ---------------------------------------------------------------------------------


async def worker(data: str) -> None:
    """Runs the workflows on ``data`` until stdin closes (or Ctrl-C)."""
    async with await fusee.Engine.open(data, workflows=[order]):
        print("worker ready", flush=True)
        await asyncio.to_thread(sys.stdin.read)


def demo() -> None:
    from starlette.testclient import TestClient

    with tempfile.TemporaryDirectory() as data:
        served = subprocess.Popen(
            [sys.executable, __file__, "worker", data],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert served.stdout is not None
        print(served.stdout.readline().strip())
        os.environ["FUSEE_DATA"] = data
        try:
            with TestClient(app) as http:
                for id, sku in (("o-1", "A1"), ("o-2", "B2")):
                    made = http.post(f"/orders/{id}", json={"sku": sku, "qty": 2})
                    print(f"POST /orders/{id}: {made.status_code} {made.json()}")
                again = http.post("/orders/o-1", json={"sku": "A1", "qty": 2})
                print(f"POST /orders/o-1 again: {again.status_code} {again.json()}")
                for _ in range(2):  # a retried payment is applied once
                    payment = http.post("/orders/o-1/paid", json={"payment": "pay-77"})
                    print(f"POST /orders/o-1/paid: {payment.status_code} {payment.json()}")
                print(f"GET /orders/o-1?wait=1: {http.get('/orders/o-1?wait=1').json()}")
                print(f"GET /orders/o-2: {http.get('/orders/o-2').json()}")
        finally:
            assert served.stdin is not None
            served.stdin.close()
            served.wait(30)
            served.stdout.close()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "worker":
        asyncio.run(worker(sys.argv[2]))
    else:
        demo()
