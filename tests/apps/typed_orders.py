"""The orders events as msgspec models, for the typed-event tests (mypy strict checks it).

Four event types; ``order.placed`` changed its schema: version 1 (what the store holds
from before the change: ``customer_name`` and a list of SKUs, no ``dataschema``) is
upcast to version 2 (``customer`` and items with quantities) on read. ``summary`` folds
an order's events into one row.
"""

from __future__ import annotations

from typing import Any

import msgspec

from streamapp import Event, EventTypes, TableView


class Item(msgspec.Struct):
    sku: str
    qty: int


class OrderPlaced(msgspec.Struct):
    customer: str
    items: list[Item]


class OrderPaid(msgspec.Struct):
    amount: int


class OrderShipped(msgspec.Struct):
    carrier: str


class OrderCancelled(msgspec.Struct):
    reason: str


OrderEvent = OrderPlaced | OrderPaid | OrderShipped | OrderCancelled

order_types = EventTypes(
    {
        "order.placed": OrderPlaced,
        "order.paid": OrderPaid,
        "order.shipped": OrderShipped,
        "order.cancelled": OrderCancelled,
    },
    unknown="reject",
)


@order_types.upcaster("order.placed", 1)
def placed_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 had ``customer_name`` and bare SKUs (one of each)."""
    return {
        "customer": data["customer_name"],
        "items": [{"sku": s, "qty": 1} for s in data["skus"]],
    }


def fold(row: dict[str, Any] | None, data: OrderEvent) -> dict[str, Any]:
    """An order's summary after one more event."""
    row = dict(row or {"status": "", "customer": "", "qty": 0, "paid": 0, "events": 0})
    row["events"] += 1
    match data:
        case OrderPlaced(customer=customer, items=items):
            row.update(status="placed", customer=customer, qty=sum(i.qty for i in items))
        case OrderPaid(amount=amount):
            row.update(status="paid", paid=row["paid"] + amount)
        case OrderShipped(carrier=carrier):
            row.update(status=f"shipped by {carrier}")
        case OrderCancelled():
            row.update(status="cancelled")
    return row


async def project(event: Event[OrderEvent], view: TableView[dict[str, Any]]) -> None:
    sid = event.stream_id
    assert sid is not None
    view[sid] = fold(view.get(sid), event.data)
