"""A test-only app for ``streamapp store parked replay`` (``STREAMAPP_BROKER=none``).

Two agents of one topic park what fails: ``park_ids`` records, per stream, the ids of
the events it applied (table ``applied``: stream versions guard it), ``side_effects``
has no tables and appends each event id it handles to the file named by
``STREAMAPP_TEST_SIDE_FILE`` (a side effect: a line written twice is an event run
twice). An event of type ``gated`` fails in both while the file named by
``STREAMAPP_TEST_REPLAY_GATE`` exists: removing it is "fixing the handler".
``ORDERS_NAMESPACE`` prefixes the app id and topic.
"""

from __future__ import annotations

import os

from streamapp import App, Event, FromEventStore, Park, Table, TableView

NAMESPACE = os.environ.get("ORDERS_NAMESPACE", "")
GATE = os.environ.get("STREAMAPP_TEST_REPLAY_GATE", "/nonexistent")
SIDE_FILE = os.environ.get("STREAMAPP_TEST_SIDE_FILE", "/dev/null")

app = App(f"{NAMESPACE}sp")
events_in = app.topic(f"{NAMESPACE}sp-events", partitions=2)
PARKING = f"{NAMESPACE}sp.parked"
applied: Table[list[str]] = Table("applied")


def _gate(event: Event) -> None:
    if event.type == "gated" and os.path.exists(GATE):  # a tiny stat: fine in a test
        raise RuntimeError("gate closed")


@app.agent(events_in, tables=[applied], on_failure=Park(PARKING), history=FromEventStore())
async def park_ids(event: Event, view: TableView[list[str]]) -> None:
    _gate(event)
    sid = event.stream_id
    assert sid is not None
    view[sid] = [*view.get(sid, []), event.id]


@app.agent(events_in, on_failure=Park(PARKING))
async def side_effects(event: Event) -> None:
    _gate(event)
    fd = os.open(SIDE_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)  # tiny: fine here
    try:
        os.write(fd, f"{event.id}\n".encode())
    finally:
        os.close(fd)
