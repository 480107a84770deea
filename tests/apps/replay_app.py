"""A test-only app whose failures are parked or dead-lettered, for ``parked replay`` and
``dlq replay``.

Two agents record, per stream, the ids of the events they applied (table ``applied``
and ``chained``): ``park_ids`` parks a failed event (``Park``), ``chain_ids`` sends it
to ``{topic}-dlq`` at its first failure (``Retry`` without inline retries or a retry
topic). An event of type ``gated`` fails while the file named by
``STREAMAPP_TEST_REPLAY_GATE`` exists: removing it is "fixing the handler". Events sent
without ``streamversion`` are applied each time they come, so an id listed twice means
a record sent twice. The agents declare history (RabbitMQ needs it to restore a
partition; the test's event store stays empty). ``ORDERS_NAMESPACE`` prefixes the app id and topics.
"""

from __future__ import annotations

import os

from streamapp import App, Event, FromEventStore, Park, Retry, Table, TableView

NAMESPACE = os.environ.get("ORDERS_NAMESPACE", "")
GATE = os.environ.get("STREAMAPP_TEST_REPLAY_GATE", "/nonexistent")

app = App(f"{NAMESPACE}rp")
parked_in = app.topic(f"{NAMESPACE}rp-park", partitions=2)
chained_in = app.topic(f"{NAMESPACE}rp-chain", partitions=2)
PARKING = f"{NAMESPACE}rp-park.parked"
DLQ = f"{NAMESPACE}rp-chain-dlq"
applied: Table[list[str]] = Table("applied")
chained: Table[list[str]] = Table("chained")


@app.agent(parked_in, tables=[applied], on_failure=Park(PARKING), history=FromEventStore())
async def park_ids(event: Event, view: TableView[list[str]]) -> None:
    _apply(event, view)


@app.agent(
    chained_in,
    tables=[chained],
    on_failure=Retry(intervals=(), max_reconsume=0, retry_suffix=""),
    history=FromEventStore(),
)
async def chain_ids(event: Event, view: TableView[list[str]]) -> None:
    _apply(event, view)


def _apply(event: Event, view: TableView[list[str]]) -> None:
    if event.type == "gated" and os.path.exists(GATE):  # a tiny stat: fine in a test
        raise RuntimeError("gate closed")
    sid = event.stream_id
    assert sid is not None
    view[sid] = [*view.get(sid, []), event.id]
