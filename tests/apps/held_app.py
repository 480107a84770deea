"""A test-only bank-like projection whose failed events hold their stream
(``Park(destination, hold="stream")``), for the held-stream integration tests.

Table ``balances`` folds each stream's events in order (:func:`fold`: the order matters,
so an event applied out of order, twice or not at all gives another value). An event of
type ``poison`` fails while the file named by ``STREAMAPP_TEST_HELD_GATE`` exists:
removing it is "fixing the handler" (a worker started after that runs the fixed one).
With ``STREAMAPP_TEST_HELD_KILL`` naming a file that does not exist yet, the fixed
handler kills its own process (SIGKILL) at the first poison event it applies, once,
having made that file: a ``kill -9`` in the middle of a release.
The agent declares history, so RabbitMQ and the embedded mode rebuild a partition from
the event store. ``ORDERS_NAMESPACE`` prefixes the app id and topics.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from streamapp import App, Event, FromEventStore, Park, Table, TableView

NAMESPACE = os.environ.get("ORDERS_NAMESPACE", "")
GATE = os.environ.get("STREAMAPP_TEST_HELD_GATE", "/nonexistent")
KILL = os.environ.get("STREAMAPP_TEST_HELD_KILL")
PARTITIONS = 2

app = App(f"{NAMESPACE}hs")
moves = app.topic(f"{NAMESPACE}hs-moves", partitions=PARTITIONS)
PARKING = f"{NAMESPACE}hs-moves.parked"
balances: Table[dict[str, Any]] = Table("balances")


def fold(value: dict[str, Any] | None, event: Event) -> dict[str, Any]:
    """The fixed handler's fold of one event into its stream's value."""
    value = value or {"n": 0, "h": 0}
    amount = int(event.data["amount"])
    return {"n": value["n"] + 1, "h": (value["h"] * 31 + amount) % 1_000_003}


@app.agent(
    moves,
    tables=[balances],
    on_failure=Park(PARKING, hold="stream"),
    history=FromEventStore(),
)
async def apply(event: Event, view: TableView[dict[str, Any]]) -> None:
    _apply(event, view)


def _apply(event: Event, view: TableView[dict[str, Any]]) -> None:
    if event.type == "poison" and os.path.exists(GATE):  # a tiny stat: fine in a test
        raise RuntimeError("poison: the handler cannot apply it yet")
    if event.type == "poison" and KILL is not None and not os.path.exists(KILL):
        open(KILL, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)  # kill -9 in the middle of the release
    sid = event.stream_id
    assert sid is not None
    view[sid] = fold(view.get(sid), event)
