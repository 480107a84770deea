"""What this worker owns right now: the ownership and status interface of views.

Transports fill it (a Kafka group assignment, RabbitMQ membership, the embedded store
source); the worker, the views and the status page read it, and know no transport.
"""

from __future__ import annotations

from typing import Any

from ..app import App
from ..partitioner import partition_for
from .directory import Directory
from .phase import Phase
from .task import PartitionTask


class Assignment:
    """The partition tasks of one worker, by (topic, partition)."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.tasks: dict[tuple[str, int], PartitionTask] = {}
        self.rebalancing = True
        """True from start (or a revocation) until the partitions are handed out."""
        self.directory: Directory | None = None
        """Owners of the partitions of other workers (None: views do not forward)."""

    def owner_of(self, table: str, key: str) -> tuple[int, PartitionTask | None]:
        """The partition of ``key`` in ``table``, and its task if this worker owns it."""
        agent, _ = self.app.tables[table]
        partition = partition_for(key.encode(), agent.topic.partitions)
        return partition, self.tasks.get((agent.topic.name, partition))

    def remote_owner(self, table: str, partition: int) -> str | None:
        """The views URL of the worker that owns ``partition`` of ``table``, if known."""
        if self.directory is None:
            return None
        agent, _ = self.app.tables[table]
        return self.directory.owner_url(agent.topic.name, partition)

    @property
    def ready(self) -> bool:
        """True when partitions are assigned and every one of them is live."""
        return not self.rebalancing and all(t.phase is Phase.LIVE for t in self.tasks.values())

    def not_live(self) -> dict[str, str]:
        """The assigned partitions that are not live yet, with their phase."""
        return {
            task.name: task.phase.value
            for _, task in sorted(self.tasks.items(), key=lambda kv: kv[0])
            if task.phase is not Phase.LIVE
        }

    def status(self) -> dict[str, Any]:
        return {
            task.name: task.status()
            for (_, _), task in sorted(self.tasks.items(), key=lambda kv: kv[0])
        }
