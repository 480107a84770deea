"""A test-only app for table versions: one orders topic, ``order_status`` v1 and v2.

``VERSIONS_VARIANT`` is what a rolling deploy changes: ``v1`` (the old code: v1 only),
``v1+v2`` (the new code: v1 and v2 beside each other, two lanes of one partition task) or
``v2`` (v1 removed from the code, before it is retired). v1 folds an order's events into
its last status; v2 is a different fold of the same events: the status, the item count
and the total. Both count the events applied (``n``: the key's stream version) and keep
the last event's id, so that a value names the store position it stands for.
``ORDERS_NAMESPACE`` prefixes the app id and the topic.

The folds are plain functions (:func:`fold_v1`, :func:`fold_v2`): the handlers and the
test's model (:mod:`tests.support.versions_model`) run the same code over the store.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from streamapp import App, Event, FromEventStore, Park, Table, TableView

NAMESPACE = os.environ.get("ORDERS_NAMESPACE", "")
VARIANTS = ("v1", "v1+v2", "v2")
VARIANT = os.environ.get("VERSIONS_VARIANT", "v1")
if VARIANT not in VARIANTS:
    raise ValueError(f"VERSIONS_VARIANT={VARIANT!r}: name one of {', '.join(VARIANTS)}")
PARTITIONS = 8
TABLE = "order_status"

Value = dict[str, Any]


def fold_v1(current: Value | None, event: Event) -> Value:
    """v1: the order's last status."""
    return {
        "status": event.type.removeprefix("order."),
        "n": (current["n"] if current else 0) + 1,
        "last": event.id,
    }


def fold_v2(current: Value | None, event: Event) -> Value:
    """v2: the last status (cancelled stays cancelled), the item count and the total."""
    items, total, status = (0, 0, "") if current is None else (
        current["items"], current["total"], current["status"]
    )  # fmt: skip
    data = event.data if isinstance(event.data, dict) else {}
    qty, price = int(data.get("qty", 0)), int(data.get("price", 0))
    if event.type in ("order.placed", "order.item_added"):
        items, total = items + qty, total + qty * price
    if status != "cancelled":
        status = event.type.removeprefix("order.")
    return {
        "status": status,
        "items": items,
        "total": total,
        "n": (current["n"] if current else 0) + 1,
        "last": event.id,
    }


FOLDS: dict[int, Callable[[Value | None, Event], Value]] = {1: fold_v1, 2: fold_v2}
"""Each table version's fold of one event."""

app = App(f"{NAMESPACE}tv")
orders = app.topic(f"{NAMESPACE}tv-orders", partitions=PARTITIONS)
PARKING = f"{NAMESPACE}tv-orders.parked"


def _project(fold: Callable[[Value | None, Event], Value]) -> Any:
    async def project(event: Event, statuses: TableView[Value]) -> None:
        key = event.stream_id
        assert key is not None  # the agent only sees keyed events
        statuses[key] = fold(statuses.get(key), event)

    return project


if VARIANT in ("v1", "v1+v2"):
    status_v1: Table[Value] = Table(TABLE, help="order id -> last status (v1)")
    app.agent(
        orders,
        tables=[status_v1],
        on_failure=Park(PARKING),
        history=FromEventStore(),
        name="status_v1",
    )(_project(fold_v1))

if VARIANT in ("v1+v2", "v2"):
    status_v2: Table[Value] = Table(
        TABLE, version=2, help="order id -> status, item count and total (v2)"
    )
    app.agent(
        orders,
        tables=[status_v2],
        on_failure=Park(PARKING),
        history=FromEventStore(),
        name="status_v2",
    )(_project(fold_v2))
