"""A projection of a plain JSON topic (no CloudEvents headers), for the plain-topic tests.

``payments`` records are JSON objects ``{"account": ..., "amount": ..., "n": ...}``
keyed by account, as a bare producer writes them. ``balances`` keeps, per account, the
sum of amounts and the count of records applied (exact only if each is applied once),
and the last record's ``n`` (records of one account come in order of ``n``).

``ORDERS_NAMESPACE`` prefixes the app id and topics, so each test has its own;
``PLAIN_STREAM_ID_FIELD`` names the value's field that holds the stream id (else the
stream id is the record's key); ``PLAIN_PARTITIONER`` names the partitioner of its
producers (else Kafka's default, murmur2). With ``PLAIN_INGEST`` set, the app has no
tables (as on RabbitMQ, where a table needs history, which a plain topic cannot have):
``ingest`` turns each record into a ``payment.received`` CloudEvent on
``payments-ingested``.
"""

from __future__ import annotations

import os
from typing import Any

from streamapp import App, Event, Park, Send, Table, TableView

NAMESPACE = os.environ.get("ORDERS_NAMESPACE", "")

app = App(f"{NAMESPACE}plain")
payments = app.topic(
    f"{NAMESPACE}payments",
    partitions=4,
    format="json",
    stream_id_field=os.environ.get("PLAIN_STREAM_ID_FIELD") or None,
    partitioner=os.environ.get("PLAIN_PARTITIONER") or "murmur2",
)
balances: Table[dict[str, Any]] = Table("balances")


parked = Park(f"{NAMESPACE}payments-parked")
ingested = app.topic(f"{NAMESPACE}payments-ingested", partitions=4)


async def project(event: Event, view: TableView[dict[str, Any]]) -> None:
    account = event.stream_id
    assert account is not None
    data = event.data
    current = view.get(account) or {"total": 0, "count": 0, "last": 0}
    if data["n"] <= current["last"]:
        raise ValueError(f"record {event.id} of {account} out of order: n={data['n']}")
    view[account] = {
        "total": current["total"] + data["amount"],
        "count": current["count"] + 1,
        "last": data["n"],
    }


async def ingest(event: Event, *, send: Send) -> None:
    account = event.stream_id
    assert account is not None
    n = event.data["n"]
    send(
        ingested,
        Event.create("payment.received", stream_id=account, id=f"{account}/{n}", data=event.data),
    )


if os.environ.get("PLAIN_INGEST"):
    app.agent(payments, sinks=[ingested], on_failure=parked)(ingest)
else:
    app.agent(payments, tables=[balances], on_failure=parked)(project)
