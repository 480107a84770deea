"""A test-only app: a per-customer running total fed by order events keyed by order id,
re-keyed by customer (``group_by``) through a repartition topic of another partition
count (``REGROUP_PARTITIONS``, default 6, the orders topic has 4).

``ORDERS_NAMESPACE`` prefixes the app id and topics, so each test has its own.
"""

from __future__ import annotations

import os

from streamapp import App, Event, Table, TableView

NAMESPACE = os.environ.get("ORDERS_NAMESPACE", "")

app = App(f"{NAMESPACE}rk")
orders = app.topic(f"{NAMESPACE}rk-orders", partitions=4)
totals: Table[int] = Table("totals")


def customer(event: Event) -> str:
    return str(event.data["customer"])


@app.agent(
    orders,
    group_by=customer,
    group_by_partitions=int(os.environ.get("REGROUP_PARTITIONS", "6")),
    tables=[totals],
)
async def per_customer(event: Event, totals: TableView[int]) -> None:
    who = customer(event)
    totals[who] = totals.get(who, 0) + int(event.data["amount"])
