"""The reference orders app: project order events into the ``order_status`` table.

Run it with ``streamapp worker -A agents.orders:app``. Events are CloudEvents keyed by
order id (the stream id). Each partition first replays its orders from the event store
(``STREAMAPP_EVENT_STORE``), then hands over to the live topic, which ``streamapp
forward`` feeds from the same store. Records that cannot be handled are parked to
``orders.parked`` with their reason, and the partition goes on.
"""

from __future__ import annotations

import os

from streamapp import App, Event, FromEventStore, Park, TableView
from tables.orders import OrderStatus, order_status

# ORDERS_NAMESPACE prefixes the app id and topics, so that several copies of the app
# (the test suite's, a colleague's) can share one Kafka cluster.
NAMESPACE = os.environ.get("ORDERS_NAMESPACE", "")

app = App(f"{NAMESPACE}orders")
orders = app.topic(f"{NAMESPACE}orders", partitions=8)
PARKING = f"{NAMESPACE}orders.parked"

ORDER_EVENTS = frozenset({"order.placed", "order.paid", "order.shipped", "order.cancelled"})


@app.agent(orders, tables=[order_status], on_failure=Park(PARKING), history=FromEventStore())
async def project_order_status(event: Event, statuses: TableView[OrderStatus]) -> None:
    """Record the order's last status and count the events applied to it."""
    if event.type not in ORDER_EVENTS:
        raise ValueError(f"unknown order event type {event.type!r}")
    order_id = event.stream_id
    assert order_id is not None  # the agent only sees keyed events
    current = statuses.get(order_id)
    statuses[order_id] = {
        "status": event.type.removeprefix("order."),
        "version": (current["version"] if current else 0) + 1,
        "last_event_id": event.id,
    }
