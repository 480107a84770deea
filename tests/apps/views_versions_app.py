"""A test-only app with table versions for the views tests: ``order_status`` version 1,
and version 2 when ``VIEWS_VERSIONS`` says so (``1`` is a worker of the old code,
``1,2`` one of the new), each written by its own agent of one topic.

Both folds keep the order's last status; version N stores ``{"status": ..., "by": N}``
so that an answer tells which version served it. ``ORDERS_NAMESPACE`` prefixes the app
id and topic, so each test has its own.
"""

from __future__ import annotations

import os
from typing import Any

from streamapp import App, Event, FromEventStore, Table, TableView

NAMESPACE = os.environ.get("ORDERS_NAMESPACE", "")
VERSIONS = [int(v) for v in os.environ.get("VIEWS_VERSIONS", "1,2").split(",")]
MANUAL = {int(v) for v in os.environ.get("VIEWS_MANUAL", "").split(",") if v}
"""``VIEWS_MANUAL=2``: those versions are ``switch="manual"``."""
HISTORY = FromEventStore() if os.environ.get("VIEWS_HISTORY") else None
"""``VIEWS_HISTORY=1``: the agents replay the event store (RabbitMQ, embedded)."""

app = App(f"{NAMESPACE}vv")
orders = app.topic(f"{NAMESPACE}vv-orders", partitions=4)


def _fold(n: int) -> Any:
    async def project(event: Event, statuses: TableView[dict[str, Any]]) -> None:
        assert event.stream_id is not None
        statuses[event.stream_id] = {"status": event.type.removeprefix("order."), "by": n}

    return project


for _n in VERSIONS:
    table = Table("order_status", version=_n, switch="manual" if _n in MANUAL else "auto")
    app.agent(orders, tables=[table], name=f"project_v{_n}", history=HISTORY)(_fold(_n))
