"""The agent contract over real Kafka: an in-process Worker, observed from outside.

Each harness uses its own app id (consumer group) and topic names. ``settle`` waits
until the group's committed offsets reach the topic's end offsets; tables are read over
the worker's HTTP views (committed state); parking topics with a read_committed consumer.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streamapp import App
from streamapp.engine.interfaces import NO_LANES, Committed
from streamapp.transports.kafka.port import KafkaPartitionPort
from streamapp.transports.kafka.topology import create_topics
from streamapp.transports.kafka.transaction import KafkaTransaction
from streamapp.worker import Worker
from tests.support.records import read_to_end
from tests.support.waits import until

from .harness import AgentHarness, Parked, counter, read_view

FAST = {
    "poll_timeout_ms": 100,
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 500,
    "rebalance_timeout_ms": 20_000,
    "shutdown_timeout_s": 20.0,
    "publish_timeout_s": 10.0,
}
"""Short settings: a test waits on polls and pauses, never on defaults made for production."""


class KafkaHarness(AgentHarness):
    redeliver_pause_s = 1.0
    stateless_calls_exact = False

    def __init__(self, bootstrap: str, data_dir: Path) -> None:
        super().__init__()
        self.bootstrap, self.data_dir = bootstrap, data_dir
        self.ns = f"contract-{uuid.uuid4().hex[:10]}-"
        self.worker: Worker | None = None
        self._producer: AIOKafkaProducer | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self._probe: AIOKafkaConsumer | None = None
        self._http: aiohttp.ClientSession | None = None
        self._sent: list[asyncio.Future[Any]] = []
        self._all_sent: list[tuple[asyncio.Future[Any], bytes | None]] = []
        self._tps: dict[str, list[TopicPartition]] = {}
        self._watch = pytest.MonkeyPatch()

    def new_app(self, **settings: Any) -> App:
        return App(
            f"{self.ns}app",
            kafka_bootstrap=self.bootstrap,
            data_dir=self.data_dir,
            web_port=0,
            **{**FAST, **settings},
        )

    def name(self, base: str) -> str:
        return self.ns + base

    async def start(self, app: App) -> None:
        self.app = app
        settings = app.settings()
        if self.narrowed:  # made first, with one partition: create_topics keeps them
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
            await admin.start()
            try:
                await admin.create_topics([NewTopic(t, 1, 1) for t in sorted(self.narrowed)])
            finally:
                await admin.close()
        await create_topics(app, settings)
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True, linger_ms=2
        )
        await self._producer.start()
        self._admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await self._admin.start()
        self._probe = AIOKafkaConsumer(bootstrap_servers=self.bootstrap)
        await self._probe.start()
        self._http = aiohttp.ClientSession()
        self._watch_settles()
        worker = Worker(app, settings)
        await worker.start()  # stops what it started when it fails
        self.worker = worker

    async def stop(self) -> None:
        worker, self.worker = self.worker, None
        try:
            if worker is not None:
                await worker.stop()
        finally:
            for closing in (self._producer, self._probe):
                if closing is not None:
                    await closing.stop()
            if self._admin is not None:
                await self._admin.close()
            if self._http is not None:
                await self._http.close()
            self._producer = self._probe = self._admin = self._http = None
            self._watch.undo()

    def _watch_settles(self) -> None:
        """Check every settle of the source at its moment, in the worker's process: an
        offset commit (``KafkaPartitionPort.settle``) or an offset in a transaction
        (``KafkaTransaction.commit``). A partition whose lanes have tables must have
        its store checkpoint at or past the settled position already (with a lane
        without tables, the offset is in the changelogs' transaction: not checked); each
        one that has not goes to ``early_settles``. Observation only: the real methods
        run as ever."""
        settle, commit = KafkaPartitionPort.settle, KafkaTransaction.commit

        def check(tp: TopicPartition, position: int, how: str) -> None:
            worker = self.worker
            task = (
                None
                if worker is None or worker.source is None
                else (worker.source.assignment.tasks.get((tp.topic, tp.partition)))
            )
            if task is None or any(lane.tables is None for lane in task.lanes):
                return  # a lane without tables: the offset goes with the changelogs
            self.settles_watched += 1
            for lane in task.lanes:
                assert lane.tables is not None
                live = lane.tables.checkpoint.live
                if live is None or live < position:
                    self.early_settles.append(
                        f"{tp.topic}[{tp.partition}] settled at {position} ({how}) with "
                        f"{lane.name}'s store at {live}"
                    )

        async def watched_settle(
            port: KafkaPartitionPort, position: int, ahead: Any = NO_LANES
        ) -> None:
            check(port.tp, position, "offset commit")
            await settle(port, position, ahead)

        async def watched_commit(
            txn: KafkaTransaction, changes: Any, outputs: Any, settle_at: Committed | None
        ) -> list[int]:
            if settle_at is not None:
                check(txn.source, settle_at.position, "in the transaction")
            return await commit(txn, changes, outputs, settle_at)

        self._watch.setattr(KafkaPartitionPort, "settle", watched_settle)
        self._watch.setattr(KafkaTransaction, "commit", watched_commit)

    async def send_raw(
        self,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        topic: str | None = None,
    ) -> None:
        assert self._producer is not None, "start the app first"
        sent = await self._producer.send(topic or self.topic, value, key=key, headers=list(headers))
        self._sent.append(sent)
        self._all_sent.append((sent, value))

    async def position_of(self, i: int) -> int:
        return int((await self._all_sent[i][0]).offset)

    async def value_of(self, i: int) -> bytes | None:
        return self._all_sent[i][1]

    async def settle(self, stalled_s: float = 30.0) -> bool:
        sent, self._sent = self._sent, []
        await asyncio.gather(*sent)  # acks=all: every record is in the topic

        async def settled() -> bool:
            return await self.unsettled() == 0 and self._idle()

        return await until(
            settled, what="every record settled", progress=self.progress, stalled_s=stalled_s
        )

    def _idle(self) -> bool:
        """No partition task is committing: with tables the offset is committed after the
        store write, outside the transaction (``streamapp/engine/commit.py``)."""
        assert self.worker is not None
        assert self.worker.source is not None
        return not any(t.busy for t in self.worker.source.assignment.tasks.values())

    async def _partitions(self, topic: str) -> list[TopicPartition]:
        if topic not in self._tps:
            assert self._admin is not None, "start the app first"
            (described,) = await self._admin.describe_topics([topic])
            assert described["error_code"] == 0, f"topic {topic}: {described}"
            parts = sorted(p["partition"] for p in described["partitions"])
            assert parts, f"topic {topic} has no partitions"
            self._tps[topic] = [TopicPartition(topic, p) for p in parts]
        return self._tps[topic]

    async def unsettled(self) -> int:
        assert self._admin is not None, "start the app first"
        assert self._probe is not None
        assert self.app is not None
        tps = [tp for topic in self.app.sources for tp in await self._partitions(topic)]
        ends = await self._probe.end_offsets(tps)
        committed = await self._admin.list_consumer_group_offsets(self.app.id)
        behind = 0
        for tp in tps:
            meta = committed.get(tp)
            done = meta.offset if meta is not None and meta.offset >= 0 else 0
            behind += ends[tp] - done
        return behind

    async def table(self, name: str, key: str) -> Any:
        assert self._http is not None, "start the app first"
        assert self.worker is not None
        return await read_view(self._http, self.worker.web_port, name, key)

    async def parked(self, topic: str) -> list[Parked]:
        tps = await self._partitions(topic)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            isolation_level="read_committed",
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            got = await read_to_end(consumer, tps)
        finally:
            await consumer.stop()
        return [Parked(r.value, r.key, dict(r.headers), r.partition) for r in got]

    def metric(self, name: str, agent: str) -> float | None:
        assert self.worker is not None, "start the app first"
        return counter(self.worker.metrics.render().decode(), name, agent)
