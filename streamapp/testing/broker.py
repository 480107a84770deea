"""An in-memory broker for users' unit tests of their agents and the quick start.

Same agents, same outcomes, same failure policies and table semantics as over Kafka,
because it runs the same partition task (:mod:`streamapp.engine.task`) through an
in-memory port: records are kept in partitioned lists, tables in MemoryStores, parked
records and derived events (``sinks=[...]``) go to in-memory topics, and a derived event
sent to a topic that feeds an agent is processed in the same :meth:`MemoryBroker.process`
call. The retry chain (``Retry``) runs as on Kafka: copies go to ``{topic}-retry`` and
``{topic}-dlq``, and the broker's relay republishes a copy to its origin topic when it
is due, in due order per partition; :meth:`MemoryBroker.process` runs its clock ahead
through the back-offs (``fast_forward``), so a test does not wait for them.
It is a product feature for users; streamapp's own integration tests never use it
in place of a real broker.

    broker = MemoryBroker(app)
    broker.send("orders", Event.create("order.placed", stream_id="o-1", data={}))
    await broker.process()
    assert broker.table("order_status").get("o-1")["status"] == "placed"

A record that stays unsettled (a handler that always raises under an unbounded
Redeliver) makes :meth:`MemoryBroker.process` raise :class:`StuckRecordsError` once it
failed ``max_attempts`` times, so a test cannot pass while records are stuck.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..agents.agent import Agent
from ..app import App
from ..codecs import kafka as codec
from ..codecs import plain
from ..engine.assignment import read_store
from ..engine.factory import TaskFactory
from ..engine.interfaces import NO_LANES, Committed, TaskMetrics
from ..engine.metrics import NO_METRICS
from ..engine.parking import parker
from ..engine.provenance import StoreIdentity
from ..engine.task import PartitionTask
from ..engine.task_config import TaskConfig
from ..engine.task_surface import Replayed
from ..errors import StreamappError
from ..events import Event
from ..failures import retry_chain as chain
from ..failures.outcomes import Outcome, Redeliver
from ..failures.republish import sent_back
from ..records import Delivery, DeliveryRecord, Message, Receipt
from ..tables.held import HeldStream
from ..tables.store import MemoryStore, Store
from ..tables.table import Table
from ..topics import Partitioner, TopicRole, partition_for, relayed
from ..transports.base import refuse_unsupported
from . import transport

MAX_ROUNDS = 1000
"""Rounds of :meth:`MemoryBroker.process` while derived events (and relayed retry copies)
feed further agents."""


def _decode(delivery: Delivery) -> Event:
    return codec.decode(delivery.key, delivery.value, delivery.headers)


def _decode_bytes(delivery: Delivery) -> Event:
    return codec.decode(delivery.key, delivery.value, delivery.headers, parse_json=False)


@dataclass(frozen=True, slots=True)
class StuckRecord:
    """A record that :meth:`MemoryBroker.process` could not settle: its partition stops
    there (later records of the partition wait behind it)."""

    agent: str
    record: DeliveryRecord
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


def _describe(record: DeliveryRecord) -> str:
    try:
        event = _decode(record)
    except Exception:
        return f"key {record.key!r}, not a CloudEvent: {(record.value or b'')[:60]!r}"
    return f"event id {event.id!r}, type {event.type!r}, stream {event.stream_id!r}"


class _MemoryPort:
    """A partition of an in-memory topic: the broker reads from ``position``."""

    absolute = True

    def __init__(self, records: list[DeliveryRecord]) -> None:
        self.records = records
        self.position = 0
        self.paused = False

    def end(self) -> int | None:
        return len(self.records)

    async def through(self, position: int) -> int:
        return position

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def rewind(self, position: int) -> None:
        self.position = position

    async def settle(self, position: int, ahead: Mapping[str, int] = NO_LANES) -> None:
        self.position = max(self.position, position)

    async def committed(self) -> Committed | None:
        return None  # the task lives as long as the broker: its lanes keep their positions

    async def begin(self, position: int | None, *, stateful: bool, earliest: bool = False) -> int:
        if position is not None:
            self.position = position
        return self.position


class _EmptyHistory:
    """The memory broker's history: an empty store (send events to the topic instead)."""

    head = 0

    async def catch_up(self, partition: Replayed, *, fresh: bool = False) -> None:
        return None

    async def live_start(self, partition: Replayed) -> int | None:
        return None

    async def identity(self) -> StoreIdentity:
        return StoreIdentity("memory", "memory", 0)


class MemoryBroker:
    """Runs an app's agents over in-memory topics.

    ``max_attempts`` bounds the attempts of a failing record in one :meth:`process`
    (at least the agent's ``Redeliver(max_attempts=...)``, so its fallback applies);
    past it, :meth:`process` raises :class:`StuckRecordsError`. Redeliveries do not
    pause here, nor do ``Retry``'s inline retries. ``batch_budget_s`` is the time a batch
    may take before it is committed in parts (the ``batch_budget_ms`` setting of a
    worker). ``delayed_policy`` is the setting of that name (``relay`` makes delay
    topics). With ``fast_forward`` (default), :meth:`process` moves the broker's clock
    to the next due retry or delay copy when nothing else is left to do; without it,
    copies wait for real time or :meth:`advance`.
    """

    def __init__(
        self,
        app: App,
        *,
        max_attempts: int = 10,
        batch_budget_s: float = 60.0,
        metrics: TaskMetrics = NO_METRICS,
        delayed_policy: str = "immediate",
        fast_forward: bool = True,
    ) -> None:
        refuse_unsupported(app, transport.NAME, transport.CAPABILITIES)
        self.app = app
        self.max_attempts = max_attempts
        self.metrics = metrics
        self.fast_forward = fast_forward
        self.topics: dict[str, list[list[DeliveryRecord]]] = {}
        self._tasks: dict[tuple[str, int], tuple[PartitionTask, _MemoryPort]] = {}
        self._stores: dict[tuple[str, int], MemoryStore] = {}
        self._ahead_s = 0.0
        self._factory = TaskFactory(
            config=TaskConfig(
                redeliver_pause_s=0.0,
                batch_budget_s=batch_budget_s,
                policy_pauses=False,
                delayed_policy=delayed_policy,
                clock=self.clock,
            ),
            decode=_decode,
            decode_bytes=_decode_bytes,
            park=lambda agent, name: parker(self, agent, name),
            history=_EmptyHistory(),
            metrics=metrics,
            encode=codec.encode,
            publish=self.publish_many,
            locate=self._read_store,
        )
        plan = app.topic_plan(delayed_policy)
        for topic in plan:
            if topic.role not in (TopicRole.CHANGELOG, TopicRole.MEMBERS):
                self.topics[topic.name] = [[] for _ in range(topic.partitions)]
        self._replayed: dict[str, list[int]] = {}
        """Per parking destination, the next position :meth:`replay_parked` sends back."""
        self._relayed = {t.name: [0] * t.partitions for t in relayed(plan)}
        """The relay's next position per retry or delay topic partition."""

    def clock(self) -> float:
        """The broker's time, seconds since the epoch (ahead of the wall clock by what
        :meth:`advance` and fast-forwarding added)."""
        return time.time() + self._ahead_s

    def advance(self, seconds: float) -> None:
        """Move the broker's clock ``seconds`` ahead (retry and delay copies fall due)."""
        self._ahead_s += seconds

    def send(self, topic: str, event: Event) -> DeliveryRecord:
        """Append ``event`` (binary content mode, keyed by stream id) to ``topic``; to a
        plain topic (``format="json"`` or ``"raw"``), its data alone, keyed by stream id."""
        spec = self.app.topics.get(topic)
        if spec is not None and spec.plain:
            key, value, headers = plain.encode(spec, event)
        else:
            key, value, headers = codec.encode(event)
        return self.send_raw(topic, value, key=key, headers=headers)

    def send_raw(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
    ) -> DeliveryRecord:
        """Append any record, CloudEvent or not, to ``topic``: to ``partition``, else a
        keyed record to the partition the topic's partitioner gives its key (where the
        topic's producers put it), else to partition 0."""
        partitions = self._topic(topic)
        p = partition if partition is not None else 0
        if partition is None and key is not None:
            spec = self.app.topics.get(topic)
            by = Partitioner.MURMUR2 if spec is None else spec.partitioner
            p = partition_for(key, len(partitions), by)
        record = DeliveryRecord(topic, p, len(partitions[p]), key, value, tuple(headers))
        partitions[p].append(record)
        return record

    async def start(self) -> None:
        """The broker as a :class:`~streamapp.engine.interfaces.Sink`: nothing to connect."""

    async def stop(self) -> None:
        """Nothing to disconnect."""

    async def publish(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
    ) -> None:
        """The broker as a sink (parking): a confirmed in-memory append."""
        self.send_raw(topic, value, key=key, headers=headers, partition=partition)

    async def publish_many(self, messages: Sequence[Message]) -> list[Receipt]:
        """The broker as the sink of derived events: confirmed in-memory appends."""
        out = []
        for m in messages:
            record = self.send_raw(
                m.topic, m.value, key=m.key, headers=m.headers, partition=m.partition
            )
            out.append(Receipt(m.topic, record.partition, record.position))
        return out

    def records(self, topic: str) -> list[DeliveryRecord]:
        """Every record of ``topic``, partition by partition (e.g. a parking topic)."""
        return [r for part in self._topic(topic) for r in part]

    def table(self, name: str) -> _TableReader:
        """Read the committed state of table ``name`` across partitions."""
        agent, table = self.app.tables[name]
        return _TableReader(self._stores, agent, table)

    def replay_parked(
        self, destination: str, *, stream: str | None = None, skip: str | None = None
    ) -> int:
        """Send what was parked to ``destination`` since the last call back to its origin,
        in order, as ``streamapp parked replay`` does (only held stream ``stream``'s, when
        given; event id ``skip`` of it marked to be skipped, as ``streamapp parked skip``
        does); returns how many went back (:meth:`process` runs them)."""
        marks = self._replayed.setdefault(destination, [0] * len(self._topic(destination)))
        sources, sent = frozenset(self.app.sources), 0
        for p, part in enumerate(self._topic(destination)):
            for m in sent_back(part[marks[p] :], sources, stream=stream, skip=skip):
                self.send_raw(m.topic, m.value, key=m.key, headers=m.headers)
                sent += 1
            marks[p] = len(part)
        return sent

    def held(self, agent: str) -> dict[str, HeldStream]:
        """The streams ``agent`` holds (``Park(..., hold="stream")``), by stream id."""
        out: dict[str, HeldStream] = {}
        for task, _ in self._tasks.values():
            for lane in task.lanes:
                if lane.name == agent and lane.tables is not None:
                    out.update(lane.tables.held_streams())
        return out

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
        again. Derived events sent to a topic that feeds agents are processed in further
        rounds of the same call.
        """
        for topic in self.app.sources.values():  # all open first: agents read each other
            for p in range(topic.partitions):
                await self._task(topic.name, p)
        counts: Counter[Outcome] = Counter()
        stuck: dict[tuple[str, int], StuckRecord] = {}
        for _ in range(MAX_ROUNDS):
            for topic in self.app.sources.values():
                for p in range(topic.partitions):
                    if (topic.name, p) in stuck:
                        continue
                    handled, stopped = await self._drain(topic.name, p)
                    counts.update(handled)
                    if stopped is not None:
                        stuck[(topic.name, p)] = stopped
            waiting = [
                (t, p)
                for t in self.app.sources
                for p, part in enumerate(self.topics[t])
                if (t, p) not in stuck and self._port(t, p).position < len(part)
            ]
            if not waiting and not self._relay():
                break
        else:
            raise StreamappError(
                f"MemoryBroker.process(): agents still send to each other's topics after "
                f"{MAX_ROUNDS} rounds (a loop of derived events?)"
            )
        if stuck:
            raise StuckRecordsError(list(stuck.values()), counts)
        return counts

    def _relay(self) -> bool:
        """Republish the due retry and delay copies to their origin topics, in order per
        partition (a partition waits while its head is not due); when none is due and
        ``fast_forward`` is on, first move the clock to the earliest head. True when
        something was republished."""
        heads = []
        for topic, positions in self._relayed.items():
            for p, at in enumerate(positions):
                part = self.topics[topic][p]
                if at < len(part):
                    heads.append(chain.due_ms(part[at].headers) or 0)
        if not heads:
            return False
        now_ms = self.clock() * 1000
        if min(heads) > now_ms:
            if not self.fast_forward:
                return False
            self._ahead_s += (min(heads) - now_ms) / 1000
            now_ms = self.clock() * 1000
        moved = False
        for topic, positions in self._relayed.items():
            for p, at in enumerate(positions):
                part = self.topics[topic][p]
                while at < len(part) and (chain.due_ms(part[at].headers) or 0) <= now_ms:
                    record = part[at]
                    origin = chain.header(record.headers, chain.ORIGIN_TOPIC)
                    if origin is not None:
                        m = chain.republished(
                            origin.decode(), record.value, record.key, record.headers
                        )
                        self.send_raw(m.topic, m.value, key=m.key, headers=m.headers)
                    at += 1
                    moved = True
                positions[p] = at
        return moved

    async def _drain(self, topic: str, p: int) -> tuple[Counter[Outcome], StuckRecord | None]:
        task, port = await self._task(topic, p)
        records = self._topic(topic)[p]
        counts: Counter[Outcome] = Counter()
        bound = self.max_attempts
        for lane in task.lanes:  # a bounded Redeliver's fallback must get its turn
            if isinstance(lane.agent.on_failure, Redeliver):
                bound = max(bound, lane.agent.on_failure.max_attempts or 0)
        tries, at = 0, -1
        while (start := port.position) < len(records):
            if task.fatal is not None:  # an agent refused: the partition stopped for good
                raise task.fatal
            before = Counter(task.outcomes)
            await task.process(records[start:])
            counts.update(Counter(task.outcomes) - before)
            if task.fatal is not None:
                raise task.fatal
            # Stopped at a failure (a lane failing at a record), or no progress at all.
            # A pass cut by the batch budget settles every record it handled.
            failing = [lane for lane in task.lanes if lane.attempts.position == port.position]
            if failing or port.position <= start:
                tries, at = (tries + 1 if port.position == at else 1), port.position
                if tries >= bound:
                    lane = failing[0] if failing else task.lanes[0]
                    error = lane.attempts.last_error if failing else ""
                    return counts, StuckRecord(lane.name, records[at], tries, error)
        return counts, None

    async def _task(self, topic: str, p: int) -> tuple[PartitionTask, _MemoryPort]:
        key = (topic, p)
        if key not in self._tasks:
            port = _MemoryPort(self._topic(topic)[p])
            name = f"{topic}[{p}]"
            task = self._factory.create(
                self.app.agents_of(topic),
                p,
                port,
                name=name,
                open_store=lambda agent, spaces: self._store(agent, p, spaces),
            )
            await task.open()
            self._tasks[key] = (task, port)
        return self._tasks[key]

    def _read_store(self, table: Table[Any], partition: int) -> Store:
        tasks = {key: task for key, (task, _) in self._tasks.items()}
        return read_store(tasks, self.app, table, partition)

    def _port(self, topic: str, p: int) -> _MemoryPort:
        return self._tasks[(topic, p)][1]

    def _store(self, agent: Agent, p: int, spaces: list[str]) -> Store:
        key = (agent.name, p)
        if key not in self._stores:
            self._stores[key] = MemoryStore(spaces)
        return self._stores[key]

    def _topic(self, topic: str) -> list[list[DeliveryRecord]]:
        if topic not in self.topics:
            raise KeyError(f"topic {topic!r} is not declared by app {self.app.id!r}")
        return self.topics[topic]


class _TableReader:
    """Committed state of one table, across its partitions."""

    def __init__(
        self, stores: dict[tuple[str, int], MemoryStore], agent: Agent, table: Table[Any]
    ) -> None:
        self._stores, self._agent, self._table = stores, agent, table

    def get(self, key: str, default: Any = None) -> Any:
        raw = self._raw(key)
        return default if raw is None else self._table.codec.loads(raw)

    def __getitem__(self, key: str) -> Any:
        raw = self._raw(key)
        if raw is None:
            raise KeyError(key)
        return self._table.codec.loads(raw)

    def _raw(self, key: str) -> bytes | None:
        p = self._agent.topic.partition_of(key.encode())
        store = self._stores.get((self._agent.name, p))
        return None if store is None else store.get(self._table.data_space, key.encode())
