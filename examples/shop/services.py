"""The services the shop's steps call: the payment API (over HTTP) and the warehouse.

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

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

import fusee
from examples.shop.models import Charge, Order, Settlement, Shipment

__all__ = ["PaymentService", "Warehouse", "connected", "payments", "warehouse"]


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


payments = PaymentService()
warehouse = Warehouse()

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
