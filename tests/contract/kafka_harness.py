"""The agent contract over real Kafka: an in-process Worker, observed from outside.

Each harness uses its own app id (consumer group) and topic names. ``settle`` waits
until the group's committed offsets reach the topic's end offsets; tables are read over
the worker's HTTP views (committed state); parking topics with a read_committed consumer.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streamapp import App
from streamapp.kafka.topics import create_topics
from streamapp.worker import Worker

from .harness import AgentHarness, Parked, read_view

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
    settles_in_transaction = True

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

    async def settle(self, within_s: float = 30.0) -> bool:
        sent, self._sent = self._sent, []
        await asyncio.gather(*sent)  # acks=all: every record is in the topic
        deadline = time.monotonic() + within_s
        while True:
            if await self.unsettled() == 0 and self._idle():
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)

    def _idle(self) -> bool:
        """No partition task is committing: the offset commits in the transaction, and
        the store (what views read) is written right after it."""
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
        got: list[Any] = []
        try:
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            async with asyncio.timeout(15):  # bounded: the ends are known up front
                while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
                    batch = await consumer.getmany(*tps, timeout_ms=200)
                    got += [r for records in batch.values() for r in records]
        finally:
            await consumer.stop()
        got.sort(key=lambda r: (r.partition, r.offset))
        return [Parked(r.value, r.key, dict(r.headers)) for r in got]
