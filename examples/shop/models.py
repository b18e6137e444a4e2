"""The shop's values: pydantic models, as inputs, step results, signals, queries and updates.

fusee journals them with its payload codec and decodes them back to these
classes from the annotations: a replayed workflow sees models, not dicts.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

__all__ = [
    "Address",
    "Approval",
    "Charge",
    "Item",
    "Order",
    "OrderView",
    "Receipt",
    "Settlement",
    "Shipment",
]


class Item(BaseModel):
    sku: str
    qty: int = Field(gt=0)
    price_cents: int = Field(ge=0)


class Address(BaseModel):
    name: str
    city: str


class Order(BaseModel):
    """An order as the front receives it: its id is the workflow id."""

    id: str
    customer: str
    items: list[Item]
    address: Address

    @property
    def total_cents(self) -> int:
        return sum(i.qty * i.price_cents for i in self.items)


class Approval(BaseModel):
    """A reviewer's decision on a large order (the ``approval`` signal)."""

    approved: bool
    by: str


class Charge(BaseModel):
    """The payment API's answer."""

    id: str
    order_id: str
    amount_cents: int


class Shipment(BaseModel):
    order_id: str
    tracking: str
    address: Address


class OrderView(BaseModel):
    """What the ``status`` query answers, and the ``change_address`` update."""

    id: str
    stage: str
    address: Address
    charge_id: str | None = None


class Receipt(BaseModel):
    """An order's result."""

    order_id: str
    outcome: str  # "shipped", "rejected" or "expired"
    charge_id: str | None = None
    tracking: str | None = None


class Settlement(BaseModel):
    """The nightly settlement: what the payment API charged in all."""

    charges: int
    total_cents: int
