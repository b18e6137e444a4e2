"""The services the shop's steps call: the payment API (over HTTP), the warehouse, billing, mail.

Each service is a class whose methods are the steps; one instance of each
lives at module level, so workflow code names them (``payments.charge``)
and every process that imports the module has them. What they hold for the
process's life (the HTTP client and its connection pool) is opened by
`connected`, the worker's setup hook:

    fusee worker examples.shop.workflows --setup examples.shop.services:connected

and closed when the worker stops. The payment API's address comes from
``SHOP_PAYMENT_URL``.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

import fusee
from examples.shop.models import Charge, Order, Refund, Settlement, Shipment

__all__ = [
    "Billing",
    "Mailer",
    "PaymentService",
    "Warehouse",
    "billing",
    "connected",
    "mailer",
    "payments",
    "warehouse",
]


class PaymentService:
    """The payment API's client: a charge per order, safe to retry.

    Example:
        >>> PaymentService().is_connected
        False
    """

    def __init__(self) -> None:
        self._http: httpx.AsyncClient | None = None

    @property
    def is_connected(self) -> bool:
        return self._http is not None

    def connect(self, http: httpx.AsyncClient) -> None:
        self._http = http

    def disconnect(self) -> None:
        self._http = None

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            raise RuntimeError(
                "the payment service is not connected: run the worker with "
                "--setup examples.shop.services:connected (or enter connected() yourself)"
            )
        return self._http

    async def charge(self, order: Order, s: fusee.StepCtx) -> Charge:
        """Charges ``order`` once, whatever the retries: ``s.key`` is the idempotency key."""
        response = await self.http.post(
            "/charges",
            json={"order_id": order.id, "amount_cents": order.total_cents},
            headers={"Idempotency-Key": s.key},
        )
        if response.status_code in (400, 402, 422):
            # A refused payment does not get better by retrying.
            raise fusee.Failure(f"payment refused: {response.text}")
        response.raise_for_status()
        return Charge.model_validate(response.json())

    async def refund(self, refund: Refund, s: fusee.StepCtx) -> str:
        """Refunds a charge once, whatever the retries; returns the refund's id."""
        response = await self.http.post(
            "/refunds",
            json={"charge_id": refund.charge_id, "order_id": refund.order_id},
            headers={"Idempotency-Key": s.key},
        )
        response.raise_for_status()
        refund_id: str = response.json()["id"]
        return refund_id

    async def settlement(self) -> Settlement:
        """The day's charges, as the payment API counts them."""
        response = await self.http.get("/settlement")
        response.raise_for_status()
        return Settlement.model_validate(response.json())


class Warehouse:
    """Stock and parcels. Its methods are sync: they run in a worker thread.

    Example:
        >>> Warehouse().label("o-1")
        'TRK-O-1'
    """

    def reserve(self, order: Order) -> str:
        return f"res-{order.id}-{sum(i.qty for i in order.items)}"

    def release(self, order: Order) -> str:
        return f"released res-{order.id}"

    def label(self, order_id: str) -> str:
        return f"TRK-{order_id.upper()}"

    def dispatch(self, shipment: Shipment) -> Shipment:
        return shipment


class Billing:
    """Invoices: a PDF per charged order.

    Example:
        >>> len(Billing().invoice(Order(id="o-1", customer="ana", items=[],
        ...     address={"name": "ana", "city": "Lyon"}), "ch_1")) > 256 * 1024
        True
    """

    # A PDF with a scanned logo and signature: some 300 KB that do not compress.
    SCAN_BYTES = 300_000

    def invoice(self, order: Order, charge_id: str) -> bytes:
        head = f"%PDF-1.7\n% invoice {order.id} {charge_id} {order.total_cents}\n".encode()
        scan = random.Random(f"{order.id}/{charge_id}").randbytes(self.SCAN_BYTES)
        return head + scan + b"\n%%EOF\n"


class Mailer:
    """Outgoing mail; each send returns its message id. Sync: runs in a worker thread.

    Example:
        >>> Mailer().send("ana", "hello", b"")
        'msg-ana-2cf24dba5fb0'
    """

    def send(self, to: str, subject: str, attachment: bytes = b"") -> str:
        digest = hashlib.sha256(subject.encode() + attachment).hexdigest()[:12]
        return f"msg-{to}-{digest}"


payments = PaymentService()
warehouse = Warehouse()
billing = Billing()
mailer = Mailer()

# How long one request to the payment API may take before it fails (and is retried).
_HTTP_TIMEOUT_S = 10.0


@asynccontextmanager
async def connected(payment_url: str | None = None) -> AsyncIterator[None]:
    """Opens the services' connections for as long as the block runs.

    Args:
        payment_url: The payment API's base URL (default: ``SHOP_PAYMENT_URL``,
            else ``http://127.0.0.1:8400``).

    Example:
        >>> import asyncio
        >>> async def main() -> bool:
        ...     async with connected("http://127.0.0.1:9"):
        ...         return payments.is_connected
        >>> asyncio.run(main())
        True
    """
    url = payment_url or os.environ.get("SHOP_PAYMENT_URL", "http://127.0.0.1:8400")
    async with httpx.AsyncClient(base_url=url, timeout=_HTTP_TIMEOUT_S) as http:
        payments.connect(http)
        try:
            yield
        finally:
            payments.disconnect()
