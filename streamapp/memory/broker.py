"""An in-memory broker for users' unit tests of their agents and the quick start.

Same agents, same outcomes, same failure policies and table semantics as over Kafka,
with no broker: records are kept in partitioned lists, tables in MemoryStores. It is a
product feature for users; streamapp's own integration tests never use it in place of
a real broker.

    broker = MemoryBroker(app)
    broker.send("orders", Event.create("order.placed", stream_id="o-1", data={}))
    await broker.process()
    assert broker.table("order_status").get("o-1")["status"] == "placed"
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from ..agent import Agent, run_batch
from ..app import App
from ..events import Event
from ..kafka import codec
from ..kafka.source import partition_for
from ..outcomes import Outcome, Park
from ..source import Message, Parker, Record, park_headers
from ..tables.partition import PartitionTables, spaces_for
from ..tables.store import MemoryStore


class MemoryBroker:
    """Runs an app's agents over in-memory topics."""

    def __init__(self, app: App, *, max_attempts: int = 10) -> None:
        self.app = app
        self.max_attempts = max_attempts
        self.topics: dict[str, list[list[Message]]] = {}
        self._tables: dict[tuple[str, int], PartitionTables] = {}
        self._positions: dict[tuple[str, int], int] = {}
        for plan in app.topic_plan():
            if plan.role != "changelog":
                self.topics[plan.name] = [[] for _ in range(plan.partitions)]

    def send(self, topic: str, event: Event) -> Message:
        """Append ``event`` (binary content mode, keyed by stream id) to ``topic``."""
        key, value, headers = codec.encode(event)
        return self.send_raw(topic, value, key=key, headers=headers)

    def send_raw(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> Message:
        """Append any record, CloudEvent or not, to ``topic``."""
        partitions = self._topic(topic)
        p = partition_for(key, len(partitions)) if key is not None else 0
        record = Message(topic, p, len(partitions[p]), key, value, tuple(headers))
        partitions[p].append(record)
        return record

    def records(self, topic: str) -> list[Message]:
        """Every record of ``topic``, partition by partition (e.g. a parking topic)."""
        return [r for part in self._topic(topic) for r in part]

    def table(self, name: str) -> _TableReader:
        """Read the committed state of table ``name`` across partitions."""
        agent, table = self.app.tables[name]
        return _TableReader(self, agent, table.name)

    def pending(self, topic: str) -> int:
        """Records of ``topic`` not settled yet."""
        parts = self._topic(topic)
        return sum(len(part) - self._positions.get((topic, p), 0) for p, part in enumerate(parts))

    async def process(self) -> Counter[Outcome]:
        """Run every agent until all records are settled or a partition keeps failing.

        A REDELIVERed record is retried up to ``max_attempts`` times, then left unsettled.
        """
        counts: Counter[Outcome] = Counter()
        for agent in self.app.agents.values():
            for p in range(agent.topic.partitions):
                counts.update(await self._drain(agent, p))
        return counts

    async def _drain(self, agent: Agent, p: int) -> Counter[Outcome]:
        counts: Counter[Outcome] = Counter()
        records = self._topic(agent.topic.name)[p]
        tables = self._partition_tables(agent, p) if agent.tables else None
        attempts = 0
        while (start := self._positions.get((agent.topic.name, p), 0)) < len(records):
            result = await run_batch(
                agent, records[start:], tables, codec.decode, self._park_for(agent), 60.0
            )
            counts.update(result.counts)
            if tables is not None:
                batch = tables.take_batch(start + result.settled)
                tables.write(batch, tables.checkpoint.advanced(start + result.settled, {}))
            self._positions[(agent.topic.name, p)] = start + result.settled
            if result.redeliver:
                attempts += 1
                if attempts >= self.max_attempts:
                    break
        return counts

    def _park_for(self, agent: Agent) -> Parker:
        async def park(record: Record, reason: str) -> bool:
            policy = agent.on_failure
            assert isinstance(policy, Park)  # run_batch parks only under a Park policy
            headers = park_headers(record, reason, agent.name)
            self.send_raw(policy.destination, record.value, key=record.key, headers=headers)
            return True

        return park

    def _partition_tables(self, agent: Agent, p: int) -> PartitionTables:
        key = (agent.name, p)
        if key not in self._tables:
            store = MemoryStore(spaces_for(agent.tables))
            self._tables[key] = PartitionTables(agent.tables, store, p)
        return self._tables[key]

    def _topic(self, topic: str) -> list[list[Message]]:
        if topic not in self.topics:
            raise KeyError(f"topic {topic!r} is not declared by app {self.app.id!r}")
        return self.topics[topic]


class _TableReader:
    """Committed and pending state of one table, across its partitions."""

    def __init__(self, broker: MemoryBroker, agent: Agent, name: str) -> None:
        self._broker, self._agent, self._name = broker, agent, name

    def get(self, key: str, default: Any = None) -> Any:
        return self._view(key).get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self._view(key)[key]

    def _view(self, key: str) -> Any:
        p = partition_for(key.encode(), self._agent.topic.partitions)
        return self._broker._partition_tables(self._agent, p).view(self._name)
