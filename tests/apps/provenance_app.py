"""A test-only app whose shape changes between runs, as a user edits an app.

``project`` replays its topic's orders from the event store, then goes live, recording
each order's last status in ``statuses``. ``PROV_PARTITIONS`` (default 4) is the topic's
partition count; ``PROV_EXTRA_TABLE=1`` gives the agent a second table, ``counts``.
``ORDERS_NAMESPACE`` prefixes the app id and topics.
"""

from __future__ import annotations

import os
from typing import Any

from streamapp import App, Event, FromEventStore, Table, TableView

NAMESPACE = os.environ.get("ORDERS_NAMESPACE", "")
PARTITIONS = int(os.environ.get("PROV_PARTITIONS", "4"))
EXTRA_TABLE = os.environ.get("PROV_EXTRA_TABLE") == "1"

app = App(f"{NAMESPACE}prov")
orders = app.topic(f"{NAMESPACE}prov-orders", partitions=PARTITIONS)
statuses: Table[dict[str, Any]] = Table("statuses")
counts: Table[int] = Table("counts")


def _status(event: Event, views: TableView[dict[str, Any]]) -> None:
    sid = event.stream_id
    assert sid is not None
    current = views.get(sid)
    views[sid] = {
        "status": event.type.removeprefix("order."),
        "version": (current["version"] if current else 0) + 1,
    }


if EXTRA_TABLE:

    @app.agent(orders, tables=[statuses, counts], history=FromEventStore(), name="project")
    async def project_with_counts(
        event: Event, views: TableView[dict[str, Any]], n: TableView[int]
    ) -> None:
        _status(event, views)
        sid = event.stream_id
        assert sid is not None
        n[sid] = n.get(sid, 0) + 1

else:

    @app.agent(orders, tables=[statuses], history=FromEventStore(), name="project")
    async def project(event: Event, views: TableView[dict[str, Any]]) -> None:
        _status(event, views)
