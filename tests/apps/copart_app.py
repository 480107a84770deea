"""A test-only app where ``reader`` reads the table of ``writer``, co-partitioned.

``writer`` sums ``data.n`` per key of ``cp-adds`` into ``totals``; ``reader`` records,
per key of ``cp-looks``, the total it read then. ``COPART_LOOKS_PARTITIONS`` (default 4,
as ``cp-adds``) makes the app not co-partitioned: registration refuses it.
``ORDERS_NAMESPACE`` prefixes the app id and topics.
"""

from __future__ import annotations

import os
from typing import Any

from streamapp import App, Event, ReadView, Table, TableView

NAMESPACE = os.environ.get("ORDERS_NAMESPACE", "")

app = App(f"{NAMESPACE}cp")
adds = app.topic(f"{NAMESPACE}cp-adds", partitions=4)
looks = app.topic(
    f"{NAMESPACE}cp-looks", partitions=int(os.environ.get("COPART_LOOKS_PARTITIONS", "4"))
)
totals: Table[int] = Table("totals")
seen: Table[dict[str, Any]] = Table("seen")


@app.agent(adds, tables=[totals])
async def writer(event: Event, totals: TableView[int]) -> None:
    sid = event.stream_id
    assert sid is not None
    totals[sid] = totals.get(sid, 0) + int(event.data["n"])


@app.agent(looks, tables=[seen], reads=[totals])
async def reader(event: Event, seen: TableView[dict[str, Any]], totals: ReadView[int]) -> None:
    sid = event.stream_id
    assert sid is not None
    seen[sid] = {"total": totals.get(sid), "look": event.id}
