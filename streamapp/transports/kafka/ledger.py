"""The ledger on Kafka (:mod:`streamapp.versions.ledger`): records of the compacted
``{app}-members`` topic whose keys start with ``streamapp.ledger/``, read from the start
and followed by one consumer, written through a confirmed sink (acks=all)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from ...errors import ConfigError, SourceError
from ...settings.settings import Settings
from ...versions.ledger import PREFIX
from .connection import with_startup_retry
from .sink import KafkaSink
from .topology import partition_counts

log = logging.getLogger("streamapp.retirement")

Records = list[tuple[str, bytes | None]]
READ_TIMEOUT_S = 60.0
"""How long reading the ledger to its end may take (a start or a retire waits on it)."""


class KafkaLedger:
    """The ledger of one app on its members topic ``topic``."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self.settings, self.topic = settings, topic
        self._tp = TopicPartition(topic, 0)
        self._consumer: AIOKafkaConsumer | None = None
        self._sink: KafkaSink | None = None

    @classmethod
    async def open(cls, settings: Settings, topic: str) -> KafkaLedger:
        """Connect; ConfigError naming the topic and the fix when it is missing."""
        if not (await partition_counts(settings, [topic])).get(topic):
            raise ConfigError(
                f"topic {topic} is missing: it holds the workers' directory and the table "
                "versions retired; create it with `streamapp topics create -A MODULE:app`"
            )
        ledger = cls(settings, topic)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.kafka_bootstrap,
            enable_auto_commit=False,
            client_id=f"{topic}-ledger",
        )
        await with_startup_retry(settings, "Kafka consumer", consumer.start)
        ledger._consumer = consumer
        consumer.assign([ledger._tp])
        await consumer.seek_to_beginning(ledger._tp)
        return ledger

    async def records(self) -> Records:
        consumer = self._consumer
        assert consumer is not None
        out: Records = []
        try:
            end = (await consumer.end_offsets([self._tp]))[self._tp]
            deadline = time.monotonic() + READ_TIMEOUT_S
            while await consumer.position(self._tp) < end:
                if time.monotonic() > deadline:
                    raise SourceError(
                        f"reading topic {self.topic!r} to its end (offset {end}) took over "
                        f"{READ_TIMEOUT_S:.0f}s; check that Kafka at "
                        f"{self.settings.kafka_bootstrap} serves it"
                    )
                out += await self._fetch(consumer)
        except KafkaError as exc:
            raise SourceError(f"reading topic {self.topic!r} failed: {exc!r}") from exc
        return out

    async def updates(self) -> AsyncIterator[Records]:
        consumer = self._consumer
        assert consumer is not None
        while True:
            try:
                records = await self._fetch(consumer)
            except KafkaError as exc:
                raise SourceError(f"reading topic {self.topic!r} failed: {exc!r}") from exc
            if records:
                yield records

    async def _fetch(self, consumer: AIOKafkaConsumer) -> Records:
        out: Records = []
        for batch in (await consumer.getmany(self._tp, timeout_ms=500)).values():
            for r in batch:
                key = r.key.decode(errors="replace") if r.key is not None else ""
                if key.startswith(PREFIX):
                    out.append((key, r.value))
        return out

    async def put(self, key: str, value: bytes) -> None:
        if self._sink is None:
            sink = KafkaSink(
                self.settings.kafka_bootstrap,
                timeout_s=self.settings.control_publish_timeout_s,
                setting="control_publish_timeout_s",
            )
            await with_startup_retry(self.settings, "Kafka producer", sink.start)
            self._sink = sink
        await self._sink.publish(self.topic, value, key=key.encode())

    async def close(self) -> None:
        if self._sink is not None:
            await self._sink.stop()
        if self._consumer is not None:
            await self._consumer.stop()


async def open_ledger(settings: Settings, topic: str) -> KafkaLedger | None:
    """The ledger a worker follows (None, with a warning, when the topic is missing: a
    worker then neither learns retirements nor declares its versions)."""
    try:
        return await KafkaLedger.open(settings, topic)
    except ConfigError as exc:
        log.warning("%s", exc)
        return None
