"""A test-only app whose agent replays the event store: what ``streamapp forward`` feeds.

``ORDERS_NAMESPACE`` prefixes the app id and topic, so each test has its own.
"""

from __future__ import annotations

import os

from streamapp import App, Event, FromEventStore

NAMESPACE = os.environ.get("ORDERS_NAMESPACE", "")

app = App(f"{NAMESPACE}fwd")
orders = app.topic(f"{NAMESPACE}fwd-orders", partitions=4)


@app.agent(orders, history=FromEventStore())
async def count_orders(event: Event) -> None:
    """Nothing to project: the forwarder tests only read the topic."""
