"""A test-only app for ``streamapp reset``: two agents with tables on one topic.

``tally`` counts the events of each stream and sums ``data.n`` times a weight that
``RESET_TALLY_MODE`` sets (``v1``: 1, ``v2``: 10), so a test can change what the
projection computes between two runs; ``latest`` keeps the last event id and a count.
``RESET_HISTORY=1`` gives both ``history=FromEventStore()``. ``ORDERS_NAMESPACE``
prefixes the app id and the topic.
"""

from __future__ import annotations

import os
from typing import Any

from streamapp import App, Event, FromEventStore, Table, TableView

NAMESPACE = os.environ.get("ORDERS_NAMESPACE", "")
MODE = os.environ.get("RESET_TALLY_MODE", "v1")
WEIGHT = {"v1": 1, "v2": 10}[MODE]
HISTORY = FromEventStore() if os.environ.get("RESET_HISTORY") == "1" else None

app = App(f"{NAMESPACE}rs")
events = app.topic(f"{NAMESPACE}rs-events", partitions=4)
tally_table: Table[dict[str, Any]] = Table("tally")
latest_table: Table[dict[str, Any]] = Table("latest")


@app.agent(events, tables=[tally_table], history=HISTORY)
async def tally(event: Event, view: TableView[dict[str, Any]]) -> None:
    key = event.stream_id
    assert key is not None
    old = view.get(key) or {"n": 0, "sum": 0}
    view[key] = {"n": old["n"] + 1, "sum": old["sum"] + WEIGHT * int(event.data["n"]), "mode": MODE}


@app.agent(events, tables=[latest_table], history=HISTORY)
async def latest(event: Event, view: TableView[dict[str, Any]]) -> None:
    key = event.stream_id
    assert key is not None
    old = view.get(key) or {"n": 0}
    view[key] = {"n": old["n"] + 1, "id": event.id}
