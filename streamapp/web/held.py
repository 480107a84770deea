"""What views say of a held stream (``Park(destination, hold="stream")``).

A key whose stream is held answers its last applied value, as any key, and says so: the
header :data:`HELD_HEADER` gives where the hold starts (the first held event's stream
version, else ``@`` and its source position) and ``?meta=1`` adds ``"held"`` (the hold:
first event, error, events held). A key is its stream's when the table is keyed by
stream id, as the stream-version guard's ``X-Streamapp-Version`` is. ``GET /tables``
counts each agent's held streams on this worker's partitions (:func:`held_of_agent`);
``/readyz`` does not look at holds: one held stream is not the worker.
"""

from __future__ import annotations

from typing import Any

from ..engine.assignment import Assignment
from ..engine.hold import held_counts
from ..tables.partition import PartitionTables

HELD_HEADER = "Streamapp-Stream-Held"
"""On the answer for a key whose stream is held: where the hold starts."""


def held_answer(tables: PartitionTables, key: str, headers: dict[str, str]) -> dict[str, Any]:
    """The ``?meta=1`` fields for ``key`` (empty: its stream is not held); when it is
    held, :data:`HELD_HEADER` is added to ``headers``."""
    held = tables.committed_held(key)
    if held is None:
        return {}
    headers[HELD_HEADER] = held.place
    return {"held": held.as_json()}


def held_of_agent(assignment: Assignment, agent: str) -> dict[str, int]:
    """``agent``'s held streams and the events they hold, over this worker's partitions."""
    streams = events = 0
    for task in assignment.tasks.values():
        n, m = held_counts(task.lanes).get(agent, (0, 0))
        streams, events = streams + n, events + m
    return {"streams": streams, "events": events}
