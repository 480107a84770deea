"""Tables of the reference orders app, served at ``GET /tables/<name>/<key>``."""

from __future__ import annotations

from typing import TypedDict

from streamapp import Table


class OrderStatus(TypedDict):
    """Where an order stands: its last event type and how many events were applied."""

    status: str
    version: int
    last_event_id: str


order_status: Table[OrderStatus] = Table(
    "order_status", help="order id -> last status and the number of events applied"
)
