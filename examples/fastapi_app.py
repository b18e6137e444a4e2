"""A FastAPI app beside workers: the app holds a `fusee.Client`, the workers run the workflows.

The app opens one Client in its ``lifespan`` and starts, signals and reads
runs through it; it has no engine of its own, so it can run as many
processes as you like. The workers are the processes that run the
workflow code: one on an SQLite directory, any number on Postgres (they
share the runs by shard, and take over a dead one's).

    python examples/fastapi_app.py                      # the demo on SQLite: a worker, the app
    python examples/fastapi_app.py postgresql://...     # the demo on Postgres: two workers
    python examples/fastapi_app.py worker STORE         # or run the parts yourself:
    FUSEE_STORE=STORE uvicorn examples.fastapi_app:app
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, HTTPException, Request

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
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with await fusee.Client.connect(os.environ.get("FUSEE_STORE", "./data")) as client:
        app.state.client = client
        yield


app = FastAPI(lifespan=lifespan)


def client_of(request: Request) -> fusee.Client:
    client: fusee.Client = request.app.state.client
    return client


@app.post("/orders/{id}", status_code=201)
async def create_order(id: str, body: dict[str, Any], request: Request) -> dict[str, str]:
    try:
        run = await client_of(request).start(order, id, Order(**body))
    except fusee.AlreadyExists:
        raise HTTPException(409, "that order exists") from None
    info = await run.describe()
    return {"id": run.id, "status": info.status}


@app.post("/orders/{id}/paid")
async def pay(id: str, body: dict[str, str], request: Request) -> dict[str, str]:
    run = client_of(request).get(id)
    try:
        # The payment's id as the dedup id: a retried request pays once.
        await run.signal(paid, body["payment"], dedup=body["payment"])
    except fusee.NotFound:
        raise HTTPException(404, "no such order") from None
    except fusee.FuseeError:  # the order has shipped (or expired) already
        raise HTTPException(409, "the order is closed") from None
    return {"id": run.id, "paid": body["payment"]}


@app.get("/orders/{id}")
async def show_order(id: str, request: Request, wait: bool = False) -> dict[str, Any]:
    run = client_of(request).get(id)
    try:
        info = await run.describe()
    except fusee.NotFound:
        raise HTTPException(404, "no such order") from None
    if wait or info.status == "completed":
        return {"id": run.id, "result": await run.result()}
    return {"id": run.id, "status": info.status}


# --- the workers --------------------------------------------------------------------------------


async def worker(store: str) -> None:
    """Runs the workflows on ``store`` until stdin closes (or Ctrl-C)."""
    async with await fusee.Engine.open(store, workflows=[order]) as engine:
        held = f" holding {len(engine.leases.held)} shards" if engine.leases else ""
        print(f"worker ready{held}", flush=True)
        await asyncio.to_thread(sys.stdin.read)


@contextlib.contextmanager
def workers(store: str, count: int) -> Iterator[None]:
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "worker", store],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            print(proc.stdout.readline().split(" holding")[0].strip())
        yield
    finally:
        for proc in procs:
            proc.communicate("", timeout=30)  # closes stdin: the worker stops


def demo(store: str, count: int) -> None:
    from fastapi.testclient import TestClient

    os.environ["FUSEE_STORE"] = store
    with workers(store, count), TestClient(app) as http:
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


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "worker":
        asyncio.run(worker(sys.argv[2]))
    elif len(sys.argv) == 2 and "://" in sys.argv[1]:
        demo(sys.argv[1], count=2)
    else:
        with tempfile.TemporaryDirectory() as data:
            demo(data, count=1)
