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
    "Note",
    "Order",
    "OrderView",
    "Receipt",
    "Refund",
    "Report",
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
    notes: list[str] = []

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


class Note(BaseModel):
    """A customer's note on an order (the ``note`` signal): it goes on the parcel."""

    text: str


class Shipment(BaseModel):
    order_id: str
    tracking: str
    address: Address
    notes: list[str] = []


class OrderView(BaseModel):
    """What the ``status`` query answers, and the ``change_address`` update."""

    id: str
    stage: str
    address: Address
    charge_id: str | None = None
    notes: list[str] = []
    # The request (the ``change_address`` update's id) that last moved the parcel.
    address_changed_by: str | None = None


class Receipt(BaseModel):
    """An order's result."""

    order_id: str
    outcome: str  # "shipped", "rejected" or "expired"
    charge_id: str | None = None
    tracking: str | None = None
    # The invoice PDF's size: the PDF itself is a step's result, in the blob store.
    invoice_bytes: int | None = None


class Refund(BaseModel):
    """A shipped order's refund (the ``refund`` workflow's input)."""

    order_id: str
    charge_id: str
    reason: str


class Settlement(BaseModel):
    """The nightly settlement: what the payment API charged in all."""

    charges: int
    total_cents: int


class Report(BaseModel):
    """A sales report (the ``sales_report`` workflow's result), for the day before its tick."""

    day: str
    charges: int
    total_cents: int
    sent_to: str
