"""A test-only app with the retry chain: sums ``data.n`` per stream in table ``sums``.

An event of type ``gated`` fails while the file named by ``STREAMAPP_TEST_RETRY_GATE``
exists (after its write, which is rolled back). ``ORDERS_NAMESPACE`` prefixes the app
id and topics, so each test has its own.
"""

from __future__ import annotations

import os

from streamapp import App, Event, Retry, Table, TableView

NAMESPACE = os.environ.get("ORDERS_NAMESPACE", "")
GATE = os.environ.get("STREAMAPP_TEST_RETRY_GATE", "/nonexistent")

app = App(f"{NAMESPACE}rt")
source = app.topic(f"{NAMESPACE}rt-in", partitions=2)
sums: Table[int] = Table("sums")


@app.agent(source, tables=[sums], on_failure=Retry(intervals=(0.05,), backoff=(1,)))
async def summer(event: Event, view: TableView[int]) -> None:
    sid = event.stream_id
    assert sid is not None
    view[sid] = view.get(sid, 0) + event.data["n"]
    if event.type == "gated" and _closed():
        raise RuntimeError("gate closed")


def _closed() -> bool:
    return os.path.exists(GATE)  # a tiny stat: fine on the loop in a test
