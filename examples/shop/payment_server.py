"""A fake payment API: it fails 30% of requests and counts charges per idempotency key.

``POST /charges`` with an ``Idempotency-Key`` header charges once per key:
a charge with a key it has seen returns the same charge and counts nothing
more. Of the requests it fails (a seeded random picks them, so a run of the
same requests fails the same ones), half fail before charging (503) and half
after (502, as a gateway that timed out on a charge that went through): a
client that retries with the same key is charged once either way.

``POST /refunds`` (a ``charge_id``, an ``Idempotency-Key``) refunds a charge
once per key, failing as charges do.

``GET /charges`` answers what it counted (the tests read it over HTTP, as
the server may live in another process than the workers), ``DELETE
/charges`` forgets it all (each test starts afresh on one server), ``GET
/settlement`` the day's total.

    python -m examples.shop.payment_server [PORT]    # serves until Ctrl-C (PORT 0: any free one)
"""

from __future__ import annotations

import asyncio
import random
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import Route

__all__ = ["Ledger", "PaymentServer", "make_app", "serving_in_a_process"]


class Ledger:
    """What the server charged, by idempotency key, and how often it failed.

    Example:
        >>> ledger = Ledger(fail_rate=0.0)
        >>> ledger.charge("k-1", {"order_id": "o-1", "amount_cents": 500})[0]
        201
        >>> ledger.charge("k-1", {"order_id": "o-1", "amount_cents": 500})[1]["id"]
        'ch_1'
        >>> len(ledger.charges)
        1
    """

    def __init__(self, *, fail_rate: float = 0.3, seed: int = 30) -> None:
        self.fail_rate = fail_rate
        self.seed = seed
        self.reset()

    def reset(self) -> None:
        """Forgets every charge and count, and draws its failures from the seed again."""
        self.random = random.Random(self.seed)
        self.charges: dict[str, dict[str, Any]] = {}
        self.refunds: dict[str, dict[str, Any]] = {}
        self.requests = 0
        self.failures = 0

    def charge(self, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Charges ``body`` under ``key`` (once per key); returns the HTTP status and answer."""
        self.requests += 1
        draw = self.random.random()
        if draw < self.fail_rate / 2:
            self.failures += 1
            return 503, {"error": "the payment network is busy; retry with the same key"}
        charge = self.charges.get(key)
        status = 200
        if charge is None:
            charge = {
                "id": f"ch_{len(self.charges) + 1}",
                "order_id": str(body["order_id"]),
                "amount_cents": int(body["amount_cents"]),
            }
            self.charges[key] = charge
            status = 201
        if draw < self.fail_rate:
            self.failures += 1
            return 502, {"error": "the gateway timed out; retry with the same key"}
        return status, charge

    def refund(self, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Refunds ``body``'s charge under ``key`` (once per key); fails as `charge` does."""
        self.requests += 1
        draw = self.random.random()
        if draw < self.fail_rate / 2:
            self.failures += 1
            return 503, {"error": "the payment network is busy; retry with the same key"}
        refund = self.refunds.setdefault(
            key,
            {
                "id": f"re_{len(self.refunds) + 1}",
                "charge_id": str(body["charge_id"]),
                "order_id": str(body["order_id"]),
            },
        )
        if draw < self.fail_rate:
            self.failures += 1
            return 502, {"error": "the gateway timed out; retry with the same key"}
        return 201, refund

    def counts(self) -> dict[str, Any]:
        """The charges and refunds by order, and the requests and failures seen."""
        by_order: dict[str, int] = {}
        for charge in self.charges.values():
            by_order[charge["order_id"]] = by_order.get(charge["order_id"], 0) + 1
        refunds: dict[str, int] = {}
        for refund in self.refunds.values():
            refunds[refund["order_id"]] = refunds.get(refund["order_id"], 0) + 1
        return {
            "by_order": by_order,
            "refunds_by_order": refunds,
            "requests": self.requests,
            "failures": self.failures,
        }


def make_app(ledger: Ledger) -> Starlette:
    """The payment API over ``ledger``, an ASGI app."""

    async def charges(request: Request) -> JSONResponse:
        if request.method == "GET":
            return JSONResponse(ledger.counts())
        if request.method == "DELETE":  # a test's fresh start, without a new server
            ledger.reset()
            return JSONResponse(ledger.counts())
        key = request.headers.get("Idempotency-Key")
        if not key:
            return JSONResponse({"error": "an Idempotency-Key header is required"}, 400)
        try:
            body = await request.json()
        except ClientDisconnect:  # the client gave up on this request: nothing to answer
            return JSONResponse({"error": "the client disconnected"}, 400)
        status, answer = ledger.charge(key, body)
        return JSONResponse(answer, status)

    async def refunds(request: Request) -> JSONResponse:
        key = request.headers.get("Idempotency-Key")
        if not key:
            return JSONResponse({"error": "an Idempotency-Key header is required"}, 400)
        try:
            body = await request.json()
        except ClientDisconnect:
            return JSONResponse({"error": "the client disconnected"}, 400)
        status, answer = ledger.refund(key, body)
        return JSONResponse(answer, status)

    async def settlement(request: Request) -> JSONResponse:
        total = sum(c["amount_cents"] for c in ledger.charges.values())
        return JSONResponse({"charges": len(ledger.charges), "total_cents": total})

    return Starlette(
        routes=[
            Route("/charges", charges, methods=["GET", "POST", "DELETE"]),
            Route("/refunds", refunds, methods=["POST"]),
            Route("/settlement", settlement, methods=["GET"]),
        ]
    )


class PaymentServer:
    """The fake payment API served on 127.0.0.1 in a thread of this process.

    Its own thread and event loop: it answers while the caller's loop is
    busy or blocked, and its counts outlive any worker process.

    Example:
        >>> with PaymentServer(fail_rate=0.0).running() as server:
        ...     server.url.startswith("http://127.0.0.1:")
        True
    """

    def __init__(self, *, fail_rate: float = 0.3, seed: int = 30, port: int = 0) -> None:
        self.ledger = Ledger(fail_rate=fail_rate, seed=seed)
        self.port = port
        self.url = ""

    @contextmanager
    def running(self) -> Iterator[PaymentServer]:
        """Serves until the block ends."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(make_app(self.ledger), log_level="warning", lifespan="off")
        server = uvicorn.Server(config)
        thread = threading.Thread(
            target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True
        )
        thread.start()
        try:
            while not server.started:
                if not thread.is_alive():
                    raise RuntimeError("the payment server did not start")
                threading.Event().wait(0.01)
            yield self
        finally:
            server.should_exit = True
            thread.join(30)
            sock.close()


@contextmanager
def serving_in_a_process(*, seed: int = 30) -> Iterator[str]:
    """The fake payment API in a process of its own; yields its URL.

    Its own process: no worker's crash takes its counts along, and it never
    waits for the caller's interpreter (its lock, its event loop).
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "examples.shop.payment_server", "0", str(seed)],
        cwd=Path(__file__).resolve().parents[2],  # where `examples` is a package
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("payment API on "):
            raise RuntimeError(f"the payment server did not start: {line!r}")
        yield line.removeprefix("payment API on ").strip()
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8400
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    with PaymentServer(port=port, seed=seed).running() as server:
        print(f"payment API on {server.url}", flush=True)
        threading.Event().wait()
