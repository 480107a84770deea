"""An in-memory broker for users' unit tests of their agents and the quick start.

Same agents, same outcomes, same failure policies and table semantics as over Kafka,
because it runs the same partition task (:mod:`streamapp.engine.task`) through an
in-memory port: records are kept in partitioned lists, tables in MemoryStores, parked
records go to in-memory topics. It is a product feature for users; streamapp's own
integration tests never use it in place of a real broker.

    broker = MemoryBroker(app)
    broker.send("orders", Event.create("order.placed", stream_id="o-1", data={}))
    await broker.process()
    assert broker.table("order_status").get("o-1")["status"] == "placed"

A record that stays unsettled (a handler that always raises under an unbounded
Redeliver) makes :meth:`MemoryBroker.process` raise :class:`StuckRecordsError` once it
failed ``max_attempts`` times, so a test cannot pass while records are stuck.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..agent import Agent
from ..app import App
from ..engine.delivery import Delivery, Message
from ..engine.metrics import NO_METRICS, TaskMetrics
from ..engine.parking import parker
from ..engine.task import PartitionTask, TaskConfig
from ..errors import StreamappError
from ..events import Event
from ..kafka import codec
from ..outcomes import Outcome, Redeliver
from ..partitioner import partition_for
from ..tables.store import MemoryStore, Store
from ..tables.table import Table


def _decode(delivery: Delivery) -> Event:
    return codec.decode(delivery.key, delivery.value, delivery.headers)


@dataclass(frozen=True, slots=True)
class StuckRecord:
    """A record that :meth:`MemoryBroker.process` could not settle: its partition stops
    there (later records of the partition wait behind it)."""

    agent: str
    record: Message
    attempts: int
    """Failed attempts in this :meth:`MemoryBroker.process` call."""
    error: str
    """Why the last attempt failed."""

    def __str__(self) -> str:
        r = self.record
        return (
            f"agent {self.agent!r}, topic {r.topic!r} partition {r.partition} position "
            f"{r.position} ({_describe(r)}): failed {self.attempts} times, last error: "
            f"{self.error or 'none (the partition task did not run it)'}"
        )


class StuckRecordsError(StreamappError):
    """Records stayed unsettled after the memory broker's bound of attempts."""

    def __init__(self, stuck: list[StuckRecord], counts: Counter[Outcome]) -> None:
        self.stuck, self.counts = stuck, counts
        lines = "\n".join(f"  {s}" for s in stuck)
        super().__init__(
            f"{len(stuck)} record(s) still unsettled after MemoryBroker.process():\n{lines}\n"
            "Their partitions stop there. Fix the handler, or bound the policy: "
            "on_failure=Park(destination) or Redeliver(max_attempts=N, fallback=Park(...)). "
            "MemoryBroker(max_attempts=...) sets how often a record is tried in one call."
        )


def _describe(record: Message) -> str:
    try:
        event = _decode(record)
    except Exception:
        return f"key {record.key!r}, not a CloudEvent: {(record.value or b'')[:60]!r}"
    return f"event id {event.id!r}, type {event.type!r}, stream {event.stream_id!r}"


class _MemoryPort:
    """A partition of an in-memory topic: the broker reads from ``position``."""

    def __init__(self, records: list[Message]) -> None:
        self.records = records
        self.position = 0
        self.paused = False

    def end(self) -> int | None:
        return len(self.records)

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def rewind(self, position: int) -> None:
        self.position = position

    async def settle(self, position: int) -> None:
        self.position = max(self.position, position)

    async def begin(self, position: int | None, *, stateful: bool, earliest: bool = False) -> int:
        if position is not None:
            self.position = position
        return self.position


class _EmptyHistory:
    """The memory broker's history: an empty store (send events to the topic instead)."""

    head = 0

    async def catch_up(self, task: PartitionTask) -> None:
        return None

    async def live_start(self, task: PartitionTask) -> int | None:
        return None


class MemoryBroker:
    """Runs an app's agents over in-memory topics.

    ``max_attempts`` bounds the attempts of a failing record in one :meth:`process`
    (at least the agent's ``Redeliver(max_attempts=...)``, so its fallback applies);
    past it, :meth:`process` raises :class:`StuckRecordsError`. Redeliveries do not
    pause here. ``batch_budget_s`` is the time a batch may take before it is committed
    in parts (the ``batch_budget_ms`` setting of a worker).
    """

    def __init__(
        self,
        app: App,
        *,
        max_attempts: int = 10,
        batch_budget_s: float = 60.0,
        metrics: TaskMetrics = NO_METRICS,
    ) -> None:
        self.app = app
        self.max_attempts = max_attempts
        self.metrics = metrics
        self.topics: dict[str, list[list[Message]]] = {}
        self._tasks: dict[tuple[str, int], tuple[PartitionTask, _MemoryPort]] = {}
        self._stores: dict[tuple[str, int], MemoryStore] = {}
        self._config = TaskConfig(
            redeliver_pause_s=0.0, batch_budget_s=batch_budget_s, policy_pauses=False
        )
        for plan in app.topic_plan():
            if plan.role not in ("changelog", "members"):
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

    async def publish(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        """The broker as a sink (parking): a confirmed in-memory append."""
        self.send_raw(topic, value, key=key, headers=headers)

    def records(self, topic: str) -> list[Message]:
        """Every record of ``topic``, partition by partition (e.g. a parking topic)."""
        return [r for part in self._topic(topic) for r in part]

    def table(self, name: str) -> _TableReader:
        """Read the committed state of table ``name`` across partitions."""
        agent, table = self.app.tables[name]
        return _TableReader(self, agent, table)

    def pending(self, topic: str) -> int:
        """Records of ``topic`` not settled yet."""
        parts = self._topic(topic)
        return sum(
            len(part) - self._port(topic, p).position if (topic, p) in self._tasks else len(part)
            for p, part in enumerate(parts)
        )

    async def process(self) -> Counter[Outcome]:
        """Run every agent until all records are settled; returns the outcomes counted.

        A record that fails is tried again at once. One that is still unsettled after
        ``max_attempts`` attempts stops its partition; the other partitions and agents
        are run all the same, then :class:`StuckRecordsError` names every stuck record
        (agent, topic, partition, position, event, last error). A later call tries them
        again.
        """
        counts: Counter[Outcome] = Counter()
        stuck: list[StuckRecord] = []
        for agent in self.app.agents.values():
            for p in range(agent.topic.partitions):
                handled, stopped = await self._drain(agent, p)
                counts.update(handled)
                if stopped is not None:
                    stuck.append(stopped)
        if stuck:
            raise StuckRecordsError(stuck, counts)
        return counts

    async def _drain(self, agent: Agent, p: int) -> tuple[Counter[Outcome], StuckRecord | None]:
        task, port = await self._task(agent, p)
        records = self._topic(agent.topic.name)[p]
        counts: Counter[Outcome] = Counter()
        bound = self.max_attempts
        if isinstance(agent.on_failure, Redeliver):  # its fallback must get its turn
            bound = max(bound, agent.on_failure.max_attempts or 0)
        tries, at = 0, -1
        while (start := port.position) < len(records):
            before = Counter(task.outcomes)
            await task.process(records[start:])
            handled = Counter(task.outcomes) - before
            counts.update(handled)
            progress = port.position - start
            # Stopped at a failure (a record handled but not settled), or no progress at
            # all. A pass cut by the batch budget settles every record it handled.
            if handled.total() > progress or progress <= 0:
                tries, at = (tries + 1 if port.position == at else 1), port.position
                if tries >= bound:
                    error = task.attempts.last_error if task.attempts.position == at else ""
                    return counts, StuckRecord(agent.name, records[at], tries, error)
        return counts, None

    async def _task(self, agent: Agent, p: int) -> tuple[PartitionTask, _MemoryPort]:
        key = (agent.topic.name, p)
        if key not in self._tasks:
            port = _MemoryPort(self._topic(agent.topic.name)[p])
            name = f"{agent.topic.name}[{p}]"
            task = PartitionTask(
                agent,
                p,
                port,
                name=name,
                config=self._config,
                decode=_decode,
                park=parker(self, agent, name),
                open_store=lambda spaces: self._store(agent, p, spaces),
                history=_EmptyHistory(),
                metrics=self.metrics,
            )
            await task.open()
            self._tasks[key] = (task, port)
        return self._tasks[key]

    def _port(self, topic: str, p: int) -> _MemoryPort:
        return self._tasks[(topic, p)][1]

    def _store(self, agent: Agent, p: int, spaces: list[str]) -> Store:
        key = (agent.name, p)
        if key not in self._stores:
            self._stores[key] = MemoryStore(spaces)
        return self._stores[key]

    def _topic(self, topic: str) -> list[list[Message]]:
        if topic not in self.topics:
            raise KeyError(f"topic {topic!r} is not declared by app {self.app.id!r}")
        return self.topics[topic]


class _TableReader:
    """Committed state of one table, across its partitions."""

    def __init__(self, broker: MemoryBroker, agent: Agent, table: Table[Any]) -> None:
        self._broker, self._agent, self._table = broker, agent, table

    def get(self, key: str, default: Any = None) -> Any:
        raw = self._raw(key)
        return default if raw is None else self._table.codec.loads(raw)

    def __getitem__(self, key: str) -> Any:
        raw = self._raw(key)
        if raw is None:
            raise KeyError(key)
        return self._table.codec.loads(raw)

    def _raw(self, key: str) -> bytes | None:
        p = partition_for(key.encode(), self._agent.topic.partitions)
        store = self._broker._stores.get((self._agent.name, p))
        return None if store is None else store.get(self._table.data_space, key.encode())
