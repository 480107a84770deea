"""Where another worker's views answer: the owner directory views forward through.

A transport fills it from the group's membership (on Kafka, the compacted
``{app}-members`` topic, :mod:`streamapp.kafka.members`); the views ask it for the
owner of a partition this worker does not own.
"""

from __future__ import annotations

from typing import Protocol


class Directory(Protocol):
    def owner_url(self, topic: str, partition: int) -> str | None:
        """The base URL of the views of ``topic[partition]``'s owner, when another worker
        claims it (None: unknown, or this worker's own stale claim)."""
        ...
