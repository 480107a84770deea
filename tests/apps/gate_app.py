"""A test-only app whose handler can be held on one event, for the embedded catch-up tests.

``balances`` keeps, per stream, how many events were applied and the last event's id;
version N stores ``{"n": ..., "last": ..., "by": N}``. ``GATE_VERSIONS`` lists the
versions the code declares (``1`` or ``1,2``; one agent each, on one topic of 4
partitions), with no ``history=`` unless ``GATE_HISTORY=1``. An event of type ``gate``
is held in the handlers of the versions listed in ``GATE_HELD`` (e.g. ``2``): the
handler writes ``GATE_DIR/reached-N`` and waits until ``GATE_DIR/open`` exists, so a
test knows the lane (and its partition) is inside that handler for as long as it likes.
An event of type ``fail`` raises in every handler until ``GATE_DIR/fixed`` exists (the
agents' policy is ``Redeliver(pause_s=GATE_PAUSE_S)``, default the poll timeout).
``ORDERS_NAMESPACE`` prefixes the app id and the topic.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from streamapp import App, Event, FromEventStore, Redeliver, Table, TableView

NAMESPACE = os.environ.get("ORDERS_NAMESPACE", "")
VERSIONS = [int(v) for v in os.environ.get("GATE_VERSIONS", "1").split(",")]
HELD = {int(v) for v in os.environ.get("GATE_HELD", "").split(",") if v}
HISTORY = FromEventStore() if os.environ.get("GATE_HISTORY") == "1" else None
GATE = Path(os.environ.get("GATE_DIR", "."))
PAUSE_S = float(os.environ["GATE_PAUSE_S"]) if os.environ.get("GATE_PAUSE_S") else None
PARTITIONS = 4

app = App(f"{NAMESPACE}gate")
topic = app.topic(f"{NAMESPACE}gate-in", partitions=PARTITIONS)


def _fold(n: int) -> Any:
    async def project(event: Event, balances: TableView[dict[str, Any]]) -> None:
        if event.type == "gate" and n in HELD:
            (GATE / f"reached-{n}").touch()
            while True:  # another process opens it: a file is what both can see
                if (GATE / "open").exists():
                    break
                await asyncio.sleep(0.02)
        if event.type == "fail" and not (GATE / "fixed").exists():
            raise RuntimeError("fail: GATE_DIR/fixed does not exist yet")
        sid = event.stream_id
        assert sid is not None
        current = balances.get(sid)
        balances[sid] = {"n": (current["n"] if current else 0) + 1, "last": event.id, "by": n}

    return project


for _n in VERSIONS:
    app.agent(
        topic,
        tables=[Table("balances", version=_n)],
        name=f"fold_v{_n}",
        history=HISTORY,
        on_failure=Redeliver(pause_s=PAUSE_S),
    )(_fold(_n))
